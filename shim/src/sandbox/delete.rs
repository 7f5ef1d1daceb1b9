//! Delete of a process (an exec, or the init with its sandbox and everything the shim made
//! for it), and Shutdown.

use std::time::{Duration, SystemTime};

use chalk_runtime::state::{self, Status};
use containerd_shim::protos::{events::task::TaskDelete, topics};

use super::Sandboxes;
use crate::container::{ExitInfo, KILLED, LOST};
use crate::{
    errors::{Result, ShimError},
    events::timestamp,
    rootfs,
};

impl Sandboxes {
    /// Deletes process `exec_id` (the init when empty) of `id`: its pid and how it ended.
    pub fn delete(&self, id: &str, exec_id: &str) -> Result<(u32, ExitInfo)> {
        let c = self.container(id)?;
        if !exec_id.is_empty() {
            let mut st = c.state.lock().unwrap();
            let p = st
                .execs
                .get(exec_id)
                .ok_or_else(|| ShimError::no_exec(id, exec_id))?;
            state::check_deletable(exec_id, p.status)?;
            let p = st.execs.remove(exec_id).expect("checked above");
            // A Wait on an exec that never started must not outlive it; like runc's shim, a
            // never-started exec reads exit status 0.
            let exit = p.exit.set(ExitInfo {
                status: 0,
                at: SystemTime::now(),
            });
            let _ = std::fs::remove_file(c.exec_spec_path(exec_id));
            let _ = std::fs::remove_file(c.exec_pid_path(exec_id));
            return Ok((p.pid, exit));
        }

        let (pid, cell, status) = {
            let st = c.state.lock().unwrap();
            let st = c.wait_idle(st);
            state::check_deletable(id, st.init.status)?;
            (st.init.pid, st.init.exit.clone(), st.init.status)
        };
        let killed = || ExitInfo {
            status: KILLED,
            at: SystemTime::now(),
        };
        if c.skipped {
            // runsc never knew it (see `pod::skip_in_pod`); a skipped container never started
            // reads as killed, as any pod container that never started does.
            if status == Status::Created {
                cell.set(killed());
            }
        } else if pid > 0 {
            match c.runtime.delete(id, true) {
                Ok(()) => {}
                // A stopped pod container whose sandbox is gone has nothing left to delete.
                Err(e) if c.in_pod() && cell.get().is_some() && !self.sandbox_runs(&c) => {
                    log::warn!("container {id}: {e}; its sandbox is gone with it")
                }
                Err(e) => return Err(e.into()),
            }
            if c.in_pod() && status == Status::Created {
                // Never started: no watcher will report an exit (its pid is the sandbox's).
                cell.set(killed());
            }
        } else {
            // A restore that never started has no sandbox and no exit to wait for.
            cell.set(killed());
        }
        // A stopped init has its exit already. A created one was just killed by the forced
        // delete: report that exit as reaped, and SIGKILL's status only if it never arrives.
        let exit = cell
            .wait_timeout(Duration::from_secs(5))
            .unwrap_or_else(|| cell.set(killed()));
        {
            // Nothing may wait forever on a process of a deleted container.
            let mut st = c.state.lock().unwrap();
            st.init.status = Status::Stopped;
            for p in st.execs.values_mut() {
                p.status = Status::Stopped;
                p.exit.set(ExitInfo {
                    status: LOST,
                    at: SystemTime::now(),
                });
            }
        }
        let cleaning = std::time::Instant::now();
        super::network::release(&c);
        rootfs::cleanup(&c.bundle, c.rootfs_mounted, c.netns.as_deref());
        log::debug!("container {id}: cleaned up in {:?}", cleaning.elapsed());
        let _ = std::fs::remove_file(c.init_pid_path());
        self.inner.containers.lock().unwrap().remove(id);
        // A pod gone takes its hold with it (what it held ended with it).
        self.inner.holds.release(id);

        let mut ev = TaskDelete::new();
        ev.container_id = id.to_string();
        ev.id = id.to_string();
        ev.pid = pid;
        ev.exit_status = exit.status;
        ev.exited_at = Some(timestamp(exit.at)).into();
        self.events().publish(topics::TASK_DELETE_EVENT_TOPIC, ev);
        Ok((pid, exit))
    }

    /// The shim goes once it has no container left.
    pub fn shutdown(&self) {
        if self.inner.containers.lock().unwrap().is_empty() {
            self.events().flush(Duration::from_secs(5));
            self.inner.exit.signal();
        }
    }
}
