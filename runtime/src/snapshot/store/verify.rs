//! Reading the store back and trusting it: small blobs checked against their digests, a
//! snapshot's two manifests against each other, file blobs by the identity they had when last
//! hashed (and hashed again when it changed).

use std::{
    fs,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use super::{layout::write_atomic, store_error, Store};
use crate::{
    snapshot::{
        hash,
        manifest::{self, Manifest},
        oci::{self, ImageManifest, Layout},
    },
    Error, Result,
};

/// A snapshot read back from the store, every small blob checked against its digest.
#[derive(Debug, Clone)]
pub struct Stored {
    pub digest: String,
    pub manifest_bytes: Vec<u8>,
    pub oci: ImageManifest,
    pub layout: Layout,
    pub manifest: Manifest,
    pub spec: Vec<u8>,
}

impl Store {
    /// A small blob, checked against its digest.
    pub fn read_blob(&self, digest: &str) -> Result<Vec<u8>> {
        let path = self.blob_path(digest)?;
        let bytes = fs::read(&path).map_err(|e| {
            store_error(
                &self.root,
                format!("blob {digest} is missing or unreadable: {e}"),
            )
        })?;
        if oci::sha256_digest(&bytes) != digest {
            return Err(store_error(
                &self.root,
                format!(
                    "blob {digest} does not match its digest: the store was changed or damaged"
                ),
            ));
        }
        Ok(bytes)
    }

    /// Snapshot `digest`: its manifest, chalk manifest and spec, each checked, and its files
    /// listed alike in both manifests.
    pub fn open_snapshot(&self, digest: &str) -> Result<Stored> {
        let manifest_bytes = self.read_blob(digest)?;
        let bad = |m: String| store_error(&self.root, format!("snapshot {digest}: {m}"));
        let oci = ImageManifest::parse(&manifest_bytes).map_err(bad)?;
        let layout = oci.layout().map_err(bad)?;
        let chalk = self.read_blob(&layout.chalk_manifest.digest)?;
        let manifest = Manifest::parse(&chalk, &self.root)?;
        let spec = self.read_blob(&layout.spec.digest)?;
        if !layout.lists(&manifest) {
            return Err(bad(
                "its layers and its chalk manifest list different files".to_string(),
            ));
        }
        Ok(Stored {
            digest: digest.to_string(),
            manifest_bytes,
            oci,
            layout,
            manifest,
            spec,
        })
    }

    /// Checks every file blob of snapshot `digest`: present, of its size, and of its digest
    /// (hashed again, in parallel, only where its identity changed since it was last hashed).
    /// Blobs in `arriving` are not here yet: their server checks each piece it serves.
    pub fn verify_blobs(&self, digest: &str, m: &Manifest, arriving: &[String]) -> Result<()> {
        let mut unsure = Vec::new();
        for f in m.files.iter().filter(|f| !arriving.contains(&f.sha256)) {
            let blob = self.root.join("blobs/sha256").join(&f.sha256);
            let meta = fs::metadata(&blob).map_err(|_| self.absent(digest, f))?;
            if meta.len() != f.size {
                return Err(corrupt(
                    &self.root,
                    digest,
                    f,
                    &format!("{} bytes", meta.len()),
                ));
            }
            if !identity_recorded(&self.root.join("verified").join(&f.sha256), &meta) {
                unsure.push(f);
            }
        }
        let paths: Vec<PathBuf> = unsure
            .iter()
            .map(|f| self.root.join("blobs/sha256").join(&f.sha256))
            .collect();
        for (f, d) in unsure.iter().zip(hash::hash_files(&paths, 0)?) {
            if d.sha256 != f.sha256 {
                return Err(corrupt(
                    &self.root,
                    digest,
                    f,
                    &format!("sha256 {}", d.sha256),
                ));
            }
            self.record_identity(&f.sha256)?;
        }
        Ok(())
    }

    /// Why file `f` of snapshot `digest` cannot be restored when its blob is not in the
    /// store: the reason its server gave, when the pull left it to arrive and serving failed
    /// before this restore looked (a bad piece or a registry gone, found by the background
    /// fetch first; the server has dropped the pull's record by then); else that the store
    /// lost it.
    fn absent(&self, digest: &str, f: &manifest::FileEntry) -> Error {
        let why = match self.never_arrived(&f.sha256) {
            Some(why) => format!(
                "blob sha256:{} ({}) {why}; nothing was restored (pull the snapshot again)",
                f.sha256, f.path
            ),
            None => format!(
                "blob sha256:{} ({}) is missing; the snapshot cannot be restored: delete it",
                f.sha256, f.path
            ),
        };
        store_error(&self.root, format!("snapshot {digest}: {why}"))
    }

    /// Records again what the blobs of `m` look like, after links to their inodes (which
    /// change their change times) were made or removed by the store itself.
    pub fn record_identities(&self, m: &Manifest) -> Result<()> {
        for f in &m.files {
            self.record_identity(&f.sha256)?;
        }
        Ok(())
    }

    /// Records what blob `hex` looks like now that its content is known to match its name.
    pub(super) fn record_identity(&self, hex: &str) -> Result<()> {
        record_identity_at(
            &self.root.join("blobs/sha256").join(hex),
            &self.root.join("verified").join(hex),
        )
    }
}

/// Records at `record` what `file` looks like now (its content known to be right).
pub(super) fn record_identity_at(file: &Path, record: &Path) -> Result<()> {
    let meta = fs::metadata(file).map_err(|e| Error::io(format!("stat {}", file.display()), e))?;
    write_atomic(record, identity(&meta).as_bytes(), 0o600)
}

/// Whether a file that looks as `meta` says is the one `record` was made of.
pub(super) fn identity_recorded(record: &Path, meta: &fs::Metadata) -> bool {
    fs::read_to_string(record).is_ok_and(|r| r == identity(meta))
}

/// What identifies a blob's content without reading it: a change to any of these (a write, a
/// replaced file, a reboot that may have lost unflushed pages) means hashing it again.
fn identity(meta: &fs::Metadata) -> String {
    format!(
        "boot {} dev {} ino {} size {} mtime {}.{} ctime {}.{}\n",
        boot_id(),
        meta.dev(),
        meta.ino(),
        meta.len(),
        meta.mtime(),
        meta.mtime_nsec(),
        meta.ctime(),
        meta.ctime_nsec()
    )
}

fn boot_id() -> String {
    fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

fn corrupt(root: &Path, digest: &str, f: &manifest::FileEntry, found: &str) -> Error {
    store_error(
        root,
        format!(
            "snapshot {digest}: blob sha256:{} ({}) has {found}, not what it is named for: the \
             store was changed or damaged; nothing was restored (delete the snapshot)",
            f.sha256, f.path
        ),
    )
}
