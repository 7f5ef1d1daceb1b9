//! Packs this host pushed, kept beside the catalog that names them: a later pull of a
//! snapshot whose pieces are in one (the same sandbox resumed here after `suspend --to
//! --release`) reads them from disk instead of the registry. Every piece read from a kept pack
//! is checked against its digest as one from the registry is, unless the host vouches for the
//! snapshot's index (`Store::catalog_vouches`) and the pack is as it was kept (its identity,
//! as for a verified blob: the same inode, size and times, since this boot). A pack no catalog
//! entry names goes at the next gc.
//!
//! ```text
//! <root>/packs/<hex>         a pack as pushed (0400)
//! <root>/packs/<hex>.seen    its identity when it was kept
//! ```

use std::{collections::BTreeSet, fs, path::Path, path::PathBuf};

use super::{
    layout::make_private_dir,
    verify::{identity_recorded, record_identity_at},
    Store,
};
use crate::{snapshot::oci, Error, Result};

impl Store {
    fn packs_dir(&self) -> PathBuf {
        self.root.join("packs")
    }

    /// Keeps the pack at `file` (on the store's filesystem) as pack `digest`.
    pub fn keep_pack(&self, file: &Path, digest: &str) -> Result<()> {
        let hex = oci::sha256_hex_of(digest)
            .ok_or_else(|| super::store_error(&self.root, format!("{digest:?} is not a digest")))?;
        make_private_dir(&self.packs_dir())?;
        let to = self.packs_dir().join(hex);
        fs::set_permissions(file, std::os::unix::fs::PermissionsExt::from_mode(0o400))
            .and_then(|_| fs::rename(file, &to))
            .map_err(|e| Error::io(format!("keep pack {}", file.display()), e))?;
        record_identity_at(&to, &self.packs_dir().join(format!("{hex}.seen")))
    }

    /// The kept pack `digest`, if this host has it.
    pub fn kept_pack(&self, digest: &str) -> Option<PathBuf> {
        let path = self.packs_dir().join(oci::sha256_hex_of(digest)?);
        path.exists().then_some(path)
    }

    /// Whether kept pack `digest` is as it was when kept (nothing wrote or replaced it, and
    /// the host has not rebooted since, which may have lost pages not yet on disk).
    pub fn kept_pack_unchanged(&self, digest: &str) -> bool {
        let Some(hex) = oci::sha256_hex_of(digest) else {
            return false;
        };
        fs::metadata(self.packs_dir().join(hex))
            .is_ok_and(|m| identity_recorded(&self.packs_dir().join(format!("{hex}.seen")), &m))
    }

    /// Removes the kept packs no catalog entry names: their bytes freed.
    pub(super) fn gc_packs(&self) -> u64 {
        let Ok(list) = fs::read_dir(self.packs_dir()) else {
            return 0;
        };
        let named: BTreeSet<String> = self
            .catalog_repositories()
            .iter()
            .flat_map(|dir| self.catalog_entries_in(dir))
            .flat_map(|e| e.index.packs)
            .filter_map(|d| oci::sha256_hex_of(&d).map(String::from))
            .collect();
        let mut freed = 0;
        for entry in list.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !named.contains(name.trim_end_matches(".seen")) {
                let size = entry.metadata().map_or(0, |m| m.len());
                if fs::remove_file(entry.path()).is_ok() && !name.ends_with(".seen") {
                    freed += size;
                }
            }
        }
        freed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::{memory::MemoryIndex, memory::PageTable, store::CatalogEntry};

    #[test]
    fn a_kept_pack_stays_while_a_catalog_entry_names_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let (named, other) = (
            format!("sha256:{}", "a".repeat(64)),
            format!("sha256:{}", "b".repeat(64)),
        );
        for d in [&named, &other] {
            let file = dir.path().join("ingest/pack");
            fs::write(&file, b"frames").unwrap();
            store.keep_pack(&file, d).unwrap();
            assert!(store.kept_pack(d).is_some());
            assert!(store.kept_pack_unchanged(d));
        }
        // Anything done to a kept pack (here its mode: a new change time) and it is read as
        // any pack from a registry is, checked piece by piece.
        let kept = store.kept_pack(&other).unwrap();
        fs::set_permissions(&kept, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        assert!(!store.kept_pack_unchanged(&other));
        let entry = CatalogEntry {
            id: format!("sha256:{}", "c".repeat(64)),
            packed: format!("sha256:{}", "d".repeat(64)),
            sandbox_id: "box".into(),
            recipients: None,
            saved: 1,
            index: MemoryIndex {
                size: 0,
                depth: 0,
                packs: vec![named.clone()],
                pieces: Vec::new(),
                extents: Vec::new(),
            },
            pack_sizes: vec![6],
        };
        let pages = PageTable {
            size: 0,
            pages: Vec::new(),
        };
        store
            .catalog_save("reg/repo", &entry, Some(&pages))
            .unwrap();
        let report = store.gc(&[]).unwrap();
        assert_eq!(report.bytes_freed, 6);
        assert!(store.kept_pack(&named).is_some());
        assert!(store.kept_pack_unchanged(&named));
        assert!(store.kept_pack(&other).is_none());
        assert!(!store.kept_pack_unchanged(&other));
        assert!(!dir
            .path()
            .join("packs")
            .join(format!("{}.seen", "b".repeat(64)))
            .exists());
        assert!(store.kept_pack("sha256:nope").is_none());
    }
}
