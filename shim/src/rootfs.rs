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
        if volatile && m.kind == "overlay" && !options.iter().any(|o| o == "volatile") {
            // A marker left by a volatile mount that was never cleaned up (a killed shim, a
            // host crash) makes the kernel refuse every later mount of this upper directory;
            // the sandbox never wrote it, so there is nothing in it a crash could have torn.
            if let Some(marker) = workdir_of(&options).map(|w| volatile_marker(&w)) {
                let _ = std::fs::remove_dir_all(marker);
            }
            options.push("volatile".into());
        }
        if let Err(e) = containerd_shim::mount::mount_rootfs(fs_type, source, &options, &target) {
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
    let markers = std::fs::read_to_string("/proc/self/mountinfo")
        .map(|info| volatile_markers(&info, &target))
        .unwrap_or_default();
    if let Some(t) = target.to_str() {
        if let Err(e) = containerd_shim::mount::umount_recursive(Some(t), libc::MNT_DETACH) {
            log::warn!("unmount {t}: {e}");
            return;
        }
    }
    // Cleanly unmounted: the upper directory may be mounted again (by a resume, a restart).
    for marker in markers {
        if let Err(e) = std::fs::remove_dir_all(&marker) {
            if e.kind() != std::io::ErrorKind::NotFound {
                log::warn!("remove {}: {e}", marker.display());
            }
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

/// What a volatile overlay leaves in its work directory, and the kernel refuses to mount over.
fn volatile_marker(workdir: &Path) -> PathBuf {
    workdir.join("work/incompat")
}

/// The markers of the volatile overlays mounted at `target`, from a mountinfo table.
fn volatile_markers(mountinfo: &str, target: &Path) -> Vec<PathBuf> {
    let target = target.to_string_lossy();
    mountinfo
        .lines()
        .filter_map(|line| {
            let (before, after) = line.split_once(" - ")?;
            let mount_point = before.split(' ').nth(4)?;
            let mut rest = after.split(' ');
            let (kind, options) = (rest.next()?, rest.nth(1)?);
            let volatile = options
                .split(',')
                .any(|o| o == "volatile" || o == "fsync=volatile");
            (mount_point == target && kind == "overlay" && volatile)
                .then(|| workdir_of(&[options.to_string()]).map(|w| volatile_marker(&w)))
                .flatten()
        })
        .collect()
}

/// Removes what the shim made for a container: the rootfs mount, then the rest
/// ([`chalk_runtime::bundle::remove_made`]).
pub fn cleanup(bundle: &Path, rootfs_mounted: bool, netns: Option<&Path>) {
    if rootfs_mounted {
        unmount(bundle);
    }
    chalk_runtime::bundle::remove_made(bundle, netns);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_volatile_overlays_marker_is_found_by_its_mount_point() {
        let info = "\
72 27 0:44 / /run/b/c1/rootfs rw,relatime - overlay overlay rw,lowerdir=/s/1/fs,upperdir=/s/9/fs,workdir=/s/9/work,uuid=on,fsync=volatile
73 27 0:45 / /run/b/c2/rootfs rw,relatime - overlay overlay rw,lowerdir=/s/1/fs,upperdir=/s/8/fs,workdir=/s/8/work
74 27 0:46 / /run/b/c3/rootfs rw,relatime - overlay overlay rw,lowerdir=/s/1/fs,upperdir=/s/7/fs,workdir=/s/7/work,volatile
";
        assert_eq!(
            volatile_markers(info, Path::new("/run/b/c1/rootfs")),
            vec![PathBuf::from("/s/9/work/work/incompat")]
        );
        assert!(volatile_markers(info, Path::new("/run/b/c2/rootfs")).is_empty());
        assert_eq!(
            volatile_markers(info, Path::new("/run/b/c3/rootfs")),
            vec![PathBuf::from("/s/7/work/work/incompat")]
        );
        assert!(volatile_markers(info, Path::new("/elsewhere")).is_empty());
    }

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
