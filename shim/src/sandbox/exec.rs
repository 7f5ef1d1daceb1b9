//! Exec: a process added to a running sandbox (`runsc exec` in the foreground, whose exit is
//! the process's), with its own stdio or terminal.

use chalk_runtime::bundle;
use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use chalk_runtime::{
    ids,
    runsc::{ExecChild, ProcessStdio},
    state::{self, Event as Transition, Status},
};
use containerd_shim::protos::{
    events::task::{TaskExecAdded, TaskExecStarted},
    topics,
};

use super::Sandboxes;
use crate::container::{Container, ExitInfo, Process, LOST};
use crate::{
    errors::{Result, ShimError},
    io::{self, StdioPaths},
};

/// How long runsc may take to start an exec'd process.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// What containerd's Exec asks for.
pub struct ExecRequest {
    pub id: String,
    pub exec_id: String,
    pub stdio: StdioPaths,
    /// The process spec (OCI `process` JSON).
    pub spec: Vec<u8>,
}

impl Sandboxes {
    pub fn exec(&self, req: ExecRequest) -> Result<()> {
        ids::exec_id(&req.exec_id)?;
        let c = self.container(&req.id)?;
        let mut st = c.state.lock().unwrap();
        if st.init.status == Status::Stopped {
            return Err(ShimError::FailedPrecondition(format!(
                "container {} is stopped: cannot exec in it",
                req.id
            )));
        }
        if st.execs.contains_key(&req.exec_id) {
            return Err(ShimError::AlreadyExists(format!(
                "exec {} already exists in container {}",
                req.exec_id, req.id
            )));
        }
        let bad = |why: String| {
            ShimError::InvalidArgument(format!("exec {} process spec {why}", req.exec_id))
        };
        let parsed: serde_json::Value =
            serde_json::from_slice(&req.spec).map_err(|e| bad(format!(": {e}")))?;
        if !parsed.is_object() {
            return Err(bad("is not a JSON object".into()));
        }
        let mut adapted = parsed.clone();
        bundle::adapt_process(&mut adapted, req.stdio.terminal);
        let spec = if adapted != parsed {
            serde_json::to_vec(&adapted).map_err(|e| ShimError::failed("encode exec spec", e))?
        } else {
            req.spec.clone()
        };
        bundle::write_private(&c.exec_spec_path(&req.exec_id), &spec)?;
        st.execs.insert(
            req.exec_id.clone(),
            Process::new(&req.exec_id, req.stdio.clone()),
        );
        let mut ev = TaskExecAdded::new();
        ev.container_id = req.id.clone();
        ev.exec_id = req.exec_id.clone();
        self.events()
            .publish(topics::TASK_EXEC_ADDED_EVENT_TOPIC, ev);
        Ok(())
    }

    pub(super) fn start_exec(&self, c: &Arc<Container>, exec_id: &str) -> Result<u32> {
        let mut st = c.state.lock().unwrap();
        if st.init.status != Status::Running {
            return Err(ShimError::FailedPrecondition(format!(
                "container {} is {}: exec needs it running",
                c.id, st.init.status
            )));
        }
        let p = st
            .execs
            .get_mut(exec_id)
            .ok_or_else(|| ShimError::no_exec(&c.id, exec_id))?;
        let next = state::transition(exec_id, p.status, Transition::Start)?;
        let (child, pid) = match self.launch_exec(c, p) {
            Ok(started) => started,
            Err(e) => {
                // Never started: release any Wait on it, as the runc shim does, and its
                // output fifos' client.
                p.io.release_outputs();
                p.status = Status::Stopped;
                p.exit.set(ExitInfo {
                    status: LOST,
                    at: SystemTime::now(),
                });
                return Err(e);
            }
        };
        p.status = next;
        p.pid = pid as u32;
        let this = self.clone();
        let (id, eid) = (c.id.clone(), exec_id.to_string());
        std::thread::spawn(move || {
            let status = child.wait().unwrap_or_else(|e| {
                log::error!("lost the exit status of exec {eid} in {id}: {e}");
                LOST as i32
            });
            this.process_exited(&id, &eid, status);
        });
        let mut ev = TaskExecStarted::new();
        ev.container_id = c.id.clone();
        ev.exec_id = exec_id.to_string();
        ev.pid = pid as u32;
        self.events()
            .publish(topics::TASK_EXEC_STARTED_EVENT_TOPIC, ev);
        Ok(pid as u32)
    }

    /// Runs `runsc exec` for `p` and waits until the process is running in the sandbox;
    /// returns the foreground runsc (whose exit is the process's) and the in-sandbox pid.
    fn launch_exec(&self, c: &Container, p: &mut Process) -> Result<(ExecChild, i32)> {
        let exec_id = p.exec_id.clone();
        let spec_path = c.exec_spec_path(&exec_id);
        let (runtime_stdio, master) = if p.stdio.terminal {
            let pty_err = |e| ShimError::failed(format!("terminal for exec {exec_id}"), e);
            let (master, slave) = io::open_pty().map_err(pty_err)?;
            let spec = std::fs::read(&spec_path)
                .ok()
                .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok());
            if let Some((w, h)) = p.size.or_else(|| spec.as_ref().and_then(io::console_size)) {
                let _ = io::set_size(&master, w, h);
            }
            (
                ProcessStdio::terminal(slave).map_err(pty_err)?,
                Some(master),
            )
        } else {
            let (s, pio) =
                io::open_plain(&p.stdio, &self.log_context(&c.id), None).map_err(|e| {
                    ShimError::InvalidArgument(format!("open stdio of exec {exec_id}: {e}"))
                })?;
            p.io = pio;
            (s, None)
        };
        let started = crate::sandbox_exec::start(
            c,
            &exec_id,
            &spec_path,
            &c.exec_pid_path(&exec_id),
            runtime_stdio,
            START_TIMEOUT,
        )?;
        if let Some(master) = master {
            // Only opening containerd's fifos can fail here; the process then still runs and
            // its exit is watched like any other.
            match io::attach_console(&p.stdio, master, &self.log_context(&c.id), None) {
                Ok(pio) => p.io = pio,
                Err(e) => log::error!("exec {exec_id} in {}: terminal not attached: {e}", c.id),
            }
        }
        Ok(started)
    }
}
