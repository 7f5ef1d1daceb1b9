//! chalk-shim on Kubernetes: the `PodSnapshot` resource ([`crd`]), what a snapshot, a fork
//! and a resume make of pods ([`pods`], pure), this node's side through containerd
//! ([`node`]), the agent that carries PodSnapshots out ([`agent`]) and where they may push
//! ([`push_policy`], pure), agent-sandbox's Sandboxes suspended with their memory
//! ([`sandbox`], pure, and [`sandboxes`]), the agents' record of what they pushed
//! ([`records`], pure), the cluster agent that keeps and removes it ([`cluster`]), what the
//! controllers share ([`reconcile`]), and `kubectl chalk` ([`plugin`]).

pub mod agent;
pub mod cluster;
pub mod crd;
pub mod node;
pub mod plugin;
pub mod pods;
pub mod push_policy;
pub mod reconcile;
pub mod records;
pub mod sandbox;
pub mod sandboxes;
