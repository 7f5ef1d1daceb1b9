//! chalk-client: the SDK of chalk-shim sandboxes over containerd's API, blocking. chalkctl,
//! chalk-web, the shim and the tests build on it. Its layers point down only (the crate's
//! tests/module_graph.rs keeps it so):
//!
//! - [`containerd`]: containerd's API, one file per service; it knows nothing of snapshots.
//! - [`records`]: what chalk keeps in containerd: snapshot records, names, owners, sandboxes.
//! - [`stdio`]: the keepers that hold a detached sandbox's stdio.
//! - [`ops`]: the operations, each a small API with typed options and results: run, exec,
//!   attach, logs, snapshot, suspend, fork, resume, remove, wait, expire, tree.
//! - [`remote`] (feature `remote`): snapshots pushed to and pulled from OCI registries, and
//!   sandboxes moved between hosts.
//!
//! Beside them, used by all: [`error`], [`progress`] (the progress lines), [`clock`], and the
//! `chalk.io/*` keys of the crate chalk-labels.

pub mod clock;
pub mod containerd;
pub mod detached;
pub mod error;
pub mod ops;
pub mod progress;
pub mod records;
#[cfg(feature = "remote")]
pub mod remote;
pub mod stdio;

pub use error::{Error, Result};
