//! The library behind chalk-shim: it drives gVisor's `runsc` and knows nothing of ttrpc.
//!
//! - [`options`]: the runtime options file (TOML) and the runsc flags it turns into.
//! - [`runsc`]: typed runsc operations, argv built in one place, capability detection.
//! - [`snapshot`]: the snapshot manifest (hashing, verification) and the isolation rule.
//! - [`spec`]: small readers over OCI spec JSON.
//! - [`state`]: the process lifecycle state machine.
//! - [`bundle`]: what the shim persists in the bundle so a later `delete` can clean up.
//! - [`stats`]: runsc's statistics output.
//! - [`terminal`]: a TTY sandbox's terminal state and signals across a restore.
//! - [`caps`]: capabilities narrowed for non-root processes as execve would.
//! - [`executable`]: finds a container's executable before its sandbox is made.
//! - [`lifetime`]: a sandbox's lifetime and what happens when it ends (annotations).
//! - [`network`]: CNI networks for sandboxes that ask for one.
//! - [`ids`]: validation of container and exec ids before they reach a path or argv.

#[cfg(test)]
mod bad_input;
pub mod bundle;
pub mod caps;
pub mod error;
pub mod executable;
pub mod fault;
pub mod foreign_spec;
pub mod hostcheck;
pub mod ids;
pub mod lifetime;
pub mod netns;
pub mod network;
pub mod options;
pub mod pod_restore;
pub mod registry_name;
pub mod runsc;
pub mod snapshot;
pub mod spec;
pub mod state;
pub mod stats;
pub mod terminal;
pub mod trust;

pub use error::{Error, Result};
