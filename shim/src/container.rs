//! What the shim tracks per container and per process.

use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Condvar, Mutex,
    },
    time::{Duration, SystemTime},
};

use chalk_runtime::{
    runsc::{Features, Runsc},
    spec::Placement,
    state::Status,
};

use crate::io::{ProcessIo, StdioPaths};

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitInfo {
    pub status: u32,
    pub at: SystemTime,
}

/// Set once when a process exits; Wait blocks on it without holding any container lock.
#[derive(Default)]
pub struct ExitCell {
    exit: Mutex<Option<ExitInfo>>,
    cond: Condvar,
}

impl ExitCell {
    /// Records the exit unless one is recorded already; returns the one that holds.
    pub fn set(&self, info: ExitInfo) -> ExitInfo {
        let mut exit = self.exit.lock().unwrap();
        if exit.is_none() {
            *exit = Some(info);
            self.cond.notify_all();
        }
        exit.unwrap_or(info)
    }

    pub fn get(&self) -> Option<ExitInfo> {
        *self.exit.lock().unwrap()
    }

    pub fn wait(&self) -> ExitInfo {
        let mut exit = self.exit.lock().unwrap();
        loop {
            if let Some(info) = *exit {
                return info;
            }
            exit = self.cond.wait(exit).unwrap();
        }
    }

    pub fn wait_timeout(&self, timeout: Duration) -> Option<ExitInfo> {
        let exit = self.exit.lock().unwrap();
        let (exit, _) = self
            .cond
            .wait_timeout_while(exit, timeout, |e| e.is_none())
            .unwrap();
        *exit
    }
}

pub struct Process {
    /// Empty for the container's init process.
    pub exec_id: String,
    pub stdio: StdioPaths,
    pub status: Status,
    /// Init: the sandbox's host pid. Exec: the pid inside the sandbox.
    pub pid: u32,
    pub io: ProcessIo,
    pub exit: Arc<ExitCell>,
    /// The terminal size last asked for (ResizePty), also before the terminal exists: a
    /// restore makes its terminal at Start.
    pub size: Option<(u32, u32)>,
}

impl Process {
    pub fn new(exec_id: &str, stdio: StdioPaths) -> Self {
        Process {
            exec_id: exec_id.to_string(),
            stdio,
            status: Status::Created,
            pid: 0,
            io: ProcessIo::default(),
            exit: Arc::default(),
            size: None,
        }
    }
}

pub struct ContainerState {
    pub init: Process,
    pub execs: HashMap<String, Process>,
}

impl ContainerState {
    pub fn process(&self, exec_id: &str) -> Option<&Process> {
        if exec_id.is_empty() {
            Some(&self.init)
        } else {
            self.execs.get(exec_id)
        }
    }

    pub fn process_mut(&mut self, exec_id: &str) -> Option<&mut Process> {
        if exec_id.is_empty() {
            Some(&mut self.init)
        } else {
            self.execs.get_mut(exec_id)
        }
    }
}

/// A verified checkpoint, and what its manifest says a restore must undo.
pub struct RestoreFrom {
    pub dir: PathBuf,
    /// The CUDA processes moved off the GPU before it was taken.
    pub cuda_pids: Vec<u32>,
    /// How many pod containers the sandbox held besides its own (each is restored into it
    /// when it starts).
    pub pod_members: usize,
    /// The terminal the sandbox's init had, for its new one.
    pub terminal: Option<chalk_runtime::terminal::TerminalState>,
    /// Set when `dir` is containerd's unpacked copy: removed once runsc has it (or with the
    /// container, if it never starts).
    pub unpacked: Mutex<Option<crate::unpacked::UnpackedCheckpoint>>,
}

pub struct Container {
    pub id: String,
    /// The pod sandbox this container belongs to (its own id when alone).
    pub sandbox_id: String,
    /// Whether it makes its sandbox or runs inside its pod's.
    pub placement: Placement,
    /// The OOM score it asks for; the shim sets the sandbox's (see `adjust_oom_score`).
    pub oom_score_adj: Option<i32>,
    pub bundle: PathBuf,
    pub runsc: Runsc,
    /// What this container's runsc binary can do.
    pub features: Features,
    pub rootfs_mounted: bool,
    pub netns: Option<PathBuf>,
    /// A verified checkpoint to restore at Start instead of starting afresh.
    pub restore_from: Option<RestoreFrom>,
    /// A pod sandbox being restored: how many of its pod's containers are still to be.
    pub pending_pod_members: std::sync::atomic::AtomicUsize,
    /// Whether the running sandbox came from a checkpoint (runsc treats those differently).
    pub restored: AtomicBool,
    /// What runs around its checkpoints and restores: the options' hooks, then its own.
    pub hooks: Vec<chalk_hooks::HookSpec>,
    /// Set for a GPU sandbox: how its CUDA processes are handed to cuda-checkpoint.
    pub gpu: Option<crate::gpu::Gpu>,
    /// Whether a checkpoint first checks its directory has room (`[snapshot]` options).
    pub check_free_space: bool,
    /// Delivers the signals of its terminal's keys once it has been restored (see
    /// `terminal.rs`); made once.
    pub terminal_signals: std::sync::OnceLock<crate::io::TerminalSignals>,
    /// Held while such a signal is delivered and while the sandbox is checkpointed: a helper
    /// exec'd into the sandbox must not cross the 2022 runsc's in-place restore.
    pub terminal_gate: Mutex<()>,
    /// How long it may run from each start, and what happens then (see `lifetime.rs`).
    pub lifetime: Option<chalk_runtime::lifetime::Lifetime>,
    pub state: Mutex<ContainerState>,
}

impl Container {
    /// A pod's container other than its sandbox container: no host process of its own (its
    /// pid is the sandbox's), and whatever it does to the sandbox it does to the whole pod.
    pub fn in_pod(&self) -> bool {
        self.placement.in_pod()
    }

    pub fn was_restored(&self) -> bool {
        self.restored.load(Ordering::Relaxed)
    }

    pub fn exec_spec_path(&self, exec_id: &str) -> PathBuf {
        self.bundle.join(format!("exec-{exec_id}.json"))
    }

    pub fn exec_pid_path(&self, exec_id: &str) -> PathBuf {
        self.bundle.join(format!("exec-{exec_id}.pid"))
    }

    pub fn init_pid_path(&self) -> PathBuf {
        self.bundle.join("init.pid")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_cell_keeps_the_first_exit() {
        let cell = Arc::new(ExitCell::default());
        assert!(cell.wait_timeout(Duration::from_millis(1)).is_none());
        let c = cell.clone();
        let waiter = std::thread::spawn(move || c.wait());
        let first = ExitInfo {
            status: 7,
            at: SystemTime::now(),
        };
        assert_eq!(cell.set(first), first);
        let later = cell.set(ExitInfo {
            status: 9,
            at: SystemTime::now(),
        });
        assert_eq!(later, first, "the first exit holds");
        assert_eq!(waiter.join().unwrap(), first);
        assert_eq!(cell.get(), Some(first));
    }
}
