//! One sandbox as the server keeps it: its state, the operation under way, its terminal
//! and the screen so far, and the channel that tells every page about them.

use std::{
    sync::{Arc, Mutex},
    time::Instant,
};

use serde_json::{json, Value};
use tokio::{net::unix::pipe, sync::broadcast, task::JoinHandle};

use super::error::{ApiError, ApiResult};
use crate::{
    procs,
    replay::Replay,
    terminal::{self, Ends, Fifos},
};

const REPLAY_BYTES: usize = 256 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Starting,
    Running,
    Suspended,
    Exited,
}

impl State {
    fn as_str(self) -> &'static str {
        match self {
            State::Starting => "starting",
            State::Running => "running",
            State::Suspended => "suspended",
            State::Exited => "exited",
        }
    }
}

/// What the terminal's websocket forwards: bytes the sandbox printed, or a state change.
#[derive(Clone)]
pub enum Out {
    Bytes(Arc<[u8]>),
    Event(String),
}

/// A running task's terminal: its fifos and the pump reading them.
pub(super) struct Attached {
    _fifos: Fifos,
    input: Arc<pipe::Sender>,
    pump: JoinHandle<()>,
}

impl Drop for Attached {
    fn drop(&mut self) {
        self.pump.abort();
    }
}

/// What changes about a sandbox, under its entry's lock.
pub(super) struct Inner {
    pub(super) state: State,
    /// The operation under way (`splitting`, `suspending`, `resuming`, `closing`).
    pub(super) busy: Option<&'static str>,
    /// Counts the sandbox's tasks: an exit seen by a watcher of an older task is not this one's.
    pub(super) task: u64,
    pub(super) pid: u32,
    pub(super) exit_code: Option<u32>,
    pub(super) exited_at: Option<Instant>,
    pub(super) size: (u32, u32),
    pub(super) replay: Replay,
    pub(super) attached: Option<Attached>,
    pub(super) expires_at: Option<String>,
    /// The suspend snapshot's id, and since when.
    pub(super) suspended: Option<(String, Instant)>,
    pub(super) split: Option<Value>,
    pub(super) suspend: Option<Value>,
    pub(super) resume: Option<Value>,
}

pub struct Entry {
    pub id: String,
    pub owner: String,
    pub parent: Option<String>,
    tx: broadcast::Sender<Out>,
    inner: Mutex<Inner>,
}

impl Entry {
    pub(super) fn new(
        id: String,
        owner: &str,
        parent: Option<String>,
        size: (u32, u32),
    ) -> Arc<Self> {
        Arc::new(Entry {
            id,
            owner: owner.to_string(),
            parent,
            tx: broadcast::channel(1024).0,
            inner: Mutex::new(Inner {
                state: State::Starting,
                busy: None,
                task: 0,
                pid: 0,
                exit_code: None,
                exited_at: None,
                size,
                replay: Replay::new(REPLAY_BYTES),
                attached: None,
                expires_at: None,
                suspended: None,
                split: None,
                suspend: None,
                resume: None,
            }),
        })
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What the page shows of the sandbox.
    pub fn view(&self) -> Value {
        let i = self.lock();
        json!({
            "id": self.id,
            "parent": self.parent,
            "state": i.state.as_str(),
            "busy": i.busy,
            "pid": i.pid,
            "exit_code": i.exit_code,
            "expires_at": i.expires_at,
            "cols": i.size.0,
            "rows": i.size.1,
            "split": i.split,
            "suspend": i.suspend,
            "resume": i.resume,
            "processes": procs::runsc_processes(&self.id),
        })
    }

    pub(super) fn announce(&self) {
        let event = json!({"type": "state", "sandbox": self.view()}).to_string();
        let _ = self.tx.send(Out::Event(event));
    }

    /// The screen so far and what comes after it, with nothing lost or repeated between.
    pub fn subscribe(&self) -> (Vec<u8>, broadcast::Receiver<Out>) {
        let i = self.lock();
        (i.replay.contents(), self.tx.subscribe())
    }

    pub fn input(&self) -> Option<Arc<pipe::Sender>> {
        self.lock().attached.as_ref().map(|a| a.input.clone())
    }

    pub fn set_size(&self, cols: u32, rows: u32) -> bool {
        let mut i = self.lock();
        i.size = (cols, rows);
        i.state == State::Running
    }

    pub(super) fn output(&self, bytes: &[u8]) {
        self.lock().replay.push(bytes);
        let _ = self.tx.send(Out::Bytes(bytes.into()));
    }

    /// Marks an operation under way, refused unless the sandbox is in state `want`.
    pub(super) fn begin(&self, what: &'static str, want: State) -> ApiResult<()> {
        let mut i = self.lock();
        if let Some(busy) = i.busy {
            return Err(ApiError::new(
                409,
                format!("sandbox {} is {busy}: wait for that to finish", self.id),
            ));
        }
        if i.state != want {
            return Err(ApiError::new(
                409,
                format!(
                    "sandbox {} is {}, and only a {} one can be {what}",
                    self.id,
                    i.state.as_str(),
                    want.as_str()
                ),
            ));
        }
        i.busy = Some(what);
        Ok(())
    }

    pub(super) fn end(&self) {
        self.lock().busy = None;
        self.announce();
    }

    /// Connects a started task: its output pumped into the replay and to every page.
    pub(super) fn attach(self: &Arc<Self>, ends: Ends, pid: u32) -> u64 {
        let me = self.clone();
        let pump = tokio::spawn(terminal::pump(ends.output, move |b| me.output(b)));
        let mut i = self.lock();
        i.task += 1;
        i.pid = pid;
        i.state = State::Running;
        i.suspended = None;
        i.attached = Some(Attached {
            _fifos: ends.fifos,
            input: ends.input,
            pump,
        });
        i.task
    }
}
