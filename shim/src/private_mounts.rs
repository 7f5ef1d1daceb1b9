//! A fork of a pod gets copies of the files its source pod had bind-mounted from containerd's
//! and the kubelet's per-pod directories (hosts, hostname, resolv.conf, termination log) and a
//! fresh, empty directory for each of its per-pod directories (shm): shared, a fork could
//! write into its source's files, and would fail once the source is removed. The sources are
//! opened without following links and copied only when they are small regular files: a pod
//! can name these paths (its annotations reach the spec), never make the shim read others.

use std::{
    fs,
    io::{self, Read},
    os::unix::fs::{DirBuilderExt, PermissionsExt},
    path::{Path, PathBuf},
};

use chalk_runtime::spec::{pod_private_mounts, PRIVATE_MOUNTS_OF};
use serde_json::Value;

/// Where the copies go: inside the bundle, so they go with the container.
fn copies_dir(bundle: &Path) -> PathBuf {
    bundle.join("private-mounts")
}

/// Copies the mounts of `spec` that belong to the pod its `PRIVATE_MOUNTS_OF` annotation
/// names into the bundle and points the spec at the copies. Returns how many it copied.
pub fn make_private(spec: &mut Value, bundle: &Path) -> io::Result<usize> {
    let Some(pod) = spec["annotations"][PRIVATE_MOUNTS_OF]
        .as_str()
        .map(str::to_string)
    else {
        return Ok(0);
    };
    let indexes = pod_private_mounts(spec, &pod);
    if indexes.is_empty() {
        return Ok(0);
    }
    let dir = copies_dir(bundle);
    fs::DirBuilder::new()
        .mode(0o700)
        .recursive(true)
        .create(&dir)?;
    for i in &indexes {
        let mount = &mut spec["mounts"][*i];
        let source = PathBuf::from(mount["source"].as_str().unwrap_or_default());
        let copy = dir.join(i.to_string());
        copy_own_file(&source, &copy).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("copy {} for the fork: {e}", source.display()),
            )
        })?;
        mount["source"] = Value::String(copy.display().to_string());
    }
    Ok(indexes.len())
}

/// The most a pod's own file may hold (hosts, resolv.conf and the like are a few lines).
const MAX_FILE: u64 = 1 << 20;

/// Copies regular file `from` (not through a link, at most [`MAX_FILE`]), or makes an empty
/// directory for directory `from`, with its mode and owner.
fn copy_own_file(from: &Path, to: &Path) -> io::Result<()> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let refuse = |why: &str| io::Error::new(io::ErrorKind::InvalidInput, why.to_string());
    let meta = fs::symlink_metadata(from)?;
    if meta.is_dir() {
        fs::DirBuilder::new().mode(0o700).create(to)?;
    } else {
        // O_NOFOLLOW and the checks on what was opened: a link swapped in after the check
        // above is refused, not followed.
        let mut src = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(from)?;
        let opened = src.metadata()?;
        if !opened.is_file() {
            return Err(refuse("not a regular file"));
        }
        if opened.len() > MAX_FILE {
            return Err(refuse("larger than a pod's own file can be (1 MiB)"));
        }
        let mut dst = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(to)?;
        io::copy(&mut Read::take(&mut src, MAX_FILE), &mut dst)?;
    }
    // The source's mode (a 1777 shm directory stays one) and owner, whatever the umask.
    std::os::unix::fs::lchown(to, Some(meta.uid()), Some(meta.gid()))?;
    fs::set_permissions(to, fs::Permissions::from_mode(meta.mode() & 0o7777))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_source_pods_files_are_copied_and_volumes_stay_shared() {
        let pod = "b".repeat(64);
        let host = tempfile::tempdir().unwrap();
        let pod_dir = host.path().join("sandboxes").join(&pod);
        fs::create_dir_all(pod_dir.join("shm")).unwrap();
        fs::set_permissions(pod_dir.join("shm"), fs::Permissions::from_mode(0o1777)).unwrap();
        fs::write(pod_dir.join("hosts"), "127.0.0.1 source\n").unwrap();
        fs::write(pod_dir.join("shm").join("seg"), "x").unwrap();
        std::os::unix::fs::symlink("/etc/shadow", pod_dir.join("sneaky")).unwrap();
        let bundle = tempfile::tempdir().unwrap();
        let mut spec = json!({
            "annotations": {PRIVATE_MOUNTS_OF: pod},
            "mounts": [
                {"destination": "/etc/hosts", "type": "bind", "source": pod_dir.join("hosts")},
                {"destination": "/dev/shm", "type": "bind", "source": pod_dir.join("shm")},
                {"destination": "/data", "type": "bind", "source": host.path()}
            ]
        });
        assert_eq!(make_private(&mut spec, bundle.path()).unwrap(), 2);
        let hosts = spec["mounts"][0]["source"].as_str().unwrap();
        assert!(hosts.starts_with(bundle.path().to_str().unwrap()));
        assert_eq!(fs::read_to_string(hosts).unwrap(), "127.0.0.1 source\n");
        fs::write(hosts, "changed").unwrap();
        assert_eq!(
            fs::read_to_string(pod_dir.join("hosts")).unwrap(),
            "127.0.0.1 source\n",
            "the source's file is untouched"
        );
        // A directory starts empty for the fork, with the source's mode.
        let shm = Path::new(spec["mounts"][1]["source"].as_str().unwrap());
        assert_eq!(fs::read_dir(shm).unwrap().count(), 0);
        assert_eq!(
            fs::metadata(shm).unwrap().permissions().mode() & 0o7777,
            0o1777
        );
        assert_eq!(spec["mounts"][2]["source"], json!(host.path()));
        // A link is never followed.
        let mut linked = json!({
            "annotations": {PRIVATE_MOUNTS_OF: pod},
            "mounts": [{"destination": "/x", "type": "bind", "source": pod_dir.join("sneaky")}]
        });
        let other = tempfile::tempdir().unwrap();
        assert!(make_private(&mut linked, other.path()).is_err());
        let mut plain = json!({"mounts": []});
        assert_eq!(make_private(&mut plain, bundle.path()).unwrap(), 0);
    }
}
