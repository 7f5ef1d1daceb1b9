//! Small readers over OCI runtime spec JSON shared by the modules that inspect specs.

use serde_json::Value;

/// containerd's CRI plugin marks each container of a pod with these annotations; runsc reads
/// the same ones to decide whether a container makes a sandbox or joins one.
pub const CRI_CONTAINER_TYPE: &str = "io.kubernetes.cri.container-type";
pub const CRI_SANDBOX_ID: &str = "io.kubernetes.cri.sandbox-id";

/// The strings of a JSON array (a capability set, args, env); empty when absent.
pub fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(String::from))
        .collect()
}

fn annotation<'a>(spec: &'a Value, key: &str) -> Option<&'a str> {
    spec.get("annotations")?.get(key)?.as_str()
}

/// Where a container runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// In a sandbox of its own: a plain container, or a pod's sandbox (pause) container.
    OwnSandbox,
    /// Inside the sandbox of its pod, whose sandbox container has id `sandbox_id`.
    InPod { sandbox_id: String },
}

impl Placement {
    pub fn of(spec: &Value) -> Result<Placement, String> {
        if annotation(spec, CRI_CONTAINER_TYPE) != Some("container") {
            return Ok(Placement::OwnSandbox);
        }
        let sandbox_id = annotation(spec, CRI_SANDBOX_ID)
            .ok_or_else(|| format!("a pod container needs the annotation {CRI_SANDBOX_ID}"))?;
        crate::ids::container_id(sandbox_id).map_err(|e| format!("{CRI_SANDBOX_ID}: {e}"))?;
        Ok(Placement::InPod {
            sandbox_id: sandbox_id.to_string(),
        })
    }
}

/// The `oomScoreAdj` a container asks for, unless it is a pod's sandbox (pause) container:
/// a gVisor sandbox holds the whole pod, so it takes the lowest of its workload containers'
/// scores, and the pause container's (near -1000) would make every pod nearly unkillable.
pub fn workload_oom_score_adj(spec: &Value) -> Option<i32> {
    if annotation(spec, CRI_CONTAINER_TYPE) == Some("sandbox") {
        return None;
    }
    spec.pointer("/process/oomScoreAdj")?
        .as_i64()
        .and_then(|v| i32::try_from(v).ok())
}

/// The id of the sandbox `id` runs in: its pod's, or its own. Containers of one pod share one
/// shim and one runsc root, as they share one sandbox.
pub fn sandbox_id_of(spec: Option<&Value>, id: &str) -> String {
    spec.and_then(|s| annotation(s, CRI_SANDBOX_ID))
        .filter(|s| crate::ids::container_id(s).is_ok())
        .unwrap_or(id)
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_string_arrays_and_skips_the_rest() {
        assert_eq!(strings(&json!(["a", 1, "b"])), ["a", "b"]);
        assert!(strings(&Value::Null).is_empty());
    }

    #[test]
    fn pod_containers_join_their_sandbox_and_the_rest_make_one() {
        let pod =
            |t: &str, s: &str| json!({"annotations": {CRI_CONTAINER_TYPE: t, CRI_SANDBOX_ID: s}});
        assert_eq!(Placement::of(&json!({})), Ok(Placement::OwnSandbox));
        assert_eq!(
            Placement::of(&pod("sandbox", "p1")),
            Ok(Placement::OwnSandbox)
        );
        assert_eq!(
            Placement::of(&pod("container", "p1")),
            Ok(Placement::InPod {
                sandbox_id: "p1".into()
            })
        );
        assert!(Placement::of(&pod("container", "../x")).is_err());
        assert!(Placement::of(&json!({"annotations": {CRI_CONTAINER_TYPE: "container"}})).is_err());
    }

    #[test]
    fn pause_containers_do_not_set_the_sandbox_oom_score() {
        let spec = |t: &str| json!({"annotations": {CRI_CONTAINER_TYPE: t}, "process": {"oomScoreAdj": -998}});
        assert_eq!(workload_oom_score_adj(&spec("sandbox")), None);
        assert_eq!(workload_oom_score_adj(&spec("container")), Some(-998));
        assert_eq!(workload_oom_score_adj(&json!({"process": {}})), None);
    }

    #[test]
    fn the_sandbox_id_is_the_pods_when_valid() {
        let spec = json!({"annotations": {CRI_SANDBOX_ID: "pod1"}});
        assert_eq!(sandbox_id_of(Some(&spec), "c1"), "pod1");
        assert_eq!(sandbox_id_of(None, "c1"), "c1");
        let bad = json!({"annotations": {CRI_SANDBOX_ID: "../x"}});
        assert_eq!(sandbox_id_of(Some(&bad), "c1"), "c1");
    }
}
