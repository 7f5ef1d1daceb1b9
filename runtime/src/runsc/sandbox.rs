//! What the shim asks of the program that runs its sandboxes: one operation per call, by
//! container id. [`Runsc`] is the one real implementation; the shim's Task layer depends on
//! this trait only, so its lifecycle is unit-tested with a fake.

use std::{path::Path, sync::mpsc::Receiver, time::Instant};

use super::{ExecChild, GlobalArgs, MemoryLoad, ProcessStdio, Runsc, State};
use crate::{stats::StatsEvent, Result};

pub trait SandboxRuntime: Send + Sync {
    /// The flags every command gets (the manifest records them).
    fn global(&self) -> &GlobalArgs;
    fn binary(&self) -> &Path;
    /// Makes sandbox (or pod container) `id` from `bundle`, not yet started; its process id
    /// goes to `pid_file`. With `console`, the init's terminal master is sent there.
    fn create(
        &self,
        id: &str,
        bundle: &Path,
        pid_file: &Path,
        stdio: ProcessStdio,
        console: Option<&Path>,
    ) -> Result<()>;
    /// Makes sandbox `id` from the checkpoint in `image`, running; its memory loads as
    /// `memory` says (with `background`, it runs before all of it is loaded).
    #[allow(clippy::too_many_arguments)]
    fn restore(
        &self,
        id: &str,
        bundle: &Path,
        image: &Path,
        pid_file: &Path,
        stdio: ProcessStdio,
        console: Option<&Path>,
        memory: MemoryLoad,
    ) -> Result<()>;
    /// Blocks until a background restore of `id` has loaded all of its memory.
    fn wait_restored(&self, id: &str) -> Result<()>;
    fn start(&self, id: &str) -> Result<()>;
    /// Starts a pod's container, handing it `stdio` (runsc gives it at start).
    fn start_with_stdio(&self, id: &str, stdio: ProcessStdio) -> Result<()>;
    /// Blocks until the init of `id` exits: its status.
    fn wait(&self, id: &str) -> Result<i32>;
    fn state(&self, id: &str) -> Result<State>;
    fn kill(&self, id: &str, signal: u32, all: bool, pid: Option<i32>) -> Result<()>;
    fn kill_group(&self, id: &str, signal: u32, pgid: i32) -> Result<()>;
    fn delete(&self, id: &str, force: bool) -> Result<()>;
    fn update(&self, id: &str, resources: &Path) -> Result<()>;
    fn pause(&self, id: &str) -> Result<()>;
    fn resume(&self, id: &str) -> Result<()>;
    fn ps(&self, id: &str) -> Result<Vec<i32>>;
    fn ps_table(&self, id: &str) -> Result<String>;
    fn stats(&self, id: &str) -> Result<StatsEvent>;
    /// A process in the sandbox, in the foreground: its exit is the process's.
    fn exec(
        &self,
        id: &str,
        process_spec: &Path,
        internal_pid_file: &Path,
        stdio: ProcessStdio,
    ) -> Result<ExecChild>;
    fn checkpoint(
        &self,
        id: &str,
        image_path: &Path,
        leave_running: bool,
        extra: &[String],
    ) -> Result<()>;
    /// The exit status of sandbox process `pid` (not running before `not_before`), once it
    /// exits.
    fn watch_exit(&self, pid: i32, not_before: Instant) -> Receiver<i32>;
}

impl SandboxRuntime for Runsc {
    fn global(&self) -> &GlobalArgs {
        Runsc::global(self)
    }
    fn binary(&self) -> &Path {
        Runsc::binary(self)
    }
    fn create(
        &self,
        id: &str,
        bundle: &Path,
        pid_file: &Path,
        stdio: ProcessStdio,
        console: Option<&Path>,
    ) -> Result<()> {
        Runsc::create(self, id, bundle, pid_file, stdio, console)
    }
    fn restore(
        &self,
        id: &str,
        bundle: &Path,
        image: &Path,
        pid_file: &Path,
        stdio: ProcessStdio,
        console: Option<&Path>,
        memory: MemoryLoad,
    ) -> Result<()> {
        Runsc::restore(self, id, bundle, image, pid_file, stdio, console, memory)
    }
    fn wait_restored(&self, id: &str) -> Result<()> {
        Runsc::wait_restored(self, id)
    }
    fn start(&self, id: &str) -> Result<()> {
        Runsc::start(self, id)
    }
    fn start_with_stdio(&self, id: &str, stdio: ProcessStdio) -> Result<()> {
        Runsc::start_with_stdio(self, id, stdio)
    }
    fn wait(&self, id: &str) -> Result<i32> {
        Runsc::wait(self, id)
    }
    fn state(&self, id: &str) -> Result<State> {
        Runsc::state(self, id)
    }
    fn kill(&self, id: &str, signal: u32, all: bool, pid: Option<i32>) -> Result<()> {
        Runsc::kill(self, id, signal, all, pid)
    }
    fn kill_group(&self, id: &str, signal: u32, pgid: i32) -> Result<()> {
        Runsc::kill_group(self, id, signal, pgid)
    }
    fn delete(&self, id: &str, force: bool) -> Result<()> {
        Runsc::delete(self, id, force)
    }
    fn update(&self, id: &str, resources: &Path) -> Result<()> {
        Runsc::update(self, id, resources)
    }
    fn pause(&self, id: &str) -> Result<()> {
        Runsc::pause(self, id)
    }
    fn resume(&self, id: &str) -> Result<()> {
        Runsc::resume(self, id)
    }
    fn ps(&self, id: &str) -> Result<Vec<i32>> {
        Runsc::ps(self, id)
    }
    fn ps_table(&self, id: &str) -> Result<String> {
        Runsc::ps_table(self, id)
    }
    fn stats(&self, id: &str) -> Result<StatsEvent> {
        Runsc::stats(self, id)
    }
    fn exec(
        &self,
        id: &str,
        process_spec: &Path,
        internal_pid_file: &Path,
        stdio: ProcessStdio,
    ) -> Result<ExecChild> {
        Runsc::exec(self, id, process_spec, internal_pid_file, stdio)
    }
    fn checkpoint(
        &self,
        id: &str,
        image_path: &Path,
        leave_running: bool,
        extra: &[String],
    ) -> Result<()> {
        Runsc::checkpoint(self, id, image_path, leave_running, extra)
    }
    fn watch_exit(&self, pid: i32, not_before: Instant) -> Receiver<i32> {
        self.spawner.watch(pid, not_before)
    }
}
