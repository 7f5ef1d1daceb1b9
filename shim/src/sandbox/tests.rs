//! The Task layer on fakes: a runtime that keeps its sandboxes in memory (their "processes"
//! are pids no host has), containerd's records and an event sink that records. No
//! containerd, no runsc.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicI32, Ordering},
        mpsc::{channel, Receiver, Sender},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use chalk_hooks::{HookSpec, Place, Stage};
use chalk_runtime::{
    options::RuntimeOptions,
    runsc::{Child, ExecChild, Features, GlobalArgs, ProcessStdio, SandboxRuntime, State},
    snapshot::manifest::ImageRef,
    state::Status,
    stats::StatsEvent,
};
use containerd_shim::{protos::protobuf::MessageDyn, ExitSignal};

use super::{CreateRequest, ExecRequest, Sandboxes};
use crate::container::KILLED;
use crate::{
    containerd::Records,
    errors::{Result, ShimError},
    events::EventSink,
    io::StdioPaths,
    runtime_options::CheckpointRequest,
    runtimes::RuntimeFactory,
};

/// Pids above Linux's largest: signalling one reaches no process.
static NEXT_PID: AtomicI32 = AtomicI32::new(5_000_000);

#[derive(Default)]
struct FakeState {
    /// Sandbox (or pod container) ids, with the pid of their sandbox process.
    made: HashMap<String, i32>,
    paused: Vec<String>,
    /// Who is told when a sandbox process ends.
    watchers: HashMap<i32, Sender<i32>>,
    /// Exits that came before anyone watched.
    ended: HashMap<i32, i32>,
    /// Pod containers' `runsc wait`.
    waiters: HashMap<String, Sender<i32>>,
    /// Pod containers started, and how those that ended before a wait ended.
    members: HashMap<String, Option<i32>>,
    calls: Vec<String>,
}

/// runsc, faked: what it was asked, and knobs for what goes wrong.
struct FakeRuntime {
    global: GlobalArgs,
    state: Mutex<FakeState>,
    /// `checkpoint` fails (after writing half a file).
    fail_checkpoint: bool,
    /// `kill` finds the process gone: its exit is on the way, and runsc errs.
    kill_races_exit: bool,
    /// How long an exec'd process (a hook, cuda-checkpoint) runs.
    exec_takes: Duration,
}

impl FakeRuntime {
    fn new(root: &Path) -> Self {
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

    fn call(&self, what: String) {
        self.state.lock().unwrap().calls.push(what);
    }

    /// Sandbox `id`'s process ends with `status`.
    fn end(&self, id: &str, status: i32) {
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

    fn make(&self, id: &str, pid_file: &Path) -> chalk_runtime::Result<()> {
        let pid = NEXT_PID.fetch_add(1, Ordering::SeqCst);
        std::fs::write(pid_file, pid.to_string()).unwrap();
        self.state.lock().unwrap().made.insert(id.to_string(), pid);
        Ok(())
    }

    fn failed(op: &'static str, id: &str, message: &str) -> chalk_runtime::Error {
        chalk_runtime::Error::Runsc {
            op,
            id: id.to_string(),
            status: 1,
            message: message.to_string(),
        }
    }
}

/// An exec'd process that ends with 0 after a while.
struct FakeChild {
    until: Instant,
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
        background: bool,
    ) -> chalk_runtime::Result<()> {
        let lazy = if background { " background" } else { "" };
        self.call(format!("restore {id} {}{lazy}", image.display()));
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

struct FakeRuntimes(Arc<FakeRuntime>);

/// A runsc that resumes in place after a checkpoint (its checkpoint has the flag only such
/// builds have).
fn features() -> Features {
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
    ) -> Result<(Arc<dyn SandboxRuntime>, Features)> {
        Ok((self.0.clone(), features()))
    }
}

struct FakeRecords;

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
struct Recorded(Mutex<Vec<&'static str>>);

impl EventSink for Recorded {
    fn send(&self, topic: &'static str, _: Box<dyn MessageDyn>) {
        self.0.lock().unwrap().push(topic);
    }
    fn flush(&self, _: Duration) {}
}

impl Recorded {
    fn topics(&self) -> Vec<&'static str> {
        self.0.lock().unwrap().clone()
    }
}

struct World {
    dir: tempfile::TempDir,
    runtime: Arc<FakeRuntime>,
    events: Arc<Recorded>,
    shim: Sandboxes,
}

fn world_with(configure: impl FnOnce(&mut FakeRuntime)) -> World {
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
    );
    World {
        dir,
        runtime,
        events,
        shim,
    }
}

fn world() -> World {
    world_with(|_| {})
}

impl World {
    /// A bundle for `id` with `annotations` in its spec.
    fn bundle(&self, id: &str, annotations: serde_json::Value) -> PathBuf {
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

    fn options(&self, hooks: Vec<HookSpec>) -> RuntimeOptions {
        RuntimeOptions {
            root: self.dir.path().join("chalk"),
            hooks,
            ..Default::default()
        }
    }

    fn create_with(
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

    fn create(&self, id: &str) -> Result<u32> {
        self.create_with(id, serde_json::json!({}), "", Vec::new())
    }

    fn status(&self, id: &str) -> Status {
        self.shim.state(id, "").unwrap().status
    }
}

/// Waits for `topic` to have been published `n` times.
fn wait_for_events(events: &Recorded, topic: &str, n: usize) {
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

const CREATE: &str = "/tasks/create";
const START: &str = "/tasks/start";
const EXIT: &str = "/tasks/exit";
const DELETE: &str = "/tasks/delete";

#[test]
fn a_sandbox_lives_and_ends_with_exact_events_and_statuses() {
    let w = world();
    let pid = w.create("web").unwrap();
    assert!(pid > 0);
    assert_eq!(w.status("web"), Status::Created);
    assert!(matches!(w.create("web"), Err(ShimError::AlreadyExists(_))));
    assert_eq!(w.shim.start("web", "").unwrap(), pid);
    assert_eq!(w.status("web"), Status::Running);
    w.shim.pause("web").unwrap();
    assert_eq!(w.status("web"), Status::Paused);
    w.shim.resume("web").unwrap();

    // An exec runs and ends on its own.
    w.shim
        .exec(ExecRequest {
            id: "web".into(),
            exec_id: "e1".into(),
            stdio: StdioPaths::default(),
            spec: br#"{"args": ["/bin/true"], "cwd": "/"}"#.to_vec(),
        })
        .unwrap();
    w.shim.start("web", "e1").unwrap();
    assert_eq!(w.shim.wait("web", "e1").unwrap().status, 0);
    w.shim.delete("web", "e1").unwrap();

    w.shim.kill("web", "", 9, false).unwrap();
    assert_eq!(w.shim.wait("web", "").unwrap().status, KILLED);
    let (deleted_pid, exit) = w.shim.delete("web", "").unwrap();
    assert_eq!((deleted_pid, exit.status), (pid, KILLED));
    assert!(matches!(
        w.shim.state("web", ""),
        Err(ShimError::NoContainer(_))
    ));
    assert_eq!(
        w.events.topics(),
        [
            CREATE,
            START,
            "/tasks/paused",
            "/tasks/resumed",
            "/tasks/exec-added",
            "/tasks/exec-started",
            EXIT,
            EXIT,
            DELETE
        ]
    );
    assert!(
        !w.dir.path().join("bundles/web/chalk-shim.json").exists(),
        "the record goes"
    );
}

#[test]
fn an_exec_that_never_started_ends_at_delete() {
    let w = world();
    w.create("web").unwrap();
    w.shim.start("web", "").unwrap();
    w.shim
        .exec(ExecRequest {
            id: "web".into(),
            exec_id: "never".into(),
            stdio: StdioPaths::default(),
            spec: br#"{"args": ["/bin/true"], "cwd": "/"}"#.to_vec(),
        })
        .unwrap();
    let shim = w.shim.clone();
    let waiter = std::thread::spawn(move || shim.wait("web", "never").unwrap().status);
    std::thread::sleep(Duration::from_millis(200)); // the Wait is in
    let (_, exit) = w.shim.delete("web", "never").unwrap();
    assert_eq!(
        exit.status, 0,
        "as runc's shim says of an exec never started"
    );
    assert_eq!(waiter.join().unwrap(), 0, "its Wait returns");
    assert!(matches!(
        w.shim.kill("web", "never", 9, false),
        Err(ShimError::NoExec { .. })
    ));
    assert!(matches!(
        w.shim.exec(ExecRequest {
            id: "web".into(),
            exec_id: "../x".into(),
            stdio: StdioPaths::default(),
            spec: b"{}".to_vec(),
        }),
        Err(ShimError::Runtime(_))
    ));
}

#[test]
fn a_pod_containers_delete_leaves_its_pod_running() {
    let w = world();
    let pod = serde_json::json!({
        "io.kubernetes.cri.container-type": "sandbox",
        "io.kubernetes.cri.sandbox-id": "pod1",
    });
    let member = serde_json::json!({
        "io.kubernetes.cri.container-type": "container",
        "io.kubernetes.cri.sandbox-id": "pod1",
    });
    w.create_with("pod1", pod, "", Vec::new()).unwrap();
    assert!(w
        .create_with("early", member.clone(), "", Vec::new())
        .is_ok());
    w.shim.start("pod1", "").unwrap();
    w.shim.start("early", "").unwrap();
    w.shim.kill("early", "", 15, false).unwrap();
    wait_for_events(&w.events, EXIT, 1);
    assert_eq!(w.shim.wait("early", "").unwrap().status, 128 + 15);
    w.shim.delete("early", "").unwrap();
    assert_eq!(w.status("pod1"), Status::Running, "the pod goes on");
    // A pod's container is not checkpointed, paused or restored on its own.
    w.create_with("m2", member.clone(), "", Vec::new()).unwrap();
    assert!(matches!(
        w.shim.pause("m2"),
        Err(ShimError::FailedPrecondition(_))
    ));
    let want = CheckpointRequest::default();
    assert!(matches!(
        w.shim.checkpoint("m2", "/ck", want),
        Err(ShimError::FailedPrecondition(_))
    ));
    // A created member that never started: deleted with a SIGKILL's status, at once.
    let started = Instant::now();
    let (_, exit) = w.shim.delete("m2", "").unwrap();
    assert_eq!(exit.status, KILLED);
    assert!(started.elapsed() < Duration::from_secs(1));
}

#[test]
fn a_kill_that_races_the_exit_reads_finished_and_the_exit_counts_once() {
    let w = world_with(|r| r.kill_races_exit = true);
    w.create("web").unwrap();
    w.shim.start("web", "").unwrap();
    let err = w.shim.kill("web", "", 9, false).unwrap_err();
    assert!(matches!(err, ShimError::Finished { .. }), "{err}");
    assert_eq!(w.shim.wait("web", "").unwrap().status, KILLED);
    assert!(matches!(
        w.shim.kill("web", "", 9, false),
        Err(ShimError::Finished { .. })
    ));
    w.shim.delete("web", "").unwrap();
    let exits = w.events.topics().iter().filter(|t| **t == EXIT).count();
    assert_eq!(exits, 1, "one TaskExit: {:?}", w.events.topics());
}

#[test]
fn a_failing_checkpoint_leaves_the_source_running_and_the_directory_empty() {
    let w = world_with(|r| r.fail_checkpoint = true);
    w.create("web").unwrap();
    w.shim.start("web", "").unwrap();
    let dir = w.dir.path().join("ck");
    let err = w
        .shim
        .checkpoint(
            "web",
            &dir.display().to_string(),
            CheckpointRequest::default(),
        )
        .unwrap_err();
    assert!(err.to_string().contains("no space left on device"), "{err}");
    assert_eq!(w.status("web"), Status::Running);
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        0,
        "nothing left in it"
    );
    assert!(!w.events.topics().contains(&"/tasks/checkpointed"));
    // A non-empty directory is refused before anything is touched.
    std::fs::write(dir.join("mine"), b"x").unwrap();
    let err = w
        .shim
        .checkpoint(
            "web",
            &dir.display().to_string(),
            CheckpointRequest::default(),
        )
        .unwrap_err();
    assert!(err.to_string().contains("not empty"), "{err}");
    let checkpoints = w
        .runtime
        .state
        .lock()
        .unwrap()
        .calls
        .iter()
        .filter(|c| c.starts_with("checkpoint"))
        .count();
    assert_eq!(checkpoints, 1);
}

#[test]
fn state_and_kill_answer_while_a_restore_runs_its_post_restore_hook() {
    let w = world_with(|r| r.exec_takes = Duration::from_millis(1500));
    w.create("src").unwrap();
    w.shim.start("src", "").unwrap();
    let dir = w.dir.path().join("ck");
    w.shim
        .checkpoint(
            "src",
            &dir.display().to_string(),
            CheckpointRequest::default(),
        )
        .unwrap();
    assert!(dir.join("chalk.manifest.json").exists(), "sealed");
    let hook = HookSpec {
        stage: Stage::PostRestore,
        command: vec!["/bin/sleep".into(), "1".into()],
        place: Place::Sandbox,
        timeout_secs: 30,
    };
    w.create_with(
        "fork",
        serde_json::json!({}),
        &dir.display().to_string(),
        vec![hook],
    )
    .unwrap();
    let shim = w.shim.clone();
    let started = Instant::now();
    let start = std::thread::spawn(move || shim.start("fork", ""));
    std::thread::sleep(Duration::from_millis(300));
    let asked = Instant::now();
    let state = w.shim.state("fork", "").unwrap();
    assert!(
        asked.elapsed() < Duration::from_millis(200),
        "State waited for the hook"
    );
    assert!(
        state.pid > 0,
        "the restored sandbox's pid is known: {state:?}"
    );
    assert!(start.join().unwrap().is_ok());
    assert!(
        started.elapsed() >= Duration::from_millis(1500),
        "Start waited for its hook"
    );
    assert_eq!(w.status("fork"), Status::Running);
    // Its exit comes after its TaskStart.
    w.shim.kill("fork", "", 9, false).unwrap();
    wait_for_events(&w.events, EXIT, 1);
    let topics = w.events.topics();
    let last_start = topics.iter().rposition(|t| *t == START).unwrap();
    let exit = topics.iter().rposition(|t| *t == EXIT).unwrap();
    assert!(last_start < exit, "{topics:?}");
}

#[test]
fn an_exit_during_a_checkpoint_is_reported_after_it() {
    // The source dies while its checkpoint runs: reported once the checkpoint ends.
    let w = world();
    w.create("web").unwrap();
    w.shim.start("web", "").unwrap();
    let c = w.shim.container("web").unwrap();
    c.state.lock().unwrap().init.busy = Some(crate::container::Busy::Checkpointing);
    w.runtime.end("web", 137);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(w.status("web"), Status::Running, "not while busy");
    let mut st = c.state.lock().unwrap();
    w.shim.finish_busy(&c, &mut st);
    drop(st);
    assert_eq!(w.status("web"), Status::Stopped);
    assert_eq!(w.shim.wait("web", "").unwrap().status, 137);
}

#[test]
fn requests_waiting_on_a_busy_sandbox_are_bounded_and_named() {
    use crate::container::{Busy, MAX_WAITING};
    let w = std::sync::Arc::new(world());
    w.create("web").unwrap();
    w.shim.start("web", "").unwrap();
    let c = w.shim.container("web").unwrap();
    c.state.lock().unwrap().init.busy = Some(Busy::Checkpointing);
    let waiters: Vec<_> = (0..MAX_WAITING)
        .map(|_| {
            let w = w.clone();
            std::thread::spawn(move || w.shim.pause("web"))
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    while c.state.lock().unwrap().waiting < MAX_WAITING {
        assert!(Instant::now() < deadline, "the waiters never queued");
        std::thread::sleep(Duration::from_millis(10));
    }
    let refused = w.shim.pause("web").unwrap_err();
    assert_eq!(
        refused.code(),
        containerd_shim::protos::ttrpc::Code::RESOURCE_EXHAUSTED
    );
    let said = refused.to_string();
    assert!(
        said.contains("16") && said.contains("checkpoint") && said.contains("try again"),
        "{said}"
    );
    let mut st = c.state.lock().unwrap();
    w.shim.finish_busy(&c, &mut st);
    drop(st);
    let outcomes: Vec<_> = waiters.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(
        outcomes.iter().filter(|r| r.is_ok()).count(),
        1,
        "one pauses"
    );
    assert_eq!(c.state.lock().unwrap().waiting, 0);
}

#[test]
fn an_execs_client_that_opens_its_output_only_after_the_exit_is_not_left_waiting() {
    use std::io::Read;
    let w = world();
    w.create("web").unwrap();
    w.shim.start("web", "").unwrap();
    let out = w.dir.path().join("e1-stdout");
    nix::unistd::mkfifo(&out, nix::sys::stat::Mode::from_bits(0o600).unwrap()).unwrap();
    w.shim
        .exec(ExecRequest {
            id: "web".into(),
            exec_id: "e1".into(),
            stdio: StdioPaths {
                stdout: out.display().to_string(),
                ..Default::default()
            },
            spec: br#"{"args": ["/bin/true"], "cwd": "/"}"#.to_vec(),
        })
        .unwrap();
    w.shim.start("web", "e1").unwrap();
    assert_eq!(w.shim.wait("web", "e1").unwrap().status, 0);
    // `ctr task exec` of a short command: its blocking open comes after the exit.
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        let mut got = Vec::new();
        let read = std::fs::File::open(&out).and_then(|mut f| f.read_to_end(&mut got));
        let _ = tx.send(read.map(|_| got));
    });
    let got = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the client's open of its output fifo hung");
    assert!(got.unwrap().is_empty(), "end-of-file");
    w.shim.delete("web", "e1").unwrap();
}
