//! The container's root filesystem as containerd hands it over: mounted at `<bundle>/rootfs`
//! for runsc, and unmounted with the rest of what the shim made at the end.
//!
//! Where the sandbox keeps its root's writes in its own memory (runsc's memory overlay), an
//! overlay root is mounted `volatile`: nothing the sandbox does reaches its upper directory,
//! and without it the unmount syncs the whole upper filesystem, which is also the snapshot
//! store's, so a suspend's delete would wait for the fresh snapshot to be written to disk.

use std::path::{Path, PathBuf};

use crate::errors::{Result, ShimError};

/// A root filesystem mount, as containerd gives it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RootfsMount {
    pub kind: String,
    pub source: String,
    pub target: String,
    pub options: Vec<String>,
}

/// Mounts containerd's rootfs mounts at `<bundle>/rootfs` (overlays `volatile` when asked);
/// false when there were none.
pub fn mount(bundle: &Path, mounts: &[RootfsMount], volatile: bool) -> Result<bool> {
    if mounts.is_empty() {
        return Ok(false);
    }
    let target = bundle.join("rootfs");
    std::fs::create_dir_all(&target)
        .map_err(|e| ShimError::failed(format!("create {}", target.display()), e))?;
    for m in mounts {
        let fs_type = (!m.kind.is_empty()).then_some(m.kind.as_str());
        let source = (!m.source.is_empty()).then_some(m.source.as_str());
        let mut options = m.options.clone();
        // The marker a volatile overlay leaves in its work directory makes the kernel refuse
        // any other mount of the same directories (containerd mounts a container's snapshot
        // to resolve `exec --user NAME`) and any later one after a crash. The sandbox never
        // writes its upper directory, so nothing there needs that protection: the marker goes
        // as soon as it is made (and one left by a killed shim goes first).
        let marker = (volatile && m.kind == "overlay")
            .then(|| workdir_of(&options).map(|w| w.join("work/incompat")))
            .flatten();
        if let Some(marker) = &marker {
            let _ = std::fs::remove_dir_all(marker);
            options.push("volatile".into());
        }
        let mounted = containerd_shim::mount::mount_rootfs(fs_type, source, &options, &target);
        if let (Ok(()), Some(marker)) = (&mounted, &marker) {
            if let Err(e) = std::fs::remove_dir_all(marker) {
                log::warn!("remove {}: {e}", marker.display());
            }
        }
        if let Err(e) = mounted {
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

/// The `workdir=` of overlay mount options.
fn workdir_of(options: &[String]) -> Option<PathBuf> {
    options
        .iter()
        .flat_map(|o| o.split(','))
        .find_map(|o| o.strip_prefix("workdir="))
        .map(PathBuf::from)
}

/// Removes what the shim made for a container: the rootfs mount, then the rest
/// ([`chalk_runtime::bundle::remove_made`]).
pub fn cleanup(bundle: &Path, rootfs_mounted: bool, netns: Option<&Path>) {
    // A network the record still names was never detached (a failed create, a crash).
    if let Ok(Some(record)) = chalk_runtime::bundle::Record::read(bundle) {
        if let Some(att) = &record.network {
            chalk_runtime::network::detach(att, &crate::reaper::ReaperSpawner);
        }
    }
    if rootfs_mounted {
        unmount(bundle);
    }
    chalk_runtime::bundle::remove_made(bundle, netns);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workdir_is_read_from_the_options() {
        let opts = vec![
            "index=off".to_string(),
            "workdir=/s/3/work".to_string(),
            "upperdir=/s/3/fs".to_string(),
        ];
        assert_eq!(workdir_of(&opts), Some(PathBuf::from("/s/3/work")));
        assert_eq!(workdir_of(&["ro".to_string()]), None);
    }
}
