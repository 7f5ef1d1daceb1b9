//! What snapshots make of pods, as data: the template kept of a pod (its spec, without what
//! its node and the API server gave it) and the pods a fork or a resume creates from it.
//! Pure: the agent and `kubectl chalk` apply it.

use chalk_labels::RESTORE_FROM;
use serde_json::{json, Map, Value};

use crate::crd::FROM_SNAPSHOT_LABEL;

/// Annotations that belong to one pod object, not to what is made again from it.
const DROPPED_ANNOTATIONS: &[&str] = &[
    "kubectl.kubernetes.io/last-applied-configuration",
    RESTORE_FROM,
];

/// The template of `pod` (a Pod as JSON): its name, labels, annotations and spec, without its
/// node, status, identity and the service account volume that admission adds again.
pub fn template_of(pod: &Value) -> Value {
    let meta = &pod["metadata"];
    let mut annotations = meta["annotations"].as_object().cloned().unwrap_or_default();
    for a in DROPPED_ANNOTATIONS {
        annotations.remove(*a);
    }
    let mut spec = pod["spec"].as_object().cloned().unwrap_or_default();
    spec.remove("nodeName");
    let injected = |v: &Value| {
        v["name"]
            .as_str()
            .is_some_and(|n| n.starts_with("kube-api-access-"))
    };
    let dropped: Vec<String> = spec
        .get("volumes")
        .and_then(Value::as_array)
        .map(|vs| {
            vs.iter()
                .filter(|v| injected(v))
                .filter_map(|v| v["name"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    if let Some(Value::Array(vs)) = spec.get_mut("volumes") {
        vs.retain(|v| !injected(v));
    }
    for key in ["containers", "initContainers"] {
        if let Some(Value::Array(cs)) = spec.get_mut(key) {
            for c in cs {
                if let Some(Value::Array(mounts)) = c.get_mut("volumeMounts") {
                    mounts.retain(|m| {
                        !m["name"]
                            .as_str()
                            .is_some_and(|n| dropped.iter().any(|d| d == n))
                    });
                }
            }
        }
    }
    json!({
        "metadata": {
            "name": meta["name"],
            "labels": meta["labels"].as_object().cloned().unwrap_or_default(),
            "annotations": annotations,
        },
        "spec": spec,
    })
}

/// How a pod made from a snapshot is named.
pub enum Naming<'a> {
    /// The template's own name (a resume).
    Same,
    /// A name the API server makes from this prefix (a fork).
    Generated(&'a str),
}

/// The pod that starts from snapshot `snapshot` (a PodSnapshot's name) through
/// `restore_from`, made from `template`; on `node` if given, else wherever the scheduler
/// places it.
pub fn restored_pod(
    template: &Value,
    naming: Naming,
    snapshot: &str,
    restore_from: &str,
    node: Option<&str>,
) -> Value {
    let meta = &template["metadata"];
    let mut labels: Map<String, Value> = meta["labels"].as_object().cloned().unwrap_or_default();
    labels.insert(FROM_SNAPSHOT_LABEL.into(), snapshot.into());
    let mut annotations = meta["annotations"].as_object().cloned().unwrap_or_default();
    annotations.insert(RESTORE_FROM.into(), restore_from.into());
    let mut metadata = json!({"labels": labels, "annotations": annotations});
    match naming {
        Naming::Same => metadata["name"] = meta["name"].clone(),
        Naming::Generated(prefix) => metadata["generateName"] = format!("{prefix}-").into(),
    }
    let mut spec = template["spec"].clone();
    if let Some(node) = node {
        spec["nodeName"] = node.into();
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec})
}

/// The node a pod made from a snapshot must run on: the snapshot's own when it was never
/// pushed (no other node can reach it), else the one asked for, if any.
pub fn placement<'a>(
    pushed: bool,
    snapshot_node: Option<&'a str>,
    asked: Option<&'a str>,
) -> Result<Option<&'a str>, String> {
    match (pushed, asked, snapshot_node) {
        (true, asked, _) => Ok(asked),
        (false, Some(a), Some(n)) if a != n => Err(format!(
            "the snapshot is only on node {n} (it was not pushed to a registry): its pods run \
             there; give the PodSnapshot a pushTo to start them on {a}"
        )),
        (false, _, Some(n)) => Ok(Some(n)),
        (false, _, None) => Err("the snapshot names no node".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> Value {
        json!({
            "metadata": {
                "name": "web", "namespace": "agents", "uid": "u-1", "resourceVersion": "9",
                "labels": {"app": "web"},
                "annotations": {
                    "kubectl.kubernetes.io/last-applied-configuration": "{}",
                    "chalk.io/restore-from": "sha256:old",
                    "team": "a"
                }
            },
            "spec": {
                "nodeName": "node-a",
                "runtimeClassName": "chalk",
                "containers": [{
                    "name": "web", "image": "busybox",
                    "volumeMounts": [
                        {"name": "kube-api-access-x1", "mountPath": "/var/run/secrets"},
                        {"name": "data", "mountPath": "/data"}
                    ]
                }],
                "volumes": [
                    {"name": "kube-api-access-x1", "projected": {}},
                    {"name": "data", "emptyDir": {}}
                ]
            },
            "status": {"podIP": "10.0.0.5"}
        })
    }

    #[test]
    fn a_template_keeps_the_spec_and_drops_what_the_cluster_gave() {
        let t = template_of(&pod());
        assert_eq!(t["metadata"]["name"], "web");
        assert!(t["metadata"].get("uid").is_none());
        assert!(t.get("status").is_none());
        assert!(t["spec"].get("nodeName").is_none());
        assert_eq!(t["spec"]["runtimeClassName"], "chalk");
        let a = t["metadata"]["annotations"].as_object().unwrap();
        assert_eq!(a.keys().collect::<Vec<_>>(), ["team"]);
        assert_eq!(
            t["spec"]["volumes"],
            json!([{"name": "data", "emptyDir": {}}])
        );
        assert_eq!(
            t["spec"]["containers"][0]["volumeMounts"],
            json!([{"name": "data", "mountPath": "/data"}])
        );
    }

    #[test]
    fn a_fork_is_named_by_the_server_and_a_resume_keeps_the_name() {
        let t = template_of(&pod());
        let fork = restored_pod(&t, Naming::Generated("web-fork"), "s1", "r@sha256:1", None);
        assert_eq!(fork["metadata"]["generateName"], "web-fork-");
        assert!(fork["metadata"].get("name").is_none());
        assert!(fork["spec"].get("nodeName").is_none());
        assert_eq!(fork["metadata"]["annotations"][RESTORE_FROM], "r@sha256:1");
        assert_eq!(fork["metadata"]["labels"]["app"], "web");
        assert_eq!(fork["metadata"]["labels"][FROM_SNAPSHOT_LABEL], "s1");
        let resumed = restored_pod(&t, Naming::Same, "s1", "sha256:1", Some("node-a"));
        assert_eq!(resumed["metadata"]["name"], "web");
        assert_eq!(resumed["spec"]["nodeName"], "node-a");
    }

    #[test]
    fn a_snapshot_never_pushed_places_its_pods_on_its_node() {
        assert_eq!(placement(true, Some("a"), None), Ok(None));
        assert_eq!(placement(true, Some("a"), Some("b")), Ok(Some("b")));
        assert_eq!(placement(false, Some("a"), None), Ok(Some("a")));
        assert_eq!(placement(false, Some("a"), Some("a")), Ok(Some("a")));
        let e = placement(false, Some("a"), Some("b")).unwrap_err();
        assert!(e.contains("only on node a") && e.contains("pushTo"), "{e}");
        assert!(placement(false, None, None).is_err());
    }
}
