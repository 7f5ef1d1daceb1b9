//! A process's stdio as containerd describes it (fifo paths or `file://` URIs), opened for
//! runsc to hand straight to the sandbox. Without a TTY nothing is copied: the sandbox writes to
//! containerd's fifos itself, so nothing can be lost at exit. With a TTY the shim receives the
//! pty master from runsc over a console socket and copies between it and the fifos.

use std::{
    fs::{File, OpenOptions},
    io,
    os::{
        fd::AsRawFd,
        unix::{fs::OpenOptionsExt, net::UnixListener},
    },
    path::{Path, PathBuf},
    thread::JoinHandle,
    time::{Duration, Instant},
};

use chalk_runtime::runsc::ProcessStdio;
use nix::{
    fcntl::{fcntl, FcntlArg, OFlag},
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
    if let Some((scheme, _)) = uri.split_once("://") {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("stdio uri scheme {scheme:?} is not supported (use a fifo path or file://)"),
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

fn clear_nonblock(f: &File) -> io::Result<()> {
    let flags = OFlag::from_bits_truncate(fcntl(f, FcntlArg::F_GETFL)?);
    fcntl(f, FcntlArg::F_SETFL(flags & !OFlag::O_NONBLOCK))?;
    Ok(())
}

/// Opens the read end of the stdin fifo without waiting for a writer, plus a write end the shim
/// keeps so the process sees no EOF before containerd's writer opens. CloseIO drops the keeper.
fn open_stdin(path: &Path) -> io::Result<(File, File)> {
    let reader = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let keeper = OpenOptions::new().write(true).open(path)?;
    clear_nonblock(&reader)?;
    Ok((reader, keeper))
}

/// Opens an output stream for writing without blocking on containerd's reader.
fn open_output(target: &Target) -> io::Result<Option<File>> {
    match target {
        Target::None => Ok(None),
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
            // Holding a read end for the moment of the open keeps O_WRONLY from blocking.
            let _hold = OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(path)?;
            let writer = OpenOptions::new().write(true).open(path)?;
            Ok(Some(writer))
        }
    }
}

fn open_stdin_target(uri: &str) -> io::Result<Option<(File, File)>> {
    match parse_target(uri)? {
        Target::None => Ok(None),
        Target::Fifo(path) => open_stdin(&path).map(Some),
        Target::File(path) => {
            // A file as stdin: no keeper needed, EOF is the file's end.
            let f = File::open(&path)?;
            let keeper = File::open("/dev/null")?;
            Ok(Some((f, keeper)))
        }
    }
}

/// What the shim holds for a running process's stdio.
#[derive(Default)]
pub struct ProcessIo {
    stdin_keeper: Option<File>,
    console: Option<File>,
    copiers: Vec<JoinHandle<()>>,
}

impl ProcessIo {
    /// Ends the process's stdin once containerd's own writer is closed.
    pub fn close_stdin(&mut self) {
        self.stdin_keeper = None;
    }

    /// Resizes the TTY, if the process has one.
    pub fn resize(&self, width: u32, height: u32) -> io::Result<()> {
        let console = self.console.as_ref().ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, "the process has no terminal")
        })?;
        let size = libc::winsize {
            ws_row: height as u16,
            ws_col: width as u16,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCSWINSZ reads a winsize struct that outlives the call.
        if unsafe { libc::ioctl(console.as_raw_fd(), libc::TIOCSWINSZ, &size) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Waits for the TTY copiers to drain; called when the process is gone.
    pub fn join_copiers(&mut self) {
        for handle in self.copiers.drain(..) {
            let _ = handle.join();
        }
    }
}

/// Opens stdio for a process without a terminal: the files go to runsc, the keeper stays here.
pub fn open_plain(paths: &StdioPaths) -> io::Result<(ProcessStdio, ProcessIo)> {
    let stdin = open_stdin_target(&paths.stdin)?;
    let stdout = open_output(&parse_target(&paths.stdout)?)?;
    let stderr = open_output(&parse_target(&paths.stderr)?)?;
    let (stdin, keeper) = match stdin {
        Some((reader, keeper)) => (Some(reader), Some(keeper)),
        None => (None, None),
    };
    Ok((
        ProcessStdio {
            stdin,
            stdout,
            stderr,
        },
        ProcessIo {
            stdin_keeper: keeper,
            ..Default::default()
        },
    ))
}

/// Starts copying between a received pty master and the process's fifos.
pub fn attach_console(paths: &StdioPaths, master: File) -> io::Result<ProcessIo> {
    let mut io = ProcessIo::default();
    if let Some((mut reader, keeper)) = open_stdin_target(&paths.stdin)? {
        io.stdin_keeper = Some(keeper);
        let mut to_master = master.try_clone()?;
        io.copiers.push(std::thread::spawn(move || {
            let _ = std::io::copy(&mut reader, &mut to_master);
        }));
    }
    if let Some(mut out) = open_output(&parse_target(&paths.stdout)?)? {
        let mut from_master = master.try_clone()?;
        // Ends with EIO once every slave end is closed; dropping `out` then gives containerd EOF.
        io.copiers.push(std::thread::spawn(move || {
            let _ = std::io::copy(&mut from_master, &mut out);
        }));
    }
    io.console = Some(master);
    Ok(io)
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

    /// Receives the master fd, waiting up to `timeout`; `gave_up` stops early (runsc died).
    pub fn receive(
        &self,
        timeout: Duration,
        mut gave_up: impl FnMut() -> bool,
    ) -> io::Result<File> {
        let deadline = Instant::now() + timeout;
        let stream = loop {
            match self.listener.accept() {
                Ok((stream, _)) => break stream,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if Instant::now() > deadline || gave_up() {
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
            MsgFlags::empty(),
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

#[cfg(test)]
mod tests {
    use super::*;

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
    fn fifo_output_opens_without_reader_and_stdin_waits_for_close() {
        use std::io::{Read, Write};
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
        let (stdio, mut pio) = open_plain(&paths).unwrap();
        let mut containerd_reader = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&o)
            .unwrap();
        stdio.stdout.unwrap().write_all(b"hi").unwrap();
        let mut got = [0u8; 2];
        containerd_reader.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"hi");

        let mut containerd_writer = OpenOptions::new().write(true).open(&i).unwrap();
        containerd_writer.write_all(b"x").unwrap();
        drop(containerd_writer);
        let mut process_stdin = stdio.stdin.unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(process_stdin.read(&mut buf).unwrap(), 1);
        pio.close_stdin();
        assert_eq!(
            process_stdin.read(&mut buf).unwrap(),
            0,
            "EOF after CloseIO"
        );
    }
}
