//! Garbage collection: what no snapshot needs (a crash's leftovers, blobs no root reaches)
//! removed, and the room the blobs take.

use std::{collections::BTreeSet, fs};

use super::{
    lock::{lock_path, Lock},
    restore::link_targets,
    Store,
};
use crate::{
    snapshot::oci::{self, ImageManifest},
    Error, Result,
};

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct GcReport {
    pub blobs_removed: usize,
    pub bytes_freed: u64,
    pub stale_dirs: usize,
}

impl Store {
    /// Removes what no snapshot needs: ingest and restore directories nobody holds (a crash's
    /// leftovers), fresh directories nobody holds once they are [`super::FRESH_MAX_AGE`] old,
    /// and blobs reachable from no ref, no `extra_roots` manifest and no restore
    /// in progress.
    pub fn gc(&self, extra_roots: &[String]) -> Result<GcReport> {
        let _exclusive = self.lock_store(true)?;
        let mut report = GcReport::default();
        report.stale_dirs += self.gc_lazy();
        report.bytes_freed += self.gc_packs();
        let mut live: BTreeSet<String> = BTreeSet::new();
        for kind in ["ingest", "restores", "fresh"] {
            let dir = self.root.join(kind);
            for entry in
                fs::read_dir(&dir).map_err(|e| Error::io(format!("list {}", dir.display()), e))?
            {
                let path = entry
                    .map_err(|e| Error::io(format!("list {}", dir.display()), e))?
                    .path();
                let name = path
                    .file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .into_owned();
                if let Some(of) = name.strip_suffix(".lock") {
                    if !dir.join(of).exists() && Lock::try_take(&path).is_some() {
                        let _ = fs::remove_file(&path);
                    }
                    continue;
                }
                match Lock::try_take(&lock_path(&path)) {
                    // A fresh directory handed to a caller is unheld while it forks from it.
                    Some(_) if kind == "fresh" && !Self::fresh_is_stale(&path) => {}
                    Some(_stale) => {
                        let _ = fs::remove_dir_all(&path);
                        let _ = fs::remove_file(lock_path(&path));
                        report.stale_dirs += 1;
                    }
                    None if kind == "restores" => live.extend(link_targets(&path)),
                    None => {}
                }
            }
        }
        let roots = self
            .refs()?
            .into_iter()
            .map(|r| r.manifest)
            .chain(extra_roots.iter().cloned());
        for digest in roots {
            let Some(hex) = oci::sha256_hex_of(&digest) else {
                continue;
            };
            live.insert(hex.to_string());
            // Read as it is, unverified: a manifest changed in place still names the blobs
            // its snapshot needs (a restore refuses it; gc must not take its files).
            let Ok(m) = fs::read(self.root.join("blobs/sha256").join(hex))
                .map_err(|e| e.to_string())
                .and_then(|b| ImageManifest::parse(&b))
            else {
                log::warn!(
                    "snapshot store: manifest {digest} of a ref is unreadable: nothing is \
                     collected"
                );
                return Ok(report);
            };
            for d in std::iter::once(&m.config).chain(&m.layers) {
                if let Some(hex) = oci::sha256_hex_of(&d.digest) {
                    live.insert(hex.to_string());
                }
            }
        }
        let blobs = self.root.join("blobs/sha256");
        for entry in
            fs::read_dir(&blobs).map_err(|e| Error::io(format!("list {}", blobs.display()), e))?
        {
            let entry = entry.map_err(|e| Error::io(format!("list {}", blobs.display()), e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if live.contains(&name) {
                continue;
            }
            let size = entry.metadata().map_or(0, |m| m.len());
            if fs::remove_file(entry.path()).is_ok() {
                let _ = fs::remove_file(self.root.join("verified").join(&name));
                report.blobs_removed += 1;
                report.bytes_freed += size;
            }
        }
        Ok(report)
    }

    /// Bytes the store's blobs take.
    pub fn usage(&self) -> u64 {
        fs::read_dir(self.root.join("blobs/sha256"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.metadata().ok())
            .map(|m| m.len())
            .sum()
    }
}
