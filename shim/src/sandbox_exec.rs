//! Processes the shim runs inside a container's sandbox, through `runsc exec`: a client's
//! exec (with its stdio), and the shim's own commands (hooks, cuda-checkpoint, the terminal
//! helper), which run as the init's user with the init's capabilities, so none reaches
//! further than the workload.

use chalk_runtime::bundle;
use std::{
    path::Path,
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant},
};

use chalk_hooks::{
    exec::{host_command, output_file, spawn_with_timeout, wait_with_timeout, Running},
    Error as HookError, Exec, Outcome, Place,
};
use chalk_runtime::runsc::{ExecChild, ProcessStdio, Spawner};

use crate::{
    container::Container,
    errors::{Result, ShimError},
    reaper::ReaperSpawner,
};

static COMMAND_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Runs the process spec at `spec_path` in `c`'s sandbox and waits (up to `timeout`) until
/// it runs there: the foreground runsc exec (whose exit is the process's) and the process's
/// pid inside the sandbox. A runsc exec that ends without starting it gives runsc's reason.
pub fn start(
    c: &Container,
    what: &str,
    spec_path: &Path,
    pid_file: &Path,
    stdio: ProcessStdio,
    timeout: Duration,
) -> Result<(ExecChild, i32)> {
    let _ = std::fs::remove_file(pid_file);
    let mut child = c.runtime.exec(&c.id, spec_path, pid_file, stdio)?;
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(pid) = bundle::read_pid(pid_file) {
            return Ok((child, pid));
        }
        let exited = child
            .try_wait()
            .map_err(|e| ShimError::failed("wait for runsc exec", e))?;
        if exited.is_some() {
            if let Some(pid) = bundle::read_pid(pid_file) {
                return Ok((child, pid));
            }
            return Err(ShimError::Internal(format!(
                "runsc exec {what} in {}: {}",
                c.id,
                child.failure_reason()
            )));
        }
        if Instant::now() > deadline {
            crate::container::kill_pid(child.pid());
            return Err(ShimError::Internal(format!(
                "runsc exec {what} in {} did not start within {timeout:?}",
                c.id
            )));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Runs the shim's commands for container `.0`: in its sandbox or on the host.
pub struct ContainerExec<'a>(pub &'a Container);

/// A child the shim's reaper waits for.
struct Reaped(Box<dyn chalk_runtime::runsc::Child>);

impl Running for Reaped {
    fn pid(&self) -> u32 {
        self.0.pid()
    }
    fn try_wait(&mut self) -> std::io::Result<Option<i32>> {
        self.0.try_wait()
    }
}

/// A foreground `runsc exec`, whose exit is the command's.
struct InSandbox(ExecChild);

impl Running for InSandbox {
    fn pid(&self) -> u32 {
        self.0.pid()
    }
    fn try_wait(&mut self) -> std::io::Result<Option<i32>> {
        self.0.try_wait()
    }
}

impl Exec for ContainerExec<'_> {
    fn exec(
        &self,
        place: Place,
        argv: &[String],
        env: &[(String, String)],
        timeout: Duration,
    ) -> std::result::Result<Outcome, chalk_hooks::Error> {
        let c = self.0;
        match place {
            Place::Host => spawn_with_timeout(host_command(argv, env)?, timeout, |cmd| {
                ReaperSpawner
                    .spawn(cmd)
                    .map(|child| Box::new(Reaped(child)) as Box<dyn Running>)
            }),
            Place::Sandbox => {
                let (output, writer) = output_file()?;
                let n = COMMAND_COUNTER.fetch_add(1, Ordering::Relaxed);
                let spec_path = c.bundle.join(format!(".command-{n}.json"));
                let pid_path = c.bundle.join(format!(".command-{n}.pid"));
                let spec = as_the_init(&c.bundle, argv, env).map_err(HookError::Invalid)?;
                bundle::write_private(&spec_path, &spec)
                    .map_err(|e| HookError::Sandbox(e.into()))?;
                let stdio = ProcessStdio {
                    stdin: None,
                    stdout: Some(writer.try_clone().map_err(HookError::io("output file"))?),
                    stderr: Some(writer),
                    terminal: false,
                };
                let started = c.runtime.exec(&c.id, &spec_path, &pid_path, stdio);
                let outcome = started
                    .map_err(|e| HookError::Sandbox(e.into()))
                    .and_then(|child| {
                        wait_with_timeout(Box::new(InSandbox(child)), output, timeout, |pid| {
                            // The process in the sandbox, then the runsc exec waiting for it.
                            if let Some(inner) = bundle::read_pid(&pid_path) {
                                let _ = c.runtime.kill(&c.id, 9, false, Some(inner));
                            }
                            crate::container::kill_pid(pid);
                        })
                    });
                let _ = std::fs::remove_file(&spec_path);
                let _ = std::fs::remove_file(&pid_path);
                outcome
            }
        }
    }
}

/// The process spec of a command of the shim's: the init's process (user, capabilities,
/// rlimits, cwd) with the command's argv and the init's environment plus `env`.
fn as_the_init(
    bundle: &Path,
    argv: &[String],
    env: &[(String, String)],
) -> std::result::Result<Vec<u8>, String> {
    let config = bundle.join("config.json");
    let spec = bundle::read_spec(bundle)
        .ok_or_else(|| format!("{} is missing or not JSON", config.display()))?;
    let mut process = spec["process"].clone();
    if !process.is_object() {
        return Err(format!("{} has no process", config.display()));
    }
    let mut vars: Vec<String> = chalk_runtime::spec::strings(&process["env"])
        .into_iter()
        .filter(|v| !env.iter().any(|(k, _)| v.starts_with(&format!("{k}="))))
        .collect();
    vars.extend(env.iter().map(|(k, v)| format!("{k}={v}")));
    process["args"] = argv.into();
    process["env"] = vars.into();
    process["terminal"] = false.into();
    if let Some(p) = process.as_object_mut() {
        p.remove("consoleSize");
    }
    serde_json::to_vec(&process).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_runs_as_the_init_with_its_own_argv_and_environment() {
        let dir = tempfile::tempdir().unwrap();
        let spec = serde_json::json!({"process": {
            "args": ["sleep", "1000"], "terminal": true, "consoleSize": {"height": 1, "width": 2},
            "user": {"uid": 1000, "gid": 1000}, "cwd": "/app",
            "env": ["PATH=/bin", "CHALK_STAGE=spoofed"],
            "capabilities": {"bounding": ["CAP_KILL"]}
        }});
        std::fs::write(dir.path().join("config.json"), spec.to_string()).unwrap();
        let argv = vec!["/bin/sh".to_string(), "-c".into(), "true".into()];
        let env = vec![("CHALK_STAGE".to_string(), "post-restore".to_string())];
        let p: serde_json::Value =
            serde_json::from_slice(&as_the_init(dir.path(), &argv, &env).unwrap()).unwrap();
        assert_eq!(p["args"], serde_json::json!(argv));
        assert_eq!(
            p["env"],
            serde_json::json!(["PATH=/bin", "CHALK_STAGE=post-restore"])
        );
        assert_eq!(p["user"]["uid"], 1000);
        assert_eq!(
            p["capabilities"]["bounding"],
            serde_json::json!(["CAP_KILL"])
        );
        assert_eq!(p["terminal"], false);
        assert!(p.get("consoleSize").is_none());
    }
}
