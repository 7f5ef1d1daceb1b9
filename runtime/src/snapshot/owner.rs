//! Who a snapshot belongs to: the containerd namespace its sandbox ran in and, for a pod, the
//! Kubernetes namespace, the pod and the agent-sandbox Sandbox. Recorded when it is taken, in
//! the manifest (covered by the snapshot's digest and any signature) and in the store's ref of
//! each copy (whose owner, for a copy pulled from a registry, is the side that pulled it).
//!
//! Every fact comes from what the tenant cannot write: CRI's own annotations on the pod's
//! sandbox container (CRI sets them after the pod's annotations, so a pod cannot name another
//! namespace), and a label on containerd's container record that only the node agent writes.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::spec::annotation;

/// CRI's annotations of a pod's namespace and name (on each of its containers' specs).
pub const CRI_SANDBOX_NAMESPACE: &str = "io.kubernetes.cri.sandbox-namespace";
pub const CRI_SANDBOX_NAME: &str = "io.kubernetes.cri.sandbox-name";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    /// The containerd namespace (`k8s.io` for every pod; a tool's own otherwise).
    pub namespace: String,
    /// For a pod's snapshot, or a copy pulled for a pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<PodOwner>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodOwner {
    pub namespace: String,
    /// The pod taken (empty for a copy pulled on a namespace's behalf).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pod: String,
    /// The agent-sandbox Sandbox whose suspend took it, as the node agent says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
}

impl Owner {
    /// A sandbox's owner from its container's spec (as runsc runs it) in containerd namespace
    /// `namespace`; `sandbox` is the agent's label on the container record, if any.
    pub fn of_container(namespace: &str, spec: &Value, sandbox: Option<&str>) -> Owner {
        let pod_namespace = annotation(spec, CRI_SANDBOX_NAMESPACE).filter(|n| !n.is_empty());
        Owner {
            namespace: namespace.to_string(),
            kubernetes: pod_namespace.map(|ns| PodOwner {
                namespace: ns.to_string(),
                pod: annotation(spec, CRI_SANDBOX_NAME)
                    .unwrap_or_default()
                    .to_string(),
                sandbox: sandbox.filter(|s| !s.is_empty()).map(String::from),
            }),
        }
    }

    /// A copy pulled in containerd namespace `namespace` for pods of Kubernetes namespace
    /// `pods` (None: a tool's own pull).
    pub fn puller(namespace: &str, pods: Option<&str>) -> Owner {
        Owner {
            namespace: namespace.to_string(),
            kubernetes: pods.map(|ns| PodOwner {
                namespace: ns.to_string(),
                pod: String::new(),
                sandbox: None,
            }),
        }
    }

    /// The Kubernetes namespace it belongs to, if a pod's.
    pub fn pod_namespace(&self) -> Option<&str> {
        self.kubernetes.as_ref().map(|k| k.namespace.as_str())
    }

    /// The Sandbox whose suspend took it, if one did.
    pub fn sandbox(&self) -> Option<&str> {
        self.kubernetes.as_ref().and_then(|k| k.sandbox.as_deref())
    }
}

/// Whether `name` is a Kubernetes namespace name (an RFC 1123 label).
pub fn is_namespace(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_pods_owner_comes_from_cris_annotations() {
        let spec = json!({"annotations": {
            CRI_SANDBOX_NAMESPACE: "team-a", CRI_SANDBOX_NAME: "web-0",
            "chalk.io/anything": "x"
        }});
        let o = Owner::of_container("k8s.io", &spec, Some("sb-1"));
        assert_eq!(o.pod_namespace(), Some("team-a"));
        assert_eq!(o.sandbox(), Some("sb-1"));
        assert_eq!(o.kubernetes.as_ref().unwrap().pod, "web-0");
        let plain = Owner::of_container("default", &json!({}), Some("sb"));
        assert_eq!(plain.kubernetes, None);
        assert_eq!(
            serde_json::to_value(&plain).unwrap(),
            json!({"namespace": "default"})
        );
        let pulled = Owner::puller("k8s.io", Some("team-b"));
        assert_eq!(
            serde_json::to_value(&pulled).unwrap(),
            json!({"namespace": "k8s.io", "kubernetes": {"namespace": "team-b"}})
        );
        assert_eq!(
            Owner::of_container("k8s.io", &spec, Some("")).sandbox(),
            None
        );
    }

    #[test]
    fn namespace_names_are_labels() {
        assert!(is_namespace("team-a1"));
        for bad in ["", "-a", "a-", "A", "a.b", "a/b", &"a".repeat(64)] {
            assert!(!is_namespace(bad), "{bad}");
        }
    }
}
