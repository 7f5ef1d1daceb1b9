//! A process's stdio as containerd describes it (fifo paths or `file://` URIs), opened for
//! runsc to hand straight to the sandbox. Without a TTY nothing is copied: the sandbox writes to
//! containerd's fifos itself, so nothing can be lost at exit. With a TTY the shim receives the
//! pty master from runsc over a console socket and copies between it and the fifos. Either
//! way the shim holds ends of the output fifos until the process has exited and containerd's
//! client has opened its own (see `release`).

mod console;
mod outputs;
mod pty;
mod release;
mod stdin;
mod targets;

use std::{
    fs::File,
    io,
    sync::{Arc, Mutex},
};

use chalk_runtime::{runsc::ProcessStdio, terminal::TerminalState};
use nix::fcntl::OFlag;

pub use console::{attach_console, reattach_console, ConsoleSocket};
pub use outputs::hold_outputs;
pub use pty::{console_size, open_pty, set_size};
pub use stdin::TerminalSignals;

use crate::logger::LogContext;
use outputs::{open_outputs, Outputs};
pub use release::Drain;
use release::HeldOutputs;
use stdin::{spawn_stdin_copier, SignalSlot, StdinSink};

/// The stdio of one process, as given in Create or Exec.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StdioPaths {
    pub stdin: String,
    pub stdout: String,
    pub stderr: String,
    pub terminal: bool,
}

/// What the shim holds for a running process's stdio.
#[derive(Default)]
pub struct ProcessIo {
    stdin: Option<StdinSink>,
    console: Option<File>,
    signals: SignalSlot,
    /// Ends of the output fifos: only held, never read or written, until
    /// [`ProcessIo::release_outputs`].
    outputs: HeldOutputs,
    /// Held from the exit until this is dropped (the process deleted): the release of the
    /// output fifos waits for a late client until then.
    deleted: Option<std::sync::mpsc::Sender<()>>,
}

impl ProcessIo {
    /// Ends the process's stdin (CloseIO).
    pub fn close_stdin(&mut self) {
        if let Some(sink) = self.stdin.take() {
            sink.lock().unwrap().take();
        }
    }

    /// Resizes the TTY, if the process has one.
    pub fn resize(&self, width: u32, height: u32) -> io::Result<()> {
        let console = self.console.as_ref().ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, "the process has no terminal")
        })?;
        set_size(console, width, height)
    }

    pub fn has_terminal(&self) -> bool {
        self.console.is_some()
    }

    /// The terminal's size and line settings, if the process has one.
    pub fn terminal_state(&self) -> Option<TerminalState> {
        self.console
            .as_ref()
            .and_then(|c| TerminalState::read(c).ok())
    }

    /// The process has exited: the shim lets go of its readers on the output fifos and returns
    /// what a client still has to read in them, to wait on ([`ProcessIo::wait_drained`]),
    /// with no lock held, before the exit is reported. See `release`.
    pub fn start_drain(&mut self) -> Option<Drain> {
        self.outputs.start_drain()
    }

    /// Waits, within bounds, for the clients of `drain` to read what is left in the fifos.
    pub fn wait_drained(drain: Drain) {
        drain.wait(release::DRAIN_STALL, release::DRAIN_CAP);
    }

    /// The process has exited: the shim lets go of its output fifos once containerd's client
    /// has opened its ends (or has not within a few seconds), so that the client reads all of
    /// the output, then end-of-file. Returns at once; the rest goes on in the background.
    /// Never for a process a restore replaces: its successor takes the fifos over as they are.
    pub fn release_outputs(&mut self) {
        let (deleted, watch) = std::sync::mpsc::channel();
        // Dropped with this ProcessIo, at the process's delete: a client not come by then
        // never will.
        self.deleted = Some(deleted);
        std::mem::take(&mut self.outputs).release(release::TIMEOUT, watch);
    }
}

/// Opens stdio for a process without a terminal. Output files go straight to runsc; stdin
/// goes through a pipe fed by the shim, so that its end is under the shim's control.
///
/// With `previous`, the process is a sandbox restored in place of the one `previous` served
/// (a checkpoint that leaves the source running on a runsc that cannot resume in place):
/// containerd's stdin, still read by the copier `previous` started, now feeds the new process;
/// a stdin already closed stays closed.
pub fn open_plain(
    paths: &StdioPaths,
    ctx: &LogContext,
    previous: Option<&ProcessIo>,
) -> io::Result<(ProcessStdio, ProcessIo)> {
    let Outputs {
        stdout,
        stderr,
        held,
    } = open_outputs(paths, ctx)?;
    let mut pio = ProcessIo {
        outputs: held,
        ..ProcessIo::default()
    };
    let stdin = match previous {
        None if paths.stdin.is_empty() => None,
        None => {
            let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
            let sink: StdinSink = Arc::new(Mutex::new(Some(File::from(write))));
            spawn_stdin_copier(&paths.stdin, sink.clone(), None)?;
            pio.stdin = Some(sink);
            Some(File::from(read))
        }
        Some(previous) => match &previous.stdin {
            Some(sink) if sink.lock().unwrap().is_some() => {
                let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
                *sink.lock().unwrap() = Some(File::from(write));
                pio.stdin = Some(sink.clone());
                Some(File::from(read))
            }
            _ => None,
        },
    };
    Ok((
        ProcessStdio {
            stdin,
            stdout,
            stderr,
            terminal: false,
        },
        pio,
    ))
}

#[cfg(test)]
mod tests;
