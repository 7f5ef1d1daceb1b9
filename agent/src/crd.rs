//! The `chalk.io` API group: a `PodSnapshot` asks for a snapshot of one pod, and its status is
//! the result, carried out by the agent on the pod's node.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The finalizer by which deleting a PodSnapshot deletes its snapshot on its node.
pub const FINALIZER: &str = "chalk.io/snapshot";
/// On a pod made from a snapshot: the PodSnapshot it came from.
pub const FROM_SNAPSHOT_LABEL: &str = "chalk.io/from-snapshot";

/// A snapshot of pod `podName` (its whole sandbox, memory included), optionally pushed to a
/// registry, the pod left running or suspended (deleted once its snapshot is safe, its spec
/// kept here so that `kubectl chalk resume` makes it again, on any node).
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "chalk.io",
    version = "v1alpha1",
    kind = "PodSnapshot",
    namespaced,
    status = "PodSnapshotStatus",
    shortname = "psnap",
    printcolumn = r#"{"name":"Pod","type":"string","jsonPath":".spec.podName"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Node","type":"string","jsonPath":".status.node"}"#,
    printcolumn = r#"{"name":"Size","type":"integer","jsonPath":".status.sizeBytes"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct PodSnapshotSpec {
    /// The pod, in this PodSnapshot's namespace.
    pub pod_name: String,
    /// A registry reference (`host[:port]/repository[:tag]`) to push the snapshot to: pods
    /// on other nodes start from it by digest. Without it the snapshot stays on its node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub push_to: Option<String>,
    /// What becomes of the pod: `Running` (the default) or `Suspended`.
    #[serde(default)]
    pub then: Then,
    /// A suspended pod's snapshot is deleted from its node once pushed, unless this is set.
    #[serde(default)]
    pub keep_on_node: bool,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum Then {
    #[default]
    Running,
    Suspended,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum Phase {
    InProgress,
    Completed,
    Failed,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodSnapshotStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// The node that holds (or held) the snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The snapshot's id (`sha256:…`, the digest of its manifest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_id: Option<String>,
    /// What a pod's `chalk.io/restore-from` names to start from it: `REF@sha256:…` once
    /// pushed (any node), else the id (its node only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_from: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timings: Option<Timings>,
    /// Whether the pod was deleted after its snapshot (Then: Suspended).
    #[serde(default)]
    pub suspended: bool,
    /// The pod as it was, without what its node and the API server gave it: what a fork or a
    /// resume makes again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_object")]
    pub pod: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Timings {
    /// From the agent taking it up to the snapshot stored on the node.
    pub snapshot_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub push_ms: Option<u64>,
    pub total_ms: u64,
}

fn any_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true
    })
}

/// The CRD as YAML (what packaging/kubernetes/crd.yaml holds).
pub fn crd_yaml() -> String {
    use kube::CustomResourceExt;
    serde_yaml::to_string(&PodSnapshot::crd()).expect("a CRD serializes")
}
