//! Snapshots: the manifest that describes and protects a checkpoint directory, the hashing
//! behind it, the isolation rule restores must keep, and the room a checkpoint needs.

pub mod describe;
pub mod dir;
pub mod extra;
pub mod follow;
pub mod hash;
pub mod isolation;
pub mod manifest;
pub mod memory;
pub mod oci;
pub mod owner;
pub mod packed;
pub mod pieces;
pub mod sealed;
pub mod signature;
pub mod space;
pub mod store;

pub use isolation::Isolation;
pub use manifest::{Kind, Manifest};
