//! The cgroup a pod's pull runs in (`chalk-pulls`, at the top of the host's hierarchy, which
//! the node's memory accounting sees): chalkctl and the server of the memory it leaves to
//! arrive are bounded there, so a hostile registry's snapshot can take no more of the node
//! than `[restore_from] pull_memory_bytes`, and cannot fork without end. cgroup v2 where the
//! host has it, else v1's memory and pids hierarchies.

use std::{
    ffi::CString,
    io,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::Command,
};

const NAME: &str = "chalk-pulls";
/// Tasks a pull may have at once: chalkctl's threads, its servers', their FUSE threads.
const PIDS_MAX: u32 = 512;

/// The files a process writes its pid to, to join the cgroup.
pub struct PullCgroup {
    procs: Vec<PathBuf>,
}

impl PullCgroup {
    /// Makes (or updates) the cgroup under `root` (`/sys/fs/cgroup`), its memory bounded by
    /// `memory_max`.
    pub fn prepare(root: &Path, memory_max: u64) -> io::Result<PullCgroup> {
        if root.join("cgroup.controllers").exists() {
            let dir = root.join(NAME);
            std::fs::create_dir_all(&dir)?;
            std::fs::write(dir.join("memory.max"), memory_max.to_string())?;
            // Swap would only hide what the limit is for.
            let _ = std::fs::write(dir.join("memory.swap.max"), "0");
            let _ = std::fs::write(dir.join("pids.max"), PIDS_MAX.to_string());
            return Ok(PullCgroup {
                procs: vec![dir.join("cgroup.procs")],
            });
        }
        let memory = root.join("memory").join(NAME);
        std::fs::create_dir_all(&memory)?;
        std::fs::write(memory.join("memory.limit_in_bytes"), memory_max.to_string())?;
        let mut procs = vec![memory.join("cgroup.procs")];
        let pids = root.join("pids").join(NAME);
        if root.join("pids").is_dir() && std::fs::create_dir_all(&pids).is_ok() {
            let _ = std::fs::write(pids.join("pids.max"), PIDS_MAX.to_string());
            procs.push(pids.join("cgroup.procs"));
        }
        Ok(PullCgroup { procs })
    }

    /// Makes `cmd`'s process join the cgroup before it runs anything (its children are born
    /// in it): it fails to start rather than run outside.
    pub fn place(&self, cmd: &mut Command) -> io::Result<()> {
        let paths = self
            .procs
            .iter()
            .map(|p| CString::new(p.as_os_str().as_encoded_bytes()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        // SAFETY: between fork and exec the closure only calls open, write and close on
        // strings made before the fork: no allocation, nothing a lock could hold.
        unsafe {
            cmd.pre_exec(move || {
                for path in &paths {
                    let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                    if fd < 0 {
                        return Err(io::Error::last_os_error());
                    }
                    let wrote = libc::write(fd, b"0".as_ptr().cast(), 1);
                    let err = io::Error::last_os_error();
                    libc::close(fd);
                    if wrote != 1 {
                        return Err(err);
                    }
                }
                Ok(())
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v2_and_v1_hierarchies_get_their_limits() {
        let v2 = tempfile::tempdir().unwrap();
        std::fs::write(v2.path().join("cgroup.controllers"), "memory pids").unwrap();
        let c = PullCgroup::prepare(v2.path(), 256 << 20).unwrap();
        let dir = v2.path().join(NAME);
        assert_eq!(
            std::fs::read_to_string(dir.join("memory.max")).unwrap(),
            (256u64 << 20).to_string()
        );
        assert_eq!(c.procs, [dir.join("cgroup.procs")]);
        let v1 = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(v1.path().join("memory")).unwrap();
        std::fs::create_dir_all(v1.path().join("pids")).unwrap();
        let c = PullCgroup::prepare(v1.path(), 1 << 30).unwrap();
        assert_eq!(
            std::fs::read_to_string(
                v1.path()
                    .join("memory")
                    .join(NAME)
                    .join("memory.limit_in_bytes")
            )
            .unwrap(),
            (1u64 << 30).to_string()
        );
        assert_eq!(c.procs.len(), 2);
    }
}
