//! The cuda-checkpoint handoff of GPU sandboxes (see `chalk_hooks::cuda`): CUDA state leaves
//! the GPU before runsc checkpoints the sandbox and comes back after, in the source when it
//! keeps running and in every fork or resumed sandbox. cuda-checkpoint runs inside the
//! sandbox (it must see the sandbox's processes), through `runsc exec`.

use std::time::Duration;

use chalk_hooks::{
    cuda::{CudaTool, Handoff},
    Error as HookError, Exec, GpuOptions, Place,
};
use chalk_runtime::snapshot::manifest::GpuFacts;
use serde_json::Value;

use crate::{
    container::{Container, Gpu},
    errors::{Result, ShimError},
    sandbox_exec::ContainerExec,
};

struct SandboxCuda<'a> {
    c: &'a Container,
    path: &'a str,
}

impl CudaTool for SandboxCuda<'_> {
    fn run(&self, args: &[String], timeout: Duration) -> std::result::Result<String, HookError> {
        let mut argv = vec![self.path.to_string()];
        argv.extend_from_slice(args);
        let out = ContainerExec(self.c).exec(Place::Sandbox, &argv, &[], timeout)?;
        if out.success() {
            Ok(out.output)
        } else {
            Err(HookError::Unsuccessful {
                how: out.describe(timeout),
                output: out.output.trim().to_string(),
            })
        }
    }
}

/// Whether runsc toggles CUDA processes itself: its checkpoint has `--cuda-checkpoint-path`
/// and the sandbox uses nvproxy (without which runsc sees no CUDA process).
pub fn runsc_does_it(c: &Container) -> bool {
    c.gpu.as_ref().is_some_and(|g| g.nvproxy)
        && c.features.checkpoint_flags.contains("cuda-checkpoint-path")
}

/// The flags that hand the CUDA processes to runsc's own checkpoint, where it does that.
pub fn runsc_flags(c: &Container) -> Vec<String> {
    let Some(gpu) = c.gpu.as_ref().filter(|_| runsc_does_it(c)) else {
        return Vec::new();
    };
    let mut flags = vec![format!(
        "--cuda-checkpoint-path={}",
        gpu.options.cuda_checkpoint_path
    )];
    if !gpu.options.parallel
        && c.features
            .checkpoint_flags
            .contains("cuda-checkpoint-sequential")
    {
        flags.push("--cuda-checkpoint-sequential".into());
    }
    flags
}

/// What the handoff did before a checkpoint: the CUDA processes it moved off the GPU (none
/// when runsc moves them itself) and the manifest's account of the GPU.
pub struct Handed {
    pub moved: Vec<u32>,
    pub facts: GpuFacts,
}

/// Before the checkpoint of GPU sandbox `c` (running): moves every CUDA process out of the
/// GPU. On a failure every process is already back where it was.
pub fn before_checkpoint(c: &Container, gpu: &Gpu) -> Result<Handed> {
    let moved = if runsc_does_it(c) {
        Vec::new()
    } else {
        let pids: Vec<u32> = c
            .runtime
            .ps(&c.id)?
            .into_iter()
            .filter_map(|p| u32::try_from(p).ok())
            .collect();
        let tool = SandboxCuda {
            c,
            path: &gpu.options.cuda_checkpoint_path,
        };
        let handoff = Handoff::new(&tool, &gpu.options);
        let cuda = handoff.cuda_processes(&pids);
        handoff.checkpoint(&cuda).map_err(|e| {
            ShimError::FailedPrecondition(format!("container {}: checkpoint not taken: {e}", c.id))
        })?;
        log::info!("container {}: CUDA processes {cuda:?} checkpointed", c.id);
        cuda
    };
    // Asked now: a suspended sandbox is gone after the checkpoint.
    let facts = facts(c, gpu, &moved);
    Ok(Handed { moved, facts })
}

/// Moves `moved` back onto the GPU and unlocks them (after the checkpoint, or in a restored
/// sandbox).
pub fn restore(c: &Container, options: &GpuOptions, moved: &[u32]) -> Result<()> {
    if moved.is_empty() {
        return Ok(());
    }
    let tool = SandboxCuda {
        c,
        path: &options.cuda_checkpoint_path,
    };
    Handoff::new(&tool, options)
        .restore(moved)
        .map_err(|e| ShimError::FailedPrecondition(format!("container {}: {e}", c.id)))
}

/// What the manifest records of a GPU sandbox: driver, GPUs, cuda-checkpoint's version and
/// which processes were moved (a restore moves those back).
fn facts(c: &Container, gpu: &Gpu, moved: &[u32]) -> GpuFacts {
    let version = SandboxCuda {
        c,
        path: &gpu.options.cuda_checkpoint_path,
    }
    .run(&["--version".to_string()], Duration::from_secs(10))
    .map(|v| v.trim().to_string())
    .unwrap_or_else(|e| format!("unknown ({e})"));
    let driver = std::fs::read_to_string("/proc/driver/nvidia/version")
        .ok()
        .and_then(|v| v.lines().next().map(str::to_string));
    let models: Vec<String> = std::fs::read_dir("/proc/driver/nvidia/gpus")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|d| std::fs::read_to_string(d.path().join("information")).ok())
        .filter_map(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("Model:"))
                .map(|m| m.trim().to_string())
        })
        .collect();
    GpuFacts {
        handoff: if runsc_does_it(c) { "runsc" } else { "chalk" }.into(),
        driver_version: driver,
        gpu_count: models.len(),
        gpu_models: models,
        cuda_checkpoint_version: version,
        moved_pids: moved.to_vec(),
    }
}

/// The GPU settings of a container with `spec` under these options, if it is a GPU sandbox.
pub fn of(spec: &Value, options: &GpuOptions, runsc_flags: &[String]) -> Option<Gpu> {
    let nvproxy_flag = runsc_flags
        .iter()
        .any(|f| f == "--nvproxy" || f == "--nvproxy=true");
    let devices = chalk_hooks::config::has_nvidia_devices(spec);
    chalk_hooks::config::is_gpu_sandbox(spec, nvproxy_flag).then(|| Gpu {
        options: options.clone(),
        // runsc turns nvproxy on by itself for NVIDIA devices in the spec.
        nvproxy: nvproxy_flag || devices,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn gpu_sandboxes_and_their_nvproxy() {
        let o = GpuOptions::default();
        assert!(of(&json!({}), &o, &[]).is_none());
        let annotated = json!({"annotations": {"chalk.io/gpu": "true"}});
        assert!(!of(&annotated, &o, &[]).unwrap().nvproxy);
        assert!(
            of(&annotated, &o, &["--nvproxy=true".into()])
                .unwrap()
                .nvproxy
        );
        let dev = json!({"linux": {"devices": [{"path": "/dev/nvidiactl"}]}});
        assert!(of(&dev, &o, &[]).unwrap().nvproxy);
    }
}
