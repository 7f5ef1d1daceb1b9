//! chalk-shim on Kubernetes: the `PodSnapshot` resource ([`crd`]), what a snapshot, a fork
//! and a resume make of pods ([`pods`], pure), this node's side through containerd
//! ([`node`]), the agent that carries PodSnapshots out ([`agent`]), and `kubectl chalk`
//! ([`plugin`]).

pub mod agent;
pub mod crd;
pub mod node;
pub mod plugin;
pub mod pods;
