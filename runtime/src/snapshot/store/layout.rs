//! Where the store keeps things and how it writes them: paths and names, root-only
//! directories, and files that appear whole or not at all.

use std::{
    fs::{self, OpenOptions},
    io::Write,
    os::unix::fs::{DirBuilderExt, OpenOptionsExt},
    path::{Path, PathBuf},
};

use super::{store_error, Store};
use crate::{snapshot::oci, Error, Result};

impl Store {
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

    /// Whether the store holds blob `digest` (a restore verifies its content).
    pub fn has_blob(&self, digest: &str) -> bool {
        self.blob_path(digest).is_ok_and(|p| p.exists())
    }
}

pub(super) fn valid_token(token: &str) -> bool {
    !token.is_empty()
        && token.len() <= 240
        && !token.starts_with('.')
        && token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._+-".contains(&b))
}

pub(super) fn make_private_dir(dir: &Path) -> Result<()> {
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
pub(super) fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
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
