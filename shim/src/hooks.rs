//! The hooks of a container around its checkpoint and its restore (see `chalk-hooks`), run in
//! its sandbox through `runsc exec` (as its init's user, with its init's capabilities: a hook
//! never reaches further than the workload) or on the host.

use std::{
    path::Path,
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

use chalk_hooks::{
    exec::{host_command, output_file, spawn_with_timeout, wait_with_timeout, Running},
    run::{run_stage, HookError},
    Exec, Outcome, Place, Stage,
};
use chalk_runtime::runsc::{ExecChild, ProcessStdio, Spawner};

use crate::{container::Container, reaper::ReaperSpawner};

static HOOK_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Runs the hooks of `stage` for `c`; `snapshot_dir` is the checkpoint's directory.
pub fn run(c: &Container, stage: Stage, snapshot_dir: Option<&Path>) -> Result<usize, HookError> {
    if !c.hooks.iter().any(|h| h.stage == stage) {
        return Ok(0);
    }
    let mut env = vec![
        ("CHALK_STAGE".to_string(), stage.as_str().to_string()),
        ("CHALK_CONTAINER_ID".to_string(), c.id.clone()),
        ("CHALK_SANDBOX_ID".to_string(), c.sandbox_id.clone()),
    ];
    if let Some(dir) = snapshot_dir {
        env.push(("CHALK_SNAPSHOT_DIR".into(), dir.display().to_string()));
    }
    run_stage(&c.hooks, stage, &ContainerExec(c), &env)
}

/// Runs commands for container `.0`: in its sandbox or on the host.
pub(crate) struct ContainerExec<'a>(pub(crate) &'a Container);

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

/// A foreground `runsc exec`, whose exit is the hook's.
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
    ) -> Result<Outcome, String> {
        let c = self.0;
        match place {
            Place::Host => spawn_with_timeout(host_command(argv, env)?, timeout, |cmd| {
                ReaperSpawner
                    .spawn(cmd)
                    .map(|child| Box::new(Reaped(child)) as Box<dyn Running>)
            }),
            Place::Sandbox => {
                let (output, writer) = output_file()?;
                let n = HOOK_COUNTER.fetch_add(1, Ordering::Relaxed);
                let spec_path = c.bundle.join(format!(".hook-{n}.json"));
                let pid_path = c.bundle.join(format!(".hook-{n}.pid"));
                let spec = hook_process(&c.bundle, argv, env)?;
                crate::task::write_private(&spec_path, &spec).map_err(|e| e.to_string())?;
                let stdio = ProcessStdio {
                    stdin: None,
                    stdout: Some(writer.try_clone().map_err(|e| e.to_string())?),
                    stderr: Some(writer),
                    terminal: false,
                };
                let started = c.runsc.exec(&c.id, &spec_path, &pid_path, stdio);
                let outcome = started.map_err(|e| e.to_string()).and_then(|child| {
                    wait_with_timeout(Box::new(InSandbox(child)), output, timeout, |pid| {
                        // The process in the sandbox, then the runsc exec waiting for it.
                        let inner = std::fs::read_to_string(&pid_path)
                            .ok()
                            .and_then(|s| s.trim().parse::<i32>().ok());
                        if let Some(inner) = inner {
                            let _ = c.runsc.kill(&c.id, 9, false, Some(inner));
                        }
                        // SAFETY: kill(2) of the runsc exec this function started.
                        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                    })
                });
                let _ = std::fs::remove_file(&spec_path);
                let _ = std::fs::remove_file(&pid_path);
                outcome
            }
        }
    }
}

/// The process spec of an in-sandbox hook: the init's process (user, capabilities, rlimits,
/// cwd) with the hook's command and the init's environment plus `env`.
fn hook_process(
    bundle: &Path,
    argv: &[String],
    env: &[(String, String)],
) -> Result<Vec<u8>, String> {
    let config = bundle.join("config.json");
    let text = std::fs::read(&config).map_err(|e| format!("read {}: {e}", config.display()))?;
    let spec: serde_json::Value =
        serde_json::from_slice(&text).map_err(|e| format!("parse {}: {e}", config.display()))?;
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
    fn a_hook_runs_as_the_init_with_its_own_command_and_environment() {
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
            serde_json::from_slice(&hook_process(dir.path(), &argv, &env).unwrap()).unwrap();
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
