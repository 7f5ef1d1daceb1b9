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
//!
//! A client that is reading must also have read it before the exit is reported
//! ([`HeldOutputs::start_drain`], [`Drain::wait`]): containerd's own client drops whatever it
//! has not read once Wait has returned. `ctr run` (containerd 1.7.2 on, 2.x) calls
//! `task.Delete`, which calls `io.Cancel()` before `io.Wait()`, and `cio`'s Cancel closes its
//! read ends of the fifos (containerd PR #8334): its copy stops at the next read, and what was
//! still in the fifo, up to a pipe's buffer, is gone. The runc shim has the same race; it
//! shows with a client slowed down (a loaded host, a slow reader of ctr's stdout).

use std::{
    fs::{File, OpenOptions},
    io,
    os::{
        fd::AsRawFd,
        unix::fs::{MetadataExt, OpenOptionsExt},
    },
    path::{Path, PathBuf},
    sync::{mpsc::Receiver, Arc, Condvar, Mutex},
    thread::JoinHandle,
    time::{Duration, Instant},
};

/// How long a client has, once the process has exited, to open its end of an output fifo,
/// looked for often. After it, the shim still looks, less often, until the process is deleted
/// (a client that opens late, an exec's among them, then reads all, as one on time does),
/// or [`LATE_LIMIT`].
pub(super) const TIMEOUT: Duration = Duration::from_secs(5);

/// The longest the shim holds the writers of a process nobody deletes (`ctr run -d` whose
/// task is left): a bound on what such processes keep.
const LATE_LIMIT: Duration = Duration::from_secs(3600);

/// The pause between two looks for a late client.
const LATE_PAUSE: Duration = Duration::from_millis(500);

/// The longest pause between two looks for a client's reader.
const MAX_PAUSE: Duration = Duration::from_millis(20);

/// How long an exit waits for a client that reads none of what is left in an output fifo
/// (one stuck behind its own output) before it is reported anyway.
pub(super) const DRAIN_STALL: Duration = Duration::from_secs(1);

/// The longest an exit waits for a client to read what is left in the output fifos.
pub(super) const DRAIN_CAP: Duration = Duration::from_secs(5);

/// The longest pause between two looks at what is left in a fifo.
const DRAIN_PAUSE: Duration = Duration::from_millis(5);

/// The ends of one output fifo the shim holds.
struct HeldFifo {
    path: PathBuf,
    /// The shim's reader: gone once the process has exited (see [`HeldOutputs::start_drain`]).
    reader: Option<File>,
    writer: File,
}

/// The ends of a process's output fifos the shim holds (see the module's documentation).
/// Dropped without [`HeldOutputs::release`], they close at once: so a sandbox replaced by its
/// restore hands its fifos over (the new one has its own, opened before).
#[derive(Default)]
pub(super) struct HeldOutputs {
    fifos: Vec<HeldFifo>,
    /// With a terminal, the shim's copier from the pty writes to the fifos: set once it has
    /// written its last.
    copier: Option<Copied>,
}

/// Set once a terminal's copier has written its last into the output fifos: the drain and
/// the release both wait for it. The copier sets it by dropping its [`CopierDone`].
#[derive(Clone, Default)]
pub(super) struct Copied(Arc<(Mutex<bool>, Condvar)>);

impl Copied {
    /// The copier's side: sets this when dropped, however the copier ends.
    pub fn done_on_drop(&self) -> CopierDone {
        CopierDone(self.clone())
    }

    /// Whether it is set, waiting up to `timeout` for it.
    fn wait(&self, timeout: Duration) -> bool {
        let (done, changed) = &*self.0;
        let done = done.lock().unwrap();
        let (done, _) = changed
            .wait_timeout_while(done, timeout, |done| !*done)
            .unwrap();
        *done
    }
}

/// Held by a terminal's copier: dropped once it has written its last (see [`Copied`]).
pub struct CopierDone(Copied);

impl Drop for CopierDone {
    fn drop(&mut self) {
        let (done, changed) = &*(self.0).0;
        *done.lock().unwrap() = true;
        changed.notify_all();
    }
}

impl HeldOutputs {
    /// Holds `reader` and a duplicate of `writer`, both ends of the fifo at `path`.
    pub fn hold(&mut self, path: &Path, reader: File, writer: &File) -> io::Result<()> {
        self.fifos.push(HeldFifo {
            path: path.to_path_buf(),
            reader: Some(reader),
            writer: writer.try_clone()?,
        });
        Ok(())
    }

    /// The fifos are written by a copier of the shim's, which sets `done` once it has
    /// written its last: a drain and a release wait for that first (within their bounds).
    pub fn copied_by(&mut self, done: Copied) {
        self.copier = Some(done);
    }

    /// The process has exited. Without a terminal nothing writes to its fifos any more: the
    /// shim lets go of its own readers (as [`HeldOutputs::release`] would at once) and returns
    /// its writers on the fifos that a client reads and that still hold output, for
    /// [`Drain::wait`] before the exit is reported, with no lock held; `None` where nothing is
    /// left to read or nobody reads. With a terminal the copier may still be writing the end
    /// of the output: the readers stay until it is done (see [`HeldOutputs::release`]), and
    /// the drain waits for it, then for the client to read.
    pub fn start_drain(&mut self) -> Option<Drain> {
        let copier = self.copier.clone();
        let mut fifos = Vec::new();
        for f in &mut self.fifos {
            if copier.is_none() {
                f.reader = None;
                if unread(&f.writer) == 0 || !has_reader(&f.writer) {
                    continue;
                }
            }
            match f.writer.try_clone() {
                Ok(w) => fifos.push((f.path.clone(), w)),
                Err(e) => log::warn!("output fifo {}: {e}; not drained", f.path.display()),
            }
        }
        (!fifos.is_empty()).then_some(Drain { fifos, copier })
    }

    /// Lets go of the held ends, as the module says, on a thread of its own (the thread, if
    /// anything was held), giving a client `timeout` to open its end, and then until
    /// `deleted` disconnects (the process is deleted) or [`LATE_LIMIT`]. Never blocks.
    pub fn release(self, timeout: Duration, deleted: Receiver<()>) -> Option<JoinHandle<()>> {
        if self.fifos.is_empty() {
            return None;
        }
        let spawned = std::thread::Builder::new()
            .name("out-release".into())
            .spawn(move || self.let_go(timeout, deleted));
        // Without a thread, everything is closed at once (the closure is dropped with it).
        spawned
            .inspect_err(|e| log::warn!("output fifos let go at once: {e}"))
            .ok()
    }

    fn let_go(self, timeout: Duration, deleted: Receiver<()>) {
        let deadline = Instant::now() + timeout;
        if let Some(done) = self.copier {
            // Until then the end of the output may be on its way: written with neither the
            // shim's reader nor a client's, it would fail (EPIPE) and be lost.
            done.wait(deadline.saturating_duration_since(Instant::now()));
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
        // A client may still come (an exec's, late): the writers stay until it does, or the
        // process is deleted, looked at less often.
        let late = Instant::now() + LATE_LIMIT;
        while !waiting.is_empty() && Instant::now() < late {
            match deleted.recv_timeout(LATE_PAUSE) {
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                _ => break,
            }
            waiting.retain(|(path, writer)| !read_or_gone(path, writer));
        }
        for (path, _) in &waiting {
            log::debug!(
                "nobody opened output fifo {} before its process was deleted: its output is \
                 dropped",
                path.display()
            );
        }
    }
}

/// Writers on output fifos that a client reads and that still hold some of an exited
/// process's output (see [`HeldOutputs::start_drain`]).
pub struct Drain {
    fifos: Vec<(PathBuf, File)>,
    /// A terminal's copier, still writing into the fifos until it is set; the shim's readers
    /// are held meanwhile, so every fifo counts as read and the stall bound ends the wait for
    /// a client that is not there (`ctr run -d -t`).
    copier: Option<Copied>,
}

impl Drain {
    /// Returns once the clients have read everything left in the fifos (their copy has it:
    /// closing their ends loses nothing), or have gone, or have read nothing for `stall`, or
    /// after `cap`; with a terminal, once its copier has written its last, too.
    pub fn wait(mut self, stall: Duration, cap: Duration) {
        let started = Instant::now();
        if let Some(copier) = self.copier.take() {
            self.wait_for_copier(&copier, stall, cap);
        }
        let mut progress = Instant::now();
        let mut left = usize::MAX;
        let mut pause = Duration::from_micros(200);
        loop {
            self.fifos.retain(|(_, w)| unread(w) > 0 && has_reader(w));
            let now: usize = self.fifos.iter().map(|(_, w)| unread(w)).sum();
            if now < left {
                left = now;
                progress = Instant::now();
            }
            if self.fifos.is_empty() || progress.elapsed() >= stall || started.elapsed() >= cap {
                break;
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(DRAIN_PAUSE);
        }
        for (path, w) in &self.fifos {
            log::warn!(
                "output fifo {}: its client left {} bytes unread {:?} after its process's \
                 exit; the exit is reported anyway",
                path.display(),
                unread(w),
                started.elapsed()
            );
        }
        if !self.fifos.is_empty() || started.elapsed() > Duration::from_millis(1) {
            log::debug!("output fifos drained in {:?}", started.elapsed());
        }
    }

    /// Waits for a terminal's copier to have written its last (it reads the pty until the
    /// process's side is closed), within `cap`, or until the output it left has not moved
    /// for `stall` (a client that does not read: the copier may be blocked on a full fifo).
    fn wait_for_copier(&self, copier: &Copied, stall: Duration, cap: Duration) {
        let started = Instant::now();
        let mut progress = started;
        let mut last = 0;
        while !copier.wait(DRAIN_PAUSE) {
            let now: usize = self.fifos.iter().map(|(_, w)| unread(w)).sum();
            if now != last {
                last = now;
                progress = Instant::now();
            }
            if (now > 0 && progress.elapsed() >= stall) || started.elapsed() >= cap {
                log::warn!(
                    "a terminal's output was still being copied {:?} after its process's \
                     exit; the exit is reported anyway",
                    started.elapsed()
                );
                return;
            }
        }
    }
}

/// How many bytes are in the fifo `end` is on, not read yet (FIONREAD: on either end).
fn unread(end: &File) -> usize {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int through the pointer, which outlives the call.
    let rc = unsafe { libc::ioctl(end.as_raw_fd(), libc::FIONREAD, &mut n) };
    if rc < 0 {
        0
    } else {
        n as usize
    }
}

/// Whether the fifo `writer` is on has a reader: a client's, once the shim's is gone.
fn has_reader(writer: &File) -> bool {
    probe(writer).is_ok()
}

/// A non-blocking writer opened through `writer`, so on that very fifo even where its path
/// was removed or replaced: ENXIO when it has no reader. Dropped at once by the callers: the
/// shim's writer still holds the fifo.
fn probe(writer: &File) -> io::Result<File> {
    OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(format!("/proc/self/fd/{}", writer.as_raw_fd()))
}

/// Whether the fifo `writer` is on has a reader (a client's: the shim's is gone), or can
/// have none any more (its path is gone).
fn read_or_gone(path: &Path, writer: &File) -> bool {
    // ENXIO: no reader (containerd's client counts as one from the start of its open).
    match probe(writer) {
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
