//! A Kubernetes pod's containers in its one sandbox: the sandbox (pause) container makes it,
//! each other container joins it (`runsc create`, then `runsc start` with its stdio, its exit
//! from `runsc wait`), and a restored pod sandbox waits for its containers to be restored
//! into it before it is settled.

use std::{
    sync::{atomic::Ordering, Arc},
    time::Duration,
};

use chalk_runtime::{runsc::ProcessStdio, state::Status};

use super::Sandboxes;
use crate::container::{Container, Process, KILLED};
use crate::{
    errors::{Result, ShimError},
    io,
};

/// Pod container `c`'s name in its pod (CRI's annotation; its id where there is none).
pub(super) fn cri_name(c: &Container) -> String {
    let spec = chalk_runtime::bundle::read_spec(&c.bundle).unwrap_or_default();
    chalk_runtime::spec::annotation(&spec, chalk_runtime::pod_restore::CRI_CONTAINER_NAME)
        .unwrap_or(&c.id)
        .to_string()
}

impl Sandboxes {
    /// Whether the sandbox pod container `c` lives in still runs.
    pub(super) fn sandbox_runs(&self, c: &Container) -> bool {
        self.container(&c.sandbox_id)
            .is_ok_and(|root| root.state.lock().unwrap().init.status != Status::Stopped)
    }

    /// The containers of pod sandbox `sandbox_id` other than its sandbox container that run
    /// in it (created ones have nothing in the sandbox yet; stopped ones no longer do).
    pub(super) fn pod_members(&self, sandbox_id: &str) -> Vec<Arc<Container>> {
        self.all_containers()
            .into_iter()
            .filter(|c| c.in_pod() && c.sandbox_id == sandbox_id)
            .filter(|c| {
                let status = c.state.lock().unwrap().init.status;
                matches!(status, Status::Running | Status::Paused)
            })
            .collect()
    }

    /// A pod container joins the sandbox its pod's sandbox container made in this shim;
    /// whether it is skipped (see [`Sandboxes::check_restored_member`]).
    pub(super) fn check_pod_sandbox(
        &self,
        id: &str,
        sandbox_id: &str,
        checkpoint: &str,
        spec: &serde_json::Value,
    ) -> Result<bool> {
        let sandbox = self.container(sandbox_id).map_err(|_| {
            ShimError::FailedPrecondition(format!(
                "container {id}: its pod's sandbox container {sandbox_id} is not running in this shim"
            ))
        })?;
        if sandbox.in_pod() || sandbox.state.lock().unwrap().init.status == Status::Stopped {
            return Err(ShimError::FailedPrecondition(format!(
                "container {id}: pod sandbox {sandbox_id} is not running"
            )));
        }
        if !checkpoint.is_empty() {
            return Err(ShimError::InvalidArgument(format!(
                "container {id}: a pod's container is not restored on its own; a snapshot is of \
                 the whole sandbox ({sandbox_id})"
            )));
        }
        self.check_restored_member(id, &sandbox, spec)
    }

    /// A pod container of a sandbox being restored has started (and so been restored into
    /// it); after the last one, the sandbox's restore is settled.
    pub(super) fn pod_member_restored(&self, c: &Container) -> Result<()> {
        let Ok(root) = self.container(&c.sandbox_id) else {
            return Ok(());
        };
        if root.pending_pod_members.load(Ordering::SeqCst) > 0 {
            self.note_joined(c);
        }
        let last = root
            .pending_pod_members
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            == Ok(1);
        match (&root.restore_from, last) {
            (Some(from), true) => {
                let pid = root.state.lock().unwrap().init.pid as i32;
                log::info!("pod sandbox {}: all its containers restored", root.id);
                self.settle_restore(&root, &from.cuda_pids, pid)
            }
            _ => Ok(()),
        }
    }

    /// `runsc start` of a pod container with its stdio, then `runsc wait` for its exit.
    pub(super) fn start_in_pod(&self, c: &Arc<Container>, init: &mut Process) -> Result<()> {
        let (stdio, pio) = if init.stdio.terminal {
            (ProcessStdio::default(), None)
        } else {
            let (s, pio) = io::open_plain(&init.stdio, &self.log_context(&c.id), None)
                .map_err(|e| ShimError::InvalidArgument(format!("open stdio of {}: {e}", c.id)))?;
            (s, Some(pio))
        };
        if let Some(pio) = pio {
            init.io = pio;
        }
        if let Err(e) = c.runtime.start_with_stdio(&c.id, stdio) {
            // Never to run, as with runc: it reads stopped and its exit is reported (and its
            // output fifos let go of).
            self.record_exit(&c.id, init, KILLED as i32);
            return Err(e.into());
        }
        // Watched before anything else can fail: whatever happens next, its exit is known.
        let (this, member) = (self.clone(), c.clone());
        std::thread::spawn(move || {
            let status = wait_for_member(member.runtime.as_ref(), &member.id);
            if status == 0 {
                this.note_completed(&member);
            }
            this.process_exited(&member.id, "", status);
        });
        Ok(())
    }

    /// Start of a pod container that is skipped (an init container that the snapshot its pod
    /// starts from had run to completion): its stdio is opened, for CRI's log readers to see
    /// it end, and nothing runs.
    pub(super) fn skip_in_pod(&self, c: &Arc<Container>, init: &mut Process) -> Result<()> {
        if !init.stdio.terminal {
            let (_, pio) = io::open_plain(&init.stdio, &self.log_context(&c.id), None)
                .map_err(|e| ShimError::InvalidArgument(format!("open stdio of {}: {e}", c.id)))?;
            init.io = pio;
        }
        self.note_completed(c);
        Ok(())
    }

    /// Pod container `c` ran to completion: its pod's sandbox remembers its name (a snapshot
    /// of the pod records it; a pod restored from that snapshot skips it).
    fn note_completed(&self, c: &Container) {
        let Ok(root) = self.container(&c.sandbox_id) else {
            return;
        };
        let name = cri_name(c);
        let mut done = root.completed_members.lock().unwrap();
        if !done.contains(&name) {
            done.push(name);
        }
    }
}

/// What a failed `runsc wait` of a pod container means, from `runsc state` just after it.
#[derive(Debug, PartialEq, Eq)]
enum AfterFailedWait {
    /// runsc still runs it: the wait failed, not the container (its process was killed, the
    /// sandbox's control server was slow to answer). Wait again.
    StillRuns,
    /// runsc no longer knows it, or it stopped: it ended with its sandbox, by SIGKILL.
    Ended,
}

fn after_failed_wait(
    state: &chalk_runtime::Result<chalk_runtime::runsc::State>,
) -> AfterFailedWait {
    match state {
        Ok(s) if matches!(s.status.as_str(), "running" | "created" | "paused") => {
            AfterFailedWait::StillRuns
        }
        _ => AfterFailedWait::Ended,
    }
}

/// Blocks until pod container `id` exits: its status. A pod container has no host process, so
/// `runsc wait` is how its exit is known; a wait that fails while runsc still runs the
/// container is never taken for its exit (it would read exited to CRI while it runs on).
fn wait_for_member(runtime: &dyn chalk_runtime::runsc::SandboxRuntime, id: &str) -> i32 {
    let mut pause = Duration::from_millis(100);
    loop {
        let e = match runtime.wait(id) {
            Ok(status) => return status,
            Err(e) => e,
        };
        match after_failed_wait(&runtime.state(id)) {
            AfterFailedWait::Ended => {
                log::warn!("container {id}: {e}; it ended with its sandbox");
                return KILLED as i32;
            }
            AfterFailedWait::StillRuns => {
                log::warn!("container {id}: runsc wait failed while it runs ({e}): waiting again");
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_secs(5));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chalk_runtime::runsc::State;

    fn state(status: &str) -> chalk_runtime::Result<State> {
        Ok(State {
            id: "web".into(),
            status: status.into(),
            pid: 1,
        })
    }

    #[test]
    fn a_failed_wait_is_an_exit_only_when_runsc_no_longer_runs_the_container() {
        for running in ["running", "created", "paused"] {
            assert_eq!(
                after_failed_wait(&state(running)),
                AfterFailedWait::StillRuns
            );
        }
        assert_eq!(after_failed_wait(&state("stopped")), AfterFailedWait::Ended);
        let gone = Err(chalk_runtime::Error::Runsc {
            op: "state",
            id: "web".into(),
            status: 1,
            message: "container not found".into(),
        });
        assert_eq!(after_failed_wait(&gone), AfterFailedWait::Ended);
    }
}
