//! What the shim tracks per container and per process.
//!
//! Locks: each container's `state` guards its processes. It is held for bookkeeping only,
//! never across runsc's restore or checkpoint, hooks or cuda-checkpoint (those mark the init
//! [`Busy`] and let go, so State, Kill and exits go on meanwhile). Where two containers'
//! states are taken together (a pod's container, then its sandbox container), the member's
//! comes first. `terminal_gate` is taken before `state`, the shim's map of containers never
//! while a container's state is held.

use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Condvar, Mutex, OnceLock,
    },
    time::{Duration, SystemTime},
};

use chalk_hooks::{GpuOptions, HookSpec};
use chalk_runtime::{
    lifetime::Lifetime,
    options::SnapshotOptions,
    runsc::{Features, SandboxRuntime},
    snapshot::store::RestoreDir,
    spec::Placement,
    state::Status,
    terminal::TerminalState,
};

use crate::{
    io::{ProcessIo, StdioPaths, TerminalSignals},
    unpacked::UnpackedCheckpoint,
};

/// An exit status of a process killed by `signal`.
pub fn killed_by(signal: i32) -> u32 {
    128 + signal as u32
}

/// The status of a process that was SIGKILLed (or never came to be, as runc's shim says).
pub const KILLED: u32 = 128 + libc::SIGKILL as u32;
/// The status of an exec whose runsc could not tell how it ended.
pub const LOST: u32 = 255;

/// Long work on the init during which its lock is not held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Busy {
    /// A restore at Start (runsc restore, then CUDA and post-restore hooks).
    Starting,
    /// A checkpoint (on the 2022 runsc, the sandbox is replaced by its restore).
    Checkpointing,
}

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
    /// Set while long work on the init goes on without the lock.
    pub busy: Option<Busy>,
    /// The sandbox's exit (with its pid), when it came while the init was busy: reported
    /// once the work is done, after what the work itself reports (TaskStart).
    pub pending_exit: Option<(u32, i32)>,
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
            busy: None,
            pending_exit: None,
        }
    }
}

pub struct ContainerState {
    pub init: Process,
    pub execs: HashMap<String, Process>,
    /// Requests waiting for the init to stop being [`Busy`] (at most [`MAX_WAITING`]).
    pub waiting: usize,
}

/// How many requests may wait for one sandbox's checkpoint or restore to end; more are
/// refused (a client retrying in a loop must not pile up the shim's threads).
pub const MAX_WAITING: usize = 16;

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
    /// The pod containers the sandbox held besides its own (CRI name, image and its digest;
    /// each is restored into it when it starts), and the ones that had completed (init
    /// containers): a container joining the restored pod must be one of the first, on the
    /// same image, or is one of the second and is skipped.
    pub pod: chalk_runtime::snapshot::extra::PodFacts,
    /// The CRI names of those that have joined so far.
    pub joined: Mutex<Vec<String>>,
    /// A pod that starts from a snapshot (`chalk.io/restore-from`): how long its sandbox waits
    /// for the snapshot's containers before it ends naming the missing ones.
    pub members_wait: Option<std::time::Duration>,
    /// The store's snapshot it comes from (empty: a checkpoint directory of runsc's files).
    pub snapshot: String,
    /// The terminal the sandbox's init had, for its new one.
    pub terminal: Option<TerminalState>,
    /// Set when `dir` is containerd's unpacked copy: removed once runsc has it (or with the
    /// container, if it never starts).
    pub unpacked: Mutex<Option<UnpackedCheckpoint>>,
    /// Set when `dir` is links into the snapshot store: held (keeping gc off its blobs) until
    /// runsc has loaded everything, then removed.
    pub linked: Mutex<Option<RestoreDir>>,
    /// How its memory loads: before all of it is in (runsc's `--background`), and mapped
    /// copy-on-write, shared with the snapshot's other restores (`--share-pages`).
    pub memory: chalk_runtime::runsc::MemoryLoad,
    /// The blobs it reads as they arrive from a registry, if any: why the sandbox ended is
    /// read from them before its exit is told (their server failed, and runsc with it).
    pub arrivals: Option<chalk_runtime::snapshot::store::Arrivals>,
}

/// A container's GPU settings, when it is a GPU sandbox.
#[derive(Debug, Clone)]
pub struct Gpu {
    pub options: GpuOptions,
    /// runsc runs it with nvproxy.
    pub nvproxy: bool,
}

/// The IPv4 addresses (interface, address, prefix) a pod's CNI gave the network namespace its
/// sandbox joined, read before runsc took them off the interfaces.
pub struct JoinedAddresses {
    pub netns: PathBuf,
    pub addresses: Vec<(String, std::net::Ipv4Addr, u8)>,
}

pub struct Container {
    pub id: String,
    /// The pod sandbox this container belongs to (its own id when alone).
    pub sandbox_id: String,
    /// Whether it makes its sandbox or runs inside its pod's.
    pub placement: Placement,
    /// The OOM score it asks for; the shim sets the sandbox's (see `pod::adjust_oom_score`).
    pub oom_score_adj: Option<i32>,
    pub bundle: PathBuf,
    pub runtime: Arc<dyn SandboxRuntime>,
    /// What this container's runsc binary can do.
    pub features: Features,
    pub rootfs_mounted: bool,
    pub netns: Option<PathBuf>,
    /// Its attachment to a CNI network, until detached (see `sandbox/network.rs`).
    pub network: Mutex<Option<chalk_runtime::network::Attachment>>,
    /// A pod's sandbox: the addresses its CRI's network gave the namespace it joined, given
    /// back when it exits (see `sandbox/network.rs`).
    pub joined_addresses: Option<JoinedAddresses>,
    /// A verified checkpoint to restore at Start instead of starting afresh.
    pub restore_from: Option<RestoreFrom>,
    /// A pod sandbox being restored: how many of its pod's containers are still to be.
    pub pending_pod_members: std::sync::atomic::AtomicUsize,
    /// A pod sandbox: the CRI names of its containers that ran to completion (exit 0), such as
    /// its init containers; a snapshot records them, and a pod restored from it skips them.
    pub completed_members: Mutex<Vec<String>>,
    /// A pod's init container that the snapshot its pod starts from had already run to
    /// completion: it never runs, and exits 0 at Start.
    pub skipped: bool,
    /// Whether the running sandbox came from a checkpoint (runsc treats those differently).
    pub restored: AtomicBool,
    /// What runs around its checkpoints and restores: the options' hooks, then its own.
    pub hooks: Vec<HookSpec>,
    /// Set for a GPU sandbox: how its CUDA processes are handed to cuda-checkpoint.
    pub gpu: Option<Gpu>,
    /// The `[snapshot]` options: free-space check, the snapshot store, lazy restores.
    pub snapshot: SnapshotOptions,
    /// Delivers the signals of its terminal's keys once it has been restored (see
    /// `terminal.rs`); made once.
    pub terminal_signals: OnceLock<TerminalSignals>,
    /// Held while such a signal is delivered and while the sandbox is checkpointed: a helper
    /// exec'd into the sandbox must not cross the 2022 runsc's in-place restore.
    pub terminal_gate: Mutex<()>,
    /// How long it may run from each start, and what happens then (see `lifetime.rs`).
    pub lifetime: Option<Lifetime>,
    pub state: Mutex<ContainerState>,
    /// Notified when the init stops being [`Busy`].
    pub idle: Condvar,
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

    /// Ends the sandbox at once (SIGKILL to all it runs, then to the sandbox process); its
    /// exit is reported as any other.
    pub fn kill_sandbox(&self) {
        if let Err(e) = self
            .runtime
            .kill(&self.id, libc::SIGKILL as u32, true, None)
        {
            log::warn!("container {}: kill --all: {e}", self.id);
        }
        let pid = self.state.lock().unwrap().init.pid;
        kill_pid(pid);
    }

    /// Waits while the init is [`Busy`] (releasing the lock meanwhile).
    pub fn wait_idle<'a>(
        &self,
        mut st: std::sync::MutexGuard<'a, ContainerState>,
    ) -> std::sync::MutexGuard<'a, ContainerState> {
        while st.init.busy.is_some() {
            st = self.idle.wait(st).unwrap();
        }
        st
    }

    /// [`Container::wait_idle`] for a request that may be refused: one more than
    /// [`MAX_WAITING`] waiting is, with the bound in the error.
    pub fn wait_idle_bounded<'a>(
        &self,
        mut st: std::sync::MutexGuard<'a, ContainerState>,
    ) -> crate::errors::Result<std::sync::MutexGuard<'a, ContainerState>> {
        let Some(busy) = st.init.busy else {
            return Ok(st);
        };
        if st.waiting >= MAX_WAITING {
            return Err(crate::errors::ShimError::ResourceExhausted(format!(
                "container {}: {} requests already wait for its {} to end, the most a sandbox \
                 queues ({MAX_WAITING}): try again once it has",
                self.id,
                st.waiting,
                match busy {
                    Busy::Starting => "restore",
                    Busy::Checkpointing => "checkpoint",
                }
            )));
        }
        st.waiting += 1;
        let mut st = self.wait_idle(st);
        st.waiting -= 1;
        Ok(st)
    }
}

/// SIGKILLs host process `pid` (a sandbox the shim adopted), if any.
pub fn kill_pid(pid: u32) {
    if pid > 0 {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
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
