//! The facts a manifest keeps beyond the checkpoint itself, under `extra`: the other
//! containers of a pod's sandbox (a fork recreates them) and the GPU handoff (a restore puts
//! the moved processes back). Typed here, read by the shim and by chalkctl alike.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Extra {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodFacts>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuFacts>,
    /// Anything else, kept as found.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

impl Extra {
    pub fn is_empty(&self) -> bool {
        self.pod.is_none() && self.gpu.is_none() && self.other.is_empty()
    }

    /// How many pod containers the sandbox held besides its own.
    pub fn pod_members(&self) -> usize {
        self.pod.as_ref().map_or(0, |p| p.containers.len())
    }

    /// The processes moved off the GPU before the checkpoint.
    pub fn moved_pids(&self) -> Vec<u32> {
        self.gpu
            .as_ref()
            .map_or_else(Vec::new, |g| g.moved_pids.clone())
    }
}

/// A pod sandbox's containers other than its sandbox (pause) container.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PodFacts {
    pub containers: Vec<PodMember>,
    /// The CRI names of the pod's containers that had run to completion (exit 0) when the
    /// snapshot was taken and run no more: its init containers. A pod that starts from the
    /// snapshot skips them (their work is in the memory it restores).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub completed: Vec<String>,
}

impl PodFacts {
    /// What a pod starting from the snapshot does with its container `name`.
    pub fn role_of(&self, name: &str) -> MemberRole {
        if self.containers.iter().any(|m| m.name == name) {
            MemberRole::Restored
        } else if self.completed.iter().any(|n| n == name) {
            MemberRole::Completed
        } else {
            MemberRole::Unknown
        }
    }
}

/// A new pod's container, against the snapshot its pod starts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberRole {
    /// It ran in the snapshot's sandbox: its state is restored into the new one.
    Restored,
    /// It had run to completion (an init container): it is skipped, reported as exited 0.
    Completed,
    /// The snapshot has no container of that name.
    Unknown,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PodMember {
    pub id: String,
    /// Its CRI name (`io.kubernetes.cri.container-name`): runsc restores it by that name.
    pub name: String,
    pub image: String,
    /// The digest `image` named when the snapshot was taken: a pod that starts from the
    /// snapshot must run the same image (absent in snapshots from before it was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_digest: Option<String>,
    /// The spec as runsc ran it: a fork recreates the container from it.
    pub spec: Value,
}

/// A GPU sandbox's handoff to cuda-checkpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuFacts {
    /// `chalk` (the shim moved the CUDA processes) or `runsc` (runsc did).
    pub handoff: String,
    #[serde(default)]
    pub driver_version: Option<String>,
    #[serde(default)]
    pub gpu_models: Vec<String>,
    #[serde(default)]
    pub gpu_count: usize,
    #[serde(default)]
    pub cuda_checkpoint_version: String,
    #[serde(default)]
    pub moved_pids: Vec<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_new_pods_container_is_restored_skipped_or_unknown() {
        let facts: PodFacts = serde_json::from_value(json!({
            "containers": [{"id": "c1", "name": "web", "image": "busybox", "spec": {}}],
            "completed": ["setup"]
        }))
        .unwrap();
        assert_eq!(facts.role_of("web"), MemberRole::Restored);
        assert_eq!(facts.role_of("setup"), MemberRole::Completed);
        assert_eq!(facts.role_of("other"), MemberRole::Unknown);
    }

    #[test]
    fn extra_reads_and_writes_the_schema_1_keys() {
        let text = json!({
            "pod": {"containers": [{"id": "c1", "name": "web", "image": "busybox", "spec": {}}]},
            "gpu": {"handoff": "chalk", "moved_pids": [1, 7]},
            "from-a-hook": {"x": 1}
        });
        let extra: Extra = serde_json::from_value(text.clone()).unwrap();
        assert_eq!(extra.pod_members(), 1);
        assert_eq!(extra.moved_pids(), [1, 7]);
        assert_eq!(extra.other["from-a-hook"], json!({"x": 1}));
        let back = serde_json::to_value(&extra).unwrap();
        assert_eq!(back["pod"], text["pod"]);
        assert_eq!(back["from-a-hook"], text["from-a-hook"]);
        assert!(Extra::default().is_empty());
        // A snapshot from before `completed` was recorded reads as having none.
        assert!(extra.pod.as_ref().unwrap().completed.is_empty());
        assert!(back["pod"].get("completed").is_none());
        assert_eq!(Extra::default().moved_pids(), Vec::<u32>::new());
    }
}
