//! Refs: a file per completed snapshot naming its manifest, the roots gc keeps.

use std::fs;

use serde::{Deserialize, Serialize};

use super::{layout::valid_token, Store};
use crate::snapshot::owner::Owner;
use crate::{Error, Result};

/// A completed snapshot in the store: the gc root its record stands for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ref {
    pub namespace: String,
    pub token: String,
    /// The snapshot's manifest digest.
    pub manifest: String,
    pub created: String,
    /// Whose copy this is: the taker's, or for a pulled copy the side that pulled it (refs
    /// written before owners were recorded have none, and no pod restores them by id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<Owner>,
    /// The registry reference a pulled copy came from (None: taken on this host).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pulled_from: Option<String>,
}

impl Store {
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

    /// The refs of snapshot `manifest` (one per copy: taken here, or pulled for someone).
    pub fn refs_of(&self, manifest: &str) -> Result<Vec<Ref>> {
        Ok(self
            .refs()?
            .into_iter()
            .filter(|r| r.manifest == manifest)
            .collect())
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
}
