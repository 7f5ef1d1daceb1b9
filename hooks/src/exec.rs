//! Running a hook's command: on the host here, inside the sandbox through whatever the shim
//! provides (it owns runsc). Output goes to a file, not a pipe: a hook that leaves a process
//! behind must not hang the checkpoint waiting for end-of-file.

use std::{
    io::{Read, Seek, SeekFrom},
    os::unix::process::CommandExt,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use crate::config::Place;

/// How a command ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The exit status; None when it was killed (by a signal or the timeout).
    pub status: Option<i32>,
    /// stdout and stderr together, at most [`OUTPUT_LIMIT`] bytes (the end is kept).
    pub output: String,
    pub timed_out: bool,
}

/// Output kept for errors and logs.
pub const OUTPUT_LIMIT: usize = 4096;

impl Outcome {
    pub fn success(&self) -> bool {
        self.status == Some(0) && !self.timed_out
    }

    /// "exit 3", "timed out after 5 s", "killed".
    pub fn describe(&self, timeout: Duration) -> String {
        match (self.timed_out, self.status) {
            (true, _) => format!("timed out after {} s", timeout.as_secs()),
            (false, Some(code)) => format!("exit {code}"),
            (false, None) => "killed by a signal".into(),
        }
    }
}

/// Runs commands where a hook says.
pub trait Exec {
    fn exec(
        &self,
        place: Place,
        argv: &[String],
        env: &[(String, String)],
        timeout: Duration,
    ) -> Result<Outcome, String>;
}

/// The end of `text`, at most [`OUTPUT_LIMIT`] bytes, cut at a character boundary.
pub fn tail(text: &str) -> String {
    if text.len() <= OUTPUT_LIMIT {
        return text.to_string();
    }
    let mut start = text.len() - OUTPUT_LIMIT;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    format!("…{}", &text[start..])
}

/// Runs `cmd` with a deadline, in a process group of its own so that the timeout kills what
/// it started too; stdin is empty, stdout and stderr are collected.
pub fn run_with_timeout(mut cmd: Command, timeout: Duration) -> Result<Outcome, String> {
    let program = format!("{:?}", cmd.get_program());
    let mut out = tempfile::tempfile().map_err(|e| format!("output file for {program}: {e}"))?;
    let err = out.try_clone().map_err(|e| e.to_string())?;
    cmd.stdin(Stdio::null())
        .stdout(out.try_clone().map_err(|e| e.to_string())?)
        .stderr(err)
        .process_group(0);
    let mut child = cmd.spawn().map_err(|e| format!("start {program}: {e}"))?;
    let deadline = Instant::now() + timeout;
    let mut timed_out = false;
    let status = loop {
        if let Some(status) = child
            .try_wait()
            .map_err(|e| format!("wait for {program}: {e}"))?
        {
            break status;
        }
        if Instant::now() >= deadline {
            timed_out = true;
            // SAFETY: kill(2) of the process group we made for this child.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            break child
                .wait()
                .map_err(|e| format!("wait for {program}: {e}"))?;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut text = String::new();
    out.seek(SeekFrom::Start(0)).map_err(|e| e.to_string())?;
    let mut bytes = Vec::new();
    out.read_to_end(&mut bytes).map_err(|e| e.to_string())?;
    text.push_str(&String::from_utf8_lossy(&bytes));
    Ok(Outcome {
        status: status.code(),
        output: tail(&text),
        timed_out,
    })
}

/// Host commands with a clean environment plus `env`.
pub fn host_command(argv: &[String], env: &[(String, String)]) -> Result<Command, String> {
    let (program, args) = argv.split_first().ok_or("empty command")?;
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env_clear()
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .envs(env.iter().map(|(k, v)| (k, v)));
    Ok(cmd)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Command {
        host_command(
            &["/bin/sh".into(), "-c".into(), script.into()],
            &[("X".into(), "1".into())],
        )
        .unwrap()
    }

    #[test]
    fn output_and_status_are_collected() {
        let o = run_with_timeout(
            sh("echo out; echo err >&2; echo $X; exit 3"),
            Duration::from_secs(5),
        )
        .unwrap();
        assert_eq!(o.status, Some(3));
        assert_eq!(o.output, "out\nerr\n1\n");
        assert!(!o.success());
        assert_eq!(o.describe(Duration::from_secs(5)), "exit 3");
    }

    #[test]
    fn a_hanging_command_and_its_children_are_killed_at_the_deadline() {
        let started = Instant::now();
        let o = run_with_timeout(
            sh("sleep 30 & echo started; sleep 30"),
            Duration::from_millis(300),
        )
        .unwrap();
        assert!(o.timed_out && !o.success());
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(o.output, "started\n");
    }

    #[test]
    fn long_output_keeps_its_end() {
        let long = "é".repeat(OUTPUT_LIMIT);
        let t = tail(&long);
        assert!(t.starts_with('…') && t.len() <= OUTPUT_LIMIT + '…'.len_utf8());
    }
}
