//! Running a hook's command: on the host here, inside the sandbox through whatever the shim
//! provides (it owns runsc). Output goes to a file, not a pipe: a hook that leaves a process
//! behind must not hang the checkpoint waiting for end-of-file.

use std::{
    fs::File,
    io::{Read, Seek, SeekFrom},
    os::unix::process::CommandExt,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use crate::{
    config::Place,
    error::{Error, Result},
};

/// How a command ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The exit status (128 + signal when a signal ended it); None when it timed out.
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
    ) -> Result<Outcome>;
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

/// A started command, however it was spawned (the shim's reaper owns its children's exits).
pub trait Running {
    fn pid(&self) -> u32;
    /// The exit status once it has exited (128 + signal when killed).
    fn try_wait(&mut self) -> std::io::Result<Option<i32>>;
}

impl Running for std::process::Child {
    fn pid(&self) -> u32 {
        self.id()
    }

    fn try_wait(&mut self) -> std::io::Result<Option<i32>> {
        use std::os::unix::process::ExitStatusExt;
        Ok(std::process::Child::try_wait(self)?
            .map(|s| s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0))))
    }
}

/// A file for a command's stdout and stderr, and a second handle to read it back.
pub fn output_file() -> Result<(File, File)> {
    let file = tempfile::tempfile().map_err(Error::io("output file for a hook"))?;
    let writer = file
        .try_clone()
        .map_err(Error::io("output file for a hook"))?;
    Ok((file, writer))
}

/// Waits for `child` until `timeout`; at the deadline calls `kill` with its pid and waits for
/// it to go. `output` is the file its stdout and stderr went to.
pub fn wait_with_timeout(
    mut child: Box<dyn Running + '_>,
    mut output: File,
    timeout: Duration,
    kill: impl FnOnce(u32),
) -> Result<Outcome> {
    let deadline = Instant::now() + timeout;
    let mut timed_out = false;
    let mut kill = Some(kill);
    let status = loop {
        if let Some(status) = child.try_wait().map_err(Error::io("wait for a hook"))? {
            break status;
        }
        if Instant::now() >= deadline {
            if let Some(kill) = kill.take() {
                timed_out = true;
                kill(child.pid());
            } else if Instant::now() >= deadline + KILL_GRACE {
                return Err(Error::Unkillable(KILL_GRACE));
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut bytes = Vec::new();
    output
        .seek(SeekFrom::Start(0))
        .and_then(|_| output.read_to_end(&mut bytes))
        .map_err(Error::io("read a hook's output"))?;
    Ok(Outcome {
        status: (!timed_out).then_some(status),
        output: tail(&String::from_utf8_lossy(&bytes)),
        timed_out,
    })
}

/// How long a killed hook may take to be gone.
const KILL_GRACE: Duration = Duration::from_secs(10);

/// Runs a host command to completion or `timeout`, in a process group of its own so that the
/// timeout kills what it started too; stdin is empty.
pub fn run_with_timeout(cmd: Command, timeout: Duration) -> Result<Outcome> {
    spawn_with_timeout(cmd, timeout, |cmd| {
        cmd.spawn().map(|c| Box::new(c) as Box<dyn Running>)
    })
}

/// [`run_with_timeout`] with the child started by `spawn` (the shim's reaper owns the exits
/// of its children).
pub fn spawn_with_timeout(
    mut cmd: Command,
    timeout: Duration,
    spawn: impl FnOnce(&mut Command) -> std::io::Result<Box<dyn Running>>,
) -> Result<Outcome> {
    let (output, writer) = output_file()?;
    cmd.stdin(Stdio::null())
        .stdout(
            writer
                .try_clone()
                .map_err(Error::io("output file for a hook"))?,
        )
        .stderr(writer)
        .process_group(0);
    let child = spawn(&mut cmd).map_err(Error::io(format!("start {:?}", cmd.get_program())))?;
    wait_with_timeout(child, output, timeout, kill_group)
}

/// SIGKILL to the process group `pid` leads.
pub fn kill_group(pid: u32) {
    // SAFETY: kill(2) of a process group this crate's caller made for the child.
    unsafe { libc::kill(-(pid as i32), libc::SIGKILL) };
}

/// Host commands with a clean environment plus `env`.
pub fn host_command(argv: &[String], env: &[(String, String)]) -> Result<Command> {
    let (program, args) = argv
        .split_first()
        .ok_or_else(|| Error::Invalid("a hook has an empty command".into()))?;
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
