//! TaskOOM: the sandbox's memory limit lives in its host cgroup (runsc puts the sandbox there),
//! so an OOM shows up there: as an eventfd notification on cgroup v1, as a rising `oom_kill`
//! count in `memory.events` on cgroup v2.

use std::{
    fs::File,
    io::{self, Read},
    os::fd::{AsFd, AsRawFd},
    path::{Path, PathBuf},
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

/// Calls `on_oom` each time the cgroup of `pid` hits an OOM, until the cgroup goes away.
pub fn watch(pid: i32, on_oom: impl Fn() + Send + 'static) -> io::Result<()> {
    let (dir, v2) = memory_cgroup(pid)?;
    if v2 {
        watch_v2(dir, on_oom)
    } else {
        watch_v1(dir, on_oom)
    }
}

fn watch_v1(dir: PathBuf, on_oom: impl Fn() + Send + 'static) -> io::Result<()> {
    let efd = EventFd::from_flags(EfdFlags::EFD_CLOEXEC)?;
    let control = File::open(dir.join("memory.oom_control"))?;
    std::fs::write(
        dir.join("cgroup.event_control"),
        format!("{} {}", efd.as_fd().as_raw_fd(), control.as_raw_fd()),
    )?;
    std::thread::Builder::new()
        .name("oom-v1".into())
        .spawn(move || {
            let _control = control;
            while efd.read().is_ok() {
                // The eventfd also fires when the cgroup is removed: that ends the watch.
                if !dir.join("memory.oom_control").exists() {
                    break;
                }
                on_oom();
            }
        })?;
    Ok(())
}

fn watch_v2(dir: PathBuf, on_oom: impl Fn() + Send + 'static) -> io::Result<()> {
    let events = dir.join("memory.events");
    let inotify = Inotify::init(InitFlags::IN_CLOEXEC)?;
    inotify.add_watch(&events, AddWatchFlags::IN_MODIFY)?;
    let read_count = move |path: &Path| -> Option<u64> {
        let mut s = String::new();
        File::open(path).ok()?.read_to_string(&mut s).ok()?;
        Some(oom_kills(&s))
    };
    let mut seen = read_count(&events).unwrap_or(0);
    std::thread::Builder::new()
        .name("oom-v2".into())
        .spawn(move || loop {
            if inotify.read_events().is_err() {
                break;
            }
            let Some(now) = read_count(&events) else {
                break;
            };
            if now > seen {
                seen = now;
                on_oom();
            }
        })?;
    Ok(())
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
