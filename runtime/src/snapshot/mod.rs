//! Snapshots: the manifest that describes and protects a checkpoint directory, the hashing
//! behind it, and the isolation rule restores must keep.

pub mod hash;
pub mod isolation;
pub mod manifest;

pub use isolation::Isolation;
pub use manifest::{Kind, Manifest};
