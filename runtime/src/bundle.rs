//! The container's bundle: its spec read and adapted for runsc, root-only files written, and
//! the record the shim keeps there so that containerd's separate `shim delete` invocation
//! (after a shim crash) can find the sandbox and clean it up.

use std::{
    io::Write,
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{caps, netns, Error, Result};

pub const RECORD_FILE: &str = "chalk-shim.json";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// runsc binary used for this container.
    pub binary: PathBuf,
    /// runsc `--root`.
    pub root: PathBuf,
    /// Global runsc flags from the options.
    pub flags: Vec<String>,
    /// Whether the shim mounted the rootfs under `<bundle>/rootfs` (and must unmount it).
    pub rootfs_mounted: bool,
    /// A network namespace the shim made for the sandbox (and must remove).
    #[serde(default)]
    pub netns: Option<PathBuf>,
    /// containerd's unpacked copy of the checkpoint this container restores from: removed by
    /// `shim delete` when the shim died before it could remove it itself.
    #[serde(default)]
    pub unpacked: Option<PathBuf>,
    /// The CNI network the sandbox's namespace is attached to, until it is detached.
    #[serde(default)]
    pub network: Option<crate::network::Attachment>,
}

impl Record {
    /// Writes the record (0600: it names paths of a root-owned runtime).
    pub fn write(&self, bundle: &Path) -> Result<()> {
        let path = bundle.join(RECORD_FILE);
        let text = serde_json::to_vec_pretty(self).map_err(|e| Error::parse("record", e))?;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| Error::io(format!("write {}", path.display()), e))?;
        f.write_all(&text)
            .map_err(|e| Error::io(format!("write {}", path.display()), e))
    }

    /// `Ok(None)` when the shim never got as far as writing one.
    pub fn read(bundle: &Path) -> Result<Option<Record>> {
        let path = bundle.join(RECORD_FILE);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| Error::parse(path.display().to_string(), e)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io(format!("read {}", path.display()), e)),
        }
    }
}

/// The bundle's `config.json`, or None when it is missing or not JSON.
pub fn read_spec(bundle: &Path) -> Option<Value> {
    serde_json::from_slice(&std::fs::read(bundle.join("config.json")).ok()?).ok()
}

/// A pid file's pid.
pub fn read_pid(path: &Path) -> Option<i32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Makes `dir` and its parents, root-only.
pub fn create_private_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| Error::io(format!("create {}", dir.display()), e))
}

/// Writes `data` to `path`, readable by root only.
pub fn write_private(path: &Path, data: &[u8]) -> Result<()> {
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| f.write_all(data))
        .map_err(|e| Error::io(format!("write {}", path.display()), e))
}

/// The spec as runsc gets it: pointed at the network namespace the shim made, the process
/// adapted as [`adapt_process`] says, and a pod's sandbox put in its pod's cgroup
/// ([`crate::spec::pod_cgroup`]).
pub fn adapted_spec(spec: &Value, netns: Option<&Path>, terminal: bool) -> Value {
    let mut adapted = spec.clone();
    if let Some(path) = netns {
        netns::set_netns_path(&mut adapted, path);
    }
    adapt_process(&mut adapted["process"], terminal);
    drop_shadowed_mounts(&mut adapted);
    if let Some(pod) = crate::spec::pod_cgroup(spec) {
        adapted["linux"]["cgroupsPath"] = pod.into();
    }
    // The shim sets the sandbox's OOM score itself (runsc 2022 fails writing it for a pod's
    // gofer, and a sandbox holding a pod must take its workload's score, not the pause one).
    if let Some(process) = adapted["process"].as_object_mut() {
        process.remove("oomScoreAdj");
    }
    adapted
}

/// Removes each mount that a later one on the same destination hides (containerd 1.x's CRI
/// mounts the image's `/dev/shm` tmpfs and then the pod's over it): what the container sees
/// is unchanged, and runsc refuses to restore a spec whose duplicate mounts differ.
fn drop_shadowed_mounts(spec: &mut Value) {
    let Some(mounts) = spec.get_mut("mounts").and_then(Value::as_array_mut) else {
        return;
    };
    let mut seen = std::collections::HashSet::new();
    let mut keep: Vec<bool> = mounts
        .iter()
        .rev()
        .map(|m| {
            seen.insert(
                m["destination"]
                    .as_str()
                    .unwrap_or_default()
                    .trim_end_matches('/')
                    .to_string(),
            )
        })
        .collect();
    keep.reverse();
    let mut i = 0;
    mounts.retain(|_| {
        i += 1;
        keep[i - 1]
    });
}

/// Writes `adapted` over the bundle's config.json when it differs from `spec`.
pub fn write_spec(bundle: &Path, spec: &Value, adapted: &Value) -> Result<()> {
    if adapted == spec {
        return Ok(());
    }
    let config = bundle.join("config.json");
    let bytes = serde_json::to_vec(adapted).map_err(|e| Error::parse("spec", e))?;
    std::fs::write(&config, bytes).map_err(|e| Error::io(format!("write {}", config.display()), e))
}

/// Capabilities narrowed as Linux's execve would (see [`caps`]), and the terminal flag set to
/// what the request's stdio is: containerd's clients may ask for a pty with a process spec
/// that says `terminal: false`, and gVisor's writes to a pty it was not told of fail once the
/// pty's buffer is full.
pub fn adapt_process(process: &mut Value, terminal: bool) {
    caps::narrow_to_exec_semantics(process);
    let asked = process.get("terminal").and_then(|t| t.as_bool());
    if process.is_object() && asked.unwrap_or(false) != terminal {
        process["terminal"] = terminal.into();
    }
}

/// Removes what the shim made for a container besides its root filesystem mount: the
/// sandbox's runsc root once empty, the network namespace and the record. A network
/// attached to the namespace must be detached first (DEL needs the namespace).
pub fn remove_made(bundle: &Path, netns: Option<&Path>) {
    // The sandbox's runsc root goes with its last container (a pod's others keep it).
    if let Ok(Some(record)) = Record::read(bundle) {
        let _ = std::fs::remove_dir(&record.root);
    }
    if let Some(path) = netns {
        netns::remove(path);
    }
    if let Some(path) = read_spec(bundle).as_ref().and_then(cgroups_path) {
        remove_empty_cgroup(Path::new("/sys/fs/cgroup"), &path);
    }
    let _ = std::fs::remove_file(bundle.join(RECORD_FILE));
}

/// The spec's `linux.cgroupsPath` when it names a cgroup by path (absolute, no `..`) that
/// runsc made; a systemd `slice:prefix:name`, a relative one, or a pod's own cgroup (the
/// kubelet's, which a pod's sandbox runs in) is left alone.
fn cgroups_path(spec: &Value) -> Option<String> {
    let path = spec.pointer("/linux/cgroupsPath")?.as_str()?;
    if crate::spec::annotation(spec, crate::spec::CRI_CONTAINER_TYPE) == Some("sandbox")
        && crate::spec::is_pod_cgroup_path(path)
    {
        return None;
    }
    let plain = path.starts_with('/')
        && !path.contains(':')
        && path.split('/').all(|c| c != ".." && c != ".")
        && path.len() > 1;
    plain.then(|| path.trim_start_matches('/').to_string())
}

/// The roots of the cgroup hierarchies mounted at `mount`: v2's one tree, or each v1
/// controller's directory.
pub fn cgroup_hierarchies(mount: &Path) -> Vec<PathBuf> {
    if mount.join("cgroup.controllers").exists() {
        return vec![mount.to_path_buf()];
    }
    std::fs::read_dir(mount)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect()
}

/// Removes the container's cgroup `path` below `mount` (in every v1 controller, or in v2's
/// one tree) if it is there and empty: runsc removes it when it destroys a sandbox, but not
/// one whose sandbox died during a restore. rmdir(2) refuses a cgroup with processes or
/// children, so nothing in use goes.
pub fn remove_empty_cgroup(mount: &Path, path: &str) {
    for h in cgroup_hierarchies(mount) {
        let dir = h.join(path);
        if dir.is_dir() {
            match std::fs::remove_dir(&dir) {
                Ok(()) => log::info!("removed cgroup {} left by runsc", dir.display()),
                Err(e) => log::debug!("cgroup {} kept: {e}", dir.display()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use serde_json::json;

    use super::*;

    #[test]
    fn round_trip_private_file() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(Record::read(dir.path()).unwrap(), None);
        let r = Record {
            binary: "/usr/bin/runsc".into(),
            root: "/run/chalk/default".into(),
            flags: vec!["--platform=ptrace".into()],
            rootfs_mounted: true,
            netns: Some("/run/chalk/.netns/default-c1".into()),
            unpacked: None,
            network: None,
        };
        r.write(dir.path()).unwrap();
        assert_eq!(Record::read(dir.path()).unwrap(), Some(r));
        let mode = std::fs::metadata(dir.path().join(RECORD_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn only_a_plain_absolute_cgroups_path_is_taken() {
        let path = |p: &str| cgroups_path(&json!({"linux": {"cgroupsPath": p}}));
        assert_eq!(path("/chalk-test/c1").as_deref(), Some("chalk-test/c1"));
        for bad in [
            "system.slice:chalk:c1",
            "rel/c1",
            "/",
            "/a/../../etc",
            "/a/./b",
        ] {
            assert_eq!(path(bad), None, "{bad}");
        }
        assert_eq!(cgroups_path(&json!({})), None);
        // A pod's sandbox runs in the kubelet's pod cgroup: that one is the kubelet's to remove.
        let sandbox = json!({
            "annotations": {crate::spec::CRI_CONTAINER_TYPE: "sandbox"},
            "linux": {"cgroupsPath": "/kubepods/podabc"}
        });
        assert_eq!(cgroups_path(&sandbox), None);
    }

    #[test]
    fn only_empty_cgroups_are_removed() {
        // A v1-like layout of plain directories: rmdir removes an empty one and keeps one
        // with something in it (the kernel refuses a cgroup with processes the same way).
        let mount = tempfile::tempdir().unwrap();
        for c in ["memory", "pids"] {
            std::fs::create_dir_all(mount.path().join(c).join("ns/c1")).unwrap();
        }
        std::fs::write(mount.path().join("pids/ns/c1/busy"), b"").unwrap();
        remove_empty_cgroup(mount.path(), "ns/c1");
        assert!(!mount.path().join("memory/ns/c1").exists());
        assert!(mount.path().join("memory/ns").exists(), "the parent stays");
        assert!(mount.path().join("pids/ns/c1").exists());
    }

    #[test]
    fn process_terminal_follows_the_request() {
        let mut p = json!({"args": ["sh"], "terminal": false});
        adapt_process(&mut p, true);
        assert_eq!(p["terminal"], json!(true));
        adapt_process(&mut p, false);
        assert_eq!(p["terminal"], json!(false));
        // Absent reads as false: nothing to rewrite.
        let mut p = json!({"args": ["sh"]});
        adapt_process(&mut p, false);
        assert_eq!(p, json!({"args": ["sh"]}));
    }

    #[test]
    fn a_mount_hidden_by_a_later_one_on_its_destination_goes() {
        let spec = json!({"mounts": [
            {"destination": "/proc", "type": "proc"},
            {"destination": "/dev/shm", "type": "tmpfs"},
            {"destination": "/etc/hosts", "type": "bind", "source": "/a"},
            {"destination": "/dev/shm/", "type": "bind", "source": "/pod/shm"},
        ]});
        let adapted = adapted_spec(&spec, None, false);
        let kinds: Vec<&str> = adapted["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["type"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, ["proc", "bind", "bind"]);
        assert_eq!(adapted["mounts"][2]["source"], "/pod/shm");
        let plain = json!({"mounts": [{"destination": "/proc"}, {"destination": "/dev"}]});
        assert_eq!(adapted_spec(&plain, None, false)["mounts"], plain["mounts"]);
        let pause = json!({
            "annotations": {crate::spec::CRI_CONTAINER_TYPE: "sandbox"},
            "linux": {"cgroupsPath": "/kubepods/podabc/c1"}
        });
        assert_eq!(
            adapted_spec(&pause, None, false)["linux"]["cgroupsPath"],
            "/kubepods/podabc"
        );
    }

    #[test]
    fn adapted_spec_is_written_only_when_it_changes() {
        let dir = tempfile::tempdir().unwrap();
        let spec = json!({"process": {"args": ["sh"], "user": {"uid": 0}}});
        write_spec(dir.path(), &spec, &adapted_spec(&spec, None, false)).unwrap();
        assert!(!dir.path().join("config.json").exists());
        write_spec(dir.path(), &spec, &adapted_spec(&spec, None, true)).unwrap();
        let written = read_spec(dir.path()).unwrap();
        assert_eq!(written["process"]["terminal"], json!(true));
    }
}
