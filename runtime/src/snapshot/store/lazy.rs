//! Blobs that arrive while they are read: `lazy/<hex>/` holds `pages.img` (where the serving
//! process mounts the file runsc reads), `data` (the bytes fetched so far, each piece checked,
//! at their offsets) and, if it failed, `failed` (why). The serving process holds the
//! directory's lock for as long as it serves; once every piece is here and the whole file
//! matches its digest, `data` becomes the ordinary blob `hex`.
//!
//! Which process fetches and serves, and how, is not the store's business: it only keeps the
//! files, says whether a blob is being served, and what became of it.

use std::{
    fs::{self, OpenOptions},
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

use super::{
    layout::{make_private_dir, write_atomic},
    lock::{lock_path, Lock},
    store_error, Store,
};
use crate::{Error, Result};

/// How long a failed lazy blob's reason stays for the shim to read.
pub const FAILED_MAX_AGE: Duration = Duration::from_secs(600);

/// A blob being fetched and served by this process: its lock is held until dropped.
#[derive(Debug)]
pub struct LazyBlob {
    dir: PathBuf,
    hex: String,
    lock: Option<Lock>,
}

impl Store {
    fn lazy_dir(&self, hex: &str) -> PathBuf {
        self.root.join("lazy").join(hex)
    }

    /// Starts serving blob `hex` of `size` bytes: its directory made afresh (a dead server's
    /// leftovers removed), `data` made sparse at full size, `pages.img` an empty file to mount
    /// on. Fails when another process serves it already.
    pub fn begin_lazy(&self, hex: &str, size: u64) -> Result<LazyBlob> {
        if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(store_error(&self.root, format!("{hex:?} is not a sha256")));
        }
        make_private_dir(&self.root.join("lazy"))?;
        let dir = self.lazy_dir(hex);
        let lock = Lock::take(&lock_path(&dir))?;
        if dir.exists() {
            detach_mount(&dir.join(super::super::pieces::LAZY_FILE));
            fs::remove_dir_all(&dir)
                .map_err(|e| Error::io(format!("remove {}", dir.display()), e))?;
        }
        make_private_dir(&dir)?;
        let made = (|| -> std::io::Result<()> {
            let data = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(dir.join("data"))?;
            data.set_len(size)?;
            OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(dir.join(super::super::pieces::LAZY_FILE))?;
            Ok(())
        })();
        let blob = LazyBlob {
            dir,
            hex: hex.to_string(),
            lock: Some(lock),
        };
        made.map_err(|e| Error::io(format!("prepare {}", blob.dir.display()), e))?;
        Ok(blob)
    }

    /// The file a restore reads blob `hex` through while it arrives: where a live server has
    /// mounted it (it holds the lock and has said it serves); None otherwise.
    pub fn lazy_file(&self, hex: &str) -> Option<PathBuf> {
        let dir = self.lazy_dir(hex);
        if !dir.join("serving").exists() || dir.join("failed").exists() {
            return None;
        }
        Lock::try_take(&lock_path(&dir))
            .is_none()
            .then(|| dir.join(super::super::pieces::LAZY_FILE))
    }

    /// Why serving blob `hex` failed, if it did (kept [`FAILED_MAX_AGE`]).
    pub fn lazy_failure(&self, hex: &str) -> Option<String> {
        fs::read_to_string(self.lazy_dir(hex).join("failed")).ok()
    }

    /// "never arrived: <its server's reason>", for blob `hex` left to a server that failed:
    /// what a restore, an import and a pull say of it in place of a missing blob.
    pub fn never_arrived(&self, hex: &str) -> Option<String> {
        self.lazy_failure(hex)
            .map(|why| format!("never arrived: {}", why.trim()))
    }

    /// Removes lazy directories nobody serves: their mount detached, unless one failed less
    /// than [`FAILED_MAX_AGE`] ago (its reason is still wanted). How many went.
    pub(super) fn gc_lazy(&self) -> usize {
        let mut removed = 0;
        for entry in fs::read_dir(self.root.join("lazy"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(of) = name.strip_suffix(".lock") {
                if !self.lazy_dir(of).exists() {
                    if let Some(_held) = Lock::try_take(&path) {
                        let _ = fs::remove_file(&path);
                    }
                }
                continue;
            }
            let Some(_held) = Lock::try_take(&lock_path(&path)) else {
                continue;
            };
            let failed_recently = fs::metadata(path.join("failed"))
                .and_then(|m| m.modified())
                .is_ok_and(|t| {
                    SystemTime::now().duration_since(t).unwrap_or_default() < FAILED_MAX_AGE
                });
            if failed_recently {
                continue;
            }
            detach_mount(&path.join(super::super::pieces::LAZY_FILE));
            if fs::remove_dir_all(&path).is_ok() {
                let _ = fs::remove_file(lock_path(&path));
                removed += 1;
            }
        }
        removed
    }
}

impl LazyBlob {
    /// Where the file is mounted.
    pub fn mountpoint(&self) -> PathBuf {
        self.dir.join(super::super::pieces::LAZY_FILE)
    }

    /// The bytes fetched so far.
    pub fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    pub fn hex(&self) -> &str {
        &self.hex
    }

    /// The file is mounted and answers reads: restores may use it from now on.
    pub fn serving(&self) -> Result<()> {
        write_atomic(&self.dir.join("serving"), b"", 0o600)
    }

    /// Every piece is here and the whole matches `hex`: `data` becomes the store's blob (the
    /// mount keeps reading the same file).
    pub fn complete(&self, store: &Store) -> Result<()> {
        let _shared = store.lock_store(false)?;
        let blob = store.root.join("blobs/sha256").join(&self.hex);
        if blob.exists() {
            return Ok(());
        }
        let data = self.data();
        fs::set_permissions(&data, std::os::unix::fs::PermissionsExt::from_mode(0o400))
            .map_err(|e| Error::io(format!("chmod {}", data.display()), e))?;
        fs::rename(&data, &blob)
            .map_err(|e| Error::io(format!("move {} into the store", data.display()), e))?;
        store.record_identity(&self.hex)
    }

    /// Serving failed for `reason`: the fetched bytes go, the reason stays for the shim.
    pub fn fail(&self, reason: &str) {
        let _ = fs::remove_file(self.data());
        self.failure_note().write(reason);
    }

    /// Where why serving failed is written: handed to the readers' side, which must say so
    /// before any read fails.
    pub fn failure_note(&self) -> FailureNote {
        FailureNote(self.dir.join("failed"))
    }

    /// Done serving: the directory goes unless it failed (its reason is kept); the lock is let
    /// go either way. The mount must be gone or detached by now.
    pub fn finish(mut self) {
        if !self.dir.join("failed").exists() {
            let _ = fs::remove_dir_all(&self.dir);
            if let Some(lock) = self.lock.take() {
                lock.remove();
            }
        }
    }
}

/// The `failed` note of a lazy blob.
#[derive(Debug, Clone)]
pub struct FailureNote(PathBuf);

impl FailureNote {
    /// Writes `reason`, unless a reason is there already.
    pub fn write(&self, reason: &str) {
        if !self.0.exists() {
            let _ = write_atomic(&self.0, reason.as_bytes(), 0o600);
        }
    }
}

/// Detaches whatever is mounted on `path` (a dead server's file): reads of it fail from then
/// on, and the kernel lets it go once nothing has it open.
pub fn detach_mount(path: &Path) {
    if let Ok(c) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) {
        // SAFETY: a NUL-terminated path; umount2 reads it only.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
}
