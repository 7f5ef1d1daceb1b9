//! How child processes are started and waited for. The shim is a child subreaper whose SIGCHLD
//! handler reaps every child, so `std::process::Child::wait` is not reliable there: the shim
//! injects a [`Spawner`] that takes exit statuses from its reaper. [`StdSpawner`] is for
//! programs without such a reaper (command-line tools, tests).

use std::{
    io,
    process::{ChildStdout, Command},
    sync::mpsc::{channel, Receiver},
};

/// A started child process whose exit status can be collected once.
pub trait Child: Send {
    fn pid(&self) -> u32;
    /// Its piped stdout, if the command asked for one.
    fn take_stdout(&mut self) -> Option<ChildStdout>;
    /// Non-blocking: `Some(status)` once it has exited.
    fn try_wait(&mut self) -> io::Result<Option<i32>>;
    /// Blocks until it exits. The status is the exit code, or 128+signal.
    fn wait(self: Box<Self>) -> io::Result<i32>;
}

pub trait Spawner: Send + Sync {
    fn spawn(&self, cmd: &mut Command) -> io::Result<Box<dyn Child>>;
    /// The exit status of process `pid` (a sandbox runsc left to this process, which reaps
    /// it), once it exits; an exit from before `not_before` belongs to an earlier process.
    fn watch(&self, pid: i32, not_before: std::time::Instant) -> Receiver<i32>;
}

/// Spawns with the standard library and waits with `waitpid` on the child itself.
#[derive(Debug, Default, Clone, Copy)]
pub struct StdSpawner;

struct StdChild(std::process::Child);

/// The shell's convention: a child killed by signal N reads as 128+N.
pub fn status_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(255)
}

impl Child for StdChild {
    fn pid(&self) -> u32 {
        self.0.id()
    }
    fn take_stdout(&mut self) -> Option<ChildStdout> {
        self.0.stdout.take()
    }
    fn try_wait(&mut self) -> io::Result<Option<i32>> {
        Ok(self.0.try_wait()?.map(status_code))
    }
    fn wait(mut self: Box<Self>) -> io::Result<i32> {
        Ok(status_code(self.0.wait()?))
    }
}

impl Spawner for StdSpawner {
    fn spawn(&self, cmd: &mut Command) -> io::Result<Box<dyn Child>> {
        Ok(Box::new(StdChild(cmd.spawn()?)))
    }

    /// Waits with `waitpid`: `pid` must be a child of this process (or one it reaps as a
    /// subreaper) that nothing else waits for.
    fn watch(&self, pid: i32, _not_before: std::time::Instant) -> Receiver<i32> {
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            let mut status = 0;
            // SAFETY: waitpid on a pid, writing into a local.
            if unsafe { libc::waitpid(pid, &mut status, 0) } == pid {
                let code = if libc::WIFEXITED(status) {
                    libc::WEXITSTATUS(status)
                } else {
                    128 + libc::WTERMSIG(status)
                };
                let _ = tx.send(code);
            }
        });
        rx
    }
}
