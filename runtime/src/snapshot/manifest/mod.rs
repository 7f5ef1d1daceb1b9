//! `chalk.manifest.json`: what a snapshot holds and what it needs to be restored, written last
//! and atomically into the checkpoint directory, verified before any restore starts. The
//! schema is documented in `runtime/MANIFEST.md`.

mod rfc3339;

use std::{
    collections::BTreeMap,
    io::Write,
    os::unix::fs::{OpenOptionsExt, PermissionsExt},
    path::{Component, Path, PathBuf},
};

use serde::{Deserialize, Serialize};

pub use super::extra::{Extra, GpuFacts, PodFacts, PodMember};
use super::{
    hash,
    isolation::Isolation,
    pieces::{Pieces, PIECE_SIZE},
};
use crate::{Error, Result};
pub use rfc3339::{rfc3339_at, rfc3339_now, rfc3339_secs};

pub const FILE_NAME: &str = "chalk.manifest.json";
/// The schema this build writes and the only one it restores.
pub const SCHEMA_VERSION: u32 = 1;
/// The largest manifest read: a real one is a few KiB (a file entry is about 200 bytes).
pub const MAX_MANIFEST_BYTES: usize = 4 << 20;
/// The most files a snapshot may hold: runsc writes a handful per sandbox (a few more per
/// pod container and GPU); anything near this is not a checkpoint.
pub const MAX_FILES: usize = 1024;
/// The longest file name (relative path) in a snapshot.
pub const MAX_PATH_BYTES: usize = 255;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// The source kept running.
    Snapshot,
    /// The source stopped after the checkpoint.
    Suspend,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Snapshot => "snapshot",
            Kind::Suspend => "suspend",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Source {
    pub namespace: String,
    pub container_id: String,
    /// The pod sandbox the container belongs to (its own id when it is alone).
    pub sandbox_id: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunscInfo {
    /// `runsc --version`'s first line.
    pub version: String,
    pub platform: String,
    pub network: String,
    /// The root filesystem overlay flag in effect (what captures root filesystem writes).
    pub overlay: Option<String>,
    /// Every global flag the sandbox ran with.
    pub flags: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostInfo {
    pub arch: String,
    pub kernel: String,
    pub cpu_vendor: String,
    pub cpu_model: String,
    pub hostname: String,
    /// The CPU's feature flags (`/proc/cpuinfo`): gVisor refuses to restore a sandbox on a
    /// CPU that lacks one its source had (empty in manifests written before they were kept).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cpu_flags: Vec<String>,
}

impl HostInfo {
    pub fn current() -> Self {
        let read = |p: &str| {
            std::fs::read_to_string(p)
                .map(|s| s.trim().to_string())
                .unwrap_or_default()
        };
        let cpuinfo = read("/proc/cpuinfo");
        let field = |name: &str| {
            cpuinfo
                .lines()
                .find(|l| l.split(':').next().map(str::trim) == Some(name))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
                .unwrap_or_default()
        };
        HostInfo {
            arch: std::env::consts::ARCH.to_string(),
            kernel: read("/proc/sys/kernel/osrelease"),
            cpu_vendor: field("vendor_id"),
            cpu_model: field("model name"),
            hostname: read("/proc/sys/kernel/hostname"),
            cpu_flags: cpu_flags(&field("flags")),
        }
    }
}

/// A cpuinfo `flags` line as a sorted set.
pub fn cpu_flags(line: &str) -> Vec<String> {
    let set: std::collections::BTreeSet<&str> = line.split_whitespace().collect();
    set.into_iter().map(String::from).collect()
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageRef {
    pub name: String,
    /// The digest the name pointed at when the snapshot was taken.
    pub digest: String,
}

impl ImageRef {
    /// `(name, digest)` of a reference pinned by digest (`name@sha256:<64 hex>`): it names its
    /// image by itself, whatever tags say now (a fork's container records one).
    pub fn pinned(reference: &str) -> Option<(&str, &str)> {
        let (name, digest) = reference.rsplit_once('@')?;
        let hex = digest.strip_prefix("sha256:")?;
        (hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit())).then_some((name, digest))
    }

    /// The name of `reference` without its digest pin, if it has one.
    pub fn unpinned(reference: &str) -> &str {
        Self::pinned(reference).map_or(reference, |(name, _)| name)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpecInfo {
    /// sha256 of the bundle's config.json as runsc ran it.
    pub sha256: String,
    /// `linux.resources` of the spec.
    pub resources: serde_json::Value,
    pub isolation: Isolation,
}

/// A mount whose content is not in the snapshot (bind mounts: volumes stay on the host).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExcludedMount {
    pub destination: String,
    pub source: String,
    #[serde(rename = "type")]
    pub kind: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// Relative to the checkpoint directory.
    pub path: String,
    pub size: u64,
    pub sha256: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub chunks: Vec<String>,
    /// The memory file's piece digests, which a restore reading it as it arrives checks
    /// each range against (older manifests have none: such a snapshot is pulled whole).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pieces: Option<crate::snapshot::pieces::Pieces>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub schema_version: u32,
    pub kind: Kind,
    /// RFC 3339, UTC.
    pub created: String,
    pub source: Source,
    pub runsc: RunscInfo,
    pub host: HostInfo,
    pub image: Option<ImageRef>,
    pub spec: SpecInfo,
    pub excluded_mounts: Vec<ExcludedMount>,
    pub files: Vec<FileEntry>,
    /// The sandbox's memory when it was taken (runsc's own figure): what each restore of
    /// it takes from the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    /// The terminal of a sandbox whose init has one: a restore gives its new terminal the
    /// same size and settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terminal: Option<crate::terminal::TerminalState>,
    /// What the shim adds: the pod's other containers, the GPU handoff; not checked by
    /// restore.
    #[serde(default, skip_serializing_if = "Extra::is_empty")]
    pub extra: Extra,
    /// Who it belongs to (absent in snapshots taken before owners were recorded, which no
    /// pod restores unless an administrator shares them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<super::owner::Owner>,
}

fn snapshot_error(dir: &Path, message: impl std::fmt::Display) -> Error {
    Error::Snapshot {
        dir: dir.to_path_buf(),
        message: message.to_string(),
    }
}

impl Manifest {
    /// Hashes every file of `dir` into `self.files` and writes the manifest last, atomically
    /// (a temporary file renamed into place), readable by root only.
    pub fn seal(&mut self, dir: &Path, threads: usize) -> Result<()> {
        self.seal_with(dir, &BTreeMap::new(), threads)
    }

    /// As [`Manifest::seal`], taking the digests of files already hashed (by a
    /// [`Follower`](crate::snapshot::follow::Follower)) as they are, where the file still has
    /// the size hashed.
    pub fn seal_with(
        &mut self,
        dir: &Path,
        known: &BTreeMap<String, hash::FileDigest>,
        threads: usize,
    ) -> Result<()> {
        let names = list_files(dir)?;
        let size_now = |n: &str| std::fs::metadata(dir.join(n)).map(|m| m.len()).ok();
        let reused: Vec<Option<hash::FileDigest>> = names
            .iter()
            .map(|n| {
                known
                    .get(n)
                    .filter(|d| size_now(n) == Some(d.size))
                    .cloned()
            })
            .collect();
        let rest: Vec<PathBuf> = names
            .iter()
            .zip(&reused)
            .filter(|(_, r)| r.is_none())
            .map(|(n, _)| dir.join(n))
            .collect();
        let mut hashed = hash::hash_files(&rest, threads)?.into_iter();
        let digests = reused
            .into_iter()
            .map(|r| r.or_else(|| hashed.next()))
            .collect::<Option<Vec<hash::FileDigest>>>()
            .ok_or_else(|| snapshot_error(dir, "a file was left unhashed"))?;
        self.files = names
            .into_iter()
            .zip(digests)
            .map(|(path, d)| FileEntry {
                path,
                size: d.size,
                sha256: d.sha256,
                chunks: d.chunks,
                pieces: d.pieces,
            })
            .collect();
        let bytes = serde_json::to_vec_pretty(self).map_err(|e| Error::parse("manifest", e))?;
        let tmp = dir.join(format!(".{FILE_NAME}.tmp"));
        let write = || -> std::io::Result<()> {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)?;
            // Not fsync'd, like runsc's own files: flushing the journal here would write the
            // whole checkpoint out to disk first.
            f.write_all(&bytes)?;
            std::fs::rename(&tmp, dir.join(FILE_NAME))
        };
        write().map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            Error::io(format!("write {}", dir.join(FILE_NAME).display()), e)
        })
    }

    /// Reads the manifest of `dir`, refusing a missing one or an unknown schema.
    pub fn load(dir: &Path) -> Result<Self> {
        let path = dir.join(FILE_NAME);
        let bytes = std::fs::read(&path).map_err(|e| {
            snapshot_error(
                dir,
                format!(
                    "no readable {FILE_NAME} ({e}): not a chalk snapshot, or an incomplete one"
                ),
            )
        })?;
        Self::parse(&bytes, dir)
    }

    /// A manifest from its bytes (`place`, where it came from, goes into errors): refused,
    /// with the field or bound named, unless it is schema 1 within the bounds and every file
    /// entry is a plain relative name (once) with a sha256 digest.
    pub fn parse(bytes: &[u8], place: &Path) -> Result<Self> {
        if bytes.len() > MAX_MANIFEST_BYTES {
            return Err(snapshot_error(
                place,
                format!(
                    "{FILE_NAME} has {} bytes, more than the {MAX_MANIFEST_BYTES} a manifest may have",
                    bytes.len()
                ),
            ));
        }
        let raw: serde_json::Value = serde_json::from_slice(bytes)
            .map_err(|e| snapshot_error(place, format!("{FILE_NAME} is not valid JSON: {e}")))?;
        match raw["schema_version"].as_u64() {
            Some(v) if v == SCHEMA_VERSION as u64 => {}
            other => {
                return Err(snapshot_error(
                    place,
                    format!(
                        "{FILE_NAME} has schema_version {other:?}; this build restores {SCHEMA_VERSION}"
                    ),
                ))
            }
        }
        if let Some(n) = raw["files"]
            .as_array()
            .map(Vec::len)
            .filter(|n| *n > MAX_FILES)
        {
            return Err(snapshot_error(
                place,
                format!(
                    "{FILE_NAME} lists {n} files, more than the {MAX_FILES} a snapshot may hold"
                ),
            ));
        }
        let m: Manifest = serde_path_to_error::deserialize(raw).map_err(|e| {
            snapshot_error(
                place,
                format!(
                    "{FILE_NAME} does not fit schema 1: {}: {}",
                    e.path(),
                    e.inner()
                ),
            )
        })?;
        m.check_files().map_err(|e| snapshot_error(place, e))?;
        Ok(m)
    }

    /// Each file entry a plain relative name within the bound, listed once, with a sha256.
    fn check_files(&self) -> std::result::Result<(), String> {
        let mut seen = std::collections::HashSet::new();
        for (i, f) in self.files.iter().enumerate() {
            if f.path.len() > MAX_PATH_BYTES {
                return Err(format!(
                    "files[{i}].path has {} bytes, more than {MAX_PATH_BYTES}",
                    f.path.len()
                ));
            }
            if !is_plain_relative(&f.path) {
                return Err(format!(
                    "files[{i}].path {:?} is not a plain relative name inside the snapshot",
                    f.path
                ));
            }
            if !seen.insert(f.path.as_str()) {
                return Err(format!("files[{i}].path {:?} is listed twice", f.path));
            }
            if !is_hex_digest(&f.sha256) {
                return Err(format!(
                    "files[{i}].sha256 {:?} is not a sha256 digest (64 hex digits)",
                    f.sha256
                ));
            }
            if let Some(p) = &f.pieces {
                check_pieces(p, f.size).map_err(|e| format!("files[{i}].pieces: {e}"))?;
            }
        }
        Ok(())
    }

    /// Checks that `dir` holds exactly the manifest's files, each of its size and sha256.
    pub fn verify_files(&self, dir: &Path, threads: usize) -> Result<()> {
        for f in &self.files {
            if !is_plain_relative(&f.path) {
                return Err(snapshot_error(
                    dir,
                    format!("manifest names file {:?} outside the snapshot", f.path),
                ));
            }
        }
        let present = list_files(dir)?;
        let listed: Vec<&str> = self.files.iter().map(|f| f.path.as_str()).collect();
        if let Some(extra) = present.iter().find(|p| !listed.contains(&p.as_str())) {
            return Err(snapshot_error(
                dir,
                format!("file {extra:?} is not in the manifest"),
            ));
        }
        for f in &self.files {
            if !present.contains(&f.path) {
                return Err(snapshot_error(
                    dir,
                    format!("file {:?} of the manifest is missing", f.path),
                ));
            }
            let size = std::fs::metadata(dir.join(&f.path))
                .map_err(|e| Error::io(format!("stat {}", dir.join(&f.path).display()), e))?
                .len();
            if size != f.size {
                return Err(snapshot_error(
                    dir,
                    format!(
                        "file {:?} has {size} bytes, the manifest says {}",
                        f.path, f.size
                    ),
                ));
            }
        }
        let paths: Vec<PathBuf> = self.files.iter().map(|f| dir.join(&f.path)).collect();
        // Manifests of older builds hashed big files as chunks.
        let digests = if self.files.iter().any(|f| !f.chunks.is_empty()) {
            hash::hash_files_chunked(&paths, threads)?
        } else {
            hash::hash_files(&paths, threads)?
        };
        for (f, d) in self.files.iter().zip(digests) {
            if d.sha256 != f.sha256 {
                return Err(snapshot_error(
                    dir,
                    format!(
                        "file {:?} has sha256 {}, the manifest says {}: the snapshot was changed or damaged",
                        f.path, d.sha256, f.sha256
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Checks that this host and runsc can restore the snapshot; names each difference.
    pub fn check_runtime(&self, runsc_version: &str, platform: &str, arch: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut same = |field: &str, recorded: &str, here: &str| {
            if recorded != here {
                out.push(format!("{field}: snapshot {recorded:?}, here {here:?}"));
            }
        };
        same("runsc version", &self.runsc.version, runsc_version);
        same("runsc platform", &self.runsc.platform, platform);
        same("arch", &self.host.arch, arch);
        out
    }

    pub fn total_size(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }
}

/// The regular files under `dir`, relative, sorted; the manifest and its temporary file are
/// left out. Anything else (a symlink, a device) is refused: a snapshot holds plain files.
pub fn list_files(dir: &Path) -> Result<Vec<String>> {
    fn walk(root: &Path, rel: &Path, out: &mut Vec<String>) -> Result<()> {
        let here = root.join(rel);
        let entries = std::fs::read_dir(&here)
            .map_err(|e| Error::io(format!("list {}", here.display()), e))?;
        for entry in entries {
            let entry = entry.map_err(|e| Error::io(format!("list {}", here.display()), e))?;
            let rel = rel.join(entry.file_name());
            let kind = entry
                .file_type()
                .map_err(|e| Error::io(format!("stat {}", root.join(&rel).display()), e))?;
            let name = rel.to_string_lossy().into_owned();
            if kind.is_dir() {
                walk(root, &rel, out)?;
            } else if kind.is_file() {
                if name != FILE_NAME && name != format!(".{FILE_NAME}.tmp") {
                    out.push(name);
                }
            } else {
                return Err(snapshot_error(
                    root,
                    format!("{name:?} is not a regular file"),
                ));
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(dir, Path::new(""), &mut out)?;
    out.sort();
    Ok(out)
}

/// Makes snapshot files readable by root only: 0600 files, 0700 directories.
pub fn restrict_permissions(dir: &Path) -> Result<()> {
    let set = |p: &Path, mode: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
            .map_err(|e| Error::io(format!("chmod {}", p.display()), e))
    };
    set(dir, 0o700)?;
    for name in list_files(dir)? {
        let path = dir.join(&name);
        set(&path, 0o600)?;
        let mut parent = path.parent();
        while let Some(p) = parent.filter(|p| *p != dir) {
            set(p, 0o700)?;
            parent = p.parent();
        }
    }
    Ok(())
}

fn is_hex_digest(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Piece digests as the format defines them: pieces of exactly [`PIECE_SIZE`], one 64-hex
/// digest per piece of a file of `len` bytes (a hostile size would be allocated as given).
fn check_pieces(p: &Pieces, len: u64) -> std::result::Result<(), String> {
    if p.size != PIECE_SIZE {
        return Err(format!(
            "size {} is not the format's piece size ({PIECE_SIZE})",
            p.size
        ));
    }
    if !p.fit(len) {
        return Err(format!(
            "{} digests for a file of {len} bytes, which has {} pieces",
            p.sha256.len(),
            p.count_for(len)
        ));
    }
    match p.sha256.iter().position(|d| !is_hex_digest(d)) {
        Some(n) => Err(format!("digest {n} is not 64 hex digits")),
        None => Ok(()),
    }
}

pub(crate) fn is_plain_relative(path: &str) -> bool {
    !path.is_empty()
        && Path::new(path)
            .components()
            .all(|c| matches!(c, Component::Normal(_)))
}

#[cfg(test)]
pub(crate) mod tests;
