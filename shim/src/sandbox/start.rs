//! Start: the init runs (`runsc start`), or, for a container created from a checkpoint, its
//! sandbox is restored and then settled (CUDA processes back on the GPU, post-restore hooks).
//! A restore's long work goes on with the init marked busy, not under its lock.

use std::{
    sync::{atomic::Ordering, Arc},
    time::Instant,
};

use chalk_labels::ENDED_BECAUSE;
use chalk_runtime::state::{self, Event as Transition, Status};
use containerd_shim::protos::{events::task::TaskStart, topics};

use super::{launch::Launch, Sandboxes};
use crate::container::{kill_pid, Busy, Container, RestoreFrom};
use crate::{
    errors::{Result, ShimError},
    runtimes::network_hint,
};
use chalk_runtime::snapshot::store::RestoreDir;

impl Sandboxes {
    pub fn start(&self, id: &str, exec_id: &str) -> Result<u32> {
        let c = self.container(id)?;
        if !exec_id.is_empty() {
            return self.start_exec(&c, exec_id);
        }
        let st = c.state.lock().unwrap();
        let mut st = c.wait_idle_bounded(st)?;
        let next = state::transition(id, st.init.status, Transition::Start)?;
        if let Some(from) = &c.restore_from {
            st.init.busy = Some(Busy::Starting);
            let (stdio, size) = (st.init.stdio.clone(), st.init.size);
            drop(st);
            let restored = self.restore_sandbox(&c, from, &stdio, size);
            let mut st = c.state.lock().unwrap();
            if restored.is_ok() {
                st.init.status = next;
                self.started(&c, st.init.pid);
            }
            // An exit that came meanwhile is reported now, after TaskStart.
            self.finish_busy(&c, &mut st);
            drop(st);
            restored?;
        } else if c.skipped {
            // An init container the snapshot had run: reported started, then exited 0.
            self.skip_in_pod(&c, &mut st.init)?;
            st.init.status = next;
            self.started(&c, st.init.pid);
            self.record_exit(id, &mut st.init, 0);
            drop(st);
        } else if c.in_pod() {
            self.start_in_pod(&c, &mut st.init)?;
            // The last container of a pod being restored settles the pod's restore.
            st.init.busy = Some(Busy::Starting);
            drop(st);
            let settled = self.pod_member_restored(&c);
            let mut st = c.state.lock().unwrap();
            if settled.is_ok() {
                st.init.status = next;
                self.started(&c, st.init.pid);
            }
            self.finish_busy(&c, &mut st);
            drop(st);
            settled?;
        } else {
            if let Err(e) = c.runtime.start(id) {
                // A sandbox whose start failed can never run: end it, so the task reads stopped
                // (as with runc) and its exit is reported, instead of lingering as created.
                kill_pid(st.init.pid);
                return Err(network_hint(e.into()));
            }
            st.init.status = next;
            self.started(&c, st.init.pid);
            drop(st);
        }
        let pid = c.state.lock().unwrap().init.pid;
        self.adjust_oom_score(&c.sandbox_id, pid);
        if let Some(lifetime) = c.lifetime {
            crate::lifetime::watch(&self.lifetime_context(), &c, lifetime);
        }
        Ok(pid)
    }

    fn started(&self, c: &Container, pid: u32) {
        let mut ev = TaskStart::new();
        ev.container_id = c.id.clone();
        ev.pid = pid;
        self.events().publish(topics::TASK_START_EVENT_TOPIC, ev);
    }

    /// Restores the sandbox of `c` from `from` and settles it: its pid.
    fn restore_sandbox(
        &self,
        c: &Arc<Container>,
        from: &RestoreFrom,
        stdio: &crate::io::StdioPaths,
        size: Option<(u32, u32)>,
    ) -> Result<u32> {
        let started_at = Instant::now();
        chalk_runtime::fault::point("restore", &c.id);
        let terminal = from.terminal.clone().map(|mut t| {
            if let Some((w, h)) = size {
                (t.cols, t.rows) = (w.min(u16::MAX.into()) as u16, h.min(u16::MAX.into()) as u16);
            }
            t
        });
        let launched = self.launch_sandbox(
            c,
            stdio,
            Launch::Restore {
                image: &from.dir,
                previous: None,
                terminal,
                signals: Some(crate::terminal::signals_for(c)),
                memory: from.memory,
            },
        );
        // runsc has opened what it reads (or failed): containerd's copy can go.
        from.unpacked.lock().unwrap().take();
        let linked = from.linked.lock().unwrap().take();
        let running = started_at.elapsed();
        match (&launched, linked) {
            // The store's links go once runsc has loaded everything: it holds the files open
            // until then, and gc must not take their blobs meanwhile.
            (Ok((pid, _)), Some(linked)) if from.memory.background => {
                let (this, c, pid) = (self.clone(), c.clone(), *pid as u32);
                std::thread::spawn(move || {
                    let loaded = c.runtime.wait_restored(&c.id);
                    let failed = linked.arrival_failure();
                    keep_while_mapped(&c, linked);
                    match (loaded, failed) {
                        (Ok(()), None) => {
                            restore_timing(&c.id, true, running, started_at.elapsed())
                        }
                        (_, Some(why)) => this.memory_never_came(&c, pid, &why),
                        (Err(e), None) => {
                            log::warn!("container {}: waiting for its restore: {e}", c.id)
                        }
                    }
                });
            }
            (Ok(_), linked) => {
                drop(linked);
                restore_timing(&c.id, false, running, running)
            }
            (Err(e), Some(linked)) => {
                // runsc's own error says only that a read failed: say why it did.
                if let Some(why) = linked.arrival_failure() {
                    let _ = self.records().set_label(&c.id, ENDED_BECAUSE, &why);
                    return Err(ShimError::FailedPrecondition(format!(
                        "container {}: the snapshot's memory could not be fetched ({why}); \
                         runsc: {e}",
                        c.id
                    )));
                }
            }
            (Err(_), None) => {}
        }
        let (pid, pio) = launched?;
        if let (Some((w, h)), None) = (size, &from.terminal) {
            let _ = pio.resize(w, h);
        }
        {
            let mut st = c.state.lock().unwrap();
            st.init.pid = pid as u32;
            st.init.io = pio;
        }
        self.watch_init(c, pid, started_at);
        log::info!("container {}: restored from {}", c.id, from.dir.display());
        chalk_runtime::fault::point("restored", &c.id);
        let members = from.pod.containers.len();
        if members > 0 {
            // The sandbox waits for its pod's containers (their starts restore them); the
            // last one's completes the restore, and settles it.
            c.pending_pod_members.store(members, Ordering::SeqCst);
            if let Some(wait) = from.members_wait {
                self.end_unless_joined(c, pid, wait);
            }
        } else {
            self.settle_restore(c, &from.cuda_pids, pid)?;
        }
        Ok(pid as u32)
    }

    /// A sandbox restored while its memory arrived can never have the rest of it: it ends
    /// (runsc kills it too), its exit is reported as any, and why is kept on its record.
    fn memory_never_came(&self, c: &Container, pid: u32, why: &str) {
        log::warn!(
            "container {}: its snapshot's memory could not be fetched ({why}): the sandbox was \
             stopped",
            c.id
        );
        // Why first: whoever sees the task stopped must find the reason already there.
        if let Err(e) = self.records().set_label(&c.id, ENDED_BECAUSE, why) {
            log::warn!("container {}: why it ended was not recorded: {e}", c.id);
        }
        kill_pid(pid);
    }

    /// After a restore: CUDA processes back on the GPU, then the post-restore hooks. A restore
    /// where either fails has failed: its sandbox (`pid`) ends.
    pub(super) fn settle_restore(&self, c: &Container, cuda_pids: &[u32], pid: i32) -> Result<()> {
        let options = c
            .gpu
            .as_ref()
            .map(|g| g.options.clone())
            .unwrap_or_default();
        let settled = crate::gpu::restore(c, &options, cuda_pids).and_then(|_| {
            crate::hooks::run(c, chalk_hooks::Stage::PostRestore, None)
                .map(drop)
                .map_err(|e| ShimError::FailedPrecondition(e.to_string()))
        });
        settled.map_err(|e| {
            kill_pid(pid as u32);
            ShimError::FailedPrecondition(format!(
                "container {}: restored, then {e}; the sandbox was stopped",
                c.id
            ))
        })
    }

    /// Gives sandbox process `pid` the lowest OOM score its running containers ask for (as
    /// runsc does for a pod), or leaves the one it inherited from the shim.
    fn adjust_oom_score(&self, sandbox_id: &str, pid: u32) {
        let lowest = self
            .all_containers()
            .iter()
            .filter(|c| c.sandbox_id == sandbox_id)
            .filter(|c| c.state.lock().unwrap().init.status != Status::Stopped)
            .filter_map(|c| c.oom_score_adj)
            .min();
        if let Some(score) = lowest {
            let path = format!("/proc/{pid}/oom_score_adj");
            if let Err(e) = std::fs::write(&path, score.to_string()) {
                log::warn!("sandbox {sandbox_id}: OOM score {score} not set on {path}: {e}");
            }
        }
    }
}

/// The line the bench reads: how long a restore took to run, and to have all of its memory.
/// A sandbox restored with shared pages maps the snapshot's pages file for as long as it
/// runs: its store links stay (keeping gc off the blobs) until the container goes.
fn keep_while_mapped(c: &Container, linked: RestoreDir) {
    match &c.restore_from {
        Some(from) if from.memory.share_pages => *from.linked.lock().unwrap() = Some(linked),
        _ => drop(linked),
    }
}

fn restore_timing(id: &str, lazy: bool, running: std::time::Duration, loaded: std::time::Duration) {
    log::info!(
        "chalk-timing op=restore id={id} lazy={lazy} running_ms={} loaded_ms={}",
        running.as_millis(),
        loaded.as_millis()
    );
}
