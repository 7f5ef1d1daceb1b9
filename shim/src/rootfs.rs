//! The container's root filesystem as containerd hands it over: mounted at `<bundle>/rootfs`
//! for runsc, and unmounted with the rest of what the shim made at the end.

use std::path::Path;

use crate::errors::{Result, ShimError};

/// A root filesystem mount, as containerd gives it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RootfsMount {
    pub kind: String,
    pub source: String,
    pub target: String,
    pub options: Vec<String>,
}

/// Mounts containerd's rootfs mounts at `<bundle>/rootfs`; false when there were none.
pub fn mount(bundle: &Path, mounts: &[RootfsMount]) -> Result<bool> {
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
            unmount(bundle);
            return Err(ShimError::failed(
                format!("mount {} rootfs at {}", m.kind, target.display()),
                e.to_string(),
            ));
        }
    }
    Ok(true)
}

pub fn unmount(bundle: &Path) {
    let target = bundle.join("rootfs");
    if let Some(t) = target.to_str() {
        if let Err(e) = containerd_shim::mount::umount_recursive(Some(t), libc::MNT_DETACH) {
            log::warn!("unmount {t}: {e}");
        }
    }
}

/// Removes what the shim made for a container: the rootfs mount, then the rest
/// ([`chalk_runtime::bundle::remove_made`]).
pub fn cleanup(bundle: &Path, rootfs_mounted: bool, netns: Option<&Path>) {
    if rootfs_mounted {
        unmount(bundle);
    }
    chalk_runtime::bundle::remove_made(bundle, netns);
}
