//! Checkpoints usable before they are sealed. Once runsc has written a checkpoint, its files
//! are linked into `fresh/<token>/` with the manifest less its digests, and a restore may
//! start from them while the shim hashes and commits the same files (the seal). A restore
//! hard-links what it needs, so the seal's renames and the fresh directory's removal leave
//! its files in place; when the fresh directory is gone, the snapshot is sealed (its ref
//! exists) or failed (`failed/<token>` says why).
//!
//! A checkpoint taken only to be forked at once (`chalkctl fork --id`) is never sealed: the
//! shim leaves its fresh directory to the caller, who removes it once the forks run.

use std::{
    fs,
    os::unix::fs::DirBuilderExt,
    path::{Path, PathBuf},
    time::{Duration, Instant, SystemTime},
};

use super::{
    layout::{make_private_dir, valid_token, write_atomic},
    lock::{lock_path, Lock},
    refs::Ref,
    restore::RestoreDir,
    store_error, Store,
};
use crate::{
    snapshot::manifest::{self, Manifest},
    Error, Result,
};

/// How old an unheld fresh directory must be before gc takes it: one left to a caller that
/// never removed it (a fork is made from it within seconds).
pub const FRESH_MAX_AGE: Duration = Duration::from_secs(600);

/// A fresh directory while its seal runs (or until its files are handed over): removed when
/// dropped.
pub struct Fresh {
    dir: PathBuf,
    lock: Option<Lock>,
}

/// Where a snapshot's seal stands.
#[derive(Debug, PartialEq, Eq)]
pub enum Seal {
    Sealed(Ref),
    Failed(String),
    /// Its ingest is still being written or hashed.
    Sealing,
    /// Neither: no shim is sealing it and it never was (a shim that died meanwhile).
    Lost,
}

impl Store {
    pub fn fresh_path(&self, token: &str) -> PathBuf {
        self.root.join("fresh").join(token)
    }

    /// The token of `dir` when it names a fresh directory of the store at `root`: a checkpoint
    /// asked for there is only forked from, never sealed.
    pub fn fresh_token_under(root: &Path, dir: &Path) -> Option<String> {
        let token = dir.file_name()?.to_str()?;
        (valid_token(token) && dir.parent()? == root.join("fresh")).then(|| token.to_string())
    }

    /// Links the files runsc wrote into `from` (an ingest directory) into `fresh/<token>`,
    /// with `m`, the manifest they will be sealed under, less its file list.
    pub fn publish_fresh(&self, from: &Path, token: &str, m: &Manifest) -> Result<Fresh> {
        if !valid_token(token) {
            return Err(store_error(
                &self.root,
                format!("fresh name {token:?} is invalid"),
            ));
        }
        let _shared = self.lock_store(false)?;
        let dir = self.fresh_path(token);
        let lock = Lock::take(&lock_path(&dir))?;
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| store_error(&self.root, format!("fresh {token}: {e}")))?;
        let fresh = Fresh {
            dir: dir.clone(),
            lock: Some(lock),
        };
        for name in manifest::list_files(from)? {
            let link = dir.join(&name);
            if let Some(parent) = link.parent() {
                make_private_dir(parent)?;
            }
            fs::hard_link(from.join(&name), &link)
                .map_err(|e| Error::io(format!("link {}", link.display()), e))?;
        }
        let mut unsealed = m.clone();
        unsealed.files.clear();
        let bytes =
            serde_json::to_vec_pretty(&unsealed).map_err(|e| Error::parse("manifest", e))?;
        write_atomic(&dir.join(manifest::FILE_NAME), &bytes, 0o600)?;
        Ok(fresh)
    }

    /// The manifest of fresh snapshot `token` (without its files' digests).
    pub fn fresh_manifest(&self, token: &str) -> Result<Manifest> {
        Manifest::load(&self.fresh_path(token))
    }

    /// A restore directory hard-linking fresh snapshot `token`'s files, with its manifest;
    /// None when the fresh directory is gone (the snapshot was sealed or failed meanwhile).
    pub fn prepare_fresh_restore(
        &self,
        token: &str,
        restore: &str,
    ) -> Result<Option<(Manifest, RestoreDir)>> {
        if !valid_token(token) {
            return Err(store_error(
                &self.root,
                format!("fresh name {token:?} is invalid"),
            ));
        }
        let fresh = self.fresh_path(token);
        let gone = |e: &std::io::Error| e.kind() == std::io::ErrorKind::NotFound;
        let m = match Manifest::load(&fresh) {
            Ok(m) => m,
            Err(_) if !fresh.exists() => return Ok(None),
            Err(e) => return Err(e),
        };
        let names = match manifest::list_files(&fresh) {
            Ok(names) => names,
            Err(_) if !fresh.exists() => return Ok(None),
            Err(e) => return Err(e),
        };
        let _shared = self.lock_store(false)?;
        let dir = self.begin_restore(restore)?;
        for name in names {
            let link = dir.dir().join(&name);
            if let Some(parent) = link.parent() {
                make_private_dir(parent)?;
            }
            match fs::hard_link(fresh.join(&name), &link) {
                Ok(()) => {}
                Err(e) if gone(&e) => return Ok(None),
                Err(e) => return Err(Error::io(format!("link {}", link.display()), e)),
            }
        }
        Ok(Some((m, dir)))
    }

    /// Records why snapshot `token` could not be sealed (its fresh and ingest directories are
    /// removed by their owners).
    pub fn note_seal_failure(&self, token: &str, error: &str) {
        let dir = self.root.join("failed");
        let written = make_private_dir(&dir)
            .and_then(|()| write_atomic(&dir.join(token), error.as_bytes(), 0o600));
        if let Err(e) = written {
            log::warn!("snapshot {token}: could not record its failure ({e}): {error}");
        }
    }

    /// Where snapshot `token`'s seal stands; a failure is read once (its note removed).
    pub fn seal_state(&self, token: &str) -> Seal {
        if let Some(r) = self.find_ref(token) {
            return Seal::Sealed(r);
        }
        let note = self.root.join("failed").join(token);
        if let Ok(error) = fs::read_to_string(&note) {
            let _ = fs::remove_file(&note);
            return Seal::Failed(error);
        }
        // The seal holds the ingest until it is committed, and the fresh directory until
        // the outcome is recorded.
        if self.ingest_in_progress(token) || self.fresh_in_progress(token) {
            return Seal::Sealing;
        }
        // The ref may have been written between the first look and the ingest's end.
        match self.find_ref(token) {
            Some(r) => Seal::Sealed(r),
            None => Seal::Lost,
        }
    }

    fn fresh_in_progress(&self, token: &str) -> bool {
        let dir = self.fresh_path(token);
        valid_token(token) && dir.exists() && Lock::try_take(&lock_path(&dir)).is_none()
    }

    /// Waits for snapshot `token` to be sealed, for at most `timeout`.
    pub fn wait_sealed(&self, token: &str, timeout: Duration) -> Result<Ref> {
        let deadline = Instant::now() + timeout;
        let mut pause = Duration::from_millis(1);
        loop {
            match self.seal_state(token) {
                Seal::Sealed(r) => return Ok(r),
                Seal::Failed(error) => {
                    return Err(store_error(
                        &self.root,
                        format!("snapshot {token} could not be sealed: {error}"),
                    ))
                }
                Seal::Lost => {
                    // Nobody holds its files any more: they go with it.
                    let _ = self.remove_fresh(token);
                    return Err(store_error(
                        &self.root,
                        format!(
                            "snapshot {token} was never sealed: the shim that took it ended \
                             first (see containerd's log)"
                        ),
                    ));
                }
                Seal::Sealing if Instant::now() >= deadline => {
                    return Err(store_error(
                        &self.root,
                        format!("snapshot {token} is still being sealed after {timeout:?}"),
                    ))
                }
                Seal::Sealing => {}
            }
            std::thread::sleep(pause);
            // A small snapshot seals within milliseconds of its checkpoint: looked at often.
            pause = (pause * 2).min(Duration::from_millis(4));
        }
    }

    /// Whether gc may remove fresh directory `dir` that nobody holds: old enough that its
    /// caller is done with it.
    pub(super) fn fresh_is_stale(dir: &Path) -> bool {
        fs::metadata(dir)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| SystemTime::now().duration_since(t).ok())
            .is_none_or(|age| age >= FRESH_MAX_AGE)
    }
}

impl Fresh {
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Hands the directory to the caller, who forks from it and removes it
    /// ([`Store::remove_fresh`]); gc takes it when it is left behind.
    pub fn hand_over(mut self) {
        if let Some(lock) = self.lock.take() {
            lock.remove();
        }
    }
}

impl Store {
    /// Removes fresh directory `token` once its forks run (the caller's, after a handover).
    pub fn remove_fresh(&self, token: &str) -> Result<()> {
        if !valid_token(token) {
            return Err(store_error(
                &self.root,
                format!("fresh name {token:?} is invalid"),
            ));
        }
        let dir = self.fresh_path(token);
        // A lock a dead shim left beside it goes too (a live seal holds it: kept).
        if let Some(lock) = Lock::try_take(&lock_path(&dir)) {
            lock.remove();
        }
        match fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io(format!("remove {}", dir.display()), e)),
        }
    }
}

impl Drop for Fresh {
    fn drop(&mut self) {
        if let Some(lock) = self.lock.take() {
            let _ = fs::remove_dir_all(&self.dir);
            lock.remove();
        }
    }
}
