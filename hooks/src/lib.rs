//! What runs around a checkpoint or a restore of a chalk sandbox: user hooks at three stages,
//! and the handoff to NVIDIA's `cuda-checkpoint` that moves CUDA state out of the GPU before
//! gVisor checkpoints the sandbox and back after. The decisions (which hooks, in which order,
//! what to roll back) are pure and tested with fakes; [`exec`] runs the real programs.

pub mod config;
pub mod cuda;
pub mod error;
pub mod exec;
pub mod run;

pub use config::{GpuOptions, HookSpec, Place, Stage};
pub use error::Error;
pub use exec::{Exec, Outcome};
