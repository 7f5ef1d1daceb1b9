//! A process with a terminal: the console socket on which runsc sends the pty master, and
//! the copying between that master and containerd's fifos (attached, or taken over from the
//! sandbox a restore replaces).

use std::{
    fs::File,
    io,
    os::{fd::AsRawFd, unix::net::UnixListener},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};

use super::{
    outputs::{open_outputs, Outputs},
    release::Copied,
    stdin::{spawn_stdin_copier, StdinSink, TerminalSignals},
    ProcessIo, StdioPaths,
};
use crate::logger::LogContext;

/// Starts copying between a received pty master and the process's fifos; with `signals`,
/// terminal keys are reported as the stdin copier says.
pub fn attach_console(
    paths: &StdioPaths,
    master: File,
    ctx: &LogContext,
    signals: Option<TerminalSignals>,
) -> io::Result<ProcessIo> {
    let mut pio = ProcessIo {
        signals: Arc::new(Mutex::new(signals)),
        ..ProcessIo::default()
    };
    if !paths.stdin.is_empty() {
        let sink: StdinSink = Arc::new(Mutex::new(Some(master.try_clone()?)));
        spawn_stdin_copier(&paths.stdin, sink.clone(), Some(pio.signals.clone()))?;
        pio.stdin = Some(sink);
    }
    // A terminal merges stderr into stdout: containerd's cio names a stderr fifo but never
    // creates it, so only stdout is opened.
    let stdout_only = StdioPaths {
        stderr: String::new(),
        ..paths.clone()
    };
    let Outputs {
        stdout, mut held, ..
    } = open_outputs(&stdout_only, ctx)?;
    // The copier writes the fifo: the shim lets go of its own ends after it (see `release`).
    let copied = Copied::default();
    let written = copied.done_on_drop();
    held.copied_by(copied);
    pio.outputs = held;
    let mut from_master = master.try_clone()?;
    // Ends with EIO once every slave end is closed; dropping `out` then gives containerd EOF
    // (once the shim, too, has let go of the fifo).
    // Without a stdout (a sandbox resumed or forked with no client attached) the output is
    // read and dropped, so that the sandbox never blocks on a full terminal.
    std::thread::Builder::new()
        .name("tty-out".into())
        .spawn(move || {
            match stdout {
                Some(mut out) => {
                    let _ = std::io::copy(&mut from_master, &mut out);
                }
                None => {
                    let _ = std::io::copy(&mut from_master, &mut std::io::sink());
                }
            }
            drop(written);
        })?;
    pio.console = Some(master);
    Ok(pio)
}

/// A unix socket on which runsc sends the pty master of a process with a terminal.
pub struct ConsoleSocket {
    _dir: tempfile::TempDir,
    path: PathBuf,
    listener: UnixListener,
}

impl ConsoleSocket {
    pub fn new() -> io::Result<Self> {
        // Short, private path: sun_path is limited to 108 bytes and the bundle path may be long.
        let dir = tempfile::Builder::new().prefix("chalk-pty-").tempdir()?;
        let path = dir.path().join("s");
        let listener = UnixListener::bind(&path)?;
        listener.set_nonblocking(true)?;
        Ok(ConsoleSocket {
            _dir: dir,
            path,
            listener,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Receives the master fd, waiting up to `timeout`.
    pub fn receive(&self, timeout: Duration) -> io::Result<File> {
        let deadline = Instant::now() + timeout;
        let stream = loop {
            match self.listener.accept() {
                Ok((stream, _)) => break stream,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if Instant::now() > deadline {
                        return Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            "runsc did not send the terminal's master end",
                        ));
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => return Err(e),
            }
        };
        stream.set_nonblocking(false)?;
        let mut buf = [0u8; 4096];
        let mut iov = [std::io::IoSliceMut::new(&mut buf)];
        let mut space = nix::cmsg_space!([std::os::fd::RawFd; 1]);
        let msg = recvmsg::<()>(
            stream.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            // CLOEXEC: the master must not leak into runsc processes started later.
            MsgFlags::MSG_CMSG_CLOEXEC,
        )?;
        for cmsg in msg.cmsgs()? {
            if let ControlMessageOwned::ScmRights(fds) = cmsg {
                if let Some(&fd) = fds.first() {
                    // SAFETY: the fd was just received and is owned by nobody else.
                    return Ok(unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) });
                }
            }
        }
        Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "console socket message carried no file descriptor",
        ))
    }
}

/// Like [`super::open_plain`] with a previous process, for a process with a terminal: the new
/// pty master takes over containerd's stdin, with the previous terminal's size and settings.
pub fn reattach_console(
    paths: &StdioPaths,
    master: File,
    ctx: &LogContext,
    previous: &ProcessIo,
    signals: Option<TerminalSignals>,
) -> io::Result<ProcessIo> {
    if let Some(state) = previous.terminal_state() {
        // The sandbox runs already: a terminal without its settings beats none.
        if let Err(e) = state.apply(&master) {
            log::warn!("terminal settings not carried over: {e}");
        }
    }
    let without_stdin = StdioPaths {
        stdin: String::new(),
        ..paths.clone()
    };
    let mut pio = attach_console(&without_stdin, master, ctx, None)?;
    if let (Some(sink), Some(console)) = (&previous.stdin, &pio.console) {
        let mut inner = sink.lock().unwrap();
        if inner.is_some() {
            *inner = Some(console.try_clone()?);
            drop(inner);
            pio.stdin = Some(sink.clone());
        }
    }
    // The previous terminal's copier keeps feeding the sink: it now reports keys too.
    *previous.signals.lock().unwrap() = signals;
    pio.signals = previous.signals.clone();
    Ok(pio)
}

#[cfg(test)]
mod tests {
    use std::{
        fs::OpenOptions,
        io::{Read, Write},
    };

    use chalk_runtime::terminal::TerminalState;

    use super::*;
    use crate::io::open_pty;

    #[test]
    fn a_restored_terminal_reports_the_signals_its_keys_raise() {
        let dir = tempfile::tempdir().unwrap();
        let i = dir.path().join("in");
        nix::unistd::mkfifo(&i, nix::sys::stat::Mode::from_bits(0o600).unwrap()).unwrap();
        let (master, slave) = open_pty().unwrap();
        let paths = StdioPaths {
            stdin: i.display().to_string(),
            terminal: true,
            ..Default::default()
        };
        let (tx, rx) = std::sync::mpsc::channel();
        let report: TerminalSignals = Arc::new(move |sig| {
            let _ = tx.send(sig);
        });
        let _pio = attach_console(&paths, master, &LogContext::default(), Some(report)).unwrap();
        let mut w = OpenOptions::new().write(true).open(&i).unwrap();
        // A new pty is in cooked mode, ISIG on: ^C raises SIGINT, plain keys nothing.
        w.write_all(b"ls\n").unwrap();
        w.write_all(b"\x03").unwrap();
        let got = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(got, libc::SIGINT);
        assert!(
            rx.recv_timeout(Duration::from_millis(200)).is_err(),
            "one signal only"
        );
        // In raw mode the program reads ^C itself.
        let mut raw = TerminalState::read(&slave).unwrap();
        raw.lflag &= !libc::ISIG;
        raw.apply(&slave).unwrap();
        w.write_all(b"\x03").unwrap();
        assert!(rx.recv_timeout(Duration::from_millis(300)).is_err());
    }

    /// A fifo for containerd's client to read the terminal's output from.
    fn out_fifo(dir: &Path) -> PathBuf {
        let o = dir.join("out");
        nix::unistd::mkfifo(&o, nix::sys::stat::Mode::from_bits(0o600).unwrap()).unwrap();
        o
    }

    /// A pty whose master the shim copies into fifo `o`: the process's end, and the shim's.
    fn attached(o: &Path) -> (File, ProcessIo) {
        let (master, slave) = open_pty().unwrap();
        let paths = StdioPaths {
            stdout: o.display().to_string(),
            terminal: true,
            ..Default::default()
        };
        let pio = attach_console(&paths, master, &LogContext::default(), None).unwrap();
        (slave, pio)
    }

    #[test]
    fn a_terminals_client_that_opens_after_the_exit_reads_all_the_output_then_end_of_file() {
        let dir = tempfile::tempdir().unwrap();
        let o = out_fifo(dir.path());
        let (mut slave, mut pio) = attached(&o);
        slave.write_all(b"bye").unwrap();
        drop(slave); // the process exits: the copier reads EIO and closes its writer
        pio.release_outputs();
        drop(pio); // Delete may well come before the client
        std::thread::sleep(Duration::from_millis(300));
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // As containerd's fifo package opens it: blocking, until there is a writer.
            let mut got = Vec::new();
            let read = File::open(&o).and_then(|mut f| f.read_to_end(&mut got));
            let _ = tx.send(read.map(|_| got));
        });
        let got = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the client's open or read hung")
            .unwrap();
        assert_eq!(got, b"bye");
    }

    #[test]
    fn a_terminals_exit_is_reported_only_once_its_last_line_is_copied_and_read() {
        // `ctr run --rm -t` on a loaded host (FLAKES.md row 21): the process's last line is
        // still in the pty, or in the fifo, when its exit is reported, and ctr's delete
        // closes its fifo before reading it.
        let dir = tempfile::tempdir().unwrap();
        let o = out_fifo(dir.path());
        let client = crate::io::tests::LaggingClient::open(&o);
        let (mut slave, mut pio) = attached(&o);
        let mut sent = Vec::new();
        for n in 0..2000 {
            let line = format!("line {n}\n");
            slave.write_all(line.as_bytes()).unwrap();
            sent.extend_from_slice(line.replace('\n', "\r\n").as_bytes());
        }
        // The process's side closes a moment after its exit is seen (runsc tearing down).
        let closer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            drop(slave);
        });
        let drain = pio.start_drain().expect("a terminal's output is drained");
        crate::io::ProcessIo::wait_drained(drain);
        pio.release_outputs(); // the exit is reported: ctr deletes, closing its fifo
        closer.join().unwrap();
        let got = client.cancel_and_wait();
        assert_eq!(got.len(), sent.len(), "output lost");
        assert_eq!(got, sent);
    }

    #[test]
    fn a_terminal_nobody_reads_delays_its_exit_only_by_the_stall_bound() {
        let dir = tempfile::tempdir().unwrap();
        let o = out_fifo(dir.path());
        let (mut slave, mut pio) = attached(&o);
        slave.write_all(b"unread\n").unwrap();
        drop(slave);
        let started = std::time::Instant::now();
        pio.start_drain()
            .unwrap()
            .wait(Duration::from_millis(200), Duration::from_secs(5));
        let took = started.elapsed();
        assert!(took < Duration::from_secs(2), "{took:?}");
    }
}
