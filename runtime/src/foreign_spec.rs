//! A spec that arrives with a snapshot from elsewhere (a registry, another host) is never run
//! as it came: it is rebuilt here from an allow-list, field by field, and anything else is
//! dropped. What a sandbox may do to its host (hooks, devices, cgroup and LSM placement,
//! runtime and CDI annotations, host ids, scheduling) is the restoring side's to give, never
//! a snapshot's. Two things are refused rather than dropped, because the sandbox's memory
//! expects them and this host cannot honour them: bind mounts of host paths, and joining
//! namespaces of processes already on this host.
//!
//! The allow-list, and why each field is safe to take from a stranger:
//!
//! | field | taken | why it is safe |
//! |---|---|---|
//! | `ociVersion` | as is | the format's version: it tells the host nothing to do |
//! | `process.terminal`, `consoleSize` | as is | whether the shim gives the init a terminal, its size |
//! | `process.args`, `env`, `cwd` | as is | what runs inside the sandbox, under gVisor's kernel |
//! | `process.user` (uid, gid, umask, additionalGids) | as is | ids inside gVisor's kernel: runsc runs the sandbox as its own host user whatever they are |
//! | `process.capabilities` | each set within containerd's default set | capabilities inside gVisor's kernel, and never more than a container gets here without asking |
//! | `process.noNewPrivileges` | as is | it only takes privileges away |
//! | `process.rlimits` | as is | limits gVisor's kernel keeps on the processes inside (and runsc refuses a restore whose rlimits differ from the checkpoint's) |
//! | `root.readonly` | as is | it only takes writes away; `root.path` is always the bundle's own `rootfs` |
//! | `hostname`, `domainname` | as is | names inside the sandbox's own UTS namespace |
//! | `mounts` of `proc`, `sysfs`, `tmpfs`, `devpts`, `mqueue`, `cgroup`, `cgroup2` | destination, type, options | file systems gVisor's kernel makes inside the sandbox, from no host path |
//! | `annotations` `chalk.io/lifetime`, `chalk.io/on-timeout`, `chalk.io/network` | as is | how long it runs, what ends it, and the name of a network this host configures |
//! | `annotations` `chalk.io/network-default` | as is | the network was chalkctl's default, which a host that cannot give it leaves out: it only asks for less |
//! | `annotations` `io.kubernetes.cri.*` | as is | the pod's shape (which container is its sandbox): a fork rewrites them |
//! | `linux.namespaces` (pid, network, ipc, uts, mount, cgroup) | type only | a namespace of its own: a `path` (joining one here) is refused |
//! | `linux.resources` memory, cpu shares/quota/period, pids | as is | limits of the sandbox's own cgroup: they only narrow, and a restore may not widen them |
//! | `linux.maskedPaths`, `readonlyPaths`, `seccomp` | as is | they only take access away, inside the sandbox |
//!
//! runsc (from 2025) refuses a restore whose spec differs from the checkpoint's in most
//! fields: a snapshot whose sandbox had a device, a sysctl, an OOM score or an LSM label is
//! therefore refused when it comes from elsewhere, rather than run with them.
//!
//! Everything else is dropped, and named: `hooks` (runsc runs them on the host, as root),
//! `linux.devices` and `resources.devices` (host devices), `linux.cgroupsPath` (the host's
//! cgroup tree: the restoring side's containerd places it), `resources` `unified`, `blockIO`,
//! `hugepageLimits`, `rdma`, `network` and cpusets (host resources), `linux.sysctl`,
//! `uidMappings`/`gidMappings`, the `user` namespace, `intelRdt`, `rootfsPropagation`,
//! `mountLabel`, `personality`, `timeOffsets`, `process` `apparmorProfile`, `selinuxLabel`,
//! `oomScoreAdj`, `ioPriority`, `scheduler` and `execCPUAffinity` (host placement and host LSM
//! labels), and every other annotation (`dev.gvisor.*` flags runsc obeys,
//! `cdi.k8s.io/*` devices, `chalk.io/hooks`, `chalk.io/ports`, `chalk.io/private-mounts-of`,
//! `chalk.io/gpu`).

use serde_json::{json, Map, Value};

use crate::spec::{is_bind_mount, strings};

/// The most a rebuilt spec may have in any capability set: what containerd gives a
/// container that asks for none.
pub const DEFAULT_CAPABILITIES: &[&str] = &crate::caps::CONTAINERD_DEFAULT;

const MOUNT_TYPES: &[&str] = &[
    "proc", "sysfs", "tmpfs", "devpts", "mqueue", "cgroup", "cgroup2",
];
const NAMESPACES: &[&str] = &["pid", "network", "ipc", "uts", "mount", "cgroup"];
const ANNOTATIONS: &[&str] = &[
    chalk_labels::LIFETIME_ANNOTATION,
    chalk_labels::ON_TIMEOUT_ANNOTATION,
    chalk_labels::NETWORK_ANNOTATION,
    chalk_labels::NETWORK_DEFAULT_ANNOTATION,
];
const CRI_ANNOTATIONS: &str = "io.kubernetes.cri.";

/// A spec rebuilt from the allow-list, and what of the original was left out.
#[derive(Debug, Clone, PartialEq)]
pub struct Rebuilt {
    pub spec: Value,
    /// Each field (or annotation) dropped, by its path in the spec.
    pub dropped: Vec<String>,
}

/// Rebuilds `foreign` (a spec that came with a snapshot from elsewhere) from the allow-list,
/// placed in cgroup `cgroups_path` of this host (none: runsc's own placement); refuses it,
/// naming why, when it binds host paths or joins namespaces of this host.
pub fn rebuild(foreign: &Value, cgroups_path: Option<&str>) -> Result<Rebuilt, String> {
    refuse_host_reach(foreign)?;
    let mut dropped = Vec::new();
    let mut out = Map::new();
    if let Some(v) = foreign.get("ociVersion").filter(|v| v.is_string()) {
        out.insert("ociVersion".into(), v.clone());
    }
    out.insert("process".into(), process(&foreign["process"], &mut dropped));
    out.insert(
        "root".into(),
        json!({"path": "rootfs", "readonly": foreign["root"]["readonly"].as_bool().unwrap_or(false)}),
    );
    for key in ["hostname", "domainname"] {
        if let Some(v) = foreign.get(key).filter(|v| v.is_string()) {
            out.insert(key.into(), v.clone());
        }
    }
    out.insert("mounts".into(), mounts(&foreign["mounts"], &mut dropped));
    let annotations = annotations(&foreign["annotations"], &mut dropped);
    if !annotations.is_empty() {
        out.insert("annotations".into(), Value::Object(annotations));
    }
    let mut linux = linux(&foreign["linux"], &mut dropped);
    if let Some(path) = cgroups_path {
        linux["cgroupsPath"] = path.into();
        // Only a placement other than this host's own is worth naming.
        if foreign["linux"]["cgroupsPath"] == path {
            dropped.retain(|d| d != "linux.cgroupsPath");
        }
    }
    out.insert("linux".into(), linux);
    note_dropped(
        foreign,
        "",
        &[
            "ociVersion",
            "process",
            "root",
            "hostname",
            "domainname",
            "mounts",
            "annotations",
            "linux",
        ],
        &mut dropped,
    );
    Ok(Rebuilt {
        spec: Value::Object(out),
        dropped,
    })
}

/// What of `spec` acts on the host when runsc runs it, beyond what containerd gives every
/// container: hooks, devices, the annotations runsc and CDI obey, host paths and namespace
/// joins. A restore of a snapshot from elsewhere is refused while its spec has any (a spec
/// rebuilt by [`rebuild`] has none).
pub fn acts_on_host(spec: &Value) -> Vec<String> {
    let mut out = Vec::new();
    if let Err(refused) = refuse_host_reach(spec) {
        out.push(refused);
    }
    for (stage, hooks) in spec["hooks"].as_object().into_iter().flatten() {
        if hooks.as_array().is_some_and(|h| !h.is_empty()) {
            out.push(format!("hooks.{stage}"));
        }
    }
    if spec["linux"]["devices"]
        .as_array()
        .is_some_and(|d| !d.is_empty())
    {
        out.push("linux.devices".into());
    }
    for key in spec["annotations"]
        .as_object()
        .into_iter()
        .flat_map(|a| a.keys())
    {
        if HOST_ANNOTATIONS.iter().any(|p| key.starts_with(p)) {
            out.push(format!("annotations.{key}"));
        }
    }
    out
}

/// Annotations that runsc (its flags, mounts and devices) or CDI act on, on the host.
const HOST_ANNOTATIONS: &[&str] = &["dev.gvisor.", "cdi.k8s.io/"];

fn refuse_host_reach(spec: &Value) -> Result<(), String> {
    let binds: Vec<String> = array(&spec["mounts"])
        .filter(|m| is_bind_mount(m))
        .map(|m| {
            format!(
                "{} on {}",
                m["source"].as_str().unwrap_or("?"),
                m["destination"].as_str().unwrap_or("?")
            )
        })
        .collect();
    let joins: Vec<String> = array(&spec["linux"]["namespaces"])
        .filter(|n| n["path"].as_str().is_some_and(|p| !p.is_empty()))
        .map(|n| format!("{} ({})", n["type"].as_str().unwrap_or("?"), n["path"]))
        .collect();
    let mut what = Vec::new();
    if !binds.is_empty() {
        what.push(format!("binds host paths {}", binds.join(", ")));
    }
    if !joins.is_empty() {
        what.push(format!("joins existing namespaces {}", joins.join(", ")));
    }
    if what.is_empty() {
        return Ok(());
    }
    Err(format!(
        "the snapshot came from elsewhere and its spec {}: a sandbox made from it here would \
         reach this host's files or processes; refused (snapshot a sandbox without them to move \
         it)",
        what.join("; ")
    ))
}

fn array(v: &Value) -> impl Iterator<Item = &Value> {
    v.as_array().into_iter().flatten()
}

/// Records each key of object `v` (at `path`) that is not in `kept`.
fn note_dropped(v: &Value, path: &str, kept: &[&str], dropped: &mut Vec<String>) {
    for key in v.as_object().into_iter().flat_map(|o| o.keys()) {
        if !kept.contains(&key.as_str()) {
            dropped.push(if path.is_empty() {
                key.clone()
            } else {
                format!("{path}.{key}")
            });
        }
    }
}

fn copy(from: &Value, to: &mut Map<String, Value>, keys: &[&str]) {
    for key in keys {
        if let Some(v) = from.get(*key).filter(|v| !v.is_null()) {
            to.insert((*key).into(), v.clone());
        }
    }
}

fn process(p: &Value, dropped: &mut Vec<String>) -> Value {
    let mut out = Map::new();
    copy(
        p,
        &mut out,
        &["terminal", "consoleSize", "args", "env", "cwd", "rlimits"],
    );
    if let Some(user) = p.get("user") {
        let mut u = Map::new();
        copy(user, &mut u, &["uid", "gid", "umask", "additionalGids"]);
        note_dropped(
            user,
            "process.user",
            &["uid", "gid", "umask", "additionalGids"],
            dropped,
        );
        out.insert("user".into(), Value::Object(u));
    }
    if let Some(caps) = p.get("capabilities").and_then(Value::as_object) {
        let mut c = Map::new();
        for (set, names) in caps {
            let (kept, cut): (Vec<String>, Vec<String>) = strings(names)
                .into_iter()
                .partition(|n| DEFAULT_CAPABILITIES.contains(&n.as_str()));
            for n in cut {
                dropped.push(format!("process.capabilities.{set}.{n}"));
            }
            c.insert(set.clone(), json!(kept));
        }
        out.insert("capabilities".into(), Value::Object(c));
    }
    if let Some(v) = p.get("noNewPrivileges").filter(|v| v.is_boolean()) {
        out.insert("noNewPrivileges".into(), v.clone());
    }
    note_dropped(
        p,
        "process",
        &[
            "terminal",
            "consoleSize",
            "args",
            "env",
            "cwd",
            "rlimits",
            "user",
            "capabilities",
            "noNewPrivileges",
        ],
        dropped,
    );
    Value::Object(out)
}

fn mounts(ms: &Value, dropped: &mut Vec<String>) -> Value {
    let mut out = Vec::new();
    for (i, m) in array(ms).enumerate() {
        let kind = m["type"].as_str().unwrap_or("");
        let dest = m["destination"].as_str().unwrap_or("");
        let inside = dest.starts_with('/') && !dest.split('/').any(|c| c == "..");
        if MOUNT_TYPES.contains(&kind) && inside {
            let mut kept = Map::new();
            kept.insert("destination".into(), dest.into());
            kept.insert("type".into(), kind.into());
            // A kernel file system is named by its type: never a host path.
            kept.insert("source".into(), kind.into());
            let options: Vec<String> = strings(&m["options"])
                .into_iter()
                .filter(|o| !o.contains("context="))
                .collect();
            kept.insert("options".into(), json!(options));
            out.push(Value::Object(kept));
        } else {
            dropped.push(format!("mounts[{i}] ({kind} on {dest})"));
        }
    }
    Value::Array(out)
}

fn annotations(a: &Value, dropped: &mut Vec<String>) -> Map<String, Value> {
    let mut out = Map::new();
    for (k, v) in a.as_object().into_iter().flatten() {
        if v.is_string() && (ANNOTATIONS.contains(&k.as_str()) || k.starts_with(CRI_ANNOTATIONS)) {
            out.insert(k.clone(), v.clone());
        } else {
            dropped.push(format!("annotations.{k}"));
        }
    }
    out
}

fn linux(l: &Value, dropped: &mut Vec<String>) -> Value {
    let mut out = Map::new();
    let namespaces: Vec<Value> = array(&l["namespaces"])
        .filter_map(|n| {
            let kind = n["type"].as_str()?;
            if NAMESPACES.contains(&kind) {
                Some(json!({ "type": kind }))
            } else {
                dropped.push(format!("linux.namespaces ({kind})"));
                None
            }
        })
        .collect();
    out.insert("namespaces".into(), Value::Array(namespaces));
    let r = &l["resources"];
    if r.is_object() {
        let mut res = Map::new();
        let mut memory = Map::new();
        copy(&r["memory"], &mut memory, &["limit", "reservation", "swap"]);
        note_dropped(
            &r["memory"],
            "linux.resources.memory",
            &["limit", "reservation", "swap"],
            dropped,
        );
        let mut cpu = Map::new();
        copy(&r["cpu"], &mut cpu, &["shares", "quota", "period"]);
        note_dropped(
            &r["cpu"],
            "linux.resources.cpu",
            &["shares", "quota", "period"],
            dropped,
        );
        let mut pids = Map::new();
        copy(&r["pids"], &mut pids, &["limit"]);
        for (key, map) in [("memory", memory), ("cpu", cpu), ("pids", pids)] {
            if !map.is_empty() {
                res.insert(key.into(), Value::Object(map));
            }
        }
        note_dropped(r, "linux.resources", &["memory", "cpu", "pids"], dropped);
        out.insert("resources".into(), Value::Object(res));
    }
    copy(l, &mut out, &["maskedPaths", "readonlyPaths", "seccomp"]);
    note_dropped(
        l,
        "linux",
        &[
            "namespaces",
            "resources",
            "maskedPaths",
            "readonlyPaths",
            "seccomp",
        ],
        dropped,
    );
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A spec as a hostile registry would ship it: everything that acts on a host.
    fn hostile() -> Value {
        json!({
            "ociVersion": "1.1.0",
            "process": {
                "terminal": false, "args": ["sh"], "env": ["A=1"], "cwd": "/",
                "user": {"uid": 0, "gid": 0, "additionalGids": [1]},
                "capabilities": {"bounding": ["CAP_KILL", "CAP_SYS_ADMIN"], "effective": ["CAP_KILL"]},
                "oomScoreAdj": -1000, "apparmorProfile": "unconfined",
                "noNewPrivileges": true, "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1, "soft": 1}]
            },
            "root": {"path": "/", "readonly": true},
            "hostname": "h",
            "mounts": [
                {"destination": "/proc", "type": "proc", "source": "/host/proc", "options": ["nosuid"]},
                {"destination": "/dev/fuse", "type": "devtmpfs", "source": "/dev"},
                {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["context=\"x\""]}
            ],
            "hooks": {"prestart": [{"path": "/bin/sh", "args": ["sh", "-c", "touch /host-marker"]}],
                      "createRuntime": [{"path": "/bin/true"}]},
            "annotations": {
                "chalk.io/lifetime": "1h", "dev.gvisor.flag.platform": "kvm",
                "chalk.io/network": "chalk", "chalk.io/network-default": "true",
                "cdi.k8s.io/gpu": "nvidia.com/gpu=all", "chalk.io/hooks": "[]",
                "io.kubernetes.cri.container-type": "sandbox"
            },
            "linux": {
                "namespaces": [{"type": "pid"}, {"type": "network"}, {"type": "user"}],
                "devices": [{"path": "/dev/sda", "type": "b", "major": 8, "minor": 0}],
                "resources": {"devices": [{"allow": true, "access": "rwm"}],
                              "memory": {"limit": 1048576, "kernel": 5},
                              "cpu": {"quota": 1000, "cpus": "0-3"}, "unified": {"memory.max": "max"}},
                "cgroupsPath": "/", "sysctl": {"kernel.x": "1"},
                "uidMappings": [{"containerID": 0, "hostID": 0, "size": 1}],
                "maskedPaths": ["/proc/kcore"]
            }
        })
    }

    #[test]
    fn nothing_that_acts_on_the_host_survives_a_rebuild() {
        let r = rebuild(&hostile(), Some("/default/web")).unwrap();
        let s = &r.spec;
        assert!(s.get("hooks").is_none());
        assert!(s["linux"].get("devices").is_none());
        assert_eq!(s["linux"]["cgroupsPath"], "/default/web");
        assert!(s["linux"].get("sysctl").is_none());
        assert!(s["linux"].get("uidMappings").is_none());
        assert!(s["linux"]["resources"].get("devices").is_none());
        assert!(s["linux"]["resources"].get("unified").is_none());
        assert_eq!(s["linux"]["resources"]["memory"], json!({"limit": 1048576}));
        assert_eq!(s["linux"]["resources"]["cpu"], json!({"quota": 1000}));
        assert_eq!(
            s["linux"]["namespaces"],
            json!([{"type": "pid"}, {"type": "network"}])
        );
        assert_eq!(s["root"], json!({"path": "rootfs", "readonly": true}));
        assert!(s["process"].get("oomScoreAdj").is_none());
        assert!(s["process"].get("apparmorProfile").is_none());
        assert_eq!(s["process"]["rlimits"][0]["type"], "RLIMIT_NOFILE");
        assert_eq!(
            s["process"]["capabilities"]["bounding"],
            json!(["CAP_KILL"])
        );
        assert_eq!(s["process"]["args"], json!(["sh"]));
        assert_eq!(
            s["annotations"],
            json!({
                "chalk.io/lifetime": "1h", "io.kubernetes.cri.container-type": "sandbox",
                // A default network stays optional: a host that cannot give it leaves it out.
                "chalk.io/network": "chalk", "chalk.io/network-default": "true"
            })
        );
        assert_eq!(
            s["mounts"],
            json!([
                {"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid"]},
                {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": []}
            ])
        );
        for named in [
            "hooks",
            "linux.devices",
            "linux.cgroupsPath",
            "linux.resources.devices",
            "annotations.dev.gvisor.flag.platform",
            "annotations.cdi.k8s.io/gpu",
            "annotations.chalk.io/hooks",
            "process.capabilities.bounding.CAP_SYS_ADMIN",
            "process.oomScoreAdj",
            "linux.namespaces (user)",
        ] {
            assert!(
                r.dropped.iter().any(|d| d == named),
                "{named}: {:?}",
                r.dropped
            );
        }
        // Rebuilding what was rebuilt changes nothing, and drops nothing.
        let again = rebuild(&r.spec, Some("/default/web")).unwrap();
        assert_eq!(again.spec, r.spec);
        assert!(again.dropped.is_empty(), "{:?}", again.dropped);
        assert!(acts_on_host(&r.spec).is_empty());
        let acts = acts_on_host(&hostile());
        for named in [
            "hooks.prestart",
            "hooks.createRuntime",
            "linux.devices",
            "annotations.dev.gvisor.flag.platform",
            "annotations.cdi.k8s.io/gpu",
        ] {
            assert!(acts.iter().any(|d| d == named), "{named}: {acts:?}");
        }
    }

    #[test]
    fn host_paths_and_namespace_joins_are_refused() {
        let plain = json!({
            "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
            "linux": {"namespaces": [{"type": "pid"}, {"type": "network"}]}});
        assert!(rebuild(&plain, None).is_ok());
        let bind = json!(
            {"mounts": [{"destination": "/data", "source": "/", "options": ["rbind"]}]});
        let err = rebuild(&bind, None).unwrap_err();
        assert!(err.contains("binds host paths / on /data"), "{err}");
        let join = json!(
            {"linux": {"namespaces": [{"type": "network", "path": "/proc/1/ns/net"}]}});
        let err = rebuild(&join, None).unwrap_err();
        assert!(err.contains("joins existing namespaces network"), "{err}");
        assert_eq!(acts_on_host(&join).len(), 1);
    }

    #[test]
    fn a_mount_that_climbs_out_is_dropped() {
        let spec = json!({"mounts": [
            {"destination": "/a/../../etc", "type": "tmpfs", "source": "tmpfs"},
            {"destination": "relative", "type": "tmpfs", "source": "tmpfs"}
        ]});
        let r = rebuild(&spec, None).unwrap();
        assert_eq!(r.spec["mounts"], json!([]));
        assert_eq!(r.dropped.len(), 2);
    }
}
