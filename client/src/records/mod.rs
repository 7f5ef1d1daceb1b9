//! What chalk keeps in containerd beside its containers: snapshot records (labelled images
//! naming snapshots in the shim's store), sandbox names, the owners of in-progress snapshots,
//! and the sandboxes of this runtime as chalkctl lists them.

pub mod names;
pub mod owner;
pub mod registry;
pub mod sandboxes;
pub mod snapshots;
