//! The hooks of a container around its checkpoint and its restore (see `chalk-hooks`), run in
//! its sandbox (see `sandbox_exec`) or on the host.

use std::path::Path;

use chalk_hooks::{
    run::{run_stage, HookError},
    Stage,
};

use crate::{container::Container, sandbox_exec::ContainerExec};

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
