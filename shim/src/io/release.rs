//! What the shim holds of a process's output fifos, and how it lets go of them once the
//! process has exited.
//!
//! While the process lives the shim holds a read end of each output fifo: as with the runc
//! shim, a client that goes away (`ctr run -d`) leaves output to fill the fifo rather than
//! fail with EPIPE, which would kill the sandbox's own runsc (a Go program) by SIGPIPE.
//!
//! It holds a write end too. containerd's client (its `fifo` package, in 1.6 as in 2.x) opens
//! its read end in the background with a blocking open, which returns only once some writer
//! has the fifo open: a process that ends, and so closes every writer it had, before that
//! open (a short exec) would leave the client waiting forever. The runc shim never does, as
//! its copy of the output keeps a writer until a reader took the data. So once the process
//! has exited ([`HeldOutputs::release`]) the shim lets go on a thread of its own: of its read
//! end first (which would otherwise pass for the client's), then, once a reader is there,
//! or after a timeout (nobody is coming: `ctr run -d`; the output is dropped, as ever), of
//! its write end. What the process wrote stays in the pipe meanwhile, kept by that writer,
//! so the client reads all of it, then end-of-file.

use std::{
    fs::{File, OpenOptions},
    io,
    os::{
        fd::AsRawFd,
        unix::fs::{MetadataExt, OpenOptionsExt},
    },
    path::{Path, PathBuf},
    sync::mpsc::Receiver,
    thread::JoinHandle,
    time::{Duration, Instant},
};

/// How long a client has, once the process has exited, to open its end of an output fifo.
pub(super) const TIMEOUT: Duration = Duration::from_secs(5);

/// The longest pause between two looks for a client's reader.
const MAX_PAUSE: Duration = Duration::from_millis(20);

/// The ends of one output fifo the shim holds.
struct HeldFifo {
    path: PathBuf,
    reader: File,
    writer: File,
}

/// The ends of a process's output fifos the shim holds (see the module's documentation).
/// Dropped without [`HeldOutputs::release`], they close at once: so a sandbox replaced by its
/// restore hands its fifos over (the new one has its own, opened before).
#[derive(Default)]
pub(super) struct HeldOutputs {
    fifos: Vec<HeldFifo>,
    /// With a terminal, the shim's copier from the pty writes to the fifos: this reads as
    /// disconnected once it has written its last.
    copier: Option<Receiver<()>>,
}

impl HeldOutputs {
    /// Holds `reader` and a duplicate of `writer`, both ends of the fifo at `path`.
    pub fn hold(&mut self, path: &Path, reader: File, writer: &File) -> io::Result<()> {
        self.fifos.push(HeldFifo {
            path: path.to_path_buf(),
            reader,
            writer: writer.try_clone()?,
        });
        Ok(())
    }

    /// The fifos are written by a copier of the shim's, which drops the sender of `done`
    /// once it has written its last: a release waits for that first (up to its timeout).
    pub fn copied_by(&mut self, done: Receiver<()>) {
        self.copier = Some(done);
    }

    /// Lets go of the held ends, as the module says, on a thread of its own (the thread, if
    /// anything was held), giving a client `timeout` to open its end. Never blocks.
    pub fn release(self, timeout: Duration) -> Option<JoinHandle<()>> {
        if self.fifos.is_empty() {
            return None;
        }
        let spawned = std::thread::Builder::new()
            .name("out-release".into())
            .spawn(move || self.let_go(timeout));
        // Without a thread, everything is closed at once (the closure is dropped with it).
        spawned
            .inspect_err(|e| log::warn!("output fifos let go at once: {e}"))
            .ok()
    }

    fn let_go(self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        if let Some(done) = self.copier {
            // Until then the end of the output may be on its way: written with neither the
            // shim's reader nor a client's, it would fail (EPIPE) and be lost.
            let _ = done.recv_timeout(deadline.saturating_duration_since(Instant::now()));
        }
        // The process has written its last: what it wrote stays, held by the writers.
        let mut waiting: Vec<(PathBuf, File)> = self
            .fifos
            .into_iter()
            .map(|f| {
                drop(f.reader);
                (f.path, f.writer)
            })
            .collect();
        let mut pause = Duration::from_millis(1);
        loop {
            waiting.retain(|(path, writer)| !read_or_gone(path, writer));
            let left = deadline.saturating_duration_since(Instant::now());
            if waiting.is_empty() || left.is_zero() {
                break;
            }
            std::thread::sleep(pause.min(left));
            pause = (pause * 2).min(MAX_PAUSE);
        }
        for (path, _) in &waiting {
            log::debug!(
                "nobody opened output fifo {} within {timeout:?} of its process's exit: its \
                 output is dropped",
                path.display()
            );
        }
    }
}

/// Whether the fifo `writer` is on has a reader (a client's: the shim's is gone), or can
/// have none any more (its path is gone).
fn read_or_gone(path: &Path, writer: &File) -> bool {
    // Opened through the shim's writer, the probe is on that very fifo, even where its path
    // was removed or replaced. Dropped at once: the shim's writer still holds the fifo.
    // ENXIO: no reader (containerd's client counts as one from the start of its open).
    let probe = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(format!("/proc/self/fd/{}", writer.as_raw_fd()));
    match probe {
        Ok(_) => true,
        Err(e) if e.raw_os_error() == Some(libc::ENXIO) => !same_file(path, writer),
        Err(e) => {
            log::warn!("output fifo {}: {e}; let go of", path.display());
            true
        }
    }
}

/// Whether `path` names the file `f` has open.
fn same_file(path: &Path, f: &File) -> bool {
    match (std::fs::metadata(path), f.metadata()) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}
