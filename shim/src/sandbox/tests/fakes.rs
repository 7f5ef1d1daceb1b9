//! The fakes the Task-level tests run on: runsc's sandboxes in memory, containerd's records,
//! an event sink that records, and a `World` that holds them with a `Sandboxes` over them.

pub(super) use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicI32, Ordering},
        mpsc::{channel, Receiver, Sender},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

pub(super) use chalk_hooks::{HookSpec, Place, Stage};
pub(super) use chalk_runtime::{
    options::RuntimeOptions,
    runsc::{
        Child, ExecChild, Features, GlobalArgs, MemoryLoad, ProcessStdio, SandboxRuntime, State,
    },
    snapshot::manifest::ImageRef,
    state::Status,
    stats::StatsEvent,
};
pub(super) use containerd_shim::{protos::protobuf::MessageDyn, ExitSignal};

pub(super) use crate::container::KILLED;
pub(super) use crate::sandbox::{CreateRequest, ExecRequest, Sandboxes};
pub(super) use crate::{
    containerd::Records,
    errors::{Result, ShimError},
    events::EventSink,
    io::StdioPaths,
    runtime_options::CheckpointRequest,
    runtimes::RuntimeFactory,
};

/// Pids above Linux's largest: signalling one reaches no process.
pub(super) static NEXT_PID: AtomicI32 = AtomicI32::new(5_000_000);

#[derive(Default)]
pub(super) struct FakeState {
    /// Sandbox (or pod container) ids, with the pid of their sandbox process.
    pub(super) made: HashMap<String, i32>,
    pub(super) paused: Vec<String>,
    /// Who is told when a sandbox process ends.
    pub(super) watchers: HashMap<i32, Sender<i32>>,
    /// Exits that came before anyone watched.
    pub(super) ended: HashMap<i32, i32>,
    /// Pod containers' `runsc wait`.
    pub(super) waiters: HashMap<String, Sender<i32>>,
    /// Pod containers started, and how those that ended before a wait ended.
    pub(super) members: HashMap<String, Option<i32>>,
    pub(super) calls: Vec<String>,
}

/// runsc, faked: what it was asked, and knobs for what goes wrong.
pub(super) struct FakeRuntime {
    pub(super) global: GlobalArgs,
    pub(super) state: Mutex<FakeState>,
    /// `checkpoint` fails (after writing half a file).
    pub(super) fail_checkpoint: bool,
    /// `kill` finds the process gone: its exit is on the way, and runsc errs.
    pub(super) kill_races_exit: bool,
    /// How long an exec'd process (a hook, cuda-checkpoint) runs.
    pub(super) exec_takes: Duration,
}

impl FakeRuntime {
    pub(super) fn new(root: &Path) -> Self {
        FakeRuntime {
            global: GlobalArgs {
                root: root.to_path_buf(),
                flags: vec!["--platform=ptrace".into(), "--network=none".into()],
            },
            state: Default::default(),
            fail_checkpoint: false,
            kill_races_exit: false,
            exec_takes: Duration::from_millis(10),
        }
    }

    pub(super) fn call(&self, what: String) {
        self.state.lock().unwrap().calls.push(what);
    }

    /// Sandbox `id`'s process ends with `status`.
    pub(super) fn end(&self, id: &str, status: i32) {
        let mut st = self.state.lock().unwrap();
        if let Some(tx) = st.waiters.remove(id) {
            let _ = tx.send(status);
            return;
        }
        if let Some(ended) = st.members.get_mut(id) {
            *ended = Some(status);
            return;
        }
        let Some(pid) = st.made.get(id).copied() else {
            return;
        };
        match st.watchers.remove(&pid) {
            Some(tx) => {
                let _ = tx.send(status);
            }
            None => {
                st.ended.insert(pid, status);
            }
        }
    }

    pub(super) fn make(&self, id: &str, pid_file: &Path) -> chalk_runtime::Result<()> {
        let pid = NEXT_PID.fetch_add(1, Ordering::SeqCst);
        std::fs::write(pid_file, pid.to_string()).unwrap();
        self.state.lock().unwrap().made.insert(id.to_string(), pid);
        Ok(())
    }

    pub(super) fn failed(op: &'static str, id: &str, message: &str) -> chalk_runtime::Error {
        chalk_runtime::Error::Runsc {
            op,
            id: id.to_string(),
            status: 1,
            message: message.to_string(),
        }
    }
}

/// An exec'd process that ends with 0 after a while.
pub(super) struct FakeChild {
    pub(super) until: Instant,
}

impl Child for FakeChild {
    fn pid(&self) -> u32 {
        NEXT_PID.fetch_add(1, Ordering::SeqCst) as u32
    }
    fn take_stdout(&mut self) -> Option<std::process::ChildStdout> {
        None
    }
    fn try_wait(&mut self) -> std::io::Result<Option<i32>> {
        Ok((Instant::now() >= self.until).then_some(0))
    }
    fn wait(self: Box<Self>) -> std::io::Result<i32> {
        std::thread::sleep(self.until.saturating_duration_since(Instant::now()));
        Ok(0)
    }
}

impl SandboxRuntime for FakeRuntime {
    fn global(&self) -> &GlobalArgs {
        &self.global
    }
    fn binary(&self) -> &Path {
        Path::new("/fake/runsc")
    }
    fn create(
        &self,
        id: &str,
        _: &Path,
        pid_file: &Path,
        _: ProcessStdio,
        _: Option<&Path>,
    ) -> chalk_runtime::Result<()> {
        self.call(format!("create {id}"));
        self.make(id, pid_file)
    }
    fn restore(
        &self,
        id: &str,
        _: &Path,
        image: &Path,
        pid_file: &Path,
        _: ProcessStdio,
        _: Option<&Path>,
        memory: MemoryLoad,
    ) -> chalk_runtime::Result<()> {
        let lazy = if memory.background { " background" } else { "" };
        let shared = if memory.share_pages {
            " share-pages"
        } else {
            ""
        };
        self.call(format!("restore {id} {}{lazy}{shared}", image.display()));
        self.make(id, pid_file)
    }
    fn wait_restored(&self, id: &str) -> chalk_runtime::Result<()> {
        self.call(format!("wait-restored {id}"));
        Ok(())
    }
    fn start(&self, id: &str) -> chalk_runtime::Result<()> {
        self.call(format!("start {id}"));
        Ok(())
    }
    fn start_with_stdio(&self, id: &str, _: ProcessStdio) -> chalk_runtime::Result<()> {
        self.call(format!("start {id}"));
        self.state
            .lock()
            .unwrap()
            .members
            .insert(id.to_string(), None);
        Ok(())
    }
    fn wait(&self, id: &str) -> chalk_runtime::Result<i32> {
        let (tx, rx) = channel();
        {
            let mut st = self.state.lock().unwrap();
            if let Some(Some(status)) = st.members.get(id) {
                return Ok(*status);
            }
            st.waiters.insert(id.to_string(), tx);
        }
        rx.recv()
            .map_err(|_| Self::failed("wait", id, "container is gone"))
    }
    fn state(&self, id: &str) -> chalk_runtime::Result<State> {
        let st = self.state.lock().unwrap();
        let pid = *st
            .made
            .get(id)
            .ok_or_else(|| Self::failed("state", id, "container does not exist"))?;
        let status = if st.paused.iter().any(|p| p == id) {
            "paused"
        } else {
            "running"
        };
        Ok(State {
            id: id.to_string(),
            status: status.into(),
            pid,
        })
    }
    fn kill(
        &self,
        id: &str,
        signal: u32,
        all: bool,
        pid: Option<i32>,
    ) -> chalk_runtime::Result<()> {
        self.call(format!("kill {id} {signal} all={all} pid={pid:?}"));
        if pid.is_some() {
            return Ok(());
        }
        self.end(id, 128 + signal as i32);
        if self.kill_races_exit {
            self.state.lock().unwrap().made.remove(id);
            return Err(Self::failed("kill", id, "process already exited"));
        }
        Ok(())
    }
    fn kill_group(&self, id: &str, signal: u32, pgid: i32) -> chalk_runtime::Result<()> {
        self.call(format!("kill {id} {signal} pgid={pgid}"));
        Ok(())
    }
    fn delete(&self, id: &str, _force: bool) -> chalk_runtime::Result<()> {
        self.call(format!("delete {id}"));
        self.end(id, KILLED as i32);
        self.state.lock().unwrap().made.remove(id);
        Ok(())
    }
    fn update(&self, id: &str, _: &Path) -> chalk_runtime::Result<()> {
        self.call(format!("update {id}"));
        Ok(())
    }
    fn pause(&self, id: &str) -> chalk_runtime::Result<()> {
        self.call(format!("pause {id}"));
        self.state.lock().unwrap().paused.push(id.to_string());
        Ok(())
    }
    fn resume(&self, id: &str) -> chalk_runtime::Result<()> {
        self.call(format!("resume {id}"));
        self.state.lock().unwrap().paused.retain(|p| p != id);
        Ok(())
    }
    fn ps(&self, _: &str) -> chalk_runtime::Result<Vec<i32>> {
        Ok(vec![1])
    }
    fn ps_table(&self, _: &str) -> chalk_runtime::Result<String> {
        Ok("UID PID PPID PGID C TTY STIME TIME CMD\n0 1 0 1 0 ? 10:00 0s sh\n".into())
    }
    fn stats(&self, id: &str) -> chalk_runtime::Result<StatsEvent> {
        let mut ev = StatsEvent {
            id: id.to_string(),
            ..Default::default()
        };
        ev.data.memory.usage.usage = 1 << 20;
        Ok(ev)
    }
    fn exec(
        &self,
        id: &str,
        _: &Path,
        pid_file: &Path,
        _: ProcessStdio,
    ) -> chalk_runtime::Result<ExecChild> {
        self.call(format!("exec {id}"));
        std::fs::write(pid_file, "7").unwrap();
        Ok(ExecChild::from_child(Box::new(FakeChild {
            until: Instant::now() + self.exec_takes,
        })))
    }
    fn checkpoint(
        &self,
        id: &str,
        dir: &Path,
        leave_running: bool,
        _: &[String],
    ) -> chalk_runtime::Result<()> {
        self.call(format!("checkpoint {id} leave_running={leave_running}"));
        std::fs::write(dir.join("checkpoint.img"), b"the sandbox's memory").unwrap();
        if self.fail_checkpoint {
            return Err(Self::failed("checkpoint", id, "no space left on device"));
        }
        if !leave_running {
            self.end(id, 0);
        }
        Ok(())
    }
    fn watch_exit(&self, pid: i32, _: Instant) -> Receiver<i32> {
        let (tx, rx) = channel();
        let mut st = self.state.lock().unwrap();
        match st.ended.remove(&pid) {
            Some(status) => {
                let _ = tx.send(status);
            }
            None => {
                st.watchers.insert(pid, tx);
            }
        }
        rx
    }
}

pub(super) struct FakeRuntimes(pub(super) Arc<FakeRuntime>);

/// A runsc that resumes in place after a checkpoint (its checkpoint has the flag only such
/// builds have).
pub(super) fn features() -> Features {
    Features::from_outputs("runsc version fake", "")
        .with_checkpoint_help("  -leave-running\n  -save-restore-exec-argv string\n")
}

impl RuntimeFactory for FakeRuntimes {
    fn runtime_for(
        &self,
        _: &RuntimeOptions,
        _: &str,
        _: &Path,
        _: &str,
        _: &str,
        _: bool,
    ) -> Result<(Arc<dyn SandboxRuntime>, Features)> {
        Ok((self.0.clone(), features()))
    }
}

pub(super) struct FakeRecords;

impl Records for FakeRecords {
    fn image_of(&self, _: &str) -> Result<Option<ImageRef>> {
        Ok(Some(ImageRef {
            name: "docker.io/library/busybox:latest".into(),
            digest: format!("sha256:{}", "ab".repeat(32)),
        }))
    }
    fn set_label(&self, _: &str, _: &str, _: &str) -> Result<()> {
        Ok(())
    }
    fn label(&self, _: &str, _: &str) -> Result<Option<String>> {
        Ok(None)
    }
    fn snapshot_facts(&self, _: &str) -> Result<crate::containerd::SnapshotFacts> {
        Ok(crate::containerd::SnapshotFacts {
            spec: br#"{"process":{"args":["sh"]}}"#.to_vec(),
            spec_type: "types.containerd.io/opencontainers/runtime-spec/1/Spec".into(),
            base: None,
            snapshotter: "overlayfs".into(),
        })
    }
}

#[derive(Default)]
pub(super) struct Recorded(pub(super) Mutex<Vec<&'static str>>);

impl EventSink for Recorded {
    fn send(&self, topic: &'static str, _: Box<dyn MessageDyn>) {
        self.0.lock().unwrap().push(topic);
    }
    fn flush(&self, _: Duration) {}
}

impl Recorded {
    pub(super) fn topics(&self) -> Vec<&'static str> {
        self.0.lock().unwrap().clone()
    }
}

pub(super) struct World {
    pub(super) dir: tempfile::TempDir,
    pub(super) runtime: Arc<FakeRuntime>,
    pub(super) events: Arc<Recorded>,
    pub(super) shim: Sandboxes,
}

pub(super) fn world_with(configure: impl FnOnce(&mut FakeRuntime)) -> World {
    let dir = tempfile::tempdir().unwrap();
    let mut runtime = FakeRuntime::new(&dir.path().join("runsc"));
    configure(&mut runtime);
    let runtime = Arc::new(runtime);
    let events = Arc::new(Recorded::default());
    let shim = Sandboxes::new(
        "default",
        "",
        Arc::new(FakeRuntimes(runtime.clone())),
        Arc::new(FakeRecords),
        events.clone(),
        Arc::new(ExitSignal::default()),
        Default::default(),
    );
    World {
        dir,
        runtime,
        events,
        shim,
    }
}

pub(super) fn world() -> World {
    world_with(|_| {})
}

impl World {
    /// A bundle for `id` with `annotations` in its spec.
    pub(super) fn bundle(&self, id: &str, annotations: serde_json::Value) -> PathBuf {
        let b = self.dir.path().join("bundles").join(id);
        std::fs::create_dir_all(&b).unwrap();
        let spec = serde_json::json!({
            "ociVersion": "1.0.2",
            "root": {"path": "rootfs"},
            "process": {"args": ["/bin/sh"], "cwd": "/", "user": {"uid": 0, "gid": 0}},
            "annotations": annotations,
        });
        std::fs::write(b.join("config.json"), spec.to_string()).unwrap();
        b
    }

    pub(super) fn options(&self, hooks: Vec<HookSpec>) -> RuntimeOptions {
        RuntimeOptions {
            root: self.dir.path().join("chalk"),
            hooks,
            ..Default::default()
        }
    }

    pub(super) fn create_with(
        &self,
        id: &str,
        annotations: serde_json::Value,
        checkpoint: &str,
        hooks: Vec<HookSpec>,
    ) -> Result<u32> {
        self.shim.create(CreateRequest {
            id: id.to_string(),
            bundle: self.bundle(id, annotations),
            rootfs: Vec::new(),
            stdio: StdioPaths::default(),
            checkpoint: checkpoint.to_string(),
            options: Ok(self.options(hooks)),
        })
    }

    pub(super) fn create(&self, id: &str) -> Result<u32> {
        self.create_with(id, serde_json::json!({}), "", Vec::new())
    }

    pub(super) fn status(&self, id: &str) -> Status {
        self.shim.state(id, "").unwrap().status
    }
}

/// Waits for `topic` to have been published `n` times.
pub(super) fn wait_for_events(events: &Recorded, topic: &str, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while events.topics().iter().filter(|t| **t == topic).count() < n {
        assert!(
            Instant::now() < deadline,
            "no {topic} in {:?}",
            events.topics()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

pub(super) const CREATE: &str = "/tasks/create";
pub(super) const START: &str = "/tasks/start";
pub(super) const EXIT: &str = "/tasks/exit";
pub(super) const DELETE: &str = "/tasks/delete";
