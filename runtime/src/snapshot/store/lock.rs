//! The store's flock'd files: `<root>/lock` (shared while ingesting or linking, exclusive for
//! gc) and the lock beside each ingest and restore directory.

use std::{
    fs::{self, File, OpenOptions},
    os::unix::fs::OpenOptionsExt,
    os::unix::io::AsRawFd,
    path::{Path, PathBuf},
};

use super::{store_error, Store};
use crate::{Error, Result};

impl Store {
    /// `<root>/lock`: shared while ingesting or linking, exclusive for gc.
    pub(super) fn lock_store(&self, exclusive: bool) -> Result<Lock> {
        Lock::wait(&self.root.join("lock"), exclusive)
    }
}

/// An flock'd file: shared or exclusive, released when dropped (or when its process dies).
#[derive(Debug)]
pub(super) struct Lock {
    file: File,
    path: PathBuf,
}

impl Lock {
    fn open(path: &Path) -> Result<File> {
        OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| Error::io(format!("open {}", path.display()), e))
    }

    fn wait(path: &Path, exclusive: bool) -> Result<Lock> {
        let file = Self::open(path)?;
        let how = if exclusive {
            libc::LOCK_EX
        } else {
            libc::LOCK_SH
        };
        // SAFETY: flock on a descriptor this function owns.
        if unsafe { libc::flock(file.as_raw_fd(), how) } != 0 {
            return Err(Error::io(
                format!("lock {}", path.display()),
                std::io::Error::last_os_error(),
            ));
        }
        Ok(Lock {
            file,
            path: path.to_path_buf(),
        })
    }

    /// Takes `path` exclusively, or fails at once when someone holds it.
    pub(super) fn take(path: &Path) -> Result<Lock> {
        Self::try_take(path)
            .ok_or_else(|| store_error(path, "already held by another operation of the same name"))
    }

    pub(super) fn try_take(path: &Path) -> Option<Lock> {
        let file = Self::open(path).ok()?;
        // SAFETY: flock on a descriptor this function owns.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        (rc == 0).then(|| Lock {
            file,
            path: path.to_path_buf(),
        })
    }

    /// Removes the lock file, then lets the lock go.
    pub(super) fn remove(self) {
        let _ = fs::remove_file(&self.path);
        drop(self.file);
    }
}

/// The lock beside directory `dir`: `<dir>.lock` (tokens have dots of their own).
pub(super) fn lock_path(dir: &Path) -> PathBuf {
    let mut name = dir.file_name().unwrap_or_default().to_os_string();
    name.push(".lock");
    dir.with_file_name(name)
}
