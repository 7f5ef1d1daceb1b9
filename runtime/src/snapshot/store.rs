//! The snapshot store: every file runsc writes kept once, as a content-addressed blob, and each
//! snapshot an OCI manifest naming its blobs (see [`super::oci`]). runsc checkpoints straight
//! into an ingest directory of the store, on the same filesystem as the blobs, so storing a
//! file is a rename and restoring one is a symlink: no byte is copied on the way in or out.
//!
//! ```text
//! <root>/lock                     shared while ingesting or linking, exclusive for gc
//! <root>/blobs/sha256/<hex>       read-only blobs (0400), root-only directories (0700)
//! <root>/verified/<hex>           the identity a blob had when it was last hashed
//! <root>/ingest/<token>/          a checkpoint being written; <token>.lock held meanwhile
//! <root>/refs/<token>             a completed snapshot: its manifest digest (gc root)
//! <root>/restores/<token>/        symlinks runsc restores from; <token>.lock held meanwhile
//! ```
//!
//! Guarantees: a ref is written only after all of its blobs are in place, so a snapshot never
//! reads completed without them; a crash leaves an unlocked ingest or restore directory and
//! unreferenced blobs, which [`Store::gc`] removes; a blob is hashed when it enters the store
//! and again only when its identity (inode, size, times, boot) changed since.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs::{self, File, OpenOptions},
    io::Write,
    os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt},
    os::unix::io::AsRawFd,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

use super::{
    hash,
    manifest::{self, Manifest},
    oci::{self, Descriptor, ImageManifest, Layout},
};
use crate::{Error, Result};

/// Where a host's snapshots live unless the runtime options say otherwise.
pub const DEFAULT_ROOT: &str = "/var/lib/chalk/snapshots";
/// The one file of a checkpoint that points into the store: what a client hands containerd
/// (as a tiny checkpoint tar) to restore a stored snapshot in place on any containerd.
pub const POINTER: &str = "chalk.restore.json";

/// Whether `dir` holds exactly one plain file, a [`POINTER`] (what containerd unpacks from a
/// stored snapshot's checkpoint: no memory).
pub fn holds_only_a_pointer(dir: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    match entries.collect::<Vec<_>>().as_slice() {
        [Ok(e)] => e.file_type().is_ok_and(|t| t.is_file()) && e.file_name() == POINTER,
        _ => false,
    }
}

/// The content of [`POINTER`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Pointer {
    /// The snapshot's manifest digest.
    pub snapshot: String,
}

impl Pointer {
    /// The pointer in checkpoint directory `dir`, if it is one (its only file).
    pub fn read(dir: &Path) -> Result<Option<Pointer>> {
        let path = dir.join(POINTER);
        let Ok(bytes) = fs::read(&path) else {
            return Ok(None);
        };
        let bad = |m: String| store_error(dir, format!("{POINTER}: {m}"));
        let p: Pointer = serde_json::from_slice(&bytes).map_err(|e| bad(e.to_string()))?;
        if oci::sha256_hex_of(&p.snapshot).is_none() {
            return Err(bad(format!("{:?} is not a sha256 digest", p.snapshot)));
        }
        let others = fs::read_dir(dir)
            .map_err(|e| Error::io(format!("list {}", dir.display()), e))?
            .flatten()
            .any(|e| e.file_name() != POINTER);
        if others {
            return Err(bad(
                "a pointer to a stored snapshot must be the checkpoint's only file".into(),
            ));
        }
        Ok(Some(p))
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a pointer serializes")
    }
}

pub struct Store {
    root: PathBuf,
}

/// A checkpoint being written into the store; removed when dropped uncommitted.
pub struct Ingest {
    dir: PathBuf,
    token: String,
    lock: Option<Lock>,
}

/// A directory of symlinks to a snapshot's blobs, named as runsc wrote them; removed (with
/// its lock, which keeps gc off the blobs) when dropped.
#[derive(Debug)]
pub struct RestoreDir {
    dir: PathBuf,
    lock: Option<Lock>,
}

/// A completed snapshot in the store: the gc root its record stands for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ref {
    pub namespace: String,
    pub token: String,
    /// The snapshot's manifest digest.
    pub manifest: String,
    pub created: String,
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

#[derive(Debug, Clone)]
pub struct Committed {
    pub manifest: Descriptor,
    pub manifest_bytes: Vec<u8>,
    /// Bytes of files that were new to the store, and of files it already held.
    pub stored: u64,
    pub reused: u64,
}

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

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct GcReport {
    pub blobs_removed: usize,
    pub bytes_freed: u64,
    pub stale_dirs: usize,
}

impl Store {
    /// Opens (making it, root-only, if needed) the store at `root`.
    pub fn open(root: &Path) -> Result<Store> {
        if !root.is_absolute() {
            return Err(store_error(root, "the store must be an absolute path"));
        }
        let store = Store {
            root: root.to_path_buf(),
        };
        for d in ["blobs/sha256", "verified", "ingest", "refs", "restores"] {
            make_private_dir(&root.join(d))?;
        }
        // Snapshots hold memory and secrets: nothing but root walks into the store.
        for d in [root.to_path_buf(), root.join("blobs")] {
            fs::set_permissions(&d, fs::Permissions::from_mode(0o700))
                .map_err(|e| Error::io(format!("chmod {}", d.display()), e))?;
        }
        Ok(store)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The name of the ref (and ingest directory) of snapshot record `name` in `namespace`.
    pub fn token(namespace: &str, name: &str) -> String {
        let clean: String = name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "._-".contains(c) {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        format!("{namespace}+{clean}")
    }

    pub fn ingest_path(&self, token: &str) -> PathBuf {
        self.root.join("ingest").join(token)
    }

    /// The token of `dir` when it names an ingest directory of the store at `root`, by path
    /// alone (nothing is opened or made).
    pub fn ingest_token_under(root: &Path, dir: &Path) -> Option<String> {
        let token = dir.file_name()?.to_str()?;
        (valid_token(token) && dir.parent()? == root.join("ingest")).then(|| token.to_string())
    }

    pub fn blob_path(&self, digest: &str) -> Result<PathBuf> {
        let hex = oci::sha256_hex_of(digest)
            .ok_or_else(|| store_error(&self.root, format!("{digest:?} is not a sha256 digest")))?;
        Ok(self.root.join("blobs/sha256").join(hex))
    }

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

    /// Whether the store holds blob `digest` (a restore verifies its content).
    pub fn has_blob(&self, digest: &str) -> bool {
        self.blob_path(digest).is_ok_and(|p| p.exists())
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
            let part = ingest.part_path(hex);
            let len = fs::metadata(&part).map(|m| m.len()).map_err(|e| {
                bad(format!(
                    "{} ({}) was not fetched: {e}",
                    d.digest,
                    d.title().unwrap_or("?")
                ))
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

    /// Stores `bytes` as a blob (a no-op when it exists): its descriptor.
    fn put(&self, bytes: &[u8], media_type: &str) -> Result<Descriptor> {
        let digest = oci::sha256_digest(bytes);
        let blob = self.blob_path(&digest)?;
        if !blob.exists() {
            write_atomic(&blob, bytes, 0o400)?;
            self.record_identity(&digest["sha256:".len()..])?;
        }
        Ok(Descriptor::new(media_type, &digest, bytes.len() as u64))
    }

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
        let from_layers: Vec<(&str, u64, &str)> = layout
            .files
            .iter()
            .map(|d| {
                (
                    d.title().unwrap_or_default(),
                    d.size,
                    &d.digest["sha256:".len()..],
                )
            })
            .collect();
        let from_manifest: Vec<(&str, u64, &str)> = manifest
            .files
            .iter()
            .map(|f| (f.path.as_str(), f.size, f.sha256.as_str()))
            .collect();
        if from_layers != from_manifest {
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

    /// A directory runsc can restore `snap` from, its files symlinks to the blobs; each blob
    /// verified first (by identity, or hashed again when that changed). Held until dropped.
    pub fn prepare_restore(&self, snap: &Stored, token: &str) -> Result<RestoreDir> {
        if !valid_token(token) {
            return Err(store_error(
                &self.root,
                format!("restore name {token:?} is invalid"),
            ));
        }
        let _shared = self.lock_store(false)?;
        let dir = self.root.join("restores").join(token);
        let lock = Lock::take(&lock_path(&dir))?;
        let restore = RestoreDir {
            dir: dir.clone(),
            lock: Some(lock),
        };
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| store_error(&self.root, format!("restore {token}: {e}")))?;
        self.verify_blobs(&snap.digest, &snap.manifest)?;
        for f in &snap.manifest.files {
            let link = dir.join(&f.path);
            if let Some(parent) = link.parent() {
                make_private_dir(parent)?;
            }
            let blob = self.root.join("blobs/sha256").join(&f.sha256);
            std::os::unix::fs::symlink(&blob, &link)
                .map_err(|e| Error::io(format!("link {}", link.display()), e))?;
        }
        Ok(restore)
    }

    /// Checks every file blob of snapshot `digest`: present, of its size, and of its digest
    /// (hashed again, in parallel, only where its identity changed since it was last hashed).
    pub fn verify_blobs(&self, digest: &str, m: &Manifest) -> Result<()> {
        let mut unsure = Vec::new();
        for f in &m.files {
            let blob = self.root.join("blobs/sha256").join(&f.sha256);
            let meta = fs::metadata(&blob).map_err(|_| {
                store_error(
                    &self.root,
                    format!(
                        "snapshot {digest}: blob sha256:{} ({}) is missing; the snapshot cannot \
                         be restored: delete it",
                        f.sha256, f.path
                    ),
                )
            })?;
            if meta.len() != f.size {
                return Err(corrupt(
                    &self.root,
                    digest,
                    f,
                    &format!("{} bytes", meta.len()),
                ));
            }
            if self.identity_of(&f.sha256).as_deref() != Some(&identity(&meta)) {
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

    fn identity_of(&self, hex: &str) -> Option<String> {
        fs::read_to_string(self.root.join("verified").join(hex)).ok()
    }

    /// Records what blob `hex` looks like now that its content is known to match its name.
    fn record_identity(&self, hex: &str) -> Result<()> {
        let blob = self.root.join("blobs/sha256").join(hex);
        let meta =
            fs::metadata(&blob).map_err(|e| Error::io(format!("stat {}", blob.display()), e))?;
        write_atomic(
            &self.root.join("verified").join(hex),
            identity(&meta).as_bytes(),
            0o600,
        )
    }

    pub fn refs(&self) -> Result<Vec<Ref>> {
        let dir = self.root.join("refs");
        let mut out = Vec::new();
        for entry in
            fs::read_dir(&dir).map_err(|e| Error::io(format!("list {}", dir.display()), e))?
        {
            let path = entry
                .map_err(|e| Error::io(format!("list {}", dir.display()), e))?
                .path();
            if path.to_string_lossy().ends_with(".tmp") {
                continue;
            }
            match fs::read(&path)
                .ok()
                .and_then(|b| serde_json::from_slice::<Ref>(&b).ok())
            {
                Some(r) => out.push(r),
                None => log::warn!("snapshot store: unreadable ref {}", path.display()),
            }
        }
        out.sort_by(|a, b| a.token.cmp(&b.token));
        Ok(out)
    }

    /// Whether ingest `token` is being written now (its directory's lock is held: by a shim
    /// checkpointing into it, or a pull).
    pub fn ingest_in_progress(&self, token: &str) -> bool {
        let dir = self.ingest_path(token);
        valid_token(token) && dir.exists() && Lock::try_take(&lock_path(&dir)).is_none()
    }

    pub fn find_ref(&self, token: &str) -> Option<Ref> {
        if !valid_token(token) {
            return None;
        }
        let bytes = fs::read(self.root.join("refs").join(token)).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// Drops the ref `token` (its blobs go at the next gc unless another snapshot has them).
    pub fn remove_ref(&self, token: &str) -> Result<()> {
        if !valid_token(token) {
            return Ok(());
        }
        match fs::remove_file(self.root.join("refs").join(token)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(Error::io(format!("remove ref {token}"), e))
            }
            _ => Ok(()),
        }
    }

    /// Removes what no snapshot needs: ingest and restore directories nobody holds (a crash's
    /// leftovers), and blobs reachable from no ref, no `extra_roots` manifest and no restore
    /// in progress.
    pub fn gc(&self, extra_roots: &[String]) -> Result<GcReport> {
        let _exclusive = self.lock_store(true)?;
        let mut report = GcReport::default();
        let mut live: BTreeSet<String> = BTreeSet::new();
        for kind in ["ingest", "restores"] {
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

    fn lock_store(&self, exclusive: bool) -> Result<Lock> {
        Lock::wait(&self.root.join("lock"), exclusive)
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

impl RestoreDir {
    pub fn dir(&self) -> &Path {
        &self.dir
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

/// An flock'd file: shared or exclusive, released when dropped (or when its process dies).
#[derive(Debug)]
struct Lock {
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
    fn take(path: &Path) -> Result<Lock> {
        Self::try_take(path)
            .ok_or_else(|| store_error(path, "already held by another operation of the same name"))
    }

    fn try_take(path: &Path) -> Option<Lock> {
        let file = Self::open(path).ok()?;
        // SAFETY: flock on a descriptor this function owns.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        (rc == 0).then(|| Lock {
            file,
            path: path.to_path_buf(),
        })
    }

    /// Removes the lock file, then lets the lock go.
    fn remove(self) {
        let _ = fs::remove_file(&self.path);
        drop(self.file);
    }
}

/// The lock beside directory `dir`: `<dir>.lock` (tokens have dots of their own).
fn lock_path(dir: &Path) -> PathBuf {
    let mut name = dir.file_name().unwrap_or_default().to_os_string();
    name.push(".lock");
    dir.with_file_name(name)
}

fn valid_token(token: &str) -> bool {
    !token.is_empty()
        && token.len() <= 240
        && !token.starts_with('.')
        && token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._+-".contains(&b))
}

fn make_private_dir(dir: &Path) -> Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| Error::io(format!("create {}", dir.display()), e))
}

/// Writes `path` through a temporary file renamed into place, with `mode`. Nothing in the
/// store is fsync'd (runsc never fsyncs its files either, and a journal flush would write the
/// whole checkpoint out first): after a power loss a ref may be lost, but a blob whose pages
/// were is never trusted, since its identity records the boot it was hashed in.
fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{}.tmp", std::process::id()));
    let tmp = path.with_file_name(name);
    let write = || -> std::io::Result<()> {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&tmp)?;
        f.write_all(bytes)?;
        fs::rename(&tmp, path)
    };
    write().map_err(|e| {
        let _ = fs::remove_file(&tmp);
        Error::io(format!("write {}", path.display()), e)
    })
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

/// The blob names a restore directory's links point at.
fn link_targets(dir: &Path) -> Vec<String> {
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

fn store_error(root: &Path, message: impl std::fmt::Display) -> Error {
    Error::Store {
        root: root.to_path_buf(),
        message: message.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::manifest::{tests::sample, FILE_NAME};

    /// A sealed checkpoint in a fresh ingest of `store`: `files` as runsc would write them.
    fn sealed(store: &Store, token: &str, files: &[(&str, &[u8])]) -> Ingest {
        let ingest = store.begin_ingest(token).unwrap();
        for (name, bytes) in files {
            fs::write(ingest.dir().join(name), bytes).unwrap();
        }
        let mut m = sample();
        m.seal(ingest.dir(), 1).unwrap();
        ingest
    }

    fn commit(store: &Store, ingest: Ingest) -> Committed {
        store
            .commit(
                ingest,
                Commit {
                    namespace: "default",
                    spec: br#"{"process":{}}"#,
                    subject: Some(Descriptor::new(
                        oci::MANIFEST,
                        &oci::sha256_digest(b"base"),
                        4,
                    )),
                    annotations: BTreeMap::new(),
                },
            )
            .unwrap()
    }

    #[test]
    fn an_imported_snapshot_needs_only_the_blobs_the_store_lacks() {
        let tmp = tempfile::tempdir().unwrap();
        let a = Store::open(&tmp.path().join("a")).unwrap();
        let files: &[(&str, &[u8])] = &[("checkpoint.img", b"state"), ("pages.img", b"pages")];
        let c = commit(&a, sealed(&a, "default+one", files));
        let snap = a.open_snapshot(&c.manifest.digest).unwrap();
        let small: Vec<Vec<u8>> = [&snap.layout.chalk_manifest, &snap.layout.spec]
            .iter()
            .map(|d| a.read_blob(&d.digest).unwrap())
            .chain([oci::EMPTY_DATA.to_vec()])
            .collect();
        let small: Vec<&[u8]> = small.iter().map(Vec::as_slice).collect();

        // Host B already has pages.img (an earlier snapshot): only checkpoint.img is fetched.
        let b = Store::open(&tmp.path().join("b")).unwrap();
        b.put(b"pages", "").unwrap();
        let ingest = b.begin_ingest("default+pulled").unwrap();
        let state = oci::sha256_digest(b"state");
        fs::write(ingest.part_path(&state["sha256:".len()..]), b"state").unwrap();
        let (got, _) = b
            .import(ingest, "default", &c.manifest_bytes, &small)
            .unwrap();
        assert_eq!(
            got.manifest.digest, c.manifest.digest,
            "the same id on every host"
        );
        assert_eq!((got.stored, got.reused), (5, 5));
        assert_eq!(
            b.find_ref("default+pulled").unwrap().manifest,
            c.manifest.digest
        );
        b.prepare_restore(&b.open_snapshot(&c.manifest.digest).unwrap(), "default+r")
            .unwrap();

        // A file that was never fetched: refused, and no ref is written.
        let other = commit(&a, sealed(&a, "default+two", &[("pages.img", b"other")]));
        let ingest = b.begin_ingest("default+half").unwrap();
        let err = b
            .import(ingest, "default", &other.manifest_bytes, &small)
            .unwrap_err();
        assert!(err.to_string().contains("was not fetched"), "{err}");
        assert!(b.find_ref("default+half").is_none());
    }

    #[test]
    fn a_committed_snapshot_is_blobs_a_manifest_and_a_ref() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(&tmp.path().join("store")).unwrap();
        let token = Store::token("default", "chalk.io/snapshots/web:2026");
        assert_eq!(token, "default+chalk.io_snapshots_web_2026");
        let ingest = sealed(
            &store,
            &token,
            &[("checkpoint.img", b"state"), ("pages.img", b"pages")],
        );
        let dir = ingest.dir().to_path_buf();
        assert_eq!(
            Store::ingest_token_under(store.root(), &dir).as_deref(),
            Some(token.as_str())
        );
        let c = commit(&store, ingest);
        assert!(!dir.exists(), "the ingest directory goes once committed");
        assert_eq!(c.stored, 10);
        let pages = store.blob_path(&oci::sha256_digest(b"pages")).unwrap();
        assert_eq!(fs::read(&pages).unwrap(), b"pages");
        assert_eq!(
            fs::metadata(&pages).unwrap().permissions().mode() & 0o777,
            0o400
        );
        assert_eq!(
            fs::metadata(store.root()).unwrap().permissions().mode() & 0o777,
            0o700
        );
        let r = store.find_ref(&token).unwrap();
        assert_eq!(r.manifest, c.manifest.digest);
        let snap = store.open_snapshot(&c.manifest.digest).unwrap();
        assert_eq!(snap.spec, br#"{"process":{}}"#);
        assert_eq!(snap.layout.files.len(), 2);
        assert_eq!(
            snap.oci.subject.unwrap().digest,
            oci::sha256_digest(b"base")
        );
        // The same files again are stored once.
        let again = sealed(
            &store,
            "default+second",
            &[("checkpoint.img", b"state"), ("pages.img", b"pages")],
        );
        let c2 = commit(&store, again);
        assert_eq!((c2.stored, c2.reused), (0, 10));
    }

    #[test]
    fn a_restore_links_verified_blobs_and_refuses_a_changed_one() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(&tmp.path().join("store")).unwrap();
        let ingest = sealed(&store, "default+s", &[("pages.img", b"pages")]);
        let c = commit(&store, ingest);
        let snap = store.open_snapshot(&c.manifest.digest).unwrap();
        let restore = store.prepare_restore(&snap, "default+web+1").unwrap();
        let link = restore.dir().join("pages.img");
        assert!(fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(fs::read(&link).unwrap(), b"pages");
        let dir = restore.dir().to_path_buf();
        drop(restore);
        assert!(!dir.exists() && !lock_path(&dir).exists());
        // Same size, other bytes: its identity changed, so it is hashed again and refused.
        let blob = store.blob_path(&oci::sha256_digest(b"pages")).unwrap();
        fs::set_permissions(&blob, fs::Permissions::from_mode(0o600)).unwrap();
        fs::write(&blob, b"PAGES").unwrap();
        let err = store
            .prepare_restore(&snap, "default+web+2")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("changed or damaged") && err.contains("pages.img"),
            "{err}"
        );
        assert!(!store.root().join("restores/default+web+2").exists());
        // A missing blob is named.
        fs::remove_file(&blob).unwrap();
        let err = store
            .prepare_restore(&snap, "default+web+3")
            .unwrap_err()
            .to_string();
        assert!(err.contains("missing"), "{err}");
    }

    #[test]
    fn gc_keeps_what_refs_and_restores_need_and_removes_the_rest() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(&tmp.path().join("store")).unwrap();
        let a = commit(
            &store,
            sealed(&store, "default+a", &[("pages.img", b"aaaa")]),
        );
        let b = commit(
            &store,
            sealed(&store, "default+b", &[("pages.img", b"bbbb")]),
        );
        // A crashed checkpoint: its directory and lock, held by nobody.
        fs::create_dir(store.ingest_path("default+crashed")).unwrap();
        fs::write(store.ingest_path("default+crashed").join("pages.img"), b"x").unwrap();
        fs::write(store.root().join("ingest/default+crashed.lock"), b"").unwrap();
        // Being written now (tokens have dots).
        let live = store.begin_ingest("default+chalk.io_live").unwrap();
        let _other = store.begin_ingest("default+chalk.io_other").unwrap();
        assert_eq!(store.gc(&[]).unwrap().blobs_removed, 0);
        assert!(!store.ingest_path("default+crashed").exists());
        assert!(live.dir().exists());
        // b's ref goes while a restore of b runs: b's blobs stay until the restore ends.
        let snap_b = store.open_snapshot(&b.manifest.digest).unwrap();
        let restoring = store.prepare_restore(&snap_b, "default+fork").unwrap();
        store.remove_ref("default+b").unwrap();
        let report = store.gc(&[]).unwrap();
        assert_eq!(report.blobs_removed, 2, "{report:?}"); // its manifest, its chalk manifest
        assert!(!store.blob_path(&b.manifest.digest).unwrap().exists());
        assert_eq!(
            fs::read(restoring.dir().join("pages.img")).unwrap(),
            b"bbbb"
        );
        drop(restoring);
        let report = store.gc(&[]).unwrap();
        assert_eq!(
            (report.blobs_removed, report.bytes_freed),
            (1, 4),
            "{report:?}"
        );
        assert!(store.open_snapshot(&a.manifest.digest).is_ok());
        // A root given by the caller (a suspended sandbox's snapshot) is kept without a ref.
        store.remove_ref("default+a").unwrap();
        store.gc(std::slice::from_ref(&a.manifest.digest)).unwrap();
        assert!(store.open_snapshot(&a.manifest.digest).is_ok());
        store.gc(&[]).unwrap();
        assert!(!store.blob_path(&a.manifest.digest).unwrap().exists());
        drop(live);
        store.gc(&[]).unwrap();
        assert_eq!(store.usage(), 0);
    }

    #[test]
    fn bad_names_and_foreign_manifests_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let store = Store::open(&tmp.path().join("store")).unwrap();
        assert!(store.begin_ingest("../x").is_err());
        assert!(store.begin_ingest(".hidden").is_err());
        assert!(store.blob_path("sha256:../../etc").is_err());
        assert!(Store::open(Path::new("relative")).is_err());
        assert!(
            Store::ingest_token_under(store.root(), Path::new("/elsewhere/default+x")).is_none()
        );
        let _held = store.begin_ingest("default+same").unwrap();
        assert!(store.begin_ingest("default+same").is_err());
        // A blob that is no snapshot manifest.
        let d = store.put(b"{}", oci::EMPTY).unwrap();
        let err = store.open_snapshot(&d.digest).unwrap_err().to_string();
        assert!(
            err.contains("not a chalk snapshot") || err.contains("not an OCI"),
            "{err}"
        );
        let _ = FILE_NAME;
    }
}
