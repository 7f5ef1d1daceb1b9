//! What this host knows of the packed snapshots it pushed to, or pulled from, each repository:
//! their memory index (which pieces the registry holds, in which packs) and the page digests
//! of their memory, so the next push of a sandbox there sends only the pages that are new.
//! Kept apart from the snapshots themselves: `suspend --to --release` drops the local copy, and
//! the next suspend still needs to know what the registry has.
//!
//! ```text
//! <root>/catalog/<repository key>/<id hex>.json    the entry (root-only)
//! <root>/catalog/<repository key>/<id hex>.pages   the page digests of its memory
//! <root>/catalog/<repository key>/<id hex>.vouched the packed form whose index this host
//!                                                  saw put that memory together
//! ```
//!
//! The newest [`KEEP`] entries of a repository are kept; the page digests say what memory
//! held (as the memory itself does), so they are root-only like it.

use std::{fs, path::PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{layout::make_private_dir, layout::write_atomic, Store};
use crate::{
    snapshot::memory::{MemoryIndex, PageTable},
    snapshot::oci,
    Error, Result,
};

/// Entries kept per repository: enough for a sandbox and a few forks pushed beside it.
pub const KEEP: usize = 8;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CatalogEntry {
    /// The snapshot's id (its plain manifest's digest).
    pub id: String,
    /// The digest of its packed manifest in the repository.
    pub packed: String,
    pub sandbox_id: String,
    /// Whom its pieces are encrypted for (a digest of the recipients; None: plain).
    pub recipients: Option<String>,
    /// When it was written (nanoseconds since the epoch): newest first.
    pub saved: u128,
    pub index: MemoryIndex,
    /// The size of each of the index's packs, in its order.
    pub pack_sizes: Vec<u64>,
}

impl Store {
    fn catalog_dir(&self, repository: &str) -> PathBuf {
        let clean: String = repository
            .chars()
            .take(100)
            .map(|c| {
                if c.is_ascii_alphanumeric() || "._-".contains(c) {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let hash = format!("{:x}", Sha256::digest(repository.as_bytes()));
        self.root
            .join("catalog")
            .join(format!("{clean}-{}", &hash[..16]))
    }

    /// Records `entry` of `repository` (`registry/name`) with its page digests, and drops
    /// the oldest past [`KEEP`]. Page digests given here are of the memory the entry's index
    /// puts together (pushed from it, or pulled and checked whole): the host vouches for it.
    pub fn catalog_save(
        &self,
        repository: &str,
        entry: &CatalogEntry,
        pages: Option<&PageTable>,
    ) -> Result<()> {
        let hex = oci::sha256_hex_of(&entry.id).ok_or_else(|| {
            super::store_error(&self.root, format!("{:?} is not a digest", entry.id))
        })?;
        let dir = self.catalog_dir(repository);
        make_private_dir(&dir)?;
        if let Some(pages) = pages {
            write_atomic(&dir.join(format!("{hex}.pages")), &pages.to_bytes(), 0o600)?;
            self.catalog_vouch(&dir, hex, &entry.packed)?;
        }
        let json = serde_json::to_vec(entry).map_err(|e| Error::parse("catalog entry", e))?;
        write_atomic(&dir.join(format!("{hex}.json")), &json, 0o600)?;
        for old in self.catalog_entries(repository).iter().skip(KEEP) {
            if let Some(hex) = oci::sha256_hex_of(&old.id) {
                let _ = fs::remove_file(dir.join(format!("{hex}.json")));
                let _ = fs::remove_file(dir.join(format!("{hex}.pages")));
                let _ = fs::remove_file(dir.join(format!("{hex}.vouched")));
            }
        }
        Ok(())
    }

    /// The entries of `repository`, newest first (an unreadable one is left out).
    pub fn catalog_entries(&self, repository: &str) -> Vec<CatalogEntry> {
        self.catalog_entries_in(&self.catalog_dir(repository))
    }

    /// Whether this host vouches for packed snapshot `packed` (id `id`) of `repository`: it
    /// saw that packed form's index put together the memory whose digest the id names (it
    /// built the index from the memory it pushed, or checked the whole file a pull put
    /// together), and has the page digests of that memory. The packs this host kept for it
    /// are its own writing: a restore may read them unhashed. Another packed form of the
    /// same id (another index) is not vouched for.
    pub fn catalog_vouches(&self, repository: &str, id: &str, packed: &str) -> bool {
        let Some(hex) = oci::sha256_hex_of(id) else {
            return false;
        };
        let dir = self.catalog_dir(repository);
        dir.join(format!("{hex}.pages")).is_file()
            && fs::read_to_string(dir.join(format!("{hex}.vouched")))
                .is_ok_and(|v| v.trim() == packed)
    }

    fn catalog_vouch(&self, dir: &std::path::Path, hex: &str, packed: &str) -> Result<()> {
        write_atomic(
            &dir.join(format!("{hex}.vouched")),
            packed.as_bytes(),
            0o600,
        )
    }

    /// The directories of the repositories this host keeps entries of.
    pub(super) fn catalog_repositories(&self) -> Vec<PathBuf> {
        fs::read_dir(self.root.join("catalog"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_dir())
            .collect()
    }

    /// The entries in catalog directory `dir`, newest first.
    pub(super) fn catalog_entries_in(&self, dir: &std::path::Path) -> Vec<CatalogEntry> {
        let Ok(list) = fs::read_dir(dir) else {
            return Vec::new();
        };
        let mut out: Vec<CatalogEntry> = list
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".json"))
            .filter_map(|e| fs::read(e.path()).ok())
            .filter_map(|b| serde_json::from_slice::<CatalogEntry>(&b).ok())
            .filter(|e| e.index.check().is_ok() && e.pack_sizes.len() == e.index.packs.len())
            .collect();
        out.sort_by_key(|e| std::cmp::Reverse(e.saved));
        out
    }

    /// Records the page digests of snapshot `id` of `repository`, found after its entry;
    /// with `put_together_by`, the packed form whose index put that memory together (every
    /// piece and the whole file checked): the host vouches for it from then on.
    pub fn catalog_pages_save(
        &self,
        repository: &str,
        id: &str,
        pages: &PageTable,
        put_together_by: Option<&str>,
    ) -> Result<()> {
        let hex = oci::sha256_hex_of(id)
            .ok_or_else(|| super::store_error(&self.root, format!("{id:?} is not a digest")))?;
        let dir = self.catalog_dir(repository);
        make_private_dir(&dir)?;
        write_atomic(&dir.join(format!("{hex}.pages")), &pages.to_bytes(), 0o600)?;
        match put_together_by {
            Some(packed) => self.catalog_vouch(&dir, hex, packed),
            None => Ok(()),
        }
    }

    /// The page digests recorded with snapshot `id` of `repository`.
    pub fn catalog_pages(&self, repository: &str, id: &str) -> Result<PageTable> {
        let hex = oci::sha256_hex_of(id)
            .ok_or_else(|| super::store_error(&self.root, format!("{id:?} is not a digest")))?;
        let path = self.catalog_dir(repository).join(format!("{hex}.pages"));
        let bytes =
            fs::read(&path).map_err(|e| Error::io(format!("read {}", path.display()), e))?;
        PageTable::parse(&bytes)
            .map_err(|e| super::store_error(&self.root, format!("{}: {e}", path.display())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(n: u8, saved: u128) -> CatalogEntry {
        CatalogEntry {
            id: format!("sha256:{}", format!("{n:02x}").repeat(32)),
            packed: format!("sha256:{}", "ff".repeat(32)),
            sandbox_id: "box".into(),
            recipients: None,
            saved,
            index: MemoryIndex {
                size: 0,
                depth: 0,
                packs: Vec::new(),
                pieces: Vec::new(),
                extents: Vec::new(),
            },
            pack_sizes: Vec::new(),
        }
    }

    #[test]
    fn entries_come_newest_first_and_the_oldest_go() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let pages = PageTable {
            size: 4096,
            pages: vec![[3; 32]],
        };
        for n in 0..(KEEP as u8 + 2) {
            store
                .catalog_save("reg:5000/a/b", &entry(n, n as u128), Some(&pages))
                .unwrap();
        }
        store
            .catalog_save("reg:5000/other", &entry(50, 0), None)
            .unwrap();
        let got = store.catalog_entries("reg:5000/a/b");
        assert_eq!(got.len(), KEEP);
        assert_eq!(got[0], entry(KEEP as u8 + 1, KEEP as u128 + 1));
        assert_eq!(
            store.catalog_pages("reg:5000/a/b", &got[0].id).unwrap(),
            pages
        );
        assert!(store
            .catalog_pages("reg:5000/a/b", &entry(0, 0).id)
            .is_err());
        assert_eq!(store.catalog_entries("reg:5000/other").len(), 1);
        assert!(store
            .catalog_pages("reg:5000/other", &entry(50, 0).id)
            .is_err());
        store
            .catalog_pages_save("reg:5000/other", &entry(50, 0).id, &pages, None)
            .unwrap();
        assert_eq!(
            store
                .catalog_pages("reg:5000/other", &entry(50, 0).id)
                .unwrap(),
            pages
        );
        assert!(store.catalog_entries("nowhere").is_empty());
    }

    #[test]
    fn only_a_packed_form_whose_index_put_the_memory_together_is_vouched_for() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let pages = PageTable {
            size: 4096,
            pages: vec![[3; 32]],
        };
        let hashed = entry(1, 1);
        let mut unhashed = entry(2, 2);
        unhashed.packed = format!("sha256:{}", "ee".repeat(32));
        store
            .catalog_save("reg:5000/a/b", &hashed, Some(&pages))
            .unwrap();
        store.catalog_save("reg:5000/a/b", &unhashed, None).unwrap();
        assert!(store.catalog_vouches("reg:5000/a/b", &hashed.id, &hashed.packed));
        // Pulled lazily, still arriving: nobody here saw its index put its memory together.
        assert!(!store.catalog_vouches("reg:5000/a/b", &unhashed.id, &unhashed.packed));
        // Its page digests from the memory file in the store: the file, not the index.
        store
            .catalog_pages_save("reg:5000/a/b", &unhashed.id, &pages, None)
            .unwrap();
        assert!(!store.catalog_vouches("reg:5000/a/b", &unhashed.id, &unhashed.packed));
        // Once all of it arrived, every piece and the whole checked.
        store
            .catalog_pages_save("reg:5000/a/b", &unhashed.id, &pages, Some(&unhashed.packed))
            .unwrap();
        assert!(store.catalog_vouches("reg:5000/a/b", &unhashed.id, &unhashed.packed));
        // The same id pulled again in another packed form (another index): its entry now
        // names that form, but the host saw only the first put the memory together.
        let mut again = hashed.clone();
        again.packed = format!("sha256:{}", "dd".repeat(32));
        store.catalog_save("reg:5000/a/b", &again, None).unwrap();
        assert!(!store.catalog_vouches("reg:5000/a/b", &again.id, &again.packed));
        assert!(store.catalog_vouches("reg:5000/a/b", &hashed.id, &hashed.packed));
        // Another repository, or no digest.
        assert!(!store.catalog_vouches("reg:5000/c", &hashed.id, &hashed.packed));
        assert!(!store.catalog_vouches("reg:5000/a/b", "not a digest", &hashed.packed));
    }
}
