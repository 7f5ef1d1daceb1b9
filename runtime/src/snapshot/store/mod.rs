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
//!                                 (hard links, for a restore from a fresh snapshot)
//! <root>/fresh/<token>/           hard links to a checkpoint's files before it is sealed
//!                                 (see [`fresh`]); <token>.lock held while it is sealed
//! <root>/failed/<token>           why snapshot <token> could not be sealed
//! <root>/catalog/<repository>/     what this host pushed to or pulled from a repository as
//!                                 pieces (see [`catalog`]): not snapshots, never gc roots
//! <root>/packs/<hex>              packs this host pushed, while a catalog entry names them
//! ```
//!
//! Guarantees: a ref is written only after all of its blobs are in place, so a snapshot never
//! reads completed without them; a crash leaves an unlocked ingest or restore directory and
//! unreferenced blobs, which [`Store::gc`] removes; a blob is hashed when it enters the store
//! and again only when its identity (inode, size, times, boot) changed since.

mod catalog;
mod fresh;
mod gc;
mod ingest;
mod layout;
mod lazy;
mod lock;
mod packs;
mod pointer;
mod refs;
mod restore;
#[cfg(test)]
mod tests;
mod verify;

use std::{
    fs,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
};

pub use catalog::{CatalogEntry, KEEP as CATALOG_KEEP};
pub use fresh::{Fresh, Seal, FRESH_MAX_AGE};
pub use gc::GcReport;
pub use ingest::{Commit, Committed, Ingest, Origin};
pub use lazy::{detach_mount, FailureNote, LazyBlob, FAILED_MAX_AGE};
pub use pointer::{holds_only_a_pointer, Pointer, POINTER};
pub use refs::Ref;
pub use restore::{Arrivals, RestoreDir};
pub use verify::Stored;

use crate::{Error, Result};
use layout::make_private_dir;

/// Where a host's snapshots live unless the runtime options say otherwise.
pub const DEFAULT_ROOT: &str = "/var/lib/chalk/snapshots";

pub struct Store {
    root: PathBuf,
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
        for d in [
            "blobs/sha256",
            "verified",
            "ingest",
            "refs",
            "restores",
            "fresh",
            "lazy",
        ] {
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
}

fn store_error(root: &Path, message: impl std::fmt::Display) -> Error {
    Error::Store {
        root: root.to_path_buf(),
        message: message.to_string(),
    }
}
