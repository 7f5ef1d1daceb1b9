//! chalk-shim on Kubernetes: the `PodSnapshot` resource ([`crd`]), what a snapshot, a fork
//! and a resume make of pods ([`pods`], pure), this node's side through containerd
//! ([`node`]), the agent that carries PodSnapshots out ([`agent`]), agent-sandbox's Sandboxes
//! suspended with their memory ([`sandbox`], pure, and [`sandboxes`]), what their controllers
//! share ([`reconcile`]), and `kubectl chalk` ([`plugin`]).

pub mod agent;
pub mod crd;
pub mod node;
pub mod plugin;
pub mod pods;
pub mod reconcile;
pub mod sandbox;
pub mod sandboxes;
