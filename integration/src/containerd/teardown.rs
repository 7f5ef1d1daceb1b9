//! Stopping a private containerd: what is left in its namespace removed, the daemon ended,
//! then whatever still runs from its directory killed and unmounted.

use std::{
    fs, io,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::atomic::{AtomicU32, Ordering},
    time::{Duration, Instant},
};

/// What stopping a containerd needs, shared with the stop on a signal ([`crate::stop`]), which
/// runs it from another thread.
pub(super) struct Teardown {
    pub(super) dir: PathBuf,
    pub(super) ctr: PathBuf,
    pub(super) namespace: String,
    /// The daemon's pid (a restart changes it).
    pub(super) pid: AtomicU32,
}

impl Teardown {
    /// Removes what is left in the namespace and stops the daemon, then ends whatever still
    /// runs from its directory (a shim or sandbox whose create a stop interrupted, or all of
    /// them when the daemon had exited already) and unmounts what is left below it.
    pub(super) fn run(&self) {
        let pid = self.pid.load(Ordering::SeqCst) as i32;
        if !reaped(pid) {
            self.remove_what_is_left();
            let _ = nix_kill(pid as u32, libc::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(10);
            while !reaped(pid) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            if !reaped(pid) {
                let _ = nix_kill(pid as u32, libc::SIGKILL);
                // SAFETY: waitpid on our own child.
                unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
            }
        }
        let mine = self.dir.display().to_string();
        let left = || {
            crate::procs::processes()
                .into_iter()
                .filter(|(_, a)| a.iter().any(|x| x.contains(&mine)))
                .map(|(pid, _)| pid)
                .collect::<Vec<_>>()
        };
        let deadline = Instant::now() + Duration::from_secs(2);
        while !left().is_empty() && Instant::now() < deadline {
            for pid in left() {
                let _ = nix_kill(pid, libc::SIGKILL);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        unmount_under(&self.dir);
    }

    /// Kills and deletes the namespace's tasks (again while a create in flight adds one),
    /// then removes its containers.
    fn remove_what_is_left(&self) {
        let ctr = |args: &[&str]| -> String {
            Command::new(&self.ctr)
                .arg("--address")
                .arg(self.dir.join("containerd.sock"))
                .arg("--namespace")
                .arg(&self.namespace)
                .args(args)
                .stdin(Stdio::null())
                .stderr(Stdio::null())
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default()
        };
        let list = |what: &str| -> Vec<String> {
            ctr(&[what, "ls", "-q"])
                .lines()
                .filter(|l| !l.is_empty())
                .map(String::from)
                .collect()
        };
        for _ in 0..3 {
            let tasks = list("task");
            if tasks.is_empty() {
                break;
            }
            for id in &tasks {
                ctr(&["task", "kill", "-a", "-s", "SIGKILL", id]);
                ctr(&["task", "delete", "-f", id]);
            }
        }
        for id in list("containers") {
            ctr(&["containers", "rm", &id]);
        }
    }
}

/// Whether child `pid` has exited, reaping it if so (or it is no child of ours any more).
fn reaped(pid: i32) -> bool {
    // SAFETY: waitpid on our own child, without blocking.
    unsafe { libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG) != 0 }
}

fn nix_kill(pid: u32, sig: i32) -> io::Result<()> {
    // SAFETY: plain kill(2) on our own child's pid.
    if unsafe { libc::kill(pid as i32, sig) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Lazily unmounts anything still mounted below `dir`, deepest first, so the temp dir can go.
pub(crate) fn unmount_under(dir: &Path) {
    let Ok(mounts) = fs::read_to_string("/proc/self/mounts") else {
        return;
    };
    let prefix = dir.display().to_string();
    let mut targets: Vec<&str> = mounts
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter(|t| t.starts_with(&prefix))
        .collect();
    targets.sort_by_key(|t| std::cmp::Reverse(t.len()));
    for t in targets {
        if let Ok(c) = std::ffi::CString::new(t) {
            // SAFETY: umount2 with a valid C string.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
    }
}
