//! Progress lines on stderr for what can take more than a second; quiet for `-o json` and
//! for the background checkpoint of `snapshot create --no-wait`.

use std::{
    sync::mpsc,
    time::{Duration, Instant},
};

/// How often a long step says it is still going.
const TICK: Duration = Duration::from_secs(2);

pub struct Progress {
    started: Instant,
    shown: bool,
}

impl Progress {
    /// Shown when `shown`, or when `CHALK_PROGRESS` is set (the timed steps of a command
    /// whose output is JSON, on stderr, to see where its time goes).
    pub fn new(shown: bool) -> Self {
        Self {
            started: Instant::now(),
            shown: shown || std::env::var_os("CHALK_PROGRESS").is_some_and(|v| !v.is_empty()),
        }
    }

    pub fn quiet() -> Self {
        Self::new(false)
    }

    /// One line: the time since the command began, and `what`.
    pub fn step(&self, what: &str) {
        if self.shown {
            eprintln!("[{:>7.3}s] {what}", self.started.elapsed().as_secs_f64());
        }
    }

    /// Runs `f`, announcing `what` first and then every [`TICK`] until it returns.
    pub fn during<T>(&self, what: &str, f: impl FnOnce() -> T) -> T {
        self.step(&format!("{what} ..."));
        if !self.shown {
            return f();
        }
        let began = Instant::now();
        let (done, wait) = mpsc::channel::<()>();
        std::thread::scope(|s| {
            s.spawn(move || {
                while let Err(mpsc::RecvTimeoutError::Timeout) = wait.recv_timeout(TICK) {
                    self.step(&format!(
                        "still {what} ({:.0}s)",
                        began.elapsed().as_secs_f64()
                    ));
                }
            });
            let out = f();
            drop(done);
            out
        })
    }

    pub fn elapsed_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Seconds since the command began, for closing lines.
    pub fn elapsed(&self) -> String {
        format!("{:.2}s", self.started.elapsed().as_secs_f64())
    }
}

/// `bytes` for people.
pub fn megabytes(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / 1e6)
}
/// The first 12 hex digits of a digest, as `ctr` and `docker` shorten ids.
pub fn short(digest: &str) -> &str {
    let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
    hex.get(..12).unwrap_or(hex)
}
