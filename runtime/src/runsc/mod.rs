//! A typed driver for runsc. Argument building lives in [`args`], capability detection in
//! [`features`], reading runsc's results and logs in `output`; this module only spawns, waits,
//! and turns failures into errors that carry runsc's own reason (read back from its JSON log).

pub mod args;
pub mod delta;
pub mod features;
mod output;
pub mod probe;
pub mod sandbox;
pub mod spawn;

use std::{
    fs::File,
    io::Read,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Instant,
};

pub use args::{GlobalArgs, MemoryLoad, Op};
pub use features::{FeatureCache, Features, LeaveRunning};
pub use output::{last_error, parse_wait};
pub use sandbox::SandboxRuntime;
pub use spawn::{Child, Spawner, StdSpawner};

use crate::{stats::StatsEvent, Error, Result};

static LOG_COUNTER: AtomicU64 = AtomicU64::new(0);

/// The stdio a runsc command passes on to the container process it creates.
#[derive(Debug, Default)]
pub struct ProcessStdio {
    pub stdin: Option<File>,
    pub stdout: Option<File>,
    pub stderr: Option<File>,
    /// The three are one terminal's slave end: runsc gets it as its controlling terminal
    /// (a foreground `runsc exec` uses its own terminal for a process that asks for one).
    pub terminal: bool,
}

impl ProcessStdio {
    /// Stdio for a process with a terminal: the slave end of a pty on all three.
    pub fn terminal(slave: File) -> std::io::Result<Self> {
        Ok(ProcessStdio {
            stdin: Some(slave.try_clone()?),
            stdout: Some(slave.try_clone()?),
            stderr: Some(slave),
            terminal: true,
        })
    }

    fn apply(self, cmd: &mut Command) {
        use std::os::unix::process::CommandExt;
        let to_stdio = |f: Option<File>| f.map_or_else(Stdio::null, Stdio::from);
        if self.terminal {
            // SAFETY: only async-signal-safe calls between fork and exec.
            unsafe {
                cmd.pre_exec(|| {
                    if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        cmd.stdin(to_stdio(self.stdin))
            .stdout(to_stdio(self.stdout))
            .stderr(to_stdio(self.stderr));
    }
}

/// `runsc state` output.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct State {
    pub id: String,
    pub status: String,
    #[serde(default)]
    pub pid: i32,
}

/// A foreground `runsc exec`: its exit status is the process's (128+signal if killed).
pub struct ExecChild {
    child: Option<Box<dyn Child>>,
    log_file: PathBuf,
}

impl ExecChild {
    /// A foreground process that stands for `runsc exec` (a fake runtime's).
    pub fn from_child(child: Box<dyn Child>) -> Self {
        ExecChild {
            child: Some(child),
            log_file: PathBuf::new(),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, |c| c.pid())
    }

    pub fn try_wait(&mut self) -> std::io::Result<Option<i32>> {
        match self.child.as_mut() {
            Some(c) => c.try_wait(),
            None => Ok(None),
        }
    }

    /// Blocks until runsc exec, and so the process, has exited.
    pub fn wait(mut self) -> std::io::Result<i32> {
        match self.child.take() {
            Some(c) => c.wait(),
            None => Err(std::io::Error::other("runsc exec was already waited for")),
        }
    }

    /// Why runsc exec failed, from its log, once it has exited without starting the process.
    pub fn failure_reason(&self) -> String {
        last_error(&self.log_file).unwrap_or_else(|| "runsc exec gave no reason".into())
    }
}

impl Drop for ExecChild {
    fn drop(&mut self) {
        if !self.log_file.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.log_file);
        }
    }
}

#[derive(Clone)]
pub struct Runsc {
    binary: PathBuf,
    global: GlobalArgs,
    /// Where per-command log files go (the bundle: private to this container).
    log_dir: PathBuf,
    spawner: Arc<dyn Spawner>,
}

impl std::fmt::Debug for Runsc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runsc")
            .field("binary", &self.binary)
            .field("global", &self.global)
            .finish()
    }
}

impl Runsc {
    pub fn new(
        binary: impl Into<PathBuf>,
        global: GlobalArgs,
        log_dir: impl Into<PathBuf>,
        spawner: Arc<dyn Spawner>,
    ) -> Self {
        Runsc {
            binary: binary.into(),
            global,
            log_dir: log_dir.into(),
            spawner,
        }
    }

    pub fn binary(&self) -> &Path {
        &self.binary
    }

    pub fn global(&self) -> &GlobalArgs {
        &self.global
    }

    /// Adds a global flag to every later command.
    pub fn add_flag(&mut self, flag: &str) {
        self.global.flags.push(flag.to_string());
    }

    /// Sets global flag `--name=value`, replacing any value it had.
    pub fn set_flag(&mut self, name: &str, value: &str) {
        let prefix = format!("--{name}=");
        self.global.flags.retain(|f| !f.starts_with(&prefix));
        self.global.flags.push(format!("{prefix}{value}"));
    }

    /// The value of global flag `--name=value`, if set.
    pub fn flag_value(&self, name: &str) -> Option<&str> {
        self.global.flag_value(name)
    }

    /// Reads what this runsc supports (version and global flags).
    pub fn features(&self) -> Result<Features> {
        let version = self.plain(&["--version"])?;
        let flags = self.plain(&["flags"])?;
        let help = self.plain(&["help"])?;
        let checkpoint = self.plain(&["help", "checkpoint"]).unwrap_or_default();
        let kill = self.plain(&["help", "kill"]).unwrap_or_default();
        let restore = self.plain(&["help", "restore"]).unwrap_or_default();
        let wait = self.plain(&["help", "wait"]).unwrap_or_default();
        Ok(Features::from_outputs(&version, &flags)
            .with_help(&help)
            .with_checkpoint_help(&checkpoint)
            .with_kill_help(&kill)
            .with_restore_help(&restore, &wait))
    }

    /// Runs runsc with bare arguments (no root, no log) and returns what it printed, stdout
    /// and stderr together: the 2022 build prints `runsc flags` on stderr.
    fn plain(&self, args: &[&str]) -> Result<String> {
        let (read, write) = pipe().map_err(|e| Error::io("pipe for runsc output", e))?;
        let mut cmd = Command::new(&self.binary);
        cmd.args(args).stdin(Stdio::null());
        let spawned = write
            .try_clone()
            .map_err(|e| Error::io("pipe for runsc output", e))
            .and_then(|w| {
                cmd.stdout(Stdio::from(w)).stderr(Stdio::from(write));
                self.spawn(&mut cmd)
            });
        // The command holds copies of the write end: without them the read ends at runsc's exit.
        drop(cmd);
        let child = spawned?;
        let mut out = Vec::new();
        std::fs::File::from(read)
            .read_to_end(&mut out)
            .map_err(|e| Error::io("read runsc output", e))?;
        let status = child.wait().map_err(|e| Error::io("wait for runsc", e))?;
        let out = String::from_utf8_lossy(&out).into_owned();
        if status != 0 {
            return Err(Error::RunscBroken {
                binary: self.binary.clone(),
                args: args.join(" "),
                status,
                output: out.trim().chars().take(500).collect(),
            });
        }
        Ok(out)
    }

    fn log_file(&self, op: &Op) -> PathBuf {
        let n = LOG_COUNTER.fetch_add(1, Ordering::Relaxed);
        self.log_dir.join(format!(
            ".runsc-{}-{}-{n}.log",
            op.name(),
            std::process::id()
        ))
    }

    fn command(&self, op: &Op, log_file: &Path) -> Command {
        let mut cmd = Command::new(&self.binary);
        cmd.args(args::argv(&self.global, log_file, op));
        cmd
    }

    fn spawn(&self, cmd: &mut Command) -> Result<Box<dyn Child>> {
        self.spawner.spawn(cmd).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                Error::RunscMissing {
                    binary: self.binary.clone(),
                    source: e,
                }
            } else {
                Error::io(format!("spawn {}", self.binary.display()), e)
            }
        })
    }

    fn collect(&self, cmd: &mut Command) -> Result<(i32, Vec<u8>)> {
        let mut child = self.spawn(cmd)?;
        let mut out = Vec::new();
        if let Some(mut stdout) = child.take_stdout() {
            stdout
                .read_to_end(&mut out)
                .map_err(|e| Error::io("read runsc output", e))?;
        }
        let status = child.wait().map_err(|e| Error::io("wait for runsc", e))?;
        Ok((status, out))
    }

    /// Runs `op` to completion. With `stdio` None, runsc's stdout is captured and returned.
    fn run(&self, op: Op, stdio: Option<ProcessStdio>) -> Result<Vec<u8>> {
        let log_file = self.log_file(&op);
        let mut cmd = self.command(&op, &log_file);
        match stdio {
            Some(io) => io.apply(&mut cmd),
            None => {
                cmd.stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::null());
            }
        }
        let started = Instant::now();
        let result = self.collect(&mut cmd);
        log::debug!(
            "runsc {:?} took {:?}",
            cmd.get_args().collect::<Vec<_>>(),
            started.elapsed()
        );
        let outcome = match result {
            Ok((0, out)) => Ok(out),
            Ok((status, _)) => Err(Error::Runsc {
                op: op.name(),
                id: op.id().to_string(),
                status,
                message: last_error(&log_file).unwrap_or_else(|| "no reason logged".into()),
            }),
            Err(e) => Err(e),
        };
        let _ = std::fs::remove_file(&log_file);
        outcome
    }

    pub fn create(
        &self,
        id: &str,
        bundle: &Path,
        pid_file: &Path,
        stdio: ProcessStdio,
        console_socket: Option<&Path>,
    ) -> Result<()> {
        self.run(
            Op::Create {
                id,
                bundle,
                pid_file,
                console_socket,
            },
            Some(stdio),
        )
        .map(drop)
    }

    /// `runsc checkpoint` into `image_path`; with `leave_running` the sandbox goes on (see
    /// [`Features::leave_running`] for which builds do that in place).
    pub fn checkpoint(
        &self,
        id: &str,
        image_path: &Path,
        leave_running: bool,
        extra: &[String],
    ) -> Result<()> {
        self.run(
            Op::Checkpoint {
                id,
                image_path,
                leave_running,
                extra,
            },
            None,
        )
        .map(drop)
    }

    /// `runsc restore --detach`: a running sandbox `id` from the checkpoint in `image_path`,
    /// with `stdio` as its init's stdio, like [`Runsc::create`] followed by a start; `memory`
    /// says how its memory loads (see [`MemoryLoad`]).
    #[allow(clippy::too_many_arguments)]
    pub fn restore(
        &self,
        id: &str,
        bundle: &Path,
        image_path: &Path,
        pid_file: &Path,
        stdio: ProcessStdio,
        console_socket: Option<&Path>,
        memory: MemoryLoad,
    ) -> Result<()> {
        self.run(
            Op::Restore {
                id,
                bundle,
                image_path,
                pid_file,
                console_socket,
                memory,
            },
            Some(stdio),
        )
        .map(drop)
    }

    /// Blocks until a background restore of `id` has loaded all of its memory.
    pub fn wait_restored(&self, id: &str) -> Result<()> {
        self.run(Op::WaitRestore { id }, None).map(drop)
    }

    pub fn start(&self, id: &str) -> Result<()> {
        self.run(Op::Start { id }, None).map(drop)
    }

    /// Starts a pod's container in its sandbox: runsc hands the container `stdio` at start
    /// (at create it has no process to give them to; a terminal comes at create instead).
    pub fn start_with_stdio(&self, id: &str, stdio: ProcessStdio) -> Result<()> {
        self.run(Op::Start { id }, Some(stdio)).map(drop)
    }

    /// Blocks until the init of container `id` exits and returns its status (128+signal when
    /// killed). A pod container's init is no host process, so this is how its exit is known.
    pub fn wait(&self, id: &str) -> Result<i32> {
        let out = self.run(Op::Wait { id }, None)?;
        parse_wait(&out)
    }

    pub fn state(&self, id: &str) -> Result<State> {
        let out = self.run(Op::State { id }, None)?;
        serde_json::from_slice(&out).map_err(|e| Error::parse("runsc state output", e))
    }

    pub fn kill(&self, id: &str, signal: u32, all: bool, pid: Option<i32>) -> Result<()> {
        self.run(
            Op::Kill {
                id,
                signal,
                all,
                pid,
                pgid: None,
            },
            None,
        )
        .map(drop)
    }

    /// Signals process group `pgid` of the sandbox (see [`Features::kill_has_pgid`]).
    pub fn kill_group(&self, id: &str, signal: u32, pgid: i32) -> Result<()> {
        self.run(
            Op::Kill {
                id,
                signal,
                all: false,
                pid: None,
                pgid: Some(pgid),
            },
            None,
        )
        .map(drop)
    }

    /// `runsc ps`'s table of the container's processes (see [`crate::terminal`]).
    pub fn ps_table(&self, id: &str) -> Result<String> {
        let out = self.run(Op::Ps { id, table: true }, None)?;
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    pub fn delete(&self, id: &str, force: bool) -> Result<()> {
        self.run(Op::Delete { id, force }, None).map(drop)
    }

    /// New resource limits (an OCI `LinuxResources` JSON file); only runsc releases that
    /// have the `update` command.
    pub fn update(&self, id: &str, resources: &Path) -> Result<()> {
        self.run(Op::Update { id, resources }, None).map(drop)
    }

    pub fn pause(&self, id: &str) -> Result<()> {
        self.run(Op::Pause { id }, None).map(drop)
    }

    pub fn resume(&self, id: &str) -> Result<()> {
        self.run(Op::Resume { id }, None).map(drop)
    }

    /// Pids of the sandbox's processes, in its root pid namespace.
    pub fn ps(&self, id: &str) -> Result<Vec<i32>> {
        let out = self.run(Op::Ps { id, table: false }, None)?;
        let text = String::from_utf8_lossy(&out);
        let text = text.trim();
        if text.is_empty() || text == "null" {
            return Ok(Vec::new());
        }
        serde_json::from_str(text).map_err(|e| Error::parse("runsc ps output", e))
    }

    pub fn stats(&self, id: &str) -> Result<StatsEvent> {
        let out = self.run(Op::Stats { id }, None)?;
        crate::stats::parse(&out)
    }

    /// Starts a foreground `runsc exec`; it returns once runsc is spawned, not when the process
    /// inside has started: poll `internal_pid_file` for that. A process that asks for a
    /// terminal gets runsc's own: pass [`ProcessStdio::terminal`] (runsc honours a console
    /// socket only for detached execs).
    pub fn exec(
        &self,
        id: &str,
        process_spec: &Path,
        internal_pid_file: &Path,
        stdio: ProcessStdio,
    ) -> Result<ExecChild> {
        let op = Op::Exec {
            id,
            process_spec,
            internal_pid_file,
            console_socket: None,
        };
        let log_file = self.log_file(&op);
        let mut cmd = self.command(&op, &log_file);
        stdio.apply(&mut cmd);
        log::debug!("runsc {:?}", cmd.get_args().collect::<Vec<_>>());
        let child = self.spawn(&mut cmd)?;
        Ok(ExecChild {
            child: Some(child),
            log_file,
        })
    }
}

/// A close-on-exec pipe: (read end, write end).
fn pipe() -> std::io::Result<(std::os::fd::OwnedFd, std::os::fd::OwnedFd)> {
    use std::os::fd::FromRawFd;
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two new descriptors into `fds`, which we then own.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just created and are owned by nothing else.
    Ok(unsafe {
        (
            std::os::fd::OwnedFd::from_raw_fd(fds[0]),
            std::os::fd::OwnedFd::from_raw_fd(fds[1]),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_runsc(dir: &Path, script: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join("runsc");
        std::fs::write(&path, format!("#!/bin/sh\n{script}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    /// Spawns like [`StdSpawner`], again for a moment while the fake is "busy": another
    /// test's fork can still hold the fake's write end open until that child execs.
    struct FakeSpawner;

    impl Spawner for FakeSpawner {
        fn watch(
            &self,
            pid: i32,
            not_before: std::time::Instant,
        ) -> std::sync::mpsc::Receiver<i32> {
            StdSpawner.watch(pid, not_before)
        }

        fn spawn(&self, cmd: &mut Command) -> std::io::Result<Box<dyn Child>> {
            let mut tries = 0;
            loop {
                match StdSpawner.spawn(cmd) {
                    Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && tries < 50 => {
                        tries += 1;
                        std::thread::sleep(std::time::Duration::from_millis(10));
                    }
                    other => return other,
                }
            }
        }
    }

    fn runsc(dir: &Path, script: &str) -> Runsc {
        Runsc::new(
            fake_runsc(dir, script),
            GlobalArgs {
                root: dir.join("root"),
                flags: vec![],
            },
            dir,
            Arc::new(FakeSpawner),
        )
    }

    #[test]
    fn failure_carries_runsc_reason_and_removes_log() {
        let dir = tempfile::tempdir().unwrap();
        // The fake writes a JSON error into the file after --log, as runsc does.
        let r = runsc(
            dir.path(),
            r#"echo '{"msg":"container \"c1\" does not exist","level":"error"}' > "$4"; exit 128"#,
        );
        let err = r.start("c1").unwrap_err().to_string();
        assert!(
            err.contains("runsc start c1") && err.contains("128"),
            "{err}"
        );
        assert!(err.contains("does not exist"), "{err}");
        let leftovers: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".log"))
            .collect();
        assert!(leftovers.is_empty());
    }

    #[test]
    fn parses_ps_and_state_output() {
        let dir = tempfile::tempdir().unwrap();
        let r = runsc(dir.path(), "echo '[1,4]'");
        assert_eq!(r.ps("c").unwrap(), vec![1, 4]);
        let r = runsc(
            dir.path(),
            r#"echo '{"ociVersion":"1.0.2","id":"c","status":"running","pid":42,"bundle":"/b"}'"#,
        );
        let s = r.state("c").unwrap();
        assert_eq!((s.status.as_str(), s.pid), ("running", 42));
    }

    #[test]
    fn broken_binary_is_named_with_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let r = runsc(dir.path(), "echo not really runsc; exit 3");
        let err = r.features().unwrap_err().to_string();
        assert!(
            err.contains("does not work")
                && err.contains("status 3")
                && err.contains("binary_name"),
            "{err}"
        );
    }

    #[test]
    fn missing_binary_says_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let r = Runsc::new(
            "/nonexistent/runsc",
            GlobalArgs {
                root: dir.path().into(),
                flags: vec![],
            },
            dir.path(),
            Arc::new(StdSpawner),
        );
        let err = r.start("c").unwrap_err().to_string();
        assert!(
            err.contains("/nonexistent/runsc") && err.contains("binary_name"),
            "{err}"
        );
    }
}
