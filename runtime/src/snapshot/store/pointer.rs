//! [`POINTER`]: the one file of a checkpoint that stands for a snapshot kept in the store.

use std::{fs, path::Path};

use serde::{Deserialize, Serialize};

use super::store_error;
use crate::{snapshot::oci, Error, Result};

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
    /// The stored snapshot's OCI manifest digest.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub snapshot: String,
    /// Or the snapshot by its store token: its ref once sealed, its fresh directory before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

impl Pointer {
    /// A pointer to stored snapshot `digest`.
    pub fn to_snapshot(digest: &str) -> Pointer {
        Pointer {
            snapshot: digest.to_string(),
            token: None,
        }
    }

    /// A pointer to the snapshot of store token `token`, sealed or not yet.
    pub fn to_token(token: &str) -> Pointer {
        Pointer {
            snapshot: String::new(),
            token: Some(token.to_string()),
        }
    }

    /// The pointer in checkpoint directory `dir`, if it is one (its only file).
    pub fn read(dir: &Path) -> Result<Option<Pointer>> {
        let path = dir.join(POINTER);
        let Ok(bytes) = fs::read(&path) else {
            return Ok(None);
        };
        let bad = |m: String| store_error(dir, format!("{POINTER}: {m}"));
        let p: Pointer = serde_json::from_slice(&bytes).map_err(|e| bad(e.to_string()))?;
        match &p.token {
            None if oci::sha256_hex_of(&p.snapshot).is_none() => {
                return Err(bad(format!("{:?} is not a sha256 digest", p.snapshot)));
            }
            Some(token) if !p.snapshot.is_empty() || !super::layout::valid_token(token) => {
                return Err(bad(format!(
                    "token {token:?}: a pointer names one snapshot, by digest or by a token of \
                     letters, digits and ._+-"
                )));
            }
            _ => {}
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
