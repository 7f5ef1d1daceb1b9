//! What enters the store: a checkpoint runsc wrote into an ingest directory, committed, or a
//! snapshot fetched from elsewhere, imported. Either way its files become blobs and its ref is
//! written last.

use std::{
    collections::BTreeMap,
    fs,
    os::unix::fs::{DirBuilderExt, PermissionsExt},
    path::{Path, PathBuf},
};

use super::{
    layout::{valid_token, write_atomic},
    lock::{lock_path, Lock},
    refs::Ref,
    store_error,
    verify::Stored,
    Store,
};
use crate::{
    snapshot::{
        manifest::{self, Manifest},
        oci::{self, Descriptor, ImageManifest},
        owner::Owner,
    },
    Error, Result,
};

/// A checkpoint being written into the store; removed when dropped uncommitted.
pub struct Ingest {
    dir: PathBuf,
    token: String,
    lock: Option<Lock>,
}

/// What a snapshot adds to its files when it is committed.
pub struct Commit<'a> {
    pub namespace: &'a str,
    /// containerd's spec of the container (forks are created from it).
    pub spec: &'a [u8],
    /// The base image's manifest (or index).
    pub subject: Option<Descriptor>,
    pub annotations: BTreeMap<String, String>,
}

/// Whose a snapshot fetched from elsewhere is on this host, and where it came from.
#[derive(Debug, Clone, Default)]
pub struct Origin {
    pub owner: Option<Owner>,
    pub pulled_from: Option<String>,
}

#[derive(Debug, Clone)]
pub struct Committed {
    pub manifest: Descriptor,
    pub manifest_bytes: Vec<u8>,
    /// Bytes of files that were new to the store, and of files it already held.
    pub stored: u64,
    pub reused: u64,
}

impl Store {
    /// Starts a checkpoint into the store: a new directory for runsc, locked until committed.
    pub fn begin_ingest(&self, token: &str) -> Result<Ingest> {
        if !valid_token(token) {
            return Err(store_error(
                &self.root,
                format!("ingest name {token:?}: only letters, digits and ._+- are allowed"),
            ));
        }
        let _shared = self.lock_store(false)?;
        let dir = self.ingest_path(token);
        let lock = Lock::take(&lock_path(&dir))?;
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| {
                store_error(
                    &self.root,
                    format!("ingest {token}: {e} (a snapshot of that name is already being taken)"),
                )
            })?;
        Ok(Ingest {
            dir,
            token: token.to_string(),
            lock: Some(lock),
        })
    }

    /// Moves a sealed checkpoint's files into the store as blobs, writes its manifest and, last,
    /// its ref. The ingest directory must hold exactly the chalk manifest and its files.
    pub fn commit(&self, mut ingest: Ingest, c: Commit) -> Result<Committed> {
        let m = Manifest::load(&ingest.dir)?;
        let listed: Vec<&str> = m.files.iter().map(|f| f.path.as_str()).collect();
        if manifest::list_files(&ingest.dir)? != listed {
            return Err(store_error(
                &self.root,
                format!("ingest {}: its files are not the manifest's", ingest.token),
            ));
        }
        let chalk_bytes = fs::read(ingest.dir.join(manifest::FILE_NAME))
            .map_err(|e| Error::io(format!("read {}", ingest.dir.display()), e))?;
        let files: Vec<(String, u64, String)> = m
            .files
            .iter()
            .map(|f| (f.path.clone(), f.size, f.sha256.clone()))
            .collect();
        let _shared = self.lock_store(false)?;
        let (mut stored, mut reused) = (0, 0);
        for (name, size, hex) in &files {
            if self.adopt(&ingest.dir.join(name), hex)? {
                stored += size;
            } else {
                reused += size;
            }
        }
        let chalk_manifest = self.put(&chalk_bytes, oci::CHALK_MANIFEST)?;
        let spec = self.put(c.spec, oci::SPEC)?;
        self.put(oci::EMPTY_DATA, oci::EMPTY)?;
        let mut annotations = c.annotations;
        annotations.insert(oci::CREATED.into(), m.created.clone());
        let image = oci::snapshot_manifest(oci::Parts {
            files: &files,
            chalk_manifest,
            spec,
            subject: c.subject,
            annotations,
        });
        let bytes = image.to_bytes();
        let manifest = self.put(&bytes, oci::MANIFEST)?;
        let r = Ref {
            namespace: c.namespace.to_string(),
            token: ingest.token.clone(),
            manifest: manifest.digest.clone(),
            created: m.created.clone(),
            owner: m.owner.clone(),
            pulled_from: None,
        };
        let text = serde_json::to_vec(&r).map_err(|e| Error::parse("ref", e))?;
        write_atomic(&self.root.join("refs").join(&ingest.token), &text, 0o600)?;
        ingest.finish();
        Ok(Committed {
            manifest,
            manifest_bytes: bytes,
            stored,
            reused,
        })
    }

    /// Commits a snapshot fetched from elsewhere under ingest `ingest`'s token: its OCI
    /// manifest as fetched, the bytes of its small blobs (chalk manifest, spec, config), and
    /// each file either already in the store or written at [`Ingest::part_path`] by a caller
    /// that checked it against its digest. The manifest is read back whole (both manifests
    /// must list the same files) before the ref is written; that reading is returned too.
    pub fn import(
        &self,
        mut ingest: Ingest,
        namespace: &str,
        origin: Origin,
        manifest_bytes: &[u8],
        small: &[&[u8]],
    ) -> Result<(Committed, Stored)> {
        let bad = |m: String| store_error(&self.root, format!("import {}: {m}", ingest.token));
        let oci = ImageManifest::parse(manifest_bytes).map_err(bad)?;
        let layout = oci.layout().map_err(bad)?;
        let _shared = self.lock_store(false)?;
        let (mut stored, mut reused) = (0, 0);
        for d in &layout.files {
            let hex = oci::sha256_hex_of(&d.digest)
                .ok_or_else(|| bad(format!("{} is not a sha256 digest", d.digest)))?;
            if self.has_blob(&d.digest) {
                reused += d.size;
                continue;
            }
            if self.lazy_file(hex).is_some() {
                // Arriving: its server makes it a blob once it is whole and checked.
                continue;
            }
            let part = ingest.part_path(hex);
            let len = fs::metadata(&part).map(|m| m.len()).map_err(|e| {
                let title = d.title().unwrap_or("?");
                // Left to arrive, and its server failed already: its reason, not "not fetched".
                bad(match self.never_arrived(hex) {
                    Some(why) => format!("{} ({title}) {why}", d.digest),
                    None => format!("{} ({title}) was not fetched: {e}", d.digest),
                })
            })?;
            if len != d.size {
                return Err(bad(format!("{} is {len} bytes, not {}", d.digest, d.size)));
            }
            self.adopt(&part, hex)?;
            stored += d.size;
        }
        for bytes in small {
            self.put(bytes, "")?;
        }
        let manifest = self.put(manifest_bytes, oci::MANIFEST)?;
        let snap = self.open_snapshot(&manifest.digest)?;
        let r = Ref {
            namespace: namespace.to_string(),
            token: ingest.token.clone(),
            manifest: manifest.digest.clone(),
            created: snap.manifest.created.clone(),
            owner: origin.owner,
            pulled_from: origin.pulled_from,
        };
        let text = serde_json::to_vec(&r).map_err(|e| Error::parse("ref", e))?;
        write_atomic(&self.root.join("refs").join(&ingest.token), &text, 0o600)?;
        ingest.finish();
        let committed = Committed {
            manifest,
            manifest_bytes: manifest_bytes.to_vec(),
            stored,
            reused,
        };
        Ok((committed, snap))
    }

    /// Renames `file` into the blob `hex` (it is sealed, so its digest is known): whether it
    /// was new. A blob the store already has is kept and the file dropped.
    fn adopt(&self, file: &Path, hex: &str) -> Result<bool> {
        let blob = self.root.join("blobs/sha256").join(hex);
        if blob.exists() {
            fs::remove_file(file)
                .map_err(|e| Error::io(format!("remove {}", file.display()), e))?;
            return Ok(false);
        }
        fs::set_permissions(file, fs::Permissions::from_mode(0o400))
            .map_err(|e| Error::io(format!("chmod {}", file.display()), e))?;
        fs::rename(file, &blob)
            .map_err(|e| Error::io(format!("move {} into the store", file.display()), e))?;
        self.record_identity(hex)?;
        Ok(true)
    }

    /// Whether blob `digest` is in the store, held for `ingest` until its import: linked in
    /// as the ingest's part, so that a gc meanwhile (a failed pull's blobs go at the next)
    /// removes only the blob's own name and [`Store::import`] adopts the part again. Without
    /// it, a pull that counted on a blob another pull's cleanup then collected failed at its
    /// import ("was not fetched", FLAKES.md row 23).
    pub fn hold_blob(&self, ingest: &Ingest, digest: &str) -> bool {
        let (Ok(blob), Some(hex)) = (self.blob_path(digest), oci::sha256_hex_of(digest)) else {
            return false;
        };
        match fs::hard_link(&blob, ingest.part_path(hex)) {
            Ok(()) => true,
            Err(e) => e.kind() == std::io::ErrorKind::AlreadyExists,
        }
    }

    /// Stores `bytes` as a blob (a no-op when it exists): its descriptor.
    pub(super) fn put(&self, bytes: &[u8], media_type: &str) -> Result<Descriptor> {
        let digest = oci::sha256_digest(bytes);
        let blob = self.blob_path(&digest)?;
        if !blob.exists() {
            write_atomic(&blob, bytes, 0o400)?;
            self.record_identity(&digest["sha256:".len()..])?;
        }
        Ok(Descriptor::new(media_type, &digest, bytes.len() as u64))
    }

    /// Whether ingest `token` is being written now (its directory's lock is held: by a shim
    /// checkpointing into it, or a pull).
    pub fn ingest_in_progress(&self, token: &str) -> bool {
        let dir = self.ingest_path(token);
        valid_token(token) && dir.exists() && Lock::try_take(&lock_path(&dir)).is_none()
    }
}

impl Ingest {
    /// The directory runsc checkpoints into.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where a fetched blob `hex` is written before [`Store::import`] moves it in.
    pub fn part_path(&self, hex: &str) -> PathBuf {
        self.dir.join(format!("{hex}.part"))
    }

    pub fn token(&self) -> &str {
        &self.token
    }

    fn finish(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
        if let Some(lock) = self.lock.take() {
            lock.remove();
        }
    }
}

impl Drop for Ingest {
    fn drop(&mut self) {
        if self.lock.is_some() {
            self.finish();
        }
    }
}
