//! How processes end: the sandbox process is the shim's adopted child, whose exit status is
//! the init's; an exec's comes from its foreground runsc; a pod container's from `runsc
//! wait`. Each exit is recorded once, and reported to containerd once (TaskExit).

use std::{
    sync::Arc,
    time::{Instant, SystemTime},
};

use chalk_runtime::state::Status;
use containerd_shim::protos::{
    events::task::{TaskExit, TaskOOM},
    topics,
};

use super::Sandboxes;
use crate::container::{Container, ContainerState, ExitInfo, Process};
use crate::{events::timestamp, io::ProcessIo, oom};

impl Sandboxes {
    /// Watches sandbox process `pid` of `c` (and its memory cgroup, for TaskOOM).
    pub(super) fn watch_init(&self, c: &Arc<Container>, pid: i32, not_before: Instant) {
        let events = self.inner.events.clone();
        let id = c.id.clone();
        let oom = oom::watch(pid, move || {
            log::warn!("container {id} hit its memory limit");
            let mut ev = TaskOOM::new();
            ev.container_id = id.clone();
            events.publish(topics::TASK_OOM_EVENT_TOPIC, ev);
        })
        .inspect_err(|e| log::warn!("no OOM events for {}: {e}", c.id))
        .ok();
        let exits = c.runtime.watch_exit(pid, not_before);
        let this = self.clone();
        let id = c.id.clone();
        std::thread::spawn(move || {
            let status = exits.recv();
            // The watch is of this sandbox process: it ends with it.
            if let Some(w) = oom {
                w.stop();
            }
            if let Ok(status) = status {
                this.sandbox_exited(&id, pid as u32, status);
            }
        });
    }

    /// A sandbox process ended: the init's exit, unless a restore already replaced that
    /// sandbox (a checkpoint that leaves the source running on an older runsc), or kept for
    /// the end of the long work going on (see [`Sandboxes::finish_busy`]).
    fn sandbox_exited(&self, id: &str, pid: u32, status: i32) {
        let Ok(c) = self.container(id) else { return };
        // A sandbox whose memory never arrived: why is on its record before its exit is
        // told (runsc ends it on the failed read, before the restore's own watch sees it).
        let arrivals = c.restore_from.as_ref().and_then(|f| f.arrivals.as_ref());
        let mut status = status;
        if let Some(why) = arrivals.and_then(|a| a.failure()) {
            if let Err(e) = self
                .records()
                .set_label(id, chalk_labels::ENDED_BECAUSE, &why)
            {
                log::warn!("container {id}: why it ended was not recorded: {e}");
            }
            // Ended for its memory, whoever ended it first: runsc on its failed read (its
            // own exit code, which depends on where the read was) or the shim's SIGKILL once
            // the restore's watch saw the failure. Told as the kill, one answer every time.
            if status != 137 {
                log::info!("container {id}: its sandbox exited with {status} once its memory failed: told as killed (137)");
                status = 137;
            }
        }
        self.drain_outputs(&c, "", Some(pid));
        let mut st = c.state.lock().unwrap();
        if st.init.pid != pid {
            log::info!("container {id}: replaced sandbox {pid} exited with {status}");
            return;
        }
        if st.init.busy.is_some() {
            st.init.pending_exit = Some((pid, status));
            return;
        }
        super::network::give_back_addresses(&c);
        self.record_exit(id, &mut st.init, status);
    }

    /// Process `exec_id` (the init when empty) of container `id` ended with `status`.
    pub(super) fn process_exited(&self, id: &str, exec_id: &str, status: i32) {
        let Ok(c) = self.container(id) else { return };
        self.drain_outputs(&c, exec_id, None);
        let mut st = c.state.lock().unwrap();
        if exec_id.is_empty() && st.init.busy.is_some() {
            st.init.pending_exit = Some((st.init.pid, status));
            return;
        }
        if let Some(p) = st.process_mut(exec_id) {
            self.record_exit(id, p, status);
        }
    }

    /// Before the exit of process `exec_id` of `c` (the init's sandbox `pid`, where given) is
    /// reported: waits, with no lock held and within bounds, for a client reading its output
    /// fifos to have read what it left there. containerd's client drops what it has not read
    /// once Wait returns (`ctr run`: task.Delete closes its fifos, io.Cancel, before io.Wait),
    /// so the exit must not come first. Not for an init that is busy (its exit waits) or whose
    /// sandbox was replaced: its fifos are the successor's.
    fn drain_outputs(&self, c: &Container, exec_id: &str, pid: Option<u32>) {
        let drain = {
            let mut st = c.state.lock().unwrap();
            match st.process_mut(exec_id) {
                Some(p)
                    if p.status != Status::Stopped
                        && p.busy.is_none()
                        && pid.is_none_or(|pid| p.pid == pid) =>
                {
                    p.io.start_drain()
                }
                _ => None,
            }
        };
        if let Some(drain) = drain {
            ProcessIo::wait_drained(drain);
        }
    }

    /// Marks `p` stopped with `status` and tells containerd, once; the shim lets go of its
    /// output fifos (see `ProcessIo::release_outputs`).
    pub(super) fn record_exit(&self, id: &str, p: &mut Process, status: i32) {
        if p.status == Status::Stopped {
            return;
        }
        p.status = Status::Stopped;
        // Its output fifos' client may not have opened them yet: it gets all of the output.
        p.io.release_outputs();
        let info = ExitInfo {
            status: status as u32,
            at: SystemTime::now(),
        };
        log::info!(
            "container {id} process {:?} exited with {status}",
            p.exec_id
        );
        let mut ev = TaskExit::new();
        ev.container_id = id.to_string();
        ev.id = if p.exec_id.is_empty() {
            id.to_string()
        } else {
            p.exec_id.clone()
        };
        ev.pid = p.pid;
        ev.exit_status = info.status;
        ev.exited_at = Some(timestamp(info.at)).into();
        self.events().publish(topics::TASK_EXIT_EVENT_TOPIC, ev);
        p.exit.set(info);
        if p.exec_id.is_empty() {
            // Its sandbox is gone: so are its address and published ports (off this
            // thread, which holds the container's state).
            let this = self.clone();
            let id = id.to_string();
            std::thread::spawn(move || {
                if let Ok(c) = this.container(&id) {
                    super::network::release(&c);
                }
            });
        }
    }

    /// Ends the long work on `c`'s init: an exit that came meanwhile is reported now (after
    /// whatever the work reported), unless its sandbox was replaced.
    pub(super) fn finish_busy(&self, c: &Container, st: &mut ContainerState) {
        st.init.busy = None;
        if let Some((pid, status)) = st.init.pending_exit.take() {
            if pid == st.init.pid {
                self.record_exit(&c.id, &mut st.init, status);
            } else {
                log::info!(
                    "container {}: replaced sandbox {pid} exited with {status}",
                    c.id
                );
            }
        }
        c.idle.notify_all();
    }
}
