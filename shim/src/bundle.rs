//! The container's bundle as the shim makes it ready: its spec read and adapted for runsc,
//! the root filesystem mounted, private files written, and everything undone at the end.

use std::path::Path;

use chalk_runtime::{bundle::Record, caps, netns};
use serde_json::Value;

use crate::errors::{Result, ShimError};

/// A root filesystem mount, as containerd gives it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RootfsMount {
    pub kind: String,
    pub source: String,
    pub target: String,
    pub options: Vec<String>,
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
        .map_err(|e| ShimError::failed(format!("create {}", dir.display()), e))
}

/// Writes `data` to `path`, readable by root only.
pub fn write_private(path: &Path, data: &[u8]) -> Result<()> {
    use std::{io::Write, os::unix::fs::OpenOptionsExt};
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| f.write_all(data))
        .map_err(|e| ShimError::failed(format!("write {}", path.display()), e))
}

/// The spec as runsc gets it: pointed at the network namespace the shim made, and the
/// process adapted as [`adapt_process`] says.
pub fn adapted_spec(spec: &Value, netns: Option<&Path>, terminal: bool) -> Value {
    let mut adapted = spec.clone();
    if let Some(path) = netns {
        netns::set_netns_path(&mut adapted, path);
    }
    adapt_process(&mut adapted["process"], terminal);
    // The shim sets the sandbox's OOM score itself (runsc 2022 fails writing it for a pod's
    // gofer, and a sandbox holding a pod must take its workload's score, not the pause one).
    if let Some(process) = adapted["process"].as_object_mut() {
        process.remove("oomScoreAdj");
    }
    adapted
}

/// Writes `adapted` over the bundle's config.json when it differs from `spec`.
pub fn write_spec(bundle: &Path, spec: &Value, adapted: &Value) -> Result<()> {
    if adapted == spec {
        return Ok(());
    }
    let config = bundle.join("config.json");
    let bytes = serde_json::to_vec(adapted).map_err(|e| ShimError::failed("encode spec", e))?;
    std::fs::write(&config, bytes)
        .map_err(|e| ShimError::failed(format!("write {}", config.display()), e))
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

/// Mounts containerd's rootfs mounts at `<bundle>/rootfs`; false when there were none.
pub fn mount_rootfs(bundle: &Path, mounts: &[RootfsMount]) -> Result<bool> {
    if mounts.is_empty() {
        return Ok(false);
    }
    let target = bundle.join("rootfs");
    std::fs::create_dir_all(&target)
        .map_err(|e| ShimError::failed(format!("create {}", target.display()), e))?;
    for m in mounts {
        let fs_type = (!m.kind.is_empty()).then_some(m.kind.as_str());
        let source = (!m.source.is_empty()).then_some(m.source.as_str());
        if let Err(e) = containerd_shim::mount::mount_rootfs(fs_type, source, &m.options, &target) {
            unmount_rootfs(bundle);
            return Err(ShimError::failed(
                format!("mount {} rootfs at {}", m.kind, target.display()),
                e.to_string(),
            ));
        }
    }
    Ok(true)
}

pub fn unmount_rootfs(bundle: &Path) {
    let target = bundle.join("rootfs");
    if let Some(t) = target.to_str() {
        if let Err(e) = containerd_shim::mount::umount_recursive(Some(t), libc::MNT_DETACH) {
            log::warn!("unmount {t}: {e}");
        }
    }
}

/// Removes what the shim made for a container: the rootfs mount, the network namespace and
/// the record in the bundle.
pub fn cleanup(bundle: &Path, rootfs_mounted: bool, netns: Option<&Path>) {
    // The sandbox's runsc root goes with its last container (a pod's others keep it).
    if let Ok(Some(record)) = Record::read(bundle) {
        let _ = std::fs::remove_dir(&record.root);
    }
    if rootfs_mounted {
        unmount_rootfs(bundle);
    }
    if let Some(path) = netns {
        netns::remove(path);
    }
    let _ = std::fs::remove_file(bundle.join(chalk_runtime::bundle::RECORD_FILE));
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
