//! A process's stdio as containerd describes it (fifo paths or `file://` URIs), opened for
//! runsc to hand straight to the sandbox. Without a TTY nothing is copied: the sandbox writes to
//! containerd's fifos itself, so nothing can be lost at exit. With a TTY the shim receives the
//! pty master from runsc over a console socket and copies between it and the fifos.

use std::{
    fs::{File, OpenOptions},
    io,
    io::{Read, Write},
    os::{
        fd::AsRawFd,
        unix::{fs::OpenOptionsExt, net::UnixListener},
    },
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use chalk_runtime::{
    runsc::ProcessStdio,
    terminal::{signals_in, TerminalState},
};

use crate::logger::{self, LogContext, LoggerSpec};
use nix::{
    fcntl::OFlag,
    sys::socket::{recvmsg, ControlMessageOwned, MsgFlags},
};

/// The stdio of one process, as given in Create or Exec.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StdioPaths {
    pub stdin: String,
    pub stdout: String,
    pub stderr: String,
    pub terminal: bool,
}

/// Where one output stream goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    None,
    Fifo(PathBuf),
    File(PathBuf),
    Binary(LoggerSpec),
}

pub fn parse_target(uri: &str) -> io::Result<Target> {
    if uri.is_empty() {
        return Ok(Target::None);
    }
    if let Some(path) = uri.strip_prefix("file://") {
        return absolute(path).map(Target::File);
    }
    if let Some(path) = uri.strip_prefix("fifo://") {
        return absolute(path).map(Target::Fifo);
    }
    if uri.starts_with("binary://") {
        return logger::parse(uri).map(Target::Binary);
    }
    if let Some((scheme, _)) = uri.split_once("://") {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("stdio uri scheme {scheme:?} is not supported (use a fifo path, file:// or binary://)"),
        ));
    }
    absolute(uri).map(Target::Fifo)
}

fn absolute(path: &str) -> io::Result<PathBuf> {
    let p = PathBuf::from(path);
    if !p.is_absolute() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("stdio path {path:?} is not absolute"),
        ));
    }
    Ok(p)
}

/// A process's opened stdout and stderr.
#[derive(Default)]
struct Outputs {
    stdout: Option<File>,
    stderr: Option<File>,
    /// A read end of each output fifo, held while the process lives: as with the runc shim,
    /// a client that goes away (`ctr run -d`) leaves output to fill the fifo rather than
    /// fail with EPIPE, which would kill the sandbox's own runsc (a Go program) by SIGPIPE.
    fifo_readers: Vec<File>,
}

/// Opens a process's stdout and stderr: fifos or files each, or both on one logging binary.
fn open_outputs(paths: &StdioPaths, ctx: &LogContext) -> io::Result<Outputs> {
    let mut out = Outputs::default();
    match parse_target(&paths.stdout)? {
        Target::Binary(spec) => {
            let (stdout, stderr) = logger::start(&spec, ctx)?;
            out.stdout = Some(stdout);
            out.stderr = Some(stderr);
        }
        stdout => {
            out.stdout = open_output(&stdout, &mut out.fifo_readers)?;
            out.stderr = open_output(&parse_target(&paths.stderr)?, &mut out.fifo_readers)?;
        }
    }
    Ok(out)
}

/// Opens an output stream for writing without blocking on containerd's reader.
fn open_output(target: &Target, fifo_readers: &mut Vec<File>) -> io::Result<Option<File>> {
    match target {
        Target::None => Ok(None),
        Target::Binary(spec) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "stderr alone cannot go to logging binary {}",
                spec.path.display()
            ),
        )),
        Target::File(path) => {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            OpenOptions::new()
                .append(true)
                .create(true)
                .mode(0o640)
                .open(path)
                .map(Some)
        }
        Target::Fifo(path) => {
            // A read end first, so that opening the write end never blocks.
            let reader = OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(path)?;
            let writer = OpenOptions::new().write(true).open(path)?;
            fifo_readers.push(reader);
            Ok(Some(writer))
        }
    }
}

/// Sets a terminal's window size (on either end of a pty).
pub fn set_size(tty: &impl AsRawFd, width: u32, height: u32) -> io::Result<()> {
    let size = libc::winsize {
        ws_row: height.min(u16::MAX as u32) as u16,
        ws_col: width.min(u16::MAX as u32) as u16,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads a winsize struct that outlives the call.
    if unsafe { libc::ioctl(tty.as_raw_fd(), libc::TIOCSWINSZ, &size) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A new pseudo-terminal `(master, slave)`, both close-on-exec from the start, so neither can
/// leak into a runsc started concurrently (a leaked slave would keep the master from EOF).
pub fn open_pty() -> io::Result<(File, File)> {
    use nix::pty::{grantpt, posix_openpt, ptsname_r, unlockpt};
    let master = posix_openpt(OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_CLOEXEC)?;
    grantpt(&master)?;
    unlockpt(&master)?;
    let name = ptsname_r(&master)?;
    let slave = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY)
        .open(name)?;
    // SAFETY: the fd is owned by `master` and handed over to the File.
    let master = unsafe {
        <File as std::os::fd::FromRawFd>::from_raw_fd(std::os::fd::IntoRawFd::into_raw_fd(master))
    };
    Ok((master, slave))
}

/// The `(width, height)` a process spec asks its terminal to start with (`consoleSize`), so the
/// process sees the right size from its first instruction, before any ResizePty arrives.
pub fn console_size(process: &serde_json::Value) -> Option<(u32, u32)> {
    let size = process.get("consoleSize")?;
    let width = size.get("width")?.as_u64()? as u32;
    let height = size.get("height")?.as_u64()? as u32;
    (width > 0 && height > 0).then_some((width, height))
}

/// Called with each signal that typing into a restored sandbox's terminal raises (runsc
/// delivers none there: see `chalk_runtime::terminal`).
pub type TerminalSignals = Arc<dyn Fn(i32) + Send + Sync>;

/// Where a terminal's stdin copier finds its [`TerminalSignals`]: set once the sandbox has
/// been restored (a copier outlives an in-place restore).
type SignalSlot = Arc<Mutex<Option<TerminalSignals>>>;

/// Where stdin bytes go: the process's stdin pipe or a pty master. CloseIO empties it.
type StdinSink = Arc<Mutex<Option<File>>>;

/// Copies containerd's stdin fifo into `sink` on a thread of its own. The fifo is opened in
/// blocking mode, which waits for containerd's writer, so the process sees EOF exactly when
/// containerd closes its end (or when CloseIO empties the sink), never before it connects.
/// With `signals`, the sink is a terminal: keys that raise a signal under its settings of
/// the moment are reported (after they are written, as a terminal echoes them first).
fn spawn_stdin_copier(uri: &str, sink: StdinSink, signals: Option<SignalSlot>) -> io::Result<()> {
    let source = match parse_target(uri)? {
        Target::None => return Ok(()),
        Target::Fifo(path) | Target::File(path) => path,
        Target::Binary(_) => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "stdin cannot come from a logging binary",
            ))
        }
    };
    std::thread::Builder::new()
        .name("stdin".into())
        .spawn(move || {
            if let Ok(mut fifo) = File::open(&source) {
                let mut buf = [0u8; 32 * 1024];
                loop {
                    let n = match fifo.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    // Write through a duplicate, outside the lock: a process that does not read
                    // its stdin must not make CloseIO (which takes the lock) wait.
                    let out = match sink.lock().unwrap().as_ref().map(File::try_clone) {
                        Some(Ok(out)) => out,
                        _ => break,
                    };
                    let report = signals.as_ref().and_then(|s| s.lock().unwrap().clone());
                    let raised = match (&report, TerminalState::read(&out)) {
                        (Some(_), Ok(t)) => signals_in(&buf[..n], t.lflag, &t.cc),
                        _ => Vec::new(),
                    };
                    if (&out).write_all(&buf[..n]).is_err() {
                        break;
                    }
                    if let Some(report) = report {
                        raised.into_iter().for_each(|sig| report(sig));
                    }
                }
            }
            sink.lock().unwrap().take();
        })?;
    Ok(())
}

/// What the shim holds for a running process's stdio.
#[derive(Default)]
pub struct ProcessIo {
    stdin: Option<StdinSink>,
    console: Option<File>,
    signals: SignalSlot,
    /// See [`Outputs::fifo_readers`]: only held, never read.
    _fifo_readers: Vec<File>,
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
}

/// Writers on the output fifos of `paths`, held while a sandbox is replaced by its restore
/// (a snapshot on a runsc that cannot resume in place): the old sandbox's (or its terminal
/// copier's) writers close before the new one's open, and a reader that sees no writer
/// reads end-of-file and stops (`ctr run` would lose the rest of the output).
pub fn hold_outputs(paths: &StdioPaths) -> Vec<File> {
    let mut held = Vec::new();
    for uri in [&paths.stdout, &paths.stderr] {
        if let Ok(target @ Target::Fifo(_)) = parse_target(uri) {
            let mut readers = Vec::new();
            if let Ok(Some(w)) = open_output(&target, &mut readers) {
                held.push(w);
            }
        }
    }
    held
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
        fifo_readers,
    } = open_outputs(paths, ctx)?;
    let mut pio = ProcessIo {
        _fifo_readers: fifo_readers,
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

/// Starts copying between a received pty master and the process's fifos; with `signals`,
/// terminal keys are reported as [`spawn_stdin_copier`] says.
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
        stdout,
        fifo_readers,
        ..
    } = open_outputs(&stdout_only, ctx)?;
    pio._fifo_readers = fifo_readers;
    let mut from_master = master.try_clone()?;
    // Ends with EIO once every slave end is closed; dropping `out` then gives containerd EOF.
    // Without a stdout (a sandbox resumed or forked with no client attached) the output is
    // read and dropped, so that the sandbox never blocks on a full terminal.
    std::thread::Builder::new()
        .name("tty-out".into())
        .spawn(move || match stdout {
            Some(mut out) => {
                let _ = std::io::copy(&mut from_master, &mut out);
            }
            None => {
                let _ = std::io::copy(&mut from_master, &mut std::io::sink());
            }
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

/// Like [`open_plain`] with a previous process, for a process with a terminal: the new pty
/// master takes over containerd's stdin, with the previous terminal's size and settings.
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
    use super::*;

    #[test]
    fn close_io_does_not_wait_for_a_process_that_never_reads() {
        let dir = tempfile::tempdir().unwrap();
        let i = dir.path().join("in");
        nix::unistd::mkfifo(&i, nix::sys::stat::Mode::from_bits(0o600).unwrap()).unwrap();
        let paths = StdioPaths {
            stdin: i.display().to_string(),
            ..Default::default()
        };
        let (stdio, mut pio) = open_plain(&paths, &LogContext::default(), None).unwrap();
        let writer_path = i.clone();
        std::thread::spawn(move || {
            let mut w = OpenOptions::new().write(true).open(writer_path).unwrap();
            let _ = w.write_all(&vec![b'x'; 1 << 20]); // far more than pipe buffers hold
        });
        std::thread::sleep(std::time::Duration::from_millis(300));
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            pio.close_stdin();
            done_tx.send(()).unwrap();
        });
        assert!(
            done_rx
                .recv_timeout(std::time::Duration::from_secs(2))
                .is_ok(),
            "CloseIO blocked behind a stdin write"
        );
        drop(stdio);
    }

    #[test]
    fn a_restored_process_takes_over_stdin_and_output_fifos_keep_a_reader() {
        use std::io::Read;
        let dir = tempfile::tempdir().unwrap();
        let (i, o) = (dir.path().join("in"), dir.path().join("out"));
        for f in [&i, &o] {
            nix::unistd::mkfifo(f, nix::sys::stat::Mode::from_bits(0o600).unwrap()).unwrap();
        }
        let paths = StdioPaths {
            stdin: i.display().to_string(),
            stdout: o.display().to_string(),
            ..Default::default()
        };
        let (first, old) = open_plain(&paths, &LogContext::default(), None).unwrap();
        // Nobody reads the output fifo, yet writing to it does not fail (EPIPE): the shim
        // holds a read end.
        let mut out = first.stdout.as_ref().unwrap();
        out.write_all(b"x").unwrap();
        let (second, new) = open_plain(&paths, &LogContext::default(), Some(&old)).unwrap();
        drop(first);
        let mut w = OpenOptions::new().write(true).open(&i).unwrap();
        w.write_all(b"hello").unwrap();
        drop(w);
        let mut got = Vec::new();
        second.stdin.unwrap().read_to_end(&mut got).unwrap();
        assert_eq!(
            got, b"hello",
            "containerd's stdin reaches the restored process"
        );
        // A closed stdin stays closed for a later restore.
        let mut closed = new;
        closed.close_stdin();
        let (third, _) = open_plain(&paths, &LogContext::default(), Some(&closed)).unwrap();
        assert!(third.stdin.is_none());
    }

    #[test]
    fn pty_ends_are_close_on_exec_and_connected() {
        use nix::fcntl::{fcntl, FcntlArg, FdFlag};
        let (master, slave) = open_pty().unwrap();
        for f in [&master, &slave] {
            let flags = FdFlag::from_bits_truncate(fcntl(f, FcntlArg::F_GETFD).unwrap());
            assert!(flags.contains(FdFlag::FD_CLOEXEC));
        }
        set_size(&master, 80, 24).unwrap();
        let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
        assert_eq!(
            unsafe { libc::ioctl(slave.as_raw_fd(), libc::TIOCGWINSZ, &mut ws) },
            0
        );
        assert_eq!((ws.ws_col, ws.ws_row), (80, 24));
    }

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

    #[test]
    fn held_outputs_keep_a_fifo_reader_from_end_of_file() {
        use std::io::Read;
        let dir = tempfile::tempdir().unwrap();
        let o = dir.path().join("out");
        nix::unistd::mkfifo(&o, nix::sys::stat::Mode::from_bits(0o600).unwrap()).unwrap();
        let mut reader = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&o)
            .unwrap();
        let paths = StdioPaths {
            stdout: o.display().to_string(),
            ..Default::default()
        };
        let first = OpenOptions::new().write(true).open(&o).unwrap();
        let held = hold_outputs(&paths);
        assert_eq!(held.len(), 1);
        drop(first); // the old sandbox goes
        let mut buf = [0u8; 8];
        // With a writer held, an empty fifo reads "would block", not end-of-file.
        assert_eq!(
            reader.read(&mut buf).unwrap_err().kind(),
            std::io::ErrorKind::WouldBlock
        );
        drop(held);
        assert_eq!(
            reader.read(&mut buf).unwrap(),
            0,
            "end-of-file once nothing holds it"
        );
    }

    #[test]
    fn reads_console_size_from_a_process_spec() {
        let p = serde_json::json!({"terminal": true, "consoleSize": {"height": 45, "width": 123}});
        assert_eq!(console_size(&p), Some((123, 45)));
        assert_eq!(console_size(&serde_json::json!({"terminal": true})), None);
        let zero = serde_json::json!({"consoleSize": {"height": 0, "width": 0}});
        assert_eq!(console_size(&zero), None);
    }

    #[test]
    fn parses_stdio_targets() {
        assert_eq!(parse_target("").unwrap(), Target::None);
        assert_eq!(
            parse_target("/run/x/stdout").unwrap(),
            Target::Fifo("/run/x/stdout".into())
        );
        assert_eq!(
            parse_target("fifo:///run/x/out").unwrap(),
            Target::Fifo("/run/x/out".into())
        );
        assert_eq!(
            parse_target("file:///var/log/c.log").unwrap(),
            Target::File("/var/log/c.log".into())
        );
        assert!(parse_target("relative/fifo").is_err());
        assert!(parse_target("ftp://host/x").is_err());
    }

    #[test]
    fn stdin_ends_with_containerds_writer_or_close_io_and_output_opens_without_reader() {
        let dir = tempfile::tempdir().unwrap();
        let (i, o) = (dir.path().join("in"), dir.path().join("out"));
        for p in [&i, &o] {
            nix::unistd::mkfifo(p, nix::sys::stat::Mode::from_bits(0o600).unwrap()).unwrap();
        }
        let paths = StdioPaths {
            stdin: i.display().to_string(),
            stdout: o.display().to_string(),
            ..Default::default()
        };
        // Opening must not block although nobody reads `out` or writes `in` yet.
        let (stdio, _pio) = open_plain(&paths, &LogContext::default(), None).unwrap();
        let mut containerd_reader = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&o)
            .unwrap();
        stdio.stdout.unwrap().write_all(b"hi").unwrap();
        let mut got = [0u8; 2];
        containerd_reader.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"hi");

        let mut process_stdin = stdio.stdin.unwrap();
        let mut containerd_writer = OpenOptions::new().write(true).open(&i).unwrap();
        containerd_writer.write_all(b"x").unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(process_stdin.read(&mut buf).unwrap(), 1);
        drop(containerd_writer);
        assert_eq!(
            process_stdin.read(&mut buf).unwrap(),
            0,
            "EOF once containerd closes"
        );

        // CloseIO ends stdin even while containerd keeps its end open.
        let (stdio, mut pio) = open_plain(&paths, &LogContext::default(), None).unwrap();
        let _writer = OpenOptions::new().write(true).open(&i).unwrap();
        pio.close_stdin();
        let mut process_stdin = stdio.stdin.unwrap();
        assert_eq!(
            process_stdin.read(&mut buf).unwrap(),
            0,
            "EOF after CloseIO"
        );
    }
}
