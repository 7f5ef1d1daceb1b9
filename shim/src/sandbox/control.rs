//! The calls on a running container: Kill, Wait, State, Pause and Resume, Pids, Stats,
//! Update, CloseIO, ResizePty, Connect.

use std::{collections::HashMap, sync::atomic::Ordering, time::Duration};

use chalk_runtime::{
    state::{self, Event as Transition, Status},
    stats::Stats,
};
use containerd_shim::protos::{
    events::task::{TaskPaused, TaskResumed},
    topics,
};

use super::{display_exec, Sandboxes};
use crate::container::{Busy, ExitInfo};
use crate::{
    errors::{Result, ShimError},
    io::StdioPaths,
};

/// A process as State reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessState {
    pub bundle: String,
    pub pid: u32,
    pub status: Status,
    pub stdio: StdioPaths,
    pub exit: Option<ExitInfo>,
}

impl Sandboxes {
    pub fn kill(&self, id: &str, exec_id: &str, signal: u32, all: bool) -> Result<()> {
        let c = self.container(id)?;
        let finished = || ShimError::Finished {
            id: id.to_string(),
            process: display_exec(exec_id).to_string(),
        };
        let mut st = c.state.lock().unwrap();
        // A restore or checkpoint in flight: the sandbox to signal is the one it ends with
        // (a restore's, once runsc has made it: then the signal goes to it at once).
        while matches!(
            (st.init.busy, st.init.pid),
            (Some(Busy::Checkpointing), _) | (Some(Busy::Starting), 0)
        ) {
            st = c.idle.wait(st).unwrap();
        }
        let p = st
            .process_mut(exec_id)
            .ok_or_else(|| ShimError::no_exec(id, exec_id))?;
        let (status, pid, settling) = (p.status, p.pid, p.busy.is_some());
        match status {
            Status::Stopped => return Err(finished()),
            // A restored sandbox being settled (hooks, CUDA) runs already.
            Status::Created if settling && pid > 0 => {}
            Status::Created if exec_id.is_empty() && (pid == 0 || c.in_pod()) => {
                // A restore that has not started, or a pod container that has not: there is
                // no process to signal yet (a pod container's pid is its sandbox's). Decided
                // under the lock Start holds, so a Start in between is seen.
                self.record_exit(id, p, crate::container::killed_by(signal as i32) as i32);
                return Ok(());
            }
            Status::Created if exec_id.is_empty() => {
                // Not started yet: runsc cannot signal it, but the sandbox process is ours.
                let sig = nix::sys::signal::Signal::try_from(signal as i32)
                    .map_err(|e| ShimError::InvalidArgument(format!("signal {signal}: {e}")))?;
                return nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig)
                    .map_err(|e| ShimError::failed(format!("kill sandbox of {id}"), e));
            }
            Status::Created => {
                return Err(ShimError::FailedPrecondition(format!(
                    "exec {exec_id} of {id} has not started"
                )))
            }
            _ => {}
        }
        drop(st);
        if exec_id.is_empty() && self.held(&c, id, signal, all) {
            return Ok(());
        }
        if exec_id.is_empty() && c.pending_pod_members.load(Ordering::SeqCst) > 0 {
            // A restored pod sandbox still waiting for its containers has no process back in
            // it for runsc to signal: any signal ends the sandbox process, which is ours.
            log::info!("pod sandbox {id}: signal {signal} before all its containers were restored: it ends");
            crate::container::kill_pid(pid);
            return Ok(());
        }
        let target = (!exec_id.is_empty()).then_some(pid as i32);
        let mut killed = c.runtime.kill(id, signal, all, target);
        if killed.is_ok()
            && all
            && exec_id.is_empty()
            && c.was_restored()
            && c.features.kill_all_misses_restored_init()
        {
            killed = c.runtime.kill(id, signal, false, None);
        }
        let Err(e) = killed else { return Ok(()) };
        // It may have exited while we were signalling it, its exit not yet handled.
        let cell = c
            .state
            .lock()
            .unwrap()
            .process(exec_id)
            .map(|p| p.exit.clone());
        match cell {
            None => Err(finished()),
            Some(cell) if cell.wait_timeout(Duration::from_millis(300)).is_some() => {
                Err(finished())
            }
            // runsc no longer knows the container: it is gone, its exit on its way.
            Some(_) if c.runtime.state(id).is_err() => Err(finished()),
            Some(_) => Err(e.into()),
        }
    }

    pub fn wait(&self, id: &str, exec_id: &str) -> Result<ExitInfo> {
        let c = self.container(id)?;
        let cell = {
            let st = c.state.lock().unwrap();
            st.process(exec_id)
                .ok_or_else(|| ShimError::no_exec(id, exec_id))?
                .exit
                .clone()
        };
        Ok(cell.wait())
    }

    pub fn state(&self, id: &str, exec_id: &str) -> Result<ProcessState> {
        let c = self.container(id)?;
        let st = c.state.lock().unwrap();
        let p = st
            .process(exec_id)
            .ok_or_else(|| ShimError::no_exec(id, exec_id))?;
        Ok(ProcessState {
            bundle: c.bundle.display().to_string(),
            pid: p.pid,
            status: p.status,
            stdio: p.stdio.clone(),
            exit: p.exit.get(),
        })
    }

    pub fn pause(&self, id: &str) -> Result<()> {
        self.pause_resume(id, Transition::Pause)
    }

    pub fn resume(&self, id: &str) -> Result<()> {
        self.pause_resume(id, Transition::Resume)
    }

    fn pause_resume(&self, id: &str, what: Transition) -> Result<()> {
        let c = self.container(id)?;
        if c.in_pod() {
            return Err(ShimError::FailedPrecondition(format!(
                "container {id} shares its pod's sandbox, which pauses as a whole: pause the \
                 pod's sandbox container {}",
                c.sandbox_id
            )));
        }
        let st = c.state.lock().unwrap();
        let mut st = c.wait_idle_bounded(st)?;
        let next = state::transition(id, st.init.status, what)?;
        if what == Transition::Pause {
            c.runtime.pause(id)?;
            st.init.status = next;
            let mut ev = TaskPaused::new();
            ev.container_id = id.to_string();
            self.events().publish(topics::TASK_PAUSED_EVENT_TOPIC, ev);
        } else {
            c.runtime.resume(id)?;
            st.init.status = next;
            let mut ev = TaskResumed::new();
            ev.container_id = id.to_string();
            self.events().publish(topics::TASK_RESUMED_EVENT_TOPIC, ev);
        }
        Ok(())
    }

    /// The sandbox's processes, with the exec id of those started by Exec.
    pub fn pids(&self, id: &str) -> Result<Vec<(u32, Option<String>)>> {
        let c = self.container(id)?;
        let pids = c.runtime.ps(id)?;
        let exec_of: HashMap<u32, String> = {
            let st = c.state.lock().unwrap();
            st.execs
                .values()
                .filter(|p| p.status == Status::Running)
                .map(|p| (p.pid, p.exec_id.clone()))
                .collect()
        };
        Ok(pids
            .into_iter()
            .map(|pid| (pid as u32, exec_of.get(&(pid as u32)).cloned()))
            .collect())
    }

    pub fn stats(&self, id: &str) -> Result<Stats> {
        let c = self.container(id)?;
        Ok(c.runtime.stats(id)?.data)
    }

    /// New limits (OCI `LinuxResources` JSON) go to the sandbox's host cgroup, which is what
    /// bounds the whole sandbox.
    /// New limits (OCI `LinuxResources` JSON), and the node agent's `chalk.io/hold-stop`
    /// among `annotations`.
    pub fn update_task(
        &self,
        id: &str,
        resources: &[u8],
        annotations: &std::collections::HashMap<String, String>,
    ) -> Result<()> {
        if let Some(v) = annotations.get(chalk_labels::HOLD_STOP) {
            self.hold_stop(id, super::Verdict::parse(v)?)?;
        }
        self.update(id, resources)
    }

    pub fn update(&self, id: &str, resources: &[u8]) -> Result<()> {
        let c = self.container(id)?;
        if resources.is_empty() {
            return Ok(());
        }
        let parsed: oci_spec::runtime::LinuxResources = serde_json::from_slice(resources)
            .map_err(|e| ShimError::InvalidArgument(format!("resources for {id}: {e}")))?;
        let pid = {
            let st = c.state.lock().unwrap();
            if st.init.status == Status::Stopped {
                return Err(ShimError::FailedPrecondition(format!(
                    "container {id} is stopped"
                )));
            }
            st.init.pid
        };
        if c.features.has_command("update") {
            // This runsc updates the sandbox's cgroup and its own view of the limits.
            let file = c
                .bundle
                .join(format!(".update-{}.json", std::process::id()));
            chalk_runtime::bundle::write_private(&file, resources)?;
            let result = c.runtime.update(id, &file);
            let _ = std::fs::remove_file(&file);
            return Ok(result?);
        }
        if c.in_pod() {
            return Err(ShimError::FailedPrecondition(format!(
                "container {id}: this runsc ({}) has no `update` command, and a pod container's \
                 limits are its sandbox's: update the pod's sandbox container {}",
                c.features.version, c.sandbox_id
            )));
        }
        let cgroup = containerd_shim::cgroup::get_cgroup(pid)
            .map_err(|e| ShimError::failed(format!("cgroup of {id}"), e.to_string()))?;
        containerd_shim::cgroup::update_resources(&cgroup, &parsed)
            .map_err(|e| ShimError::failed(format!("update resources of {id}"), e.to_string()))
    }

    pub fn close_io(&self, id: &str, exec_id: &str) -> Result<()> {
        let c = self.container(id)?;
        let mut st = c.state.lock().unwrap();
        let p = st
            .process_mut(exec_id)
            .ok_or_else(|| ShimError::no_exec(id, exec_id))?;
        p.io.close_stdin();
        Ok(())
    }

    pub fn resize_pty(&self, id: &str, exec_id: &str, width: u32, height: u32) -> Result<()> {
        log::debug!("resize terminal of {id} {exec_id:?} to {width}x{height}");
        let c = self.container(id)?;
        let mut st = c.state.lock().unwrap();
        let p = st
            .process_mut(exec_id)
            .ok_or_else(|| ShimError::no_exec(id, exec_id))?;
        // A restore makes its terminal at Start: it gets this size then.
        let later = !p.io.has_terminal() && p.stdio.terminal && p.status == Status::Created;
        if !later {
            p.io.resize(width, height).map_err(|e| {
                ShimError::FailedPrecondition(format!("resize {}: {e}", display_exec(exec_id)))
            })?;
        }
        p.size = Some((width, height));
        drop(st);
        // runsc forwards no SIGWINCH to a restored sandbox's foreground job.
        if !later && exec_id.is_empty() && c.was_restored() {
            crate::terminal::signals_for(&c)(libc::SIGWINCH);
        }
        Ok(())
    }

    /// The pid of container `id`'s init, if this shim has it.
    pub fn task_pid(&self, id: &str) -> Option<u32> {
        self.container(id)
            .ok()
            .map(|c| c.state.lock().unwrap().init.pid)
    }
}
