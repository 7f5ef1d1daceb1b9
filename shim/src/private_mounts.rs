//! A fork of a pod gets copies of the files its source pod had bind-mounted from containerd's
//! per-pod directories (hosts, hostname, resolv.conf, shm): shared, a fork could write into
//! its source's files, and would fail once the source is removed.

use std::{
    fs, io,
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
        copy_tree(&source, &copy).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("copy {} for the fork: {e}", source.display()),
            )
        })?;
        mount["source"] = Value::String(copy.display().to_string());
    }
    Ok(indexes.len())
}

/// Copies a file, or a directory with what is in it, keeping modes; symlinks stay links.
fn copy_tree(from: &Path, to: &Path) -> io::Result<()> {
    let meta = fs::symlink_metadata(from)?;
    if meta.file_type().is_symlink() {
        return std::os::unix::fs::symlink(fs::read_link(from)?, to);
    }
    if meta.is_dir() {
        fs::DirBuilder::new()
            .mode(meta.permissions().mode())
            .create(to)?;
        for entry in fs::read_dir(from)? {
            let entry = entry?;
            copy_tree(&entry.path(), &to.join(entry.file_name()))?;
        }
        return Ok(());
    }
    if meta.is_file() {
        fs::copy(from, to)?;
        return fs::set_permissions(to, meta.permissions());
    }
    // Sockets, fifos, devices: nothing a pod's own files hold; leave them out.
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_source_pods_files_are_copied_and_volumes_stay_shared() {
        let pod = "b".repeat(64);
        let host = tempfile::tempdir().unwrap();
        let pod_dir = host.path().join(&pod);
        fs::create_dir_all(pod_dir.join("shm")).unwrap();
        fs::write(pod_dir.join("hosts"), "127.0.0.1 source\n").unwrap();
        fs::write(pod_dir.join("shm").join("seg"), "x").unwrap();
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
        let shm = Path::new(spec["mounts"][1]["source"].as_str().unwrap());
        assert_eq!(fs::read_to_string(shm.join("seg")).unwrap(), "x");
        assert_eq!(spec["mounts"][2]["source"], json!(host.path()));
        let mut plain = json!({"mounts": []});
        assert_eq!(make_private(&mut plain, bundle.path()).unwrap(), 0);
    }
}
