//! TaskOOM: the sandbox's memory limit lives in its host cgroup (runsc puts the sandbox there),
//! so an OOM shows up there: as an eventfd notification on cgroup v1, as a rising `oom_kill`
//! count in `memory.events` on cgroup v2.

use std::{
    fs::File,
    io::{self, Read},
    os::fd::{AsFd, AsRawFd},
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
};

use nix::sys::{
    eventfd::{EfdFlags, EventFd},
    inotify::{AddWatchFlags, InitFlags, Inotify},
};

const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// The memory cgroup directory of `pid`, and whether it is cgroup v2.
pub fn memory_cgroup(pid: i32) -> io::Result<(PathBuf, bool)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))?;
    let unified = Path::new(CGROUP_ROOT).join("cgroup.controllers").exists();
    parse_memory_cgroup(&text, unified).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("process {pid} has no memory cgroup"),
        )
    })
}

fn parse_memory_cgroup(proc_cgroup: &str, unified: bool) -> Option<(PathBuf, bool)> {
    for line in proc_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let rel = path.trim_start_matches('/');
        if unified && controllers.is_empty() {
            return Some((Path::new(CGROUP_ROOT).join(rel), true));
        }
        if !unified && controllers.split(',').any(|c| c == "memory") {
            return Some((Path::new(CGROUP_ROOT).join("memory").join(rel), false));
        }
    }
    None
}

/// The `oom_kill` counter of a cgroup v2 `memory.events` file.
fn oom_kills(memory_events: &str) -> u64 {
    memory_events
        .lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// A running watch: [`Watch::stop`] ends its thread and closes its files. A sandbox replaced
/// by its restore keeps its cgroup when the old one's cannot be removed yet, and the new
/// sandbox gets a watch of its own: the old one must not linger (two files and a thread each).
pub struct Watch {
    stopped: Arc<AtomicBool>,
    wake: Box<dyn FnOnce() + Send>,
}

impl Watch {
    pub fn stop(self) {
        self.stopped.store(true, Ordering::SeqCst);
        (self.wake)();
    }
}

/// Calls `on_oom` each time the memory cgroup of process `pid` hits its limit, until stopped.
pub fn watch(pid: i32, on_oom: impl Fn() + Send + 'static) -> io::Result<Watch> {
    let (dir, v2) = memory_cgroup(pid)?;
    let stopped = Arc::new(AtomicBool::new(false));
    if v2 {
        watch_v2(dir, stopped, on_oom)
    } else {
        watch_v1(dir, stopped, on_oom)
    }
}

/// What a stop adds to the v1 eventfd's count: more than any number of OOM notifications.
const STOP: u64 = 1 << 32;

fn watch_v1(
    dir: PathBuf,
    stopped: Arc<AtomicBool>,
    on_oom: impl Fn() + Send + 'static,
) -> io::Result<Watch> {
    let efd = Arc::new(EventFd::from_flags(EfdFlags::EFD_CLOEXEC)?);
    let control = File::open(dir.join("memory.oom_control"))?;
    std::fs::write(
        dir.join("cgroup.event_control"),
        format!("{} {}", efd.as_fd().as_raw_fd(), control.as_raw_fd()),
    )?;
    let (events, done) = (efd.clone(), stopped.clone());
    std::thread::Builder::new()
        .name("oom-v1".into())
        .spawn(move || {
            let _control = control;
            // The eventfd also fires when the cgroup is removed, and when stopped (adding
            // STOP, so that an OOM read together with the stop still counts).
            while let Ok(n) = events.read() {
                if n % STOP > 0 && dir.join("memory.oom_control").exists() {
                    on_oom();
                }
                if done.load(Ordering::SeqCst) || !dir.join("memory.oom_control").exists() {
                    break;
                }
            }
        })?;
    Ok(Watch {
        stopped,
        wake: Box::new(move || {
            let _ = efd.write(STOP);
        }),
    })
}

fn watch_v2(
    dir: PathBuf,
    stopped: Arc<AtomicBool>,
    on_oom: impl Fn() + Send + 'static,
) -> io::Result<Watch> {
    let events = dir.join("memory.events");
    let inotify = Arc::new(Inotify::init(InitFlags::IN_CLOEXEC)?);
    let wd = inotify.add_watch(&events, AddWatchFlags::IN_MODIFY)?;
    let read_count = move |path: &Path| -> Option<u64> {
        let mut s = String::new();
        File::open(path).ok()?.read_to_string(&mut s).ok()?;
        Some(oom_kills(&s))
    };
    let mut seen = read_count(&events).unwrap_or(0);
    let (watching, done) = (inotify.clone(), stopped.clone());
    std::thread::Builder::new()
        .name("oom-v2".into())
        .spawn(move || loop {
            // Removing the watch (stop) wakes the read with IN_IGNORED; an OOM counted
            // before it is still reported.
            let woke = watching.read_events().is_ok();
            let Some(now) = read_count(&events) else {
                break;
            };
            if now > seen {
                seen = now;
                on_oom();
            }
            if !woke || done.load(Ordering::SeqCst) {
                break;
            }
        })?;
    Ok(Watch {
        stopped,
        wake: Box::new(move || {
            let _ = inotify.rm_watch(wd);
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_v1_memory_cgroup() {
        let text = "9:name=systemd:/\n4:memory:/default/c1\n0::/\n";
        assert_eq!(
            parse_memory_cgroup(text, false).unwrap(),
            (PathBuf::from("/sys/fs/cgroup/memory/default/c1"), false)
        );
        assert_eq!(
            parse_memory_cgroup("4:cpu,memory:/x\n", false).unwrap().0,
            PathBuf::from("/sys/fs/cgroup/memory/x")
        );
    }

    #[test]
    fn finds_v2_cgroup() {
        assert_eq!(
            parse_memory_cgroup("0::/default/c1\n", true).unwrap(),
            (PathBuf::from("/sys/fs/cgroup/default/c1"), true)
        );
        assert!(parse_memory_cgroup("1:cpu:/x\n", false).is_none());
    }

    #[test]
    fn reads_oom_kill_count() {
        assert_eq!(oom_kills("low 0\nhigh 0\nmax 3\noom 2\noom_kill 2\n"), 2);
        assert_eq!(oom_kills(""), 0);
    }
}
