//! chalkctl's library: a blocking client of containerd's API (also what the shim asks
//! containerd through), the snapshot registry kept in containerd's image store, and the
//! operations of the command line (snapshot, fork, suspend and resume, lifetimes, the fork
//! tree). The command line itself (`main.rs`, feature `cli`) only parses and prints.

pub mod attach;
pub mod client;
pub mod error;
pub mod exec;
pub mod fork;
pub mod logs;
pub mod names;
pub mod owner;
pub mod progress;
pub mod registry;
#[cfg(feature = "remote")]
pub mod remote;
pub mod remove;
pub mod run;
pub mod sandboxes;
pub mod snapshots;
pub mod stdio;
pub mod tree;

pub use error::{Error, Result};
