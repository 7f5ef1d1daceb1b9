//! The two setups containerd drives: this shim, and containerd's runc shim with runsc as its
//! runc binary (through a wrapper that adds the same runsc flags). Both through `ctr`, as
//! users do; snapshots through `chalkctl`.

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use serde_json::Value;

use super::timed;
use crate::{containerd::IMAGE, procs::processes, Containerd, CtrOutput, RUNTIME};

pub struct ViaCtr<'a> {
    pub c: &'a Containerd,
    runtime: Vec<OsString>,
    /// The shim's executable name, to find its processes.
    pub shim: &'static str,
}

fn ok(out: CtrOutput, what: &str) -> Result<CtrOutput, String> {
    if out.code != 0 {
        return Err(format!(
            "{what}: exit {}: {}{}",
            out.code,
            out.stdout,
            out.stderr.trim()
        ));
    }
    Ok(out)
}

impl<'a> ViaCtr<'a> {
    pub fn chalk(c: &'a Containerd) -> Self {
        ViaCtr {
            c,
            runtime: vec!["--runtime".into(), RUNTIME.into()],
            shim: "containerd-shim-chalk-v1",
        }
    }

    /// The runc shim running `wrapper` as its runc.
    pub fn runc_shim(c: &'a Containerd, wrapper: &Path) -> Self {
        ViaCtr {
            c,
            runtime: vec![
                "--runtime".into(),
                "io.containerd.runc.v2".into(),
                "--runc-binary".into(),
                wrapper.into(),
            ],
            shim: "containerd-shim-runc-v2",
        }
    }

    fn run_args(&self, mode: &str, id: &str, cmd: &[&str]) -> Vec<OsString> {
        let mut args: Vec<OsString> = vec!["run".into(), mode.into()];
        args.extend(self.runtime.iter().cloned());
        args.push(IMAGE.into());
        args.push(id.into());
        args.extend(cmd.iter().map(OsString::from));
        args
    }

    /// `ctr run --rm ... echo hi`.
    pub fn run_echo(&self, id: &str) -> Result<Duration, String> {
        let args = self.run_args("--rm", id, &["echo", "hi"]);
        Ok(timed(|| ok(self.c.ctr(&args), "ctr run --rm"))?.0)
    }

    /// `ctr run -d ... sh -c SCRIPT`: create and start.
    pub fn run_detached(&self, id: &str, script: &str) -> Result<Duration, String> {
        let args = self.run_args("-d", id, &["sh", "-c", script]);
        Ok(timed(|| ok(self.c.ctr(&args), "ctr run -d"))?.0)
    }

    pub fn exec_true(&self, id: &str, exec_id: &str) -> Result<Duration, String> {
        Ok(timed(|| {
            ok(
                self.c
                    .ctr(["task", "exec", "--exec-id", exec_id, id, "true"]),
                "ctr task exec",
            )
        })?
        .0)
    }

    /// `ctr task delete --force` (kill, wait, delete); the container goes after, untimed.
    pub fn kill_delete(&self, id: &str) -> Result<Duration, String> {
        let took = timed(|| {
            ok(
                self.c.ctr(["task", "delete", "--force", id]),
                "ctr task delete -f",
            )
        })?
        .0;
        ok(self.c.ctr(["containers", "rm", id]), "ctr containers rm")?;
        Ok(took)
    }

    /// Best effort, for cleanup.
    pub fn remove(&self, id: &str) {
        self.c.ctr(["task", "delete", "--force", id]);
        self.c.ctr(["containers", "rm", id]);
    }

    /// Waits until `path` exists in sandbox `id`.
    pub fn wait_file(&self, id: &str, path: &str, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        let mut n = 0;
        loop {
            n += 1;
            let exec_id = format!("wait-{n}");
            if self
                .c
                .ctr([
                    "task",
                    "exec",
                    "--exec-id",
                    &exec_id,
                    id,
                    "test",
                    "-e",
                    path,
                ])
                .code
                == 0
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!("{path} did not appear in {id} within {timeout:?}"));
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    /// chalkctl with `-o json`; its result.
    pub fn chalkctl(&self, args: &[&str]) -> Result<Value, String> {
        let out = self
            .c
            .chalkctl_command()
            .map_err(|e| e.to_string())?
            .args(["-o", "json"])
            .args(args)
            .output()
            .map_err(|e| format!("run chalkctl: {e}"))?;
        if !out.status.success() {
            // A command on several sandboxes says what failed for each on stdout.
            return Err(format!(
                "chalkctl {}: {} {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim(),
                String::from_utf8_lossy(&out.stdout).trim()
            ));
        }
        serde_json::from_slice(&out.stdout).map_err(|e| format!("chalkctl {}: {e}", args.join(" ")))
    }

    /// A snapshot of `id`: how long, its digest, and its size in bytes (the manifest's files).
    pub fn snapshot(&self, id: &str) -> Result<(Duration, String, u64), String> {
        let (took, out) = timed(|| self.chalkctl(&["snapshot", "create", "--id", id]))?;
        let digest = out["id"].as_str().unwrap_or_default().to_string();
        let got = self.chalkctl(&["snapshot", "get", "--snapshot-id", &digest])?;
        Ok((took, digest, got["manifest"]["size"].as_u64().unwrap_or(0)))
    }

    pub fn fork(&self, digest: &str, id: &str, count: usize) -> Result<Duration, String> {
        let n = count.to_string();
        Ok(timed(|| {
            self.chalkctl(&[
                "fork",
                "--snapshot-id",
                digest,
                "--fork-id",
                id,
                "--count",
                &n,
            ])
        })?
        .0)
    }

    /// `chalkctl fork --id`: a fork of running sandbox `src` (its checkpoint, the fork, the
    /// checkpoint removed), as `id`.
    pub fn fork_running(&self, src: &str, id: &str) -> Result<Duration, String> {
        Ok(timed(|| self.chalkctl(&["fork", "--id", src, "--fork-id", id]))?.0)
    }

    /// Suspend: how long, and the snapshot it made.
    pub fn suspend(&self, id: &str) -> Result<(Duration, String), String> {
        let (took, out) = timed(|| self.chalkctl(&["suspend", "--id", id]))?;
        Ok((
            took,
            out["snapshot"]["id"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        ))
    }

    pub fn resume(&self, id: &str) -> Result<Duration, String> {
        Ok(timed(|| self.chalkctl(&["resume", "--id", id]))?.0)
    }

    /// The shim's `chalk-timing` figures (milliseconds) of its `nth` (from 0) `op` of container
    /// `id` (see [`crate::Containerd::chalk_timing`]).
    pub fn timing(
        &self,
        op: &str,
        id: &str,
        nth: usize,
    ) -> Option<std::collections::HashMap<String, f64>> {
        self.c.chalk_timing(op, id, nth, Duration::from_secs(30))
    }

    /// How long after running the `nth` restore of `id` was fully loaded (0 when eager).
    pub fn loading_after_running(&self, id: &str, nth: usize) -> f64 {
        self.timing("restore", id, nth).map_or(0.0, |t| {
            t.get("loaded_ms").unwrap_or(&0.0) - t.get("running_ms").unwrap_or(&0.0)
        })
    }

    pub fn delete_snapshot(&self, digest: &str) {
        let _ = self.chalkctl(&["snapshot", "delete", "--snapshot-id", digest]);
    }

    /// Resident memory (bytes) of each of this setup's shim processes serving this containerd.
    pub fn shim_rss(&self) -> Vec<u64> {
        let socket = self.c.socket().to_string_lossy().into_owned();
        processes()
            .into_iter()
            .filter(|(_, args)| {
                args.first().is_some_and(|a| a.ends_with(self.shim))
                    && args.iter().any(|a| a == &socket)
            })
            .filter_map(|(pid, _)| rss(pid))
            .collect()
    }
}

/// VmRSS of `pid`, in bytes.
pub fn rss(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// The wrapper the runc shim runs as its runc: runsc with the flags the chalk shim uses.
/// Written once from fixed text; `runsc` and the flags are checked to be plain words.
pub fn write_runc_wrapper(dir: &Path, runsc: &Path, flags: &[String]) -> Result<PathBuf, String> {
    let plain = |s: &str| {
        s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-=:".contains(c))
    };
    let runsc = runsc.to_string_lossy();
    if !plain(&runsc) || !flags.iter().all(|f| plain(f)) {
        return Err(format!(
            "runsc path or flags are not plain words: {runsc} {flags:?}"
        ));
    }
    let path = dir.join("runsc-as-runc");
    let script = format!("#!/bin/sh\nexec {runsc} {} \"$@\"\n", flags.join(" "));
    std::fs::write(&path, script).map_err(|e| format!("{}: {e}", path.display()))?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}
