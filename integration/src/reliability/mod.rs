//! The load and soak runs behind RELIABILITY.md (`chalk-reliability`, `scripts/reliability`),
//! against a private containerd and the real runsc, and the report made of their results and
//! of the fault cases' (`$CHALK_RESULTS` lines of the e2e suite).

pub mod load;
pub mod report;
pub mod soak;

use std::{
    process::Command,
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::{containerd::IMAGE, testkit::COUNTER, Containerd, CtrOutput};

/// A containerd driven by chalkctl and ctr, with the checks load and soak share.
pub struct Node<'a> {
    pub c: &'a Containerd,
}

impl Node<'_> {
    pub fn chalkctl(&self, args: &[&str]) -> CtrOutput {
        let mut cmd: Command = match self.c.chalkctl_command() {
            Ok(cmd) => cmd,
            Err(e) => {
                return CtrOutput {
                    code: -1,
                    stdout: String::new(),
                    stderr: format!("chalkctl: {e}"),
                }
            }
        };
        match cmd.args(args).output() {
            Ok(out) => out.into(),
            Err(e) => CtrOutput {
                code: -1,
                stdout: String::new(),
                stderr: format!("chalkctl: {e}"),
            },
        }
    }

    /// `chalkctl --output json args`, its answer parsed; what it said when it failed.
    pub fn chalkctl_json(&self, args: &[&str]) -> Result<Value, String> {
        let mut all = vec!["--output", "json"];
        all.extend_from_slice(args);
        let out = self.chalkctl(&all);
        if out.code != 0 {
            return Err(format!("chalkctl {args:?}: {}", out.stderr.trim()));
        }
        serde_json::from_str(&out.stdout).map_err(|e| format!("chalkctl {args:?}: {e}"))
    }

    /// A sandbox running the counter.
    pub fn run(&self, id: &str) -> Result<(), String> {
        self.run_with(id, COUNTER)
    }

    /// A sandbox running the shell command `script`.
    pub fn run_with(&self, id: &str, script: &str) -> Result<(), String> {
        let out = self.chalkctl(&["run", IMAGE, id, "--", "sh", "-c", script]);
        if out.code != 0 {
            return Err(format!("chalkctl run {id}: {}", out.stderr.trim()));
        }
        Ok(())
    }

    /// The counter's value in `id` (by an exec), if it answers.
    pub fn count(&self, id: &str) -> Option<u64> {
        let out = self
            .c
            .ctr(["task", "exec", "--exec-id", "peek", id, "cat", "/tmp/count"]);
        out.stdout.trim().parse().ok()
    }

    /// Waits (30 s at most) for `id`'s counter to read at least `n`.
    pub fn counts_to(&self, id: &str, n: u64) -> Result<u64, String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match self.count(id) {
                Some(now) if now >= n => return Ok(now),
                now if Instant::now() > deadline => {
                    return Err(format!("{id} does not count to {n}: {now:?}"))
                }
                _ => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// Kills and removes `id` (task and container) and deletes its snapshot records.
    pub fn remove(&self, id: &str) -> Result<(), String> {
        self.c.ctr(["task", "kill", "-s", "SIGKILL", id]);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let rm = self.c.ctr(["task", "rm", "-f", id]);
            let listed = self.c.ctr(["task", "ls", "-q"]).stdout;
            if rm.code == 0 || !listed.lines().any(|l| l == id) {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!("{id}'s task cannot be removed: {}", rm.stderr));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let rm = self.c.ctr(["containers", "rm", id]);
        let listed = self.c.ctr(["containers", "ls", "-q"]).stdout;
        if rm.code != 0 && listed.lines().any(|l| l == id) {
            return Err(format!("container {id} not removed: {}", rm.stderr));
        }
        self.delete_snapshots_of(id)
    }

    /// Deletes every snapshot record of sandbox `id`.
    pub fn delete_snapshots_of(&self, id: &str) -> Result<(), String> {
        let listed = self.chalkctl_json(&["snapshot", "list", "--sandbox-id", id])?;
        for r in listed["items"].as_array().into_iter().flatten() {
            let name = r["name"].as_str().unwrap_or_default();
            let out = self.chalkctl(&["snapshot", "delete", "--snapshot-id", name]);
            if out.code != 0 {
                return Err(format!("snapshot delete {name}: {}", out.stderr.trim()));
            }
        }
        Ok(())
    }

    /// What is left of `ids`: runsc processes, bundles, runsc state.
    pub fn leftovers(&self, ids: &[String]) -> Vec<String> {
        let mut left = Vec::new();
        for (pid, args) in crate::procs::processes() {
            if args.iter().any(|a| a.contains("runsc")) && args.iter().any(|a| ids.contains(a)) {
                left.push(format!("runsc process {pid}"));
            }
        }
        let bundles = self
            .c
            .dir()
            .join("state/io.containerd.runtime.v2.task")
            .join(&self.c.namespace);
        for id in ids {
            if bundles.join(id).exists() {
                left.push(format!("bundle of {id}"));
            }
            if self.c.runsc_root().join(id).exists() {
                left.push(format!("runsc state of {id}"));
            }
        }
        left
    }

    /// containerd's daemon pid (the process whose arguments name this instance's config).
    pub fn containerd_pid(&self) -> Option<u32> {
        let config = self.c.dir().join("config.toml").display().to_string();
        crate::procs::processes()
            .into_iter()
            .find(|(_, a)| {
                a.first().is_some_and(|b| b.ends_with("containerd")) && a.contains(&config)
            })
            .map(|(pid, _)| pid)
    }

    /// The shim serving container `id`.
    pub fn shim_pid(&self, id: &str) -> Option<u32> {
        crate::procs::processes()
            .into_iter()
            .find(|(_, a)| {
                a.first()
                    .is_some_and(|b| b.ends_with("containerd-shim-chalk-v1"))
                    && a.windows(2).any(|w| w[0] == "-id" && w[1] == id)
            })
            .map(|(pid, _)| pid)
    }
}

/// Open file descriptors of `pid`.
pub fn fds(pid: u32) -> Option<u64> {
    Some(std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64)
}

/// Seconds, to a tenth.
pub fn secs(d: Duration) -> f64 {
    (d.as_secs_f64() * 10.0).round() / 10.0
}
