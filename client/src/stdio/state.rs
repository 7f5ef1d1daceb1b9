//! Where chalkctl keeps a sandbox's stdio: `<root>/<namespace>/<id>/`, root-only (0700), with
//! the init's fifos, its bounded log, the attach socket, the keeper's lock and the init's exit
//! status; an exec's fifos live under `exec/<exec-id>/` there while it runs. Pure layout and
//! directory making; the keeper (`keeper.rs`) owns what is inside.

use std::{
    os::unix::fs::{DirBuilderExt, PermissionsExt},
    path::{Path, PathBuf},
};

use crate::{Error, Result};

/// The default root (`--state-dir`, `CHALKCTL_STATE_DIR`): logs outlive a reboot, as a
/// suspended sandbox does.
pub const DEFAULT_ROOT: &str = "/var/lib/chalkctl";

/// One sandbox's directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxDir {
    dir: PathBuf,
}

/// The directory of sandbox `id` of `namespace` under `root` (both checked: they become
/// path components).
pub fn sandbox_dir(root: &Path, namespace: &str, id: &str) -> Result<SandboxDir> {
    chalk_runtime::ids::validate("namespace", namespace).map_err(|e| Error::from(e.to_string()))?;
    chalk_runtime::ids::container_id(id).map_err(|e| Error::from(e.to_string()))?;
    Ok(SandboxDir {
        dir: root.join(namespace).join(id),
    })
}

impl SandboxDir {
    pub fn path(&self) -> &Path {
        &self.dir
    }
    pub fn stdin(&self) -> PathBuf {
        self.dir.join("in")
    }
    pub fn stdout(&self) -> PathBuf {
        self.dir.join("out")
    }
    pub fn stderr(&self) -> PathBuf {
        self.dir.join("err")
    }
    /// The output so far; `log.1` the part before it, once it filled.
    pub fn log(&self) -> PathBuf {
        self.dir.join("log")
    }
    pub fn old_log(&self) -> PathBuf {
        self.dir.join("log.1")
    }
    pub fn socket(&self) -> PathBuf {
        self.dir.join("attach.sock")
    }
    /// Held (exclusively) by the keeper for as long as it runs.
    pub fn lock(&self) -> PathBuf {
        self.dir.join("keeper.lock")
    }
    /// The init's exit status, written by the keeper when it ends.
    pub fn exit(&self) -> PathBuf {
        self.dir.join("exit")
    }
    /// What the keeper had to say after its start (it has no terminal then).
    pub fn keeper_log(&self) -> PathBuf {
        self.dir.join("keeper.log")
    }
    /// The fifos of exec `exec_id` while it runs.
    pub fn exec(&self, exec_id: &str) -> Result<PathBuf> {
        chalk_runtime::ids::exec_id(exec_id).map_err(|e| Error::from(e.to_string()))?;
        Ok(self.dir.join("exec").join(exec_id))
    }

    /// Makes the directory and those above it up to the root (each 0700: what passes through
    /// them is the sandbox's terminal).
    pub fn make(&self) -> Result<()> {
        make_private(&self.dir)
    }

    /// Whether chalkctl keeps anything of this sandbox.
    pub fn exists(&self) -> bool {
        self.dir.exists()
    }

    /// Removes the directory (the namespace's stays: another chalkctl may be making a
    /// sandbox's in it).
    pub fn remove(&self) -> Result<()> {
        match std::fs::remove_dir_all(&self.dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(format!("remove {}: {e}", self.dir.display()).into()),
        }
    }
}

/// Makes `dir` and its missing parents 0700 (an existing root is narrowed to 0700 too).
pub fn make_private(dir: &Path) -> Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| Error::from(format!("make {}: {e}", dir.display())))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| Error::from(format!("protect {}: {e}", dir.display())))
}

/// Makes fifo `path` (0600), if it is not there already.
pub fn fifo(path: &Path) -> Result<()> {
    match nix::unistd::mkfifo(path, nix::sys::stat::Mode::from_bits_truncate(0o600)) {
        Ok(()) | Err(nix::errno::Errno::EEXIST) => Ok(()),
        Err(e) => Err(format!("make fifo {}: {e}", path.display()).into()),
    }
}

/// A path to `name` in `dir` short enough for a unix socket address (108 bytes): through
/// `/proc/self/fd` of `dir` opened, when the full path is longer.
pub fn socket_path(dir: &std::fs::File, full: &Path) -> PathBuf {
    use std::os::fd::AsRawFd;
    if full.as_os_str().len() < 100 {
        return full.to_path_buf();
    }
    let name = full.file_name().unwrap_or_default();
    PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd())).join(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sandbox_dir_is_namespace_then_id_and_refuses_bad_ones() {
        let d = sandbox_dir(Path::new("/s"), "default", "web-1").unwrap();
        assert_eq!(d.path(), Path::new("/s/default/web-1"));
        assert_eq!(d.log(), Path::new("/s/default/web-1/log"));
        assert_eq!(d.exec("e1").unwrap(), Path::new("/s/default/web-1/exec/e1"));
        for bad in ["..", "a/b", "", "-x"] {
            assert!(
                sandbox_dir(Path::new("/s"), "default", bad).is_err(),
                "{bad}"
            );
            assert!(sandbox_dir(Path::new("/s"), bad, "a").is_err(), "{bad}");
        }
        assert!(d.exec("../x").is_err());
    }

    #[test]
    fn made_dirs_are_root_only_and_removed_whole() {
        let root = tempfile::tempdir().unwrap();
        let d = sandbox_dir(root.path(), "ns", "a").unwrap();
        d.make().unwrap();
        for p in [root.path().join("ns"), d.path().to_path_buf()] {
            let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o700, "{}", p.display());
        }
        fifo(&d.stdout()).unwrap();
        fifo(&d.stdout()).unwrap();
        d.remove().unwrap();
        assert!(!d.exists() && root.path().join("ns").exists());
        d.remove().unwrap();
    }

    #[test]
    fn long_socket_paths_go_through_the_directory_fd() {
        let root = tempfile::tempdir().unwrap();
        let dir = std::fs::File::open(root.path()).unwrap();
        let short = root.path().join("attach.sock");
        assert_eq!(socket_path(&dir, &short), short);
        let long = root.path().join("x".repeat(120));
        let p = socket_path(&dir, &long);
        assert!(p.starts_with("/proc/self/fd/"), "{}", p.display());
    }
}
