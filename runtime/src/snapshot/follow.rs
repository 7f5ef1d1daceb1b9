//! Hashing a checkpoint's files while runsc writes them, so that a snapshot is sealed close to
//! when runsc finishes instead of a whole hashing pass later.
//!
//! runsc writes each image file in increasing offset order: `pages.img` through one queue of
//! `pwrite`s at a rising offset, the state files through buffered `write`s (both generations;
//! without `--direct`, which the shim never passes). So the bytes below a file's size are
//! final, except for one case: a short write's remainder is queued again behind at most 128
//! writes of 256 KiB. The follower therefore stays [`LAG`] behind each file's size until the
//! writer is done, then reads every file to its end.
//!
//! The following thread runs at a lower priority, so as not to take CPU from runsc's
//! checkpoint; once the writer is done there is nothing left to yield to, and the snapshot's
//! seal (its record, chalkctl, a suspended sandbox's resume) waits on the rest: that last
//! round runs on the thread that calls [`Follower::finish`], at its priority. On a loaded
//! host a nice-10 thread gets a tenth of a CPU or less, and a seal took ten times as long.

use std::{
    collections::BTreeMap,
    fs::File,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread::JoinHandle,
    time::Duration,
};

use sha2::{Digest, Sha256};

use super::hash::{hex, read_some, FileDigest};
use super::pieces::{self, PieceHasher};
use crate::{Error, Result};

/// How far behind a file's size the follower reads while the writer runs: more than runsc's
/// queue of writes (128 × 256 KiB) that a retried short write can land behind.
pub const LAG: u64 = 64 << 20;
const READ_BUF: usize = 4 << 20;
const IDLE: Duration = Duration::from_millis(2);

/// A thread hashing the files of a directory as they are written.
pub struct Follower {
    dir: PathBuf,
    done: Arc<AtomicBool>,
    cancelled: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<Option<Progress>>>>,
}

/// What the following thread has read of each file when the writer is done (none when
/// cancelled): [`Follower::finish`] reads the rest.
type Progress = BTreeMap<String, Followed>;

/// One file being followed.
struct Followed {
    file: File,
    hasher: Sha256,
    /// The memory file's piece digests, hashed on the same pass.
    pieces: Option<PieceHasher>,
    offset: u64,
}

impl Follower {
    /// Starts following the regular files of `dir` (its top level: runsc's image files), those
    /// there now and those that appear.
    pub fn start(dir: &Path) -> Follower {
        Self::lagging(dir, LAG)
    }

    fn lagging(dir: &Path, lag: u64) -> Follower {
        let done = Arc::new(AtomicBool::new(false));
        let cancelled = Arc::new(AtomicBool::new(false));
        let thread = {
            let (dir, done, cancelled) = (dir.to_path_buf(), done.clone(), cancelled.clone());
            std::thread::spawn(move || {
                yield_to_the_checkpoint();
                follow(&dir, lag, &done, &cancelled)
            })
        };
        Follower {
            dir: dir.to_path_buf(),
            done,
            cancelled,
            thread: Some(thread),
        }
    }

    /// The writer has finished: reads every file to its end, on the calling thread (at its
    /// priority, not the follower's), and returns each file's digest by name.
    pub fn finish(mut self) -> Result<BTreeMap<String, FileDigest>> {
        self.done.store(true, Ordering::Release);
        let thread = self.thread.take().expect("a follower is finished once");
        let files = thread.join().unwrap_or_else(|_| {
            Err(Error::io(
                "hash the checkpoint while it was written",
                std::io::Error::other("the hashing thread panicked"),
            ))
        })?;
        let mut files = files.unwrap_or_default();
        // Every size seen from here on is final: the writer was done before `done` was set.
        discover(&self.dir, &mut files)?;
        for (name, f) in files.iter_mut() {
            let path = self.dir.join(name);
            let size = f
                .file
                .metadata()
                .map_err(|e| Error::io(format!("stat {}", path.display()), e))?
                .len();
            f.finish_until(size, &path)?;
        }
        Ok(files
            .into_iter()
            .map(|(name, f)| {
                let digest = FileDigest {
                    size: f.offset,
                    sha256: hex(&f.hasher.finalize().into()),
                    chunks: Vec::new(),
                    pieces: f.pieces.map(PieceHasher::finish),
                };
                (name, digest)
            })
            .collect())
    }

    /// Stops at once, without a result (the checkpoint failed).
    pub fn cancel(mut self) {
        self.stop();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }

    fn stop(&self) {
        self.cancelled.store(true, Ordering::Release);
        self.done.store(true, Ordering::Release);
    }
}

/// A follower dropped on a path that neither finished nor cancelled it stops reading.
impl Drop for Follower {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.stop();
        }
    }
}

/// Hashes each file of `dir` up to [`LAG`] behind its size until the writer is done; returns
/// what it has read then (the rest is read by [`Follower::finish`]), or None when cancelled.
fn follow(
    dir: &Path,
    lag: u64,
    done: &AtomicBool,
    cancelled: &AtomicBool,
) -> Result<Option<Progress>> {
    let mut files: BTreeMap<String, Followed> = BTreeMap::new();
    let mut buf = vec![0u8; READ_BUF];
    loop {
        if cancelled.load(Ordering::Acquire) {
            return Ok(None);
        }
        if done.load(Ordering::Acquire) {
            return Ok(Some(files));
        }
        discover(dir, &mut files)?;
        let mut progressed = false;
        for (name, f) in files.iter_mut() {
            let size = f
                .file
                .metadata()
                .map_err(|e| Error::io(format!("stat {}", dir.join(name).display()), e))?
                .len();
            let until = size.saturating_sub(lag);
            // Stops mid-file once the writer is done (a cancel sets `done` too): the rest is
            // the finishing thread's.
            progressed |= f.read_until(until, &mut buf, &dir.join(name), done)?;
        }
        if !progressed {
            std::thread::sleep(IDLE);
        }
    }
}

/// Lowers the calling thread's priority (nice 10): on a host with few cores the hashing would
/// otherwise take CPU from runsc's checkpoint, which pauses the source, and from the reply that
/// makes the snapshot usable. Linux's nice value is per thread.
fn yield_to_the_checkpoint() {
    // SAFETY: setpriority only reads its arguments; gettid cannot fail.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 10) };
    if rc != 0 {
        log::debug!(
            "could not lower the hashing thread's priority: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// Opens the files of `dir` not yet followed.
fn discover(dir: &Path, files: &mut BTreeMap<String, Followed>) -> Result<()> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| Error::io(format!("list {}", dir.display()), e))?;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if files.contains_key(&name) || name.starts_with('.') {
            continue;
        }
        if !entry.file_type().is_ok_and(|t| t.is_file()) {
            continue;
        }
        let path: PathBuf = entry.path();
        let file =
            File::open(&path).map_err(|e| Error::io(format!("open {}", path.display()), e))?;
        files.insert(
            name,
            Followed {
                file,
                hasher: Sha256::new(),
                pieces: pieces::wanted(&path).then(PieceHasher::default),
                offset: 0,
            },
        );
    }
    Ok(())
}

impl Followed {
    /// Hashes the file up to `until`, or until `stop` is set: whether anything was read.
    fn read_until(
        &mut self,
        until: u64,
        buf: &mut [u8],
        path: &Path,
        stop: &AtomicBool,
    ) -> Result<bool> {
        let start = self.offset;
        while self.offset < until && !stop.load(Ordering::Relaxed) {
            let want = (until - self.offset).min(buf.len() as u64) as usize;
            let n = read_some(&self.file, &mut buf[..want], self.offset, path)?;
            self.hasher.update(&buf[..n]);
            if let Some(p) = &mut self.pieces {
                p.update(&buf[..n]);
            }
            self.offset += n as u64;
        }
        Ok(self.offset > start)
    }

    /// Hashes the rest of the file up to `until`, the writer being done: the memory file's
    /// whole digest and its piece digests on two threads, each reading the file for itself.
    /// The seal waits on this, and once runsc has ended the host's cores are free: on two
    /// cores it takes half as long as one pass feeding both.
    fn finish_until(&mut self, until: u64, path: &Path) -> Result<()> {
        if self.pieces.is_none() {
            let mut buf = vec![0u8; READ_BUF];
            return self
                .read_until(until, &mut buf, path, &AtomicBool::new(false))
                .map(drop);
        }
        let Followed {
            file,
            hasher,
            pieces: Some(pieces),
            offset,
        } = self
        else {
            unreachable!("checked above")
        };
        let start = *offset;
        let feed = |update: &mut dyn FnMut(&[u8])| -> Result<()> {
            let mut buf = vec![0u8; READ_BUF];
            let mut at = start;
            while at < until {
                let want = (until - at).min(buf.len() as u64) as usize;
                let n = read_some(file, &mut buf[..want], at, path)?;
                update(&buf[..n]);
                at += n as u64;
            }
            Ok(())
        };
        std::thread::scope(|s| {
            let other = s.spawn(|| feed(&mut |b| pieces.update(b)));
            let mine = feed(&mut |b| hasher.update(b));
            let other = other.join().unwrap_or_else(|_| {
                Err(Error::io(
                    format!("hash {}", path.display()),
                    std::io::Error::other("the piece-hashing thread panicked"),
                ))
            });
            mine.and(other)
        })?;
        *offset = until.max(start);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;
    use crate::snapshot::hash::{hash_files, sha256_hex};

    /// A writer appending in pieces while the follower runs gets the digests a hash of the
    /// finished files gives, whatever the timing.
    #[test]
    fn files_written_while_followed_get_their_plain_sha256() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("before"), b"there first").unwrap();
        let lag = 1 << 20;
        let follower = Follower::lagging(dir.path(), lag);
        let mut pages = File::create(dir.path().join("pages.img")).unwrap();
        let mut meta = File::create(dir.path().join("pages_meta.img")).unwrap();
        let mut expected = Vec::new();
        for i in 0..48 {
            let block: Vec<u8> = (0..lag / 4).map(|k| ((k * 31 + i) % 251) as u8).collect();
            pages.write_all(&block).unwrap();
            expected.extend_from_slice(&block);
            meta.write_all(format!("{i}\n").as_bytes()).unwrap();
        }
        drop((pages, meta));
        // A file that appears at the very end is hashed whole too.
        std::fs::write(dir.path().join("checkpoint.img"), b"state").unwrap();
        let got = follower.finish().unwrap();
        assert_eq!(got.len(), 4);
        assert_eq!(got["pages.img"].sha256, sha256_hex(&expected));
        assert_eq!(got["pages.img"].size, expected.len() as u64);
        let pieces = got["pages.img"]
            .pieces
            .clone()
            .expect("pages.img has pieces");
        assert!(pieces.fit(expected.len() as u64));
        assert!(pieces.matches(3, &expected[3 << 20..4 << 20]));
        assert!(got["pages_meta.img"].pieces.is_none());
        for name in ["before", "pages_meta.img", "checkpoint.img"] {
            let whole = hash_files(&[dir.path().join(name)], 1).unwrap();
            assert_eq!(got[name], whole[0], "{name}");
        }
    }

    #[test]
    fn a_cancelled_follower_stops_without_reading_on() {
        let dir = tempfile::tempdir().unwrap();
        let big = File::create(dir.path().join("pages.img")).unwrap();
        big.set_len(8 << 30).unwrap();
        let follower = Follower::lagging(dir.path(), 0);
        let started = std::time::Instant::now();
        follower.cancel();
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "hashing 8 GiB takes longer than a cancel may"
        );
    }

    #[test]
    fn the_hashing_thread_runs_at_a_lower_priority() {
        let nice = std::thread::spawn(|| {
            yield_to_the_checkpoint();
            // SAFETY: as above; errno is not looked at as the value is checked.
            unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) }
        })
        .join()
        .unwrap();
        assert_eq!(nice, 10);
    }

    #[test]
    fn temporary_files_are_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(".chalk-manifest.json.tmp"), b"x").unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let got = Follower::start(dir.path()).finish().unwrap();
        assert!(got.is_empty());
    }
}
