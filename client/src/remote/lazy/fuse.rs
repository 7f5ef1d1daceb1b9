//! The file runsc reads: one read-only regular file, mounted over `lazy/<hex>/pages.img`,
//! whose reads are answered from the bytes fetched so far, each read waiting for the pieces
//! it covers. Opened with direct I/O, so every read of runsc's reaches here as it is (its
//! reads of pages a process is blocked on first) and the page cache keeps no second copy.

use std::{
    fs::File,
    os::unix::fs::FileExt,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant, UNIX_EPOCH},
};

use chalk_runtime::snapshot::pieces::Pieces;
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, INodeNo, LockOwner, OpenAccMode,
    OpenFlags, ReplyAttr, ReplyData, ReplyEmpty, ReplyOpen, Request,
};

use super::arrivals::Arrivals;

/// How long attributes may be cached: they never change.
const TTL: Duration = Duration::from_secs(3600);

pub struct PagesFile {
    pub size: u64,
    pub pieces: Pieces,
    pub arrivals: Arc<Arrivals>,
    pub data: Arc<File>,
    /// How long one read may wait for its pieces before serving fails as a whole.
    pub wait_limit: Duration,
    pub readers: Arc<Readers>,
}

/// Who has the file open: a server whose readers are all gone (their sandbox ended) has no
/// reason to go on.
#[derive(Default)]
pub struct Readers {
    open: AtomicUsize,
    /// When the first open came, and when the last one closed.
    first: Mutex<Option<Instant>>,
    last_close: Mutex<Option<Instant>>,
}

impl Readers {
    fn opened(&self) {
        self.open.fetch_add(1, Ordering::SeqCst);
        self.first.lock().unwrap().get_or_insert_with(Instant::now);
    }

    fn closed(&self) {
        if self.open.fetch_sub(1, Ordering::SeqCst) == 1 {
            *self.last_close.lock().unwrap() = Some(Instant::now());
        }
    }

    /// Whether any reader ever opened the file.
    pub fn ever(&self) -> bool {
        self.first.lock().unwrap().is_some()
    }

    /// How long the file has had no reader, after having had one (None: it has one now, or
    /// never had any).
    pub fn gone_for(&self) -> Option<Duration> {
        if self.open.load(Ordering::SeqCst) > 0 || !self.ever() {
            return None;
        }
        self.last_close.lock().unwrap().map(|t| t.elapsed())
    }
}

impl PagesFile {
    fn attr(&self) -> FileAttr {
        FileAttr {
            ino: INodeNo::ROOT,
            size: self.size,
            blocks: self.size.div_ceil(512),
            atime: UNIX_EPOCH,
            mtime: UNIX_EPOCH,
            ctime: UNIX_EPOCH,
            crtime: UNIX_EPOCH,
            kind: FileType::RegularFile,
            perm: 0o400,
            nlink: 1,
            uid: 0,
            gid: 0,
            rdev: 0,
            flags: 0,
            blksize: 4096,
        }
    }
}

impl Filesystem for PagesFile {
    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        if ino == INodeNo::ROOT {
            reply.attr(&TTL, &self.attr());
        } else {
            reply.error(Errno::ENOENT);
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if ino != INodeNo::ROOT {
            reply.error(Errno::ENOENT);
        } else if flags.acc_mode() != OpenAccMode::O_RDONLY {
            reply.error(Errno::EROFS);
        } else {
            self.readers.opened();
            reply.opened(FileHandle(0), FopenFlags::FOPEN_DIRECT_IO);
        }
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.readers.closed();
        reply.ok();
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        if offset >= self.size {
            reply.data(&[]);
            return;
        }
        let len = (self.size - offset).min(size as u64);
        let covering = self.pieces.covering(offset, len);
        let data = self.data.clone();
        if self.arrivals.have(&covering) {
            answer(&data, offset, len, reply);
            return;
        }
        // Waiting here would hold up the event loop and every other read.
        let (arrivals, limit) = (self.arrivals.clone(), self.wait_limit);
        std::thread::spawn(move || match arrivals.wait_for(covering, limit) {
            Ok(()) => answer(&data, offset, len, reply),
            Err(why) => {
                // One read that cannot be answered ends serving: a sandbox must not go on
                // with some of its pages missing.
                arrivals.fail(&why);
                reply.error(Errno::EIO);
            }
        });
    }
}

/// Answers a read from the checked bytes: all of it, never short (runsc takes a short read
/// at the end of what it asked for as the end of the file).
fn answer(data: &File, offset: u64, len: u64, reply: ReplyData) {
    let mut buf = vec![0u8; len as usize];
    match data.read_exact_at(&mut buf, offset) {
        Ok(()) => reply.data(&buf),
        Err(_) => reply.error(Errno::EIO),
    }
}
