//! The shim asks chalkctl for what goes through containerd as a client would (a lifetime's
//! expiry, a pod's snapshot pulled from a registry): chalkctl installed beside the shim, run
//! with argv only, reaped by the shim's reaper, killed when it runs past its time.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use chalk_runtime::runsc::{Child, Spawner};

use crate::reaper::ReaperSpawner;

/// chalkctl, installed beside the shim (the installer and the package put both in one
/// directory); else the one on PATH.
pub fn path() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.join("chalkctl")))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("chalkctl"))
}

const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// What one chalkctl run ended with: its exit status, what it wrote to stderr, and what it
/// printed (its result).
pub struct Outcome {
    pub status: i32,
    pub said: String,
    pub printed: String,
}

/// Where chalkctl reaches containerd, and what its environment adds.
pub struct Target<'a> {
    pub address: &'a str,
    pub namespace: &'a str,
    pub env: &'a [(&'a str, &'a std::ffi::OsStr)],
    /// Run in the pulls' cgroup with this much memory (a pod's pull: what it fetches and
    /// serves comes from a stranger).
    pub memory_max: Option<u64>,
}

/// Runs chalkctl against `to` with `args`; its stderr goes through `log_file` (removed
/// after) so that a long run cannot block on a pipe.
pub fn run(
    to: &Target,
    args: &[&str],
    log_file: &Path,
    timeout: Duration,
) -> std::io::Result<Outcome> {
    let log = std::fs::File::create(log_file)?;
    let out_file = log_file.with_extension("out");
    let out = std::fs::File::create(&out_file)?;
    let (address, namespace) = (to.address, to.namespace);
    let mut cmd = Command::new(path());
    cmd.envs(to.env.iter().copied())
        .args(["--address", address])
        .args(["--namespace", namespace])
        .args(args)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(log);
    if let Some(max) = to.memory_max {
        crate::pull_cgroup::PullCgroup::prepare(Path::new(CGROUP_ROOT), max)
            .and_then(|c| c.place(&mut cmd))
            .map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!("the pulls' cgroup under {CGROUP_ROOT}: {e}"),
                )
            })?;
    }
    let status = ReaperSpawner
        .spawn(&mut cmd)
        .and_then(|child| wait_for(child, timeout));
    let said = std::fs::read_to_string(log_file).unwrap_or_default();
    let printed = std::fs::read_to_string(&out_file).unwrap_or_default();
    let _ = std::fs::remove_file(log_file);
    let _ = std::fs::remove_file(&out_file);
    Ok(Outcome {
        status: status?,
        said: said.trim().to_string(),
        printed: printed.trim().to_string(),
    })
}

/// The exit status of `child`, which is killed if it runs past `timeout`.
fn wait_for(mut child: Box<dyn Child>, timeout: Duration) -> std::io::Result<i32> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        if std::time::Instant::now() > deadline {
            // SAFETY: kill(2) of the child this module started, not yet reaped.
            unsafe { libc::kill(child.pid() as i32, libc::SIGKILL) };
            child.wait()?;
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("chalkctl did not finish within {timeout:?}"),
            ));
        }
        // A pod's start waits on this: a coarse poll would add its period to every pull.
        std::thread::sleep(Duration::from_millis(5));
    }
}
