//! Restore directories: a snapshot's files as symlinks to its verified blobs, named as runsc
//! wrote them, locked (and so kept from gc) until dropped.

use std::{
    fs,
    os::unix::fs::DirBuilderExt,
    path::{Path, PathBuf},
};

use super::{
    layout::{make_private_dir, valid_token},
    lock::{lock_path, Lock},
    store_error,
    verify::Stored,
    Store,
};
use crate::{Error, Result};

/// A directory of symlinks to a snapshot's blobs, named as runsc wrote them; removed (with
/// its lock, which keeps gc off the blobs) when dropped.
#[derive(Debug)]
pub struct RestoreDir {
    dir: PathBuf,
    lock: Option<Lock>,
    /// The blobs linked to a server's file because they are still arriving.
    arriving: Vec<String>,
}

impl Store {
    /// A directory runsc can restore `snap` from, its files symlinks to the blobs; each blob
    /// verified first (by identity, or hashed again when that changed). Held until dropped.
    pub fn prepare_restore(&self, snap: &Stored, token: &str) -> Result<RestoreDir> {
        let _shared = self.lock_store(false)?;
        let mut restore = self.begin_restore(token)?;
        let dir = restore.dir.clone();
        // A blob still arriving is read through its server's file.
        let arriving: Vec<(String, PathBuf)> = snap
            .manifest
            .files
            .iter()
            .filter(|f| !self.root.join("blobs/sha256").join(&f.sha256).exists())
            .filter_map(|f| Some((f.sha256.clone(), self.lazy_file(&f.sha256)?)))
            .collect();
        restore.arriving = arriving.iter().map(|(hex, _)| hex.clone()).collect();
        self.verify_blobs(&snap.digest, &snap.manifest, &restore.arriving)?;
        for f in &snap.manifest.files {
            let link = dir.join(&f.path);
            if let Some(parent) = link.parent() {
                make_private_dir(parent)?;
            }
            let blob = arriving
                .iter()
                .find(|(hex, _)| *hex == f.sha256)
                .map_or_else(
                    || self.root.join("blobs/sha256").join(&f.sha256),
                    |(_, p)| p.clone(),
                );
            std::os::unix::fs::symlink(&blob, &link)
                .map_err(|e| Error::io(format!("link {}", link.display()), e))?;
        }
        Ok(restore)
    }

    /// A new, empty restore directory `token`, locked (the caller holds the store's lock).
    pub(super) fn begin_restore(&self, token: &str) -> Result<RestoreDir> {
        if !valid_token(token) {
            return Err(store_error(
                &self.root,
                format!("restore name {token:?} is invalid"),
            ));
        }
        let dir = self.root.join("restores").join(token);
        let lock = Lock::take(&lock_path(&dir))?;
        let restore = RestoreDir {
            dir: dir.clone(),
            lock: Some(lock),
            arriving: Vec::new(),
        };
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| store_error(&self.root, format!("restore {token}: {e}")))?;
        Ok(restore)
    }
}

impl RestoreDir {
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The blobs this restore reads as they arrive (their digests' hex).
    pub fn arriving(&self) -> &[String] {
        &self.arriving
    }

    /// Why a blob this restore reads as it arrives will never be whole, if one will not:
    /// its server's reason, or that the server is gone.
    pub fn arrival_failure(&self) -> Option<String> {
        self.arrivals()?.failure()
    }

    /// What tells whether its arriving blobs failed, kept apart from the directory (which
    /// goes once runsc has loaded them): none when nothing arrives.
    pub fn arrivals(&self) -> Option<Arrivals> {
        let root = self.dir.parent()?.parent()?;
        (!self.arriving.is_empty()).then(|| Arrivals {
            root: root.to_path_buf(),
            arriving: self.arriving.clone(),
        })
    }
}

/// The blobs a restore read as they arrived, in a store: whether they failed.
#[derive(Debug, Clone)]
pub struct Arrivals {
    root: PathBuf,
    arriving: Vec<String>,
}

impl Arrivals {
    /// Why one of the blobs will never be whole, if one will not.
    pub fn failure(&self) -> Option<String> {
        let store = Store {
            root: self.root.clone(),
        };
        self.arriving.iter().find_map(|hex| {
            if let Some(why) = store.lazy_failure(hex) {
                return Some(why.trim().to_string());
            }
            let here = self.root.join("blobs/sha256").join(hex).exists();
            (!here && store.lazy_file(hex).is_none())
                .then(|| format!("the server of blob sha256:{hex} ended before the blob was whole"))
        })
    }
}

impl Drop for RestoreDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
        if let Some(lock) = self.lock.take() {
            lock.remove();
        }
    }
}

/// The blob names a restore directory's links point at.
pub(super) fn link_targets(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            match fs::read_link(&path) {
                Ok(target) => {
                    out.extend(target.file_name().map(|n| n.to_string_lossy().into_owned()))
                }
                Err(_) if path.is_dir() => stack.push(path),
                Err(_) => {}
            }
        }
    }
    out
}
