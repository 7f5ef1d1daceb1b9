//! Test harness for chalk-shim: a private containerd with the shim registered, and a tiny OCI
//! image built from the host's static busybox (no registry is needed or reached).

pub mod api;
pub mod bench;
pub mod containerd;
pub mod cri;
pub mod crictl;
pub mod debian;
pub mod hostile_registry;
pub mod image;
pub mod k8s;
pub mod memfill;
pub mod network;
pub mod procs;
pub mod registry;
pub mod reliability;
pub mod sealing;
pub mod stop;
pub mod testkit;
pub mod tmux;
pub mod tty;
pub mod web;

pub use containerd::{Containerd, CtrOutput};

/// The runtime name containerd knows the shim by.
pub const RUNTIME: &str = "io.containerd.chalk.v1";
