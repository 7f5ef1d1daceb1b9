//! Finds a container's executable in its root filesystem before the sandbox is made, so a
//! missing binary fails Create (as it does with runc) instead of surfacing at Start.
//!
//! The lookup only says "missing" when it is sure: a path that passes through a mount of the
//! spec (a bind mount may bring the binary), or that cannot be read, counts as present and is
//! left to runsc.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use crate::{Error, Result};

/// The PATH a process gets when its environment names none (what runc and gVisor use).
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Linux's limit on symlinks followed while resolving one path.
const MAX_LINKS: usize = 40;

/// Fails with [`Error::ExecutableNotFound`] when the process of `spec` (an OCI runtime spec)
/// certainly cannot start because its executable is absent from the root filesystem.
pub fn check(spec: &serde_json::Value, bundle: &Path) -> Result<()> {
    let process = &spec["process"];
    let Some(name) = process["args"][0].as_str() else {
        return Ok(());
    };
    let Some(root) = spec["root"]["path"].as_str() else {
        return Ok(());
    };
    let root = bundle.join(root);
    if !root.is_dir() {
        return Ok(());
    }
    let env = process["env"].as_array().into_iter().flatten();
    let path_var = env
        .filter_map(|v| v.as_str()?.strip_prefix("PATH="))
        .next_back()
        .unwrap_or(DEFAULT_PATH);
    let cwd = process["cwd"].as_str().unwrap_or("/");
    let mounts: Vec<PathBuf> = spec["mounts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["destination"].as_str().map(PathBuf::from))
        .collect();
    let searched = candidates(name, path_var, cwd);
    let found = searched
        .iter()
        .any(|c| !matches!(resolve(&root, c, &mounts), Resolution::Missing));
    if found {
        return Ok(());
    }
    Err(Error::ExecutableNotFound {
        name: name.to_string(),
        searched: if name.contains('/') {
            String::new()
        } else {
            format!(" in PATH {path_var}")
        },
    })
}

/// Where a process named `name` may live, as paths inside the container.
fn candidates(name: &str, path_var: &str, cwd: &str) -> Vec<PathBuf> {
    if name.contains('/') {
        return vec![Path::new("/").join(cwd).join(name)];
    }
    path_var
        .split(':')
        .filter(|dir| dir.starts_with('/'))
        .map(|dir| Path::new(dir).join(name))
        .collect()
}

#[derive(Debug, PartialEq, Eq)]
enum Resolution {
    /// An executable regular file at this path inside the container.
    Executable(PathBuf),
    /// Absent, or not an executable file.
    Missing,
    /// Cannot be known from the root filesystem alone.
    Unknown,
}

/// Resolves `path` inside the container whose root filesystem is at `root`, following
/// symlinks as the container would see them (absolute targets and `..` stay inside `root`).
fn resolve(root: &Path, path: &Path, mounts: &[PathBuf]) -> Resolution {
    let mut pending: VecDeque<OsString> = components(path);
    let mut current = PathBuf::from("/");
    let mut links = 0;
    while let Some(part) = pending.pop_front() {
        if part == ".." {
            current.pop();
            continue;
        }
        let next = current.join(&part);
        if mounts.iter().any(|m| m == &next) {
            return Resolution::Unknown;
        }
        let on_host = root.join(next.strip_prefix("/").unwrap_or(&next));
        let meta = match std::fs::symlink_metadata(&on_host) {
            Ok(m) => m,
            // runsc makes missing mount points: a directory on the way to a mount exists.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if mounts.iter().any(|m| m.starts_with(&next)) {
                    current = next;
                    continue;
                }
                return Resolution::Missing;
            }
            Err(_) => return Resolution::Unknown,
        };
        if !meta.file_type().is_symlink() {
            current = next;
            continue;
        }
        links += 1;
        if links > MAX_LINKS {
            return Resolution::Missing;
        }
        let Ok(target) = std::fs::read_link(&on_host) else {
            return Resolution::Unknown;
        };
        if target.is_absolute() {
            current = PathBuf::from("/");
        }
        for part in components(&target).into_iter().rev() {
            pending.push_front(part);
        }
    }
    match std::fs::metadata(root.join(current.strip_prefix("/").unwrap_or(&current))) {
        Ok(m) if m.is_file() && m.permissions().mode() & 0o111 != 0 => {
            Resolution::Executable(current)
        }
        Ok(_) => Resolution::Missing,
        Err(_) => Resolution::Unknown,
    }
}

fn components(path: &Path) -> VecDeque<OsString> {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(p) => Some(p.to_os_string()),
            Component::ParentDir => Some("..".into()),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn exe(path: &Path) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, b"#!").unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    /// A bundle with `rootfs/bin/busybox` and `rootfs/bin/sh -> /bin/busybox`.
    fn bundle() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("rootfs");
        exe(&root.join("bin/busybox"));
        symlink("/bin/busybox", root.join("bin/sh")).unwrap();
        dir
    }

    fn spec(args0: &str, env: &[&str], mounts: &[&str]) -> serde_json::Value {
        let mounts: Vec<_> = mounts
            .iter()
            .map(|d| serde_json::json!({"destination": d}))
            .collect();
        serde_json::json!({
            "root": {"path": "rootfs"},
            "process": {"args": [args0], "env": env, "cwd": "/"},
            "mounts": mounts,
        })
    }

    #[test]
    fn finds_binaries_through_path_and_absolute_symlinks() {
        let b = bundle();
        check(&spec("sh", &["PATH=/usr/bin:/bin"], &[]), b.path()).unwrap();
        check(&spec("/bin/sh", &[], &[]), b.path()).unwrap();
        check(&spec("busybox", &[], &[]), b.path()).unwrap(); // default PATH
    }

    #[test]
    fn missing_binary_names_what_was_searched() {
        let b = bundle();
        let err = check(&spec("nothing", &["PATH=/bin"], &[]), b.path()).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("\"nothing\"") && msg.contains("PATH /bin"),
            "{msg}"
        );
        assert!(check(&spec("/bin/nothing", &[], &[]), b.path()).is_err());
    }

    #[test]
    fn symlinks_cannot_leave_the_root() {
        let b = bundle();
        let root = b.path().join("rootfs");
        // On the host, ../../.. from bin would reach real directories; inside, it stays at /.
        symlink("../../../../../../bin/true", root.join("bin/escape")).unwrap();
        assert_eq!(
            resolve(&root, Path::new("/bin/escape"), &[]),
            Resolution::Missing
        );
        exe(&root.join("bin/true"));
        assert_eq!(
            resolve(&root, Path::new("/bin/escape"), &[]),
            Resolution::Executable(PathBuf::from("/bin/true"))
        );
    }

    #[test]
    fn symlink_loops_are_missing() {
        let b = bundle();
        let root = b.path().join("rootfs");
        symlink("/bin/b", root.join("bin/a")).unwrap();
        symlink("/bin/a", root.join("bin/b")).unwrap();
        assert_eq!(
            resolve(&root, Path::new("/bin/a"), &[]),
            Resolution::Missing
        );
    }

    #[test]
    fn a_mount_may_bring_the_binary() {
        let b = bundle();
        check(&spec("/opt/tools/run", &[], &["/opt/tools"]), b.path()).unwrap();
        check(
            &spec("tool", &["PATH=/opt/tools"], &["/opt/tools"]),
            b.path(),
        )
        .unwrap();
        assert!(check(&spec("/opt/other/run", &[], &["/opt/tools"]), b.path()).is_err());
    }

    #[test]
    fn non_executable_files_and_directories_are_missing() {
        let b = bundle();
        let root = b.path().join("rootfs");
        std::fs::write(root.join("bin/data"), b"x").unwrap();
        assert!(check(&spec("/bin/data", &[], &[]), b.path()).is_err());
        assert!(check(&spec("/bin", &[], &[]), b.path()).is_err());
    }

    #[test]
    fn relative_names_resolve_against_cwd() {
        let b = bundle();
        let mut s = spec("./busybox", &[], &[]);
        s["process"]["cwd"] = "/bin".into();
        check(&s, b.path()).unwrap();
    }

    #[test]
    fn no_args_or_root_is_left_to_runsc() {
        let b = bundle();
        let mut s = spec("nothing", &[], &[]);
        s["root"]["path"] = "absent".into();
        check(&s, b.path()).unwrap();
        check(&serde_json::json!({"root": {"path": "rootfs"}}), b.path()).unwrap();
        check(&serde_json::json!({"process": {"args": ["x"]}}), b.path()).unwrap();
    }
}
