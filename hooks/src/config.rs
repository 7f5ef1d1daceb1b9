//! Hooks and GPU options as the runtime options file and annotations state them.
//!
//! ```toml
//! allow_annotation_hooks = false      # may pods add (in-sandbox) hooks by annotation?
//! [[hooks]]
//! stage = "post-restore"              # pre-checkpoint | post-checkpoint | post-restore
//! place = "sandbox"                   # sandbox (runsc exec) | host
//! command = ["/bin/sh", "-c", "echo forked"]
//! timeout_secs = 10
//! [gpu]
//! cuda_checkpoint_path = "/usr/bin/cuda-checkpoint"   # inside the sandbox
//! lock_timeout_secs = 10
//! parallel = false
//! ```

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::Error;
pub use chalk_labels::{GPU_ANNOTATION, HOOKS_ANNOTATION};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Stage {
    /// Before the checkpoint, with the sandbox running: a failure aborts the checkpoint.
    PreCheckpoint,
    /// After the checkpoint, in a source that keeps running: a failure is logged.
    PostCheckpoint,
    /// In each fork or resumed sandbox, before Start returns: a failure fails the restore.
    PostRestore,
}

impl Stage {
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::PreCheckpoint => "pre-checkpoint",
            Stage::PostCheckpoint => "post-checkpoint",
            Stage::PostRestore => "post-restore",
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Place {
    /// Inside the sandbox, through `runsc exec`, as the sandbox's own user.
    #[default]
    Sandbox,
    /// On the host, as the shim (root): only from the runtime options, never an annotation.
    Host,
}

const DEFAULT_TIMEOUT_SECS: u64 = 30;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HookSpec {
    pub stage: Stage,
    pub command: Vec<String>,
    #[serde(default)]
    pub place: Place,
    #[serde(default = "default_timeout")]
    pub timeout_secs: u64,
}

fn default_timeout() -> u64 {
    DEFAULT_TIMEOUT_SECS
}

impl HookSpec {
    pub fn timeout(&self) -> Duration {
        Duration::from_secs(self.timeout_secs)
    }

    /// A hook that can run: a command, an absolute program path, a timeout of 1 s to 1 h.
    pub fn validate(&self) -> Result<(), Error> {
        let Some(program) = self.command.first() else {
            return Err(Error::Invalid(format!(
                "a {} hook has an empty command",
                self.stage.as_str()
            )));
        };
        if !program.starts_with('/') {
            return Err(Error::Invalid(format!(
                "{} hook {program:?}: the program must be an absolute path",
                self.stage.as_str()
            )));
        }
        if !(1..=3600).contains(&self.timeout_secs) {
            return Err(Error::Invalid(format!(
                "{} hook {program:?}: timeout_secs must be 1 to 3600, not {}",
                self.stage.as_str(),
                self.timeout_secs
            )));
        }
        Ok(())
    }
}

/// The hooks of a container: those of the options, then those of its annotation when the
/// options allow annotation hooks. Annotation hooks run only inside the sandbox.
pub fn container_hooks(
    configured: &[HookSpec],
    allow_annotations: bool,
    annotation: Option<&str>,
) -> Result<Vec<HookSpec>, Error> {
    let mut hooks = configured.to_vec();
    if let Some(text) = annotation {
        if !allow_annotations {
            return Err(Error::Invalid(format!(
                "annotation {HOOKS_ANNOTATION} is set but the runtime options do not allow \
                 annotation hooks (allow_annotation_hooks = true)"
            )));
        }
        let extra: Vec<HookSpec> = serde_json::from_str(text)
            .map_err(|e| Error::Invalid(format!("annotation {HOOKS_ANNOTATION}: {e}")))?;
        if let Some(h) = extra.iter().find(|h| h.place == Place::Host) {
            return Err(Error::Invalid(format!(
                "annotation {HOOKS_ANNOTATION}: hook {:?} asks for the host; hooks from \
                 annotations run only in the sandbox",
                h.command
            )));
        }
        hooks.extend(extra);
    }
    for h in &hooks {
        h.validate()?;
    }
    Ok(hooks)
}

/// How the shim hands CUDA state to `cuda-checkpoint`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuOptions {
    /// cuda-checkpoint's path inside the sandbox.
    #[serde(default = "default_cuda_checkpoint")]
    pub cuda_checkpoint_path: String,
    /// How long `--action lock` may wait for running CUDA work to finish.
    #[serde(default = "default_lock_timeout")]
    pub lock_timeout_secs: u64,
    /// Move the processes one after another (false) or all at once (true).
    #[serde(default)]
    pub parallel: bool,
}

fn default_cuda_checkpoint() -> String {
    "/usr/bin/cuda-checkpoint".into()
}

fn default_lock_timeout() -> u64 {
    10
}

impl Default for GpuOptions {
    fn default() -> Self {
        GpuOptions {
            cuda_checkpoint_path: default_cuda_checkpoint(),
            lock_timeout_secs: default_lock_timeout(),
            parallel: false,
        }
    }
}

/// Whether the spec gives the container NVIDIA devices (runsc then turns nvproxy on itself).
pub fn has_nvidia_devices(spec: &serde_json::Value) -> bool {
    spec["linux"]["devices"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|d| d["path"].as_str())
        .any(|p| p.starts_with("/dev/nvidia"))
}

/// Whether a container is a GPU sandbox: NVIDIA devices in its spec, runsc's nvproxy on, or
/// the [`GPU_ANNOTATION`].
pub fn is_gpu_sandbox(spec: &serde_json::Value, nvproxy: bool) -> bool {
    if nvproxy || spec["annotations"][GPU_ANNOTATION] == "true" {
        return true;
    }
    let in_devices = has_nvidia_devices(spec);
    // The NVIDIA container toolkit's CDI/legacy hooks name visible devices by env var.
    let env = spec["process"]["env"].as_array().into_iter().flatten();
    let asks = env.filter_map(|e| e.as_str()).any(|e| {
        e.strip_prefix("NVIDIA_VISIBLE_DEVICES=")
            .is_some_and(|v| !v.is_empty() && v != "void" && v != "none")
    });
    in_devices || asks
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn hook(stage: Stage, cmd: &[&str]) -> HookSpec {
        HookSpec {
            stage,
            command: cmd.iter().map(|s| s.to_string()).collect(),
            place: Place::Sandbox,
            timeout_secs: 5,
        }
    }

    #[test]
    fn annotation_hooks_need_the_options_and_stay_in_the_sandbox() {
        let base = [hook(Stage::PostRestore, &["/bin/true"])];
        let text = r#"[{"stage": "pre-checkpoint", "command": ["/bin/sync"]}]"#;
        let err = container_hooks(&base, false, Some(text)).unwrap_err();
        assert!(err.to_string().contains("allow_annotation_hooks"), "{err}");
        let all = container_hooks(&base, true, Some(text)).unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!(all[1].timeout_secs, DEFAULT_TIMEOUT_SECS);
        let host = r#"[{"stage": "pre-checkpoint", "place": "host", "command": ["/bin/sh"]}]"#;
        let err = container_hooks(&base, true, Some(host)).unwrap_err();
        assert!(err.to_string().contains("only in the sandbox"), "{err}");
    }

    #[test]
    fn hooks_are_checked() {
        assert!(hook(Stage::PreCheckpoint, &[]).validate().is_err());
        let err = hook(Stage::PreCheckpoint, &["sync"])
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("absolute"), "{err}");
        let mut h = hook(Stage::PreCheckpoint, &["/bin/sync"]);
        h.timeout_secs = 0;
        assert!(h.validate().is_err());
        let bad = r#"[{"stage": "pre-checkpoint", "command": ["/x"], "shell": true}]"#;
        assert!(container_hooks(&[], true, Some(bad)).is_err());
    }

    #[test]
    fn gpu_sandboxes_are_recognised() {
        assert!(!is_gpu_sandbox(&json!({}), false));
        assert!(is_gpu_sandbox(&json!({}), true));
        assert!(is_gpu_sandbox(
            &json!({"annotations": {"chalk.io/gpu": "true"}}),
            false
        ));
        let dev = json!({"linux": {"devices": [{"path": "/dev/nvidia0"}]}});
        assert!(is_gpu_sandbox(&dev, false));
        let env = json!({"process": {"env": ["NVIDIA_VISIBLE_DEVICES=all"]}});
        assert!(is_gpu_sandbox(&env, false));
        let void = json!({"process": {"env": ["NVIDIA_VISIBLE_DEVICES=void"]}});
        assert!(!is_gpu_sandbox(&void, false));
    }
}
