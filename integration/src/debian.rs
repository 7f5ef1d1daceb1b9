//! The Debian 12 test image: the root filesystem scripts/debian-image builds from Debian's
//! packages (`CHALK_DEBIAN_ROOTFS`), made into an OCI archive once per build and imported into
//! a containerd; and reading what integration/debian/workload.py reports.

use std::{
    io,
    path::PathBuf,
    sync::OnceLock,
    time::{Duration, Instant},
};

use crate::Containerd;

/// The image's name in every containerd the tests start.
pub const DEBIAN_IMAGE: &str = "docker.io/chalk/debian:12";
/// Where the image keeps the workload (integration/debian).
pub const WORKLOAD: &[&str] = &["python3", "/srv/fixtures/workload.py"];
/// The seeds' counter: writes the count to /workspace/count.txt.
pub const COUNT_PY: &[&str] = &["python3", "/srv/fixtures/count.py"];

/// The root filesystem tar scripts/debian-image built.
pub fn rootfs() -> io::Result<PathBuf> {
    let path = std::env::var_os("CHALK_DEBIAN_ROOTFS")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .ok_or_else(|| {
            io::Error::other(
                "CHALK_DEBIAN_ROOTFS is not set: run `eval \"$(scripts/debian-image)\"` \
                 (scripts/test does) to build the Debian test image",
            )
        })?;
    if !path.is_file() {
        return Err(io::Error::other(format!(
            "CHALK_DEBIAN_ROOTFS={} is missing: run scripts/debian-image again",
            path.display()
        )));
    }
    Ok(path)
}

/// The OCI archive of the image, beside the root filesystem it is made of: built the first
/// time (the same bytes each time), shared by every containerd of every test binary.
fn archive() -> io::Result<PathBuf> {
    static ARCHIVE: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    ARCHIVE
        .get_or_init(|| build_archive().map_err(|e| e.to_string()))
        .clone()
        .map_err(io::Error::other)
}

fn build_archive() -> io::Result<PathBuf> {
    let rootfs = rootfs()?;
    let out = rootfs.with_file_name("image.oci.tar");
    if out.is_file() {
        return Ok(out);
    }
    let layer = std::fs::read(&rootfs)?;
    let config = serde_json::json!({
        "Env": ["PATH=/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin", "LANG=C.UTF-8"],
        "Cmd": ["/bin/bash"],
        "WorkingDir": "/workspace",
    });
    let archive = crate::image::oci_archive_configured(&layer, DEBIAN_IMAGE, config)?;
    // Renamed into place: test binaries running side by side never read half an archive.
    let tmp = out.with_extension(format!("tmp.{}", std::process::id()));
    std::fs::write(&tmp, archive)?;
    std::fs::rename(&tmp, &out)?;
    Ok(out)
}

impl Containerd {
    /// Imports the Debian image as [`DEBIAN_IMAGE`].
    pub fn import_debian(&self) -> io::Result<()> {
        self.import_archive_file(&archive()?)
    }
}

/// What the workload last wrote to /workspace/status.json.
#[derive(Debug, Clone)]
pub struct Status(pub serde_json::Value);

/// The workload's progress counters: each must go on rising in a sandbox that carried on.
pub const PROGRESS: &[&str] = &[
    "counter",
    "heap0_rounds",
    "heap1_rounds",
    "heap2_rounds",
    "heap3_rounds",
    "ipc_round_trips",
    "sleep_ticks",
    "files_checks",
];

impl Status {
    pub fn parse(text: &str) -> Result<Self, String> {
        serde_json::from_str(text)
            .map(Status)
            .map_err(|e| format!("status.json {text:?}: {e}"))
    }

    pub fn num(&self, key: &str) -> u64 {
        self.0[key].as_u64().unwrap_or(0)
    }

    pub fn float(&self, key: &str) -> f64 {
        self.0[key].as_f64().unwrap_or(0.0)
    }

    /// What the workload's parts reported as failed.
    pub fn errors(&self) -> Vec<String> {
        self.0["errors"]
            .as_array()
            .map(|a| a.iter().map(|e| e.to_string()).collect())
            .unwrap_or_default()
    }

    /// Names created in the watched directory that inotify reported.
    pub fn inotify_seen(&self) -> Vec<String> {
        self.0["inotify_seen"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|e| e.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Every part has started: each progress counter moved and a transaction committed.
    pub fn all_started(&self) -> bool {
        PROGRESS.iter().all(|k| self.num(k) > 0) && self.num("sqlite_committed_batches") > 0
    }

    /// The progress counters that did not rise from `before` to `self`.
    pub fn stalled_since(&self, before: &Status) -> Vec<String> {
        PROGRESS
            .iter()
            .filter(|k| self.num(k) <= before.num(k))
            .map(|k| format!("{k} {} -> {}", before.num(k), self.num(k)))
            .collect()
    }
}

/// Polls `read` until `ok` holds of what it returns, or `limit` passes: the last value read.
pub fn poll<T: std::fmt::Debug>(
    limit: Duration,
    mut read: impl FnMut() -> Result<T, String>,
    ok: impl Fn(&T) -> bool,
) -> Result<T, String> {
    let deadline = Instant::now() + limit;
    loop {
        let got = read();
        match &got {
            Ok(v) if ok(v) => return got,
            _ if Instant::now() >= deadline => {
                return Err(format!("not reached in {limit:?}: last {got:?}"))
            }
            _ => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

/// Where the workload reports.
pub const STATUS: &str = "/workspace/status.json";

fn exec_id(what: &str) -> String {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{what}-{n}")
}

/// `cmd` run in sandbox `id` by `ctr task exec`, with an exec id of its own.
pub fn exec(c: &Containerd, id: &str, cmd: &[&str]) -> crate::CtrOutput {
    let exec = exec_id("deb");
    let mut args = vec!["task", "exec", "--exec-id", &exec, id];
    args.extend_from_slice(cmd);
    c.ctr(&args)
}

/// What the workload in `id` last reported.
pub fn status(c: &Containerd, id: &str) -> Result<Status, String> {
    let out = exec(c, id, &["cat", STATUS]);
    if out.code != 0 {
        return Err(format!("cat {STATUS} in {id}: {out:?}"));
    }
    Status::parse(&out.stdout)
}

/// Waits until every part of the workload in `id` has started.
pub fn wait_started(c: &Containerd, id: &str) -> Result<Status, String> {
    poll(
        Duration::from_secs(90),
        || status(c, id),
        |s| s.all_started() || !s.errors().is_empty(),
    )
    .and_then(no_errors)
}

fn no_errors(s: Status) -> Result<Status, String> {
    match s.errors() {
        e if e.is_empty() => Ok(s),
        e => Err(format!("the workload reports {e:?}")),
    }
}

/// Checks that the workload in `id` carried on from `before` (read in its source, or in itself
/// before a suspend): the same process, every part still progressing with nothing it holds
/// changed, a new file seen by its inotify watch (named `tag`), a transaction committed since,
/// and its database whole to another process. What it reports then.
pub fn carries_on(c: &Containerd, id: &str, before: &Status, tag: &str) -> Result<Status, String> {
    let touch = exec(c, id, &["touch", &format!("/workspace/watched/{tag}")]);
    if touch.code != 0 {
        return Err(format!("touch in {id}: {touch:?}"));
    }
    let after = poll(
        Duration::from_secs(30),
        || status(c, id),
        |s| {
            !s.errors().is_empty()
                || (s.stalled_since(before).is_empty()
                    && s.inotify_seen().iter().any(|n| n == tag)
                    && s.num("sqlite_committed_batches") > before.num("sqlite_committed_batches"))
        },
    )
    .map_err(|e| format!("{id} did not carry on from {before:?}: {e}"))
    .and_then(no_errors)?;
    if after.num("pid") != before.num("pid") {
        return Err(format!(
            "{id} runs another workload: pid {} then {}",
            before.num("pid"),
            after.num("pid")
        ));
    }
    let db = exec(
        c,
        id,
        &[
            "sqlite3",
            "/workspace/db.sqlite",
            "PRAGMA integrity_check; SELECT COUNT(*) % 20 FROM t;",
        ],
    );
    if db.code != 0 || db.stdout != "ok\n0\n" {
        return Err(format!("{id}'s database, read by sqlite3: {db:?}"));
    }
    Ok(after)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_reads_progress_errors_and_events() {
        let a = Status::parse(r#"{"counter": 3, "errors": [], "inotify_seen": ["x"]}"#).unwrap();
        let b = Status::parse(
            r#"{"counter": 5, "heap0_rounds": 1, "errors": ["ipc: closed"], "inotify_seen": []}"#,
        )
        .unwrap();
        assert_eq!(a.inotify_seen(), vec!["x".to_string()]);
        assert_eq!(b.errors(), vec!["\"ipc: closed\"".to_string()]);
        let stalled = b.stalled_since(&a);
        assert!(!stalled.iter().any(|s| s.starts_with("counter")));
        assert!(stalled.iter().any(|s| s.starts_with("ipc_round_trips")));
        assert!(!b.all_started());
        assert!(Status::parse("{half").is_err());
    }

    #[test]
    fn poll_returns_the_first_value_that_holds() {
        let mut n = 0;
        let got = poll(
            Duration::from_secs(5),
            || {
                n += 1;
                Ok::<_, String>(n)
            },
            |v| *v >= 2,
        );
        assert_eq!(got, Ok(2));
        let never = poll(Duration::ZERO, || Ok::<_, String>(0), |v| *v > 0);
        assert!(never.unwrap_err().contains("last Ok(0)"));
    }
}
