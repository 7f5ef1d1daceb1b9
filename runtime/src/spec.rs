//! Small readers over OCI runtime spec JSON shared by the modules that inspect specs.

pub use chalk_labels::PRIVATE_MOUNTS_OF;
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

/// Annotation `key` of OCI spec `spec`, when it is a string.
pub fn annotation<'a>(spec: &'a Value, key: &str) -> Option<&'a str> {
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
    pub fn in_pod(&self) -> bool {
        matches!(self, Placement::InPod { .. })
    }

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

/// Whether OCI mount `m` is a bind mount (by its type, or `bind`/`rbind` in its options).
pub fn is_bind_mount(m: &Value) -> bool {
    m["type"] == "bind"
        || strings(&m["options"])
            .iter()
            .any(|o| o == "bind" || o == "rbind")
}

/// CRI's annotation with the pod's uid (the kubelet keys its per-pod files by it).
pub const CRI_SANDBOX_UID: &str = "io.kubernetes.cri.sandbox-uid";

/// Whether bind-mount `source` is one of pod `pod`'s own files: containerd's per-pod
/// directory (`…/sandboxes/<pod>/…`), the kubelet's (`…/pods/<uid>/…`, but not its volumes,
/// which stay outside a snapshot), or a copy an earlier fork made (`…/private-mounts/…`).
fn is_pod_file(source: &str, pod: &str, uid: Option<&str>) -> bool {
    let parts: Vec<&str> = source.split('/').filter(|p| !p.is_empty()).collect();
    let after = |dir: &str, id: &str| {
        parts
            .windows(2)
            .position(|w| w[0] == dir && w[1] == id)
            .map(|i| parts.get(i + 2).copied())
    };
    if after("sandboxes", pod).is_some() || parts.contains(&"private-mounts") {
        return true;
    }
    match uid.and_then(|uid| after("pods", uid)) {
        Some(next) => !matches!(next, Some("volumes" | "volume-subpaths" | "plugins")),
        None => false,
    }
}

/// The indexes of the bind mounts in `spec` that are pod `pod`'s own files (see
/// [`is_pod_file`]; the pod's uid comes from the spec): what a fork of the pod must not share.
pub fn pod_private_mounts(spec: &Value, pod: &str) -> Vec<usize> {
    if crate::ids::container_id(pod).is_err() {
        return Vec::new();
    }
    let uid = annotation(spec, CRI_SANDBOX_UID).filter(|u| crate::ids::container_id(u).is_ok());
    let mounts = spec.get("mounts").and_then(Value::as_array);
    mounts
        .into_iter()
        .flatten()
        .enumerate()
        .filter(|(_, m)| {
            is_bind_mount(m) && is_pod_file(m["source"].as_str().unwrap_or(""), pod, uid)
        })
        .map(|(i, _)| i)
        .collect()
}

/// A fork's spec from its source's: container `old_id` becomes `new_id`, in pod `new_pod`
/// (from `old_pod`) when it is a pod's. It gets a cgroup of its own, a network of its own
/// (runsc and the shim make a fresh namespace where the spec names none), and copies of the
/// source pod's files.
pub fn fork_spec(spec: &mut Value, old_id: &str, new_id: &str, pod: Option<(&str, &str)>) {
    if let Some(path) = spec.pointer_mut("/linux/cgroupsPath") {
        if let Some(p) = path.as_str().map(str::to_string) {
            *path = Value::String(fork_cgroup(&p, old_id, new_id, pod.map(|(_, new)| new)));
        }
    }
    if let Some(namespaces) = spec
        .pointer_mut("/linux/namespaces")
        .and_then(Value::as_array_mut)
    {
        // A pod container's namespaces are its sandbox's (`/proc/<sandbox pid>/ns/...`):
        // the source's. The fork's container shares its own sandbox's instead; runsc makes
        // a pid namespace given as the sandbox's the sandbox root one, so leave it out.
        let of_a_process = |ns: &Value| {
            ns["path"]
                .as_str()
                .is_some_and(|p| p.starts_with("/proc/") && p.contains("/ns/"))
        };
        namespaces.retain(|ns| !(ns["type"] == "pid" && of_a_process(ns)));
        for ns in namespaces.iter_mut() {
            if ns["type"] == "network" || of_a_process(ns) {
                if let Some(ns) = ns.as_object_mut() {
                    ns.remove("path");
                }
            }
        }
    }
    if let Some((old_pod, new_pod)) = pod {
        if let Some(a) = spec.get_mut("annotations").and_then(Value::as_object_mut) {
            a.insert(CRI_SANDBOX_ID.into(), new_pod.into());
            a.insert(PRIVATE_MOUNTS_OF.into(), old_pod.into());
        }
    }
}

/// A fork's cgroup path. A pod's fork leaves the pod's cgroup (its limits are the source's,
/// and the kubelet kills what is left in it when the source pod goes): it gets one of its own
/// under `chalk-forks`, in the path's style (cgroupfs `/a/b`, or systemd `slice:prefix:name`).
/// Any other fork takes the source's path with its id in place of the source's.
fn fork_cgroup(path: &str, old_id: &str, new_id: &str, new_pod: Option<&str>) -> String {
    match new_pod {
        Some(pod) if path.contains(':') => format!("chalk-forks.slice:chalk-{pod}:{new_id}"),
        Some(pod) => format!("/chalk-forks/{pod}/{new_id}"),
        None => path.replace(old_id, new_id),
    }
}

/// The kubelet's cgroup of the pod whose sandbox (pause) container `spec` is, when its
/// `linux.cgroupsPath` names one by path (cgroupfs: `…/pod<uid>/<container>`). A gVisor
/// sandbox holds the whole pod and runsc sizes it (memory, CPUs) from the cgroup it is put
/// in: the pause container's has no limits, the pod's has them all (its containers' and the
/// RuntimeClass overhead). gVisor's own shim names the pod's cgroup by an annotation, which
/// runsc compares across a restore; the path is not compared, so a pod restored from a
/// snapshot joins its own new pod's cgroup. A systemd path (`slice:prefix:name`) is left as it
/// is.
pub fn pod_cgroup(spec: &Value) -> Option<String> {
    if annotation(spec, CRI_CONTAINER_TYPE) != Some("sandbox") {
        return None;
    }
    let path = spec.pointer("/linux/cgroupsPath")?.as_str()?;
    if path.contains(':') || !path.starts_with('/') {
        return None;
    }
    let (parent, _container) = path.trim_end_matches('/').rsplit_once('/')?;
    let is_pod = is_pod_cgroup_path(parent);
    (is_pod && !parent.split('/').any(|c| c == "..")).then(|| parent.to_string())
}

/// Whether cgroup path `path` ends in a kubelet's pod directory (`pod<uid>`).
pub fn is_pod_cgroup_path(path: &str) -> bool {
    let last = path.trim_end_matches('/').rsplit('/').next().unwrap_or("");
    last.len() > 3
        && last.starts_with("pod")
        && last[3..]
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
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
    fn a_pod_sandbox_is_sized_by_its_pods_cgroup() {
        let spec = |kind: &str, path: &str| json!({"annotations": {CRI_CONTAINER_TYPE: kind}, "linux": {"cgroupsPath": path}});
        let pod = "/node-a/kubepods/burstable/pod6f1c2d3e-aa/0123abcd";
        assert_eq!(
            pod_cgroup(&spec("sandbox", pod)).as_deref(),
            Some("/node-a/kubepods/burstable/pod6f1c2d3e-aa")
        );
        assert_eq!(
            pod_cgroup(&spec("sandbox", "/kubepods/podabc/c1")).as_deref(),
            Some("/kubepods/podabc")
        );
        // A pod's container, a plain container, a fork's own cgroup, systemd's form and a
        // path that climbs are left alone.
        assert_eq!(pod_cgroup(&spec("container", pod)), None);
        assert_eq!(pod_cgroup(&json!({"linux": {"cgroupsPath": pod}})), None);
        assert_eq!(pod_cgroup(&spec("sandbox", "/chalk-forks/p1/f1")), None);
        assert_eq!(pod_cgroup(&spec("sandbox", "/k8s.io/0123abcd")), None);
        assert_eq!(
            pod_cgroup(&spec("sandbox", "kubepods-podabc.slice:cri-containerd:c1")),
            None
        );
        assert_eq!(pod_cgroup(&spec("sandbox", "/../podabc/c1")), None);
        assert_eq!(pod_cgroup(&spec("sandbox", "/pod/c1")), None);
    }

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
    fn a_fork_owns_its_cgroup_network_and_pod_files() {
        let old = "a".repeat(64);
        let mut spec = json!({
            "linux": {
                "cgroupsPath": "/kubepods/pod1/c1",
                "namespaces": [
                    {"type": "network", "path": "/var/run/netns/cni-1"},
                    {"type": "pid", "path": "/proc/42/ns/pid"},
                    {"type": "ipc", "path": "/proc/42/ns/ipc"},
                    {"type": "mount"}
                ]
            },
            "mounts": [
                {"destination": "/etc/hosts", "type": "bind", "source": format!("/var/lib/cri/sandboxes/{old}/hosts")},
                {"destination": "/data", "type": "bind", "source": "/srv/data"},
                {"destination": "/dev/shm", "type": "none", "options": ["rbind"], "source": format!("/run/cri/sandboxes/{old}/shm")},
                {"destination": "/proc", "type": "proc", "source": "proc"},
                {"destination": "/dev/termination-log", "type": "bind", "source": "/var/lib/kubelet/pods/u1/containers/web/0"},
                {"destination": "/cache", "type": "bind", "source": "/var/lib/kubelet/pods/u1/volumes/kubernetes.io~empty-dir/cache"},
                {"destination": "/etc/resolv.conf", "type": "bind", "source": "/run/ctd/task/web-f1/private-mounts/3"},
                {"destination": "/named", "type": "bind", "source": format!("/srv/{old}/x")}
            ],
            "annotations": {CRI_SANDBOX_ID: old, CRI_CONTAINER_TYPE: "container", CRI_SANDBOX_UID: "u1"}
        });
        // Containerd's and the kubelet's per-pod files and an earlier fork's copies; not
        // volumes, nor a path that merely names the pod.
        assert_eq!(pod_private_mounts(&spec, &old), [0, 2, 4, 6]);
        assert!(pod_private_mounts(&spec, "../x").is_empty());
        fork_spec(&mut spec, "c1", "f-c1", Some((&old, "f")));
        assert_eq!(spec["linux"]["cgroupsPath"], "/chalk-forks/f/f-c1");
        assert_eq!(
            spec["linux"]["namespaces"],
            json!([{"type": "network"}, {"type": "ipc"}, {"type": "mount"}])
        );
        assert_eq!(spec["annotations"][CRI_SANDBOX_ID], "f");
        assert_eq!(spec["annotations"][PRIVATE_MOUNTS_OF], old.as_str());
        let mut plain = json!({"linux": {"cgroupsPath": "/ns/c1"}});
        fork_spec(&mut plain, "c1", "f", None);
        assert_eq!(plain, json!({"linux": {"cgroupsPath": "/ns/f"}}));
        assert_eq!(
            fork_cgroup("kubepods.slice:cri-containerd:c1", "c1", "f-c1", Some("f")),
            "chalk-forks.slice:chalk-f:f-c1"
        );
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
