//! The Task service: containerd's task RPCs on top of the runtime library. Methods here are
//! free of ttrpc types where they can be, so the logic reads as plain Rust; the trait adapter at
//! the bottom is the only place that speaks ttrpc.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{atomic::Ordering, Arc, LazyLock, Mutex},
    time::{Duration, Instant, SystemTime},
};

use chalk_runtime::{
    bundle::Record,
    caps, executable, ids, netns,
    options::RuntimeOptions,
    runsc::{
        probe::NetworkProbe, ExecChild, FeatureCache, Features, GlobalArgs, ProcessStdio, Runsc,
    },
    spec::Placement,
    state::{self, Event as Transition, Status},
    terminal::TerminalState,
};
use containerd_shim::{
    api::{
        CloseIORequest, ConnectRequest, ConnectResponse, CreateTaskRequest, CreateTaskResponse,
        DeleteRequest, DeleteResponse, Empty, ExecProcessRequest, KillRequest, PauseRequest,
        PidsRequest, PidsResponse, ResizePtyRequest, ResumeRequest, ShutdownRequest, StartRequest,
        StartResponse, StateRequest, StateResponse, StatsRequest, StatsResponse, UpdateTaskRequest,
        WaitRequest, WaitResponse,
    },
    protos::{
        events::task::{
            TaskCreate, TaskDelete, TaskExecAdded, TaskExecStarted, TaskExit, TaskIO, TaskOOM,
            TaskPaused, TaskResumed, TaskStart,
        },
        protobuf::{
            well_known_types::{any::Any, timestamp::Timestamp},
            Message, MessageField,
        },
        shim::oci::ProcessDetails,
        topics,
        ttrpc::{self, TtrpcContext},
        types::task::{ProcessInfo, Status as ApiStatus},
    },
    ExitSignal, Task,
};

use crate::{
    container::{Container, ContainerState, ExitInfo, Process},
    errors::{Result, ShimError},
    events::EventSender,
    io::{self, ConsoleSocket, StdioPaths},
    logger::LogContext,
    metrics, oom,
    reaper::{self, ReaperSpawner},
    runtime_options,
};

/// How a sandbox comes to be.
pub(crate) enum Launch<'a> {
    Create,
    /// From the checkpoint in `image`; `previous` is the IO of the sandbox it replaces, when it
    /// replaces one under the same id (its terminal's state carries over). A fork or resume
    /// gives its new terminal `terminal` (from the snapshot, with the last ResizePty's size).
    Restore {
        image: &'a Path,
        previous: Option<&'a io::ProcessIo>,
        terminal: Option<TerminalState>,
        /// Where the keys of its terminal that raise signals go (runsc delivers none).
        signals: Option<io::TerminalSignals>,
    },
}

impl Launch<'_> {
    fn name(&self) -> &'static str {
        match self {
            Launch::Create => "create",
            Launch::Restore { .. } => "restore",
        }
    }
}

/// How long runsc may take to start an exec'd process or hand over a terminal.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// What each runsc binary supports, probed once per shim process.
static FEATURES: LazyLock<Mutex<HashMap<PathBuf, Features>>> = LazyLock::new(Default::default);

#[derive(Clone)]
pub struct TaskService {
    inner: Arc<Inner>,
}

struct Inner {
    namespace: String,
    /// containerd's gRPC address, for asking which image a container runs.
    containerd_address: String,
    containers: Mutex<HashMap<String, Arc<Container>>>,
    events: EventSender,
    exit: Arc<ExitSignal>,
}

pub fn timestamp(t: SystemTime) -> Timestamp {
    let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let mut ts = Timestamp::new();
    ts.seconds = d.as_secs() as i64;
    ts.nanos = d.subsec_nanos() as i32;
    ts
}

fn api_status(s: Status) -> ApiStatus {
    match s {
        Status::Created => ApiStatus::CREATED,
        Status::Running => ApiStatus::RUNNING,
        Status::Paused => ApiStatus::PAUSED,
        Status::Stopped => ApiStatus::STOPPED,
    }
}

fn read_spec(bundle: &Path) -> Option<serde_json::Value> {
    serde_json::from_slice(&std::fs::read(bundle.join("config.json")).ok()?).ok()
}

fn read_pid(path: &Path) -> Option<i32> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

impl TaskService {
    pub fn new(
        namespace: &str,
        containerd_address: &str,
        events: EventSender,
        exit: Arc<ExitSignal>,
    ) -> Self {
        TaskService {
            inner: Arc::new(Inner {
                namespace: namespace.to_string(),
                containerd_address: containerd_address.to_string(),
                containers: Mutex::new(HashMap::new()),
                events,
                exit,
            }),
        }
    }

    pub(crate) fn namespace(&self) -> &str {
        &self.inner.namespace
    }

    pub(crate) fn containerd_address(&self) -> &str {
        &self.inner.containerd_address
    }

    pub(crate) fn container(&self, id: &str) -> Result<Arc<Container>> {
        self.inner
            .containers
            .lock()
            .unwrap()
            .get(id)
            .cloned()
            .ok_or_else(|| ShimError::NotFound(format!("container {id} not found")))
    }

    fn log_context(&self, container_id: &str) -> LogContext {
        LogContext {
            container_id: container_id.to_string(),
            namespace: self.inner.namespace.clone(),
        }
    }

    pub(crate) fn events(&self) -> &EventSender {
        &self.inner.events
    }

    /// The runsc for a container, and what that runsc binary can do.
    fn runsc_for(
        &self,
        opts: &RuntimeOptions,
        bundle: &Path,
        id: &str,
        sandbox_id: &str,
    ) -> Result<(Runsc, Features)> {
        // `%ID%` in a flag (e.g. debug-log) names the container, whatever the runsc release.
        let flags = opts
            .runsc_flags()
            .map_err(ShimError::InvalidArgument)?
            .into_iter()
            .map(|f| f.replace("%ID%", id))
            .collect();
        // One runsc root per sandbox: the 2022 runsc resolves ids by prefix and refuses
        // "web" while "web-2" exists in the same root ("id is ambiguous").
        let shared_root = opts.runsc_root(&self.inner.namespace)?;
        let root = shared_root.join(sandbox_id);
        let mut runsc = Runsc::new(
            &opts.binary_name,
            GlobalArgs { root, flags },
            bundle,
            Arc::new(ReaperSpawner),
        );
        let binary = runsc.binary().to_path_buf();
        let disk = FeatureCache::new(opts.root.join(".features"));
        let cached = FEATURES.lock().unwrap().get(&binary).cloned();
        let mut features = match cached.or_else(|| disk.get(&binary)) {
            Some(f) => f,
            None => {
                let f = runsc.features()?;
                log::info!("runsc {}: {}", binary.display(), f.version);
                disk.put(&binary, &f);
                f
            }
        };
        // What runsc shares between sandboxes (current builds pin a "null" network namespace
        // there) stays in the namespace's root, not in each sandbox's.
        if features.global_flags.contains("shared-root")
            && !opts.runsc_config.contains_key("shared-root")
        {
            runsc.add_flag(&format!("--shared-root={}", shared_root.display()));
        }
        // A seccomp profile in the spec (Kubernetes' RuntimeDefault, a pod's own) applies to
        // the container's processes inside the sandbox, as it would under runc.
        if features.global_flags.contains("oci-seccomp")
            && !opts.runsc_config.contains_key("oci-seccomp")
        {
            runsc.add_flag("--oci-seccomp");
        }
        features
            .check_flags(&runsc.global().flags)
            .map_err(ShimError::InvalidArgument)?;
        // No network chosen: runsc's default (a network of the sandbox's own) where this
        // runsc can have it on this host, else loopback only. Tried once per binary while the
        // cache lasts (under the options' root: /run/chalk is a tmpfs, so once per boot).
        if !opts.runsc_config.contains_key("network") {
            if features.network_probe.is_none() {
                let work = opts.root.join(format!(".probe-{}", std::process::id()));
                features.network_probe = chalk_runtime::runsc::probe::network(&runsc, &work)?;
                if features.network_probe.is_some() {
                    disk.put(&binary, &features);
                }
                if features.network_probe == Some(NetworkProbe::NoneOnly) {
                    log::warn!(
                        "{} cannot give sandboxes a network of their own on this host: they get \
                         loopback only (network = \"none\"); set network under [runsc_config] \
                         in the runtime options to choose",
                        binary.display()
                    );
                }
            }
            if features.network_probe == Some(NetworkProbe::NoneOnly) {
                runsc.add_flag("--network=none");
            }
        }
        FEATURES.lock().unwrap().insert(binary, features.clone());
        Ok((runsc, features))
    }

    // ---- create / start ------------------------------------------------------------------

    pub fn create(&self, req: &CreateTaskRequest) -> Result<u32> {
        ids::container_id(&req.id)?;
        if self.inner.containers.lock().unwrap().contains_key(&req.id) {
            return Err(ShimError::AlreadyExists(format!(
                "container {} already exists",
                req.id
            )));
        }
        // containerd's unpacked copy of a checkpoint goes whatever becomes of this request.
        let mut unpacked = (!req.checkpoint.is_empty())
            .then(|| {
                crate::unpacked::UnpackedCheckpoint::of(
                    Path::new(&req.checkpoint),
                    &crate::unpacked::containerd_temp_dir(),
                )
            })
            .flatten();
        let opts = runtime_options::resolve(req.options.as_ref())?;
        // The options may raise the shim's log level; containerd's -debug is never lowered.
        if let Some(level) = opts.log_level.as_deref().and_then(|l| l.parse().ok()) {
            if level > log::max_level() {
                log::set_max_level(level);
            }
        }
        let bundle = PathBuf::from(&req.bundle);
        if !bundle.is_absolute() || !bundle.join("config.json").exists() {
            return Err(ShimError::InvalidArgument(format!(
                "bundle {} has no config.json",
                req.bundle
            )));
        }
        let spec = read_spec(&bundle).ok_or_else(|| {
            ShimError::InvalidArgument(format!("{}/config.json is not valid JSON", req.bundle))
        })?;
        let placement = Placement::of(&spec)
            .map_err(|e| ShimError::InvalidArgument(format!("container {}: {e}", req.id)))?;
        if let Placement::InPod { sandbox_id } = &placement {
            self.check_pod_sandbox(&req.id, sandbox_id, &req.checkpoint)?;
        }
        let hooks = chalk_hooks::config::container_hooks(
            &opts.hooks,
            opts.allow_annotation_hooks,
            spec.pointer(&format!(
                "/annotations/{}",
                chalk_hooks::config::HOOKS_ANNOTATION.replace('/', "~1")
            ))
            .and_then(|v| v.as_str()),
        )
        .map_err(|e| ShimError::InvalidArgument(format!("container {}: {e}", req.id)))?;
        let gpu = crate::gpu::of(&spec, &opts.gpu, &opts.runsc_flags().unwrap_or_default());
        let lifetime = chalk_runtime::lifetime::Lifetime::of_spec(&spec)
            .map_err(|e| ShimError::InvalidArgument(format!("container {}: {e}", req.id)))?
            .filter(|_| {
                // Kubernetes owns a pod's life (activeDeadlineSeconds): it would only make
                // the pod again.
                let cri = spec["annotations"][chalk_runtime::spec::CRI_CONTAINER_TYPE].is_string();
                if cri {
                    log::warn!(
                        "container {}: a lifetime is not kept for a pod's containers",
                        req.id
                    );
                }
                !cri
            });
        let sandbox_id = chalk_runtime::spec::sandbox_id_of(Some(&spec), &req.id);
        let (mut runsc, features) = self.runsc_for(&opts, &bundle, &req.id, &sandbox_id)?;
        // Root filesystem writes stay in sandbox memory, where a checkpoint captures them,
        // unless the options choose an overlay themselves.
        let user_overlay = ["overlay", "overlay2"]
            .iter()
            .any(|k| opts.runsc_config.contains_key(*k));
        if let (false, Some(flag)) = (user_overlay, features.memory_overlay_flag()) {
            runsc.add_flag(flag);
        }
        log::info!(
            "container {}: runsc {} ({}); resource updates via {}",
            req.id,
            runsc.binary().display(),
            features.version,
            if features.has_command("update") {
                "runsc update"
            } else {
                "the sandbox cgroup"
            }
        );

        let network = runsc.flag_value("network");
        // A pod container lives in its sandbox's network, whatever its spec says.
        let netns = (!placement.in_pod() && netns::needs_private_netns(&spec, network))
            .then(|| netns::netns_path(&opts.root, &self.inner.namespace, &req.id));
        let mut adapted = adapted_spec(&spec, netns.as_deref(), req.terminal);
        // A restore is verified before anything is made for it.
        let restore_from = match req.checkpoint.as_str() {
            "" => None,
            dir => {
                let from =
                    self.verify_restore(&req.id, Path::new(dir), &runsc, &features, &adapted)?;
                *from.unpacked.lock().unwrap() = unpacked.take();
                Some(from)
            }
        };
        create_private_dir(&runsc.global().root)?;
        // Written before anything is made, so `shim delete` can undo any of it after a crash.
        let record = Record {
            binary: runsc.binary().to_path_buf(),
            root: runsc.global().root.clone(),
            flags: runsc.global().flags.clone(),
            rootfs_mounted: !req.rootfs.is_empty(),
            netns: netns.clone(),
        };
        record.write(&bundle)?;
        if let Some(path) = &netns {
            if let Err(e) = self.make_netns(path) {
                cleanup_bundle(&bundle, false, None);
                return Err(e);
            }
        }
        let made_private = crate::private_mounts::make_private(&mut adapted, &bundle)
            .map_err(|e| ShimError::InvalidArgument(format!("container {}: {e}", req.id)));
        if let Err(e) = made_private.and_then(|_| write_spec(&bundle, &spec, &adapted)) {
            cleanup_bundle(&bundle, false, netns.as_deref());
            return Err(e);
        }
        let rootfs_mounted = match mount_rootfs(&bundle, &req.rootfs) {
            Ok(m) => m,
            Err(e) => {
                cleanup_bundle(&bundle, false, netns.as_deref());
                return Err(e);
            }
        };
        // runsc would only notice at start; containerd clients expect Create to fail.
        if let Err(e) = executable::check(&spec, &bundle) {
            cleanup_bundle(&bundle, rootfs_mounted, netns.as_deref());
            return Err(e.into());
        }
        let stdio = StdioPaths {
            stdin: req.stdin.clone(),
            stdout: req.stdout.clone(),
            stderr: req.stderr.clone(),
            terminal: req.terminal,
        };
        let container = Container {
            id: req.id.clone(),
            sandbox_id,
            placement,
            oom_score_adj: chalk_runtime::spec::workload_oom_score_adj(&spec),
            pending_pod_members: Default::default(),
            bundle: bundle.clone(),
            runsc,
            features,
            rootfs_mounted,
            netns,
            restore_from,
            restored: Default::default(),
            hooks,
            gpu,
            check_free_space: opts.snapshot.check_free_space,
            terminal_signals: Default::default(),
            terminal_gate: Default::default(),
            lifetime,
            state: Mutex::new(ContainerState {
                init: Process::new("", stdio.clone()),
                execs: HashMap::new(),
            }),
        };
        let started_at = Instant::now();
        let launched = match &container.restore_from {
            // A restore runs at Start, as with runc: nothing runs until then.
            Some(_) => Ok(None),
            None => self
                .launch_sandbox(&container, &stdio, Launch::Create)
                .map(Some),
        };
        let pid = match launched {
            Ok(Some((pid, pio))) => {
                let mut st = container.state.lock().unwrap();
                st.init.pid = pid as u32;
                st.init.io = pio;
                pid
            }
            Ok(None) => 0,
            Err(e) => {
                // Leave nothing behind: no sandbox, no mount, no record.
                let _ = container.runsc.delete(&container.id, true);
                cleanup_bundle(&bundle, rootfs_mounted, container.netns.as_deref());
                return Err(network_hint(e));
            }
        };
        let container = Arc::new(container);
        self.inner
            .containers
            .lock()
            .unwrap()
            .insert(req.id.clone(), container.clone());
        let mut io = TaskIO::new();
        io.stdin = req.stdin.clone();
        io.stdout = req.stdout.clone();
        io.stderr = req.stderr.clone();
        io.terminal = req.terminal;
        let mut ev = TaskCreate::new();
        ev.container_id = req.id.clone();
        ev.bundle = req.bundle.clone();
        ev.rootfs = req.rootfs.clone();
        ev.io = Some(io).into();
        ev.pid = pid as u32;
        self.events().send(topics::TASK_CREATE_EVENT_TOPIC, ev);
        // After TaskCreate: a sandbox that already died must not report its exit first. A pod
        // container's exit is watched from its start (its pid is the sandbox's).
        if pid > 0 && !container.in_pod() {
            self.watch_init(&container, pid, started_at);
        }
        Ok(pid as u32)
    }

    /// Every container of this shim, for looking through without holding the map's lock.
    fn all_containers(&self) -> Vec<Arc<Container>> {
        let map = self.inner.containers.lock().unwrap();
        map.values().cloned().collect()
    }

    /// Whether the sandbox pod container `c` lives in still runs.
    fn sandbox_runs(&self, c: &Container) -> bool {
        self.container(&c.sandbox_id)
            .is_ok_and(|root| root.state.lock().unwrap().init.status != Status::Stopped)
    }

    /// The containers of pod sandbox `sandbox_id` other than its sandbox container that run
    /// in it (created ones have nothing in the sandbox yet; stopped ones no longer do).
    pub(crate) fn pod_members(&self, sandbox_id: &str) -> Vec<Arc<Container>> {
        self.all_containers()
            .into_iter()
            .filter(|c| c.in_pod() && c.sandbox_id == sandbox_id)
            .filter(|c| {
                let status = c.state.lock().unwrap().init.status;
                matches!(status, Status::Running | Status::Paused)
            })
            .collect()
    }

    /// A pod container joins the sandbox its pod's sandbox container made in this shim.
    fn check_pod_sandbox(&self, id: &str, sandbox_id: &str, checkpoint: &str) -> Result<()> {
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
        Ok(())
    }

    /// Makes the fresh network namespace the spec asks for.
    fn make_netns(&self, path: &Path) -> Result<()> {
        netns::create(path).map_err(|e| {
            ShimError::internal(format!("create network namespace {}", path.display()), e)
        })
    }

    /// Makes the sandbox of `c` with its init's stdio, by `runsc create` or by restoring a
    /// checkpoint; returns the sandbox pid and the IO the shim holds for it. Takes no lock.
    pub(crate) fn launch_sandbox(
        &self,
        c: &Container,
        stdio: &StdioPaths,
        how: Launch,
    ) -> Result<(i32, io::ProcessIo)> {
        let pid_file = c.init_pid_path();
        let _ = std::fs::remove_file(&pid_file);
        let ctx = self.log_context(&c.id);
        let open_err =
            |e: std::io::Error| ShimError::InvalidArgument(format!("open stdio of {}: {e}", c.id));
        let (runsc_stdio, console, mut pio) = if stdio.terminal {
            let socket =
                ConsoleSocket::new().map_err(|e| ShimError::internal("console socket", e))?;
            (
                ProcessStdio::default(),
                Some(socket),
                io::ProcessIo::default(),
            )
        } else if c.in_pod() {
            // runsc gives a pod container its stdio at start (see start_in_pod).
            (ProcessStdio::default(), None, io::ProcessIo::default())
        } else {
            let (s, pio) = match &how {
                Launch::Restore { previous, .. } => io::open_plain(stdio, &ctx, *previous),
                Launch::Create => io::open_plain(stdio, &ctx, None),
            }
            .map_err(open_err)?;
            (s, None, pio)
        };
        let socket_path = console.as_ref().map(|s| s.path());
        match &how {
            Launch::Create => {
                c.runsc
                    .create(&c.id, &c.bundle, &pid_file, runsc_stdio, socket_path)?
            }
            Launch::Restore { image, .. } => {
                c.runsc
                    .restore(&c.id, &c.bundle, image, &pid_file, runsc_stdio, socket_path)?;
                c.restored.store(true, Ordering::Relaxed);
            }
        }
        let pid = read_pid(&pid_file).ok_or_else(|| {
            ShimError::Internal(format!(
                "runsc {} {} wrote no pid to {}",
                how.name(),
                c.id,
                pid_file.display()
            ))
        })?;
        if let Some(console) = console {
            let master = console
                .receive(START_TIMEOUT)
                .map_err(|e| ShimError::internal(format!("terminal of {}", c.id), e))?;
            pio = match how {
                Launch::Create => {
                    let size = read_spec(&c.bundle).and_then(|s| io::console_size(&s["process"]));
                    if let Some((w, h)) = size {
                        let _ = io::set_size(&master, w, h);
                    }
                    io::attach_console(stdio, master, &ctx, None)
                }
                Launch::Restore {
                    previous: Some(previous),
                    signals,
                    ..
                } => io::reattach_console(stdio, master, &ctx, previous, signals),
                Launch::Restore {
                    previous: None,
                    terminal,
                    signals,
                    ..
                } => {
                    // Before any input: keys typed into default settings would echo twice.
                    if let Some(t) = &terminal {
                        if let Err(e) = t.apply(&master) {
                            log::warn!("container {}: terminal settings not restored: {e}", c.id);
                        }
                    }
                    io::attach_console(stdio, master, &ctx, signals)
                }
            }
            .map_err(open_err)?;
        }
        Ok((pid, pio))
    }

    /// The sandbox process is the shim's (adopted) child: its exit status is the init's.
    pub(crate) fn watch_init(&self, c: &Arc<Container>, pid: i32, not_before: Instant) {
        let exits = reaper::watch(pid, not_before);
        let this = self.clone();
        let id = c.id.clone();
        std::thread::spawn(move || {
            if let Ok(status) = exits.recv() {
                this.sandbox_exited(&id, pid as u32, status);
            }
        });
        let events = self.events().clone();
        let id = c.id.clone();
        if let Err(e) = oom::watch(pid, move || {
            log::warn!("container {id} hit its memory limit");
            let mut ev = TaskOOM::new();
            ev.container_id = id.clone();
            events.send(topics::TASK_OOM_EVENT_TOPIC, ev);
        }) {
            log::warn!("no OOM events for {}: {e}", c.id);
        }
    }

    /// A sandbox process ended: the init's exit, unless a restore already replaced that
    /// sandbox (a checkpoint that leaves the source running on an older runsc).
    fn sandbox_exited(&self, id: &str, pid: u32, status: i32) {
        if let Ok(c) = self.container(id) {
            let current = c.state.lock().unwrap().init.pid;
            if current != pid {
                log::info!("container {id}: replaced sandbox {pid} exited with {status}");
                return;
            }
        }
        self.process_exited(id, "", status);
    }

    pub(crate) fn process_exited(&self, id: &str, exec_id: &str, status: i32) {
        let Ok(c) = self.container(id) else { return };
        let mut st = c.state.lock().unwrap();
        if let Some(p) = st.process_mut(exec_id) {
            self.record_exit(id, p, status);
        }
    }

    /// Marks `p` stopped with `status` and tells containerd, once.
    fn record_exit(&self, id: &str, p: &mut Process, status: i32) {
        let exec_id = p.exec_id.clone();
        if p.status == Status::Stopped {
            return;
        }
        p.status = Status::Stopped;
        let info = ExitInfo {
            status: status as u32,
            at: SystemTime::now(),
        };
        log::info!("container {id} process {:?} exited with {status}", exec_id);
        let mut ev = TaskExit::new();
        ev.container_id = id.to_string();
        ev.id = if exec_id.is_empty() {
            id.to_string()
        } else {
            exec_id.clone()
        };
        ev.pid = p.pid;
        ev.exit_status = info.status;
        ev.exited_at = Some(timestamp(info.at)).into();
        self.events().send(topics::TASK_EXIT_EVENT_TOPIC, ev);
        p.exit.set(info);
    }

    pub fn start(&self, id: &str, exec_id: &str) -> Result<u32> {
        let c = self.container(id)?;
        if !exec_id.is_empty() {
            return self.start_exec(&c, exec_id);
        }
        // The lock is held across runsc start so an exit cannot be reported before TaskStart.
        let mut st = c.state.lock().unwrap();
        let next = state::transition(id, st.init.status, Transition::Start)?;
        if let Some(from) = &c.restore_from {
            let started_at = Instant::now();
            let terminal = from.terminal.clone().map(|mut t| {
                if let Some((w, h)) = st.init.size {
                    (t.cols, t.rows) =
                        (w.min(u16::MAX.into()) as u16, h.min(u16::MAX.into()) as u16);
                }
                t
            });
            let launched = self.launch_sandbox(
                &c,
                &st.init.stdio.clone(),
                Launch::Restore {
                    image: &from.dir,
                    previous: None,
                    terminal,
                    signals: Some(crate::terminal::signals_for(&c)),
                },
            );
            // runsc has opened what it reads (or failed): containerd's copy can go.
            from.unpacked.lock().unwrap().take();
            let (pid, pio) = launched?;
            if let (Some((w, h)), None) = (st.init.size, &from.terminal) {
                let _ = pio.resize(w, h);
            }
            st.init.pid = pid as u32;
            st.init.io = pio;
            self.watch_init(&c, pid, started_at);
            log::info!("container {id}: restored from {}", from.dir.display());
            if from.pod_members > 0 {
                // The sandbox waits for its pod's containers (their starts restore them);
                // the last one's completes the restore, and settles it.
                c.pending_pod_members
                    .store(from.pod_members, Ordering::SeqCst);
            } else {
                self.settle_restore(&c, &from.cuda_pids, pid)?;
            }
        } else if c.in_pod() {
            self.start_in_pod(&c, &mut st.init)?;
        } else if let Err(e) = c.runsc.start(id) {
            // A sandbox whose start failed can never run: end it, so the task reads stopped
            // (as with runc) and its exit is reported, instead of lingering as created.
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(st.init.pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            return Err(network_hint(e.into()));
        }
        st.init.status = next;
        let pid = st.init.pid;
        let mut ev = TaskStart::new();
        ev.container_id = id.to_string();
        ev.pid = pid;
        self.events().send(topics::TASK_START_EVENT_TOPIC, ev);
        drop(st);
        self.adjust_oom_score(&c.sandbox_id, pid);
        if let Some(lifetime) = c.lifetime {
            crate::lifetime::watch(self, &c, lifetime);
        }
        Ok(pid)
    }

    /// Ends sandbox `c` at once (SIGKILL to all it runs, then to the sandbox process); its
    /// exit is reported as any other.
    pub(crate) fn kill_sandbox(&self, c: &Container) {
        if let Err(e) = c.runsc.kill(&c.id, libc::SIGKILL as u32, true, None) {
            log::warn!("container {}: kill --all: {e}", c.id);
        }
        let pid = c.state.lock().unwrap().init.pid;
        if pid > 0 {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
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

    /// After a restore: CUDA processes back on the GPU, then the post-restore hooks. A restore
    /// where either fails has failed: its sandbox (`pid`) ends.
    fn settle_restore(&self, c: &Container, cuda_pids: &[u32], pid: i32) -> Result<()> {
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
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
            ShimError::FailedPrecondition(format!(
                "container {}: restored, then {e}; the sandbox was stopped",
                c.id
            ))
        })
    }

    /// A pod container of a sandbox being restored has started (and so been restored into
    /// it); after the last one, the sandbox's restore is settled.
    fn pod_member_restored(&self, c: &Container) -> Result<()> {
        let Ok(root) = self.container(&c.sandbox_id) else {
            return Ok(());
        };
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
    fn start_in_pod(&self, c: &Arc<Container>, init: &mut Process) -> Result<()> {
        let (stdio, pio) = if init.stdio.terminal {
            (ProcessStdio::default(), None)
        } else {
            let (s, pio) = io::open_plain(&init.stdio, &self.log_context(&c.id), None)
                .map_err(|e| ShimError::InvalidArgument(format!("open stdio of {}: {e}", c.id)))?;
            (s, Some(pio))
        };
        if let Err(e) = c.runsc.start_with_stdio(&c.id, stdio) {
            // Never to run, as with runc: it reads stopped and its exit is reported.
            self.record_exit(&c.id, init, 128 + libc::SIGKILL);
            return Err(e.into());
        }
        if let Some(pio) = pio {
            init.io = pio;
        }
        // Watched before anything else can fail: whatever happens next, its exit is known.
        let (this, member) = (self.clone(), c.clone());
        std::thread::spawn(move || {
            let status = member.runsc.wait(&member.id).unwrap_or_else(|e| {
                // The sandbox went (the pod was killed): so did the container, by SIGKILL.
                log::warn!("container {}: {e}; it ended with its sandbox", member.id);
                128 + libc::SIGKILL
            });
            this.process_exited(&member.id, "", status);
        });
        self.pod_member_restored(c)
    }

    // ---- exec -----------------------------------------------------------------------------

    pub fn exec(&self, req: &ExecProcessRequest) -> Result<()> {
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
        let spec = req
            .spec
            .as_ref()
            .map(|a| a.value.as_slice())
            .unwrap_or_default();
        let parsed: serde_json::Value = serde_json::from_slice(spec).map_err(|e| {
            ShimError::InvalidArgument(format!("exec {} process spec: {e}", req.exec_id))
        })?;
        if !parsed.is_object() {
            return Err(ShimError::InvalidArgument(format!(
                "exec {} process spec is not a JSON object",
                req.exec_id
            )));
        }
        let mut adapted = parsed.clone();
        adapt_process(&mut adapted, req.terminal);
        let spec = if adapted != parsed {
            serde_json::to_vec(&adapted).map_err(|e| ShimError::internal("encode exec spec", e))?
        } else {
            spec.to_vec()
        };
        write_private(&c.exec_spec_path(&req.exec_id), &spec)?;
        let stdio = StdioPaths {
            stdin: req.stdin.clone(),
            stdout: req.stdout.clone(),
            stderr: req.stderr.clone(),
            terminal: req.terminal,
        };
        st.execs
            .insert(req.exec_id.clone(), Process::new(&req.exec_id, stdio));
        let mut ev = TaskExecAdded::new();
        ev.container_id = req.id.clone();
        ev.exec_id = req.exec_id.clone();
        self.events().send(topics::TASK_EXEC_ADDED_EVENT_TOPIC, ev);
        Ok(())
    }

    fn start_exec(&self, c: &Arc<Container>, exec_id: &str) -> Result<u32> {
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
            .ok_or_else(|| ShimError::NotFound(format!("exec {exec_id} not found in {}", c.id)))?;
        let next = state::transition(exec_id, p.status, Transition::Start)?;
        let (child, pid) = match self.launch_exec(c, p) {
            Ok(started) => started,
            Err(e) => {
                // Never started: release any Wait on it, as the runc shim does.
                p.status = Status::Stopped;
                p.exit.set(ExitInfo {
                    status: 255,
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
                255
            });
            this.process_exited(&id, &eid, status);
        });
        let mut ev = TaskExecStarted::new();
        ev.container_id = c.id.clone();
        ev.exec_id = exec_id.to_string();
        ev.pid = pid as u32;
        self.events()
            .send(topics::TASK_EXEC_STARTED_EVENT_TOPIC, ev);
        Ok(pid as u32)
    }

    /// Runs `runsc exec` for `p` and waits until the process is running in the sandbox;
    /// returns the foreground runsc (whose exit is the process's) and the in-sandbox pid.
    fn launch_exec(&self, c: &Container, p: &mut Process) -> Result<(ExecChild, i32)> {
        let exec_id = p.exec_id.clone();
        let pid_file = c.exec_pid_path(&exec_id);
        let _ = std::fs::remove_file(&pid_file);
        let (runsc_stdio, master) = if p.stdio.terminal {
            let (master, slave) = io::open_pty()
                .map_err(|e| ShimError::internal(format!("terminal for exec {exec_id}"), e))?;
            let spec = std::fs::read(c.exec_spec_path(&exec_id))
                .ok()
                .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok());
            if let Some((w, h)) = p.size.or_else(|| spec.as_ref().and_then(io::console_size)) {
                let _ = io::set_size(&master, w, h);
            }
            let stdio = ProcessStdio::terminal(slave)
                .map_err(|e| ShimError::internal(format!("terminal for exec {exec_id}"), e))?;
            (stdio, Some(master))
        } else {
            let (s, pio) =
                io::open_plain(&p.stdio, &self.log_context(&c.id), None).map_err(|e| {
                    ShimError::InvalidArgument(format!("open stdio of exec {exec_id}: {e}"))
                })?;
            p.io = pio;
            (s, None)
        };
        let mut child = c
            .runsc
            .exec(&c.id, &c.exec_spec_path(&exec_id), &pid_file, runsc_stdio)?;

        // Started once runsc has written the in-sandbox pid; failed if runsc exits without it.
        let deadline = Instant::now() + START_TIMEOUT;
        let pid = loop {
            if let Some(pid) = read_pid(&pid_file) {
                break pid;
            }
            let exited = child
                .try_wait()
                .map_err(|e| ShimError::internal("wait for runsc exec", e))?;
            if exited.is_some() {
                if let Some(pid) = read_pid(&pid_file) {
                    break pid;
                }
                return Err(ShimError::Internal(format!(
                    "runsc exec {exec_id} in {}: {}",
                    c.id,
                    child.failure_reason()
                )));
            }
            if Instant::now() > deadline {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(child.pid() as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
                return Err(ShimError::Internal(format!(
                    "runsc exec {exec_id} in {} did not start within {START_TIMEOUT:?}",
                    c.id
                )));
            }
            std::thread::sleep(Duration::from_millis(2));
        };
        if let Some(master) = master {
            // Only opening containerd's fifos can fail here; the process then still runs and
            // its exit is watched like any other.
            match io::attach_console(&p.stdio, master, &self.log_context(&c.id), None) {
                Ok(pio) => p.io = pio,
                Err(e) => log::error!("exec {exec_id} in {}: terminal not attached: {e}", c.id),
            }
        }
        Ok((child, pid))
    }

    // ---- signals, waiting, state ----------------------------------------------------------

    pub fn kill(&self, req: &KillRequest) -> Result<()> {
        let c = self.container(&req.id)?;
        let (status, pid) = {
            let st = c.state.lock().unwrap();
            let p = st.process(&req.exec_id).ok_or_else(|| {
                ShimError::NotFound(format!("exec {} not found in {}", req.exec_id, req.id))
            })?;
            (p.status, p.pid)
        };
        let finished = || {
            ShimError::NotFound(format!(
                "process {} of {} already finished",
                display_exec(&req.exec_id),
                req.id
            ))
        };
        match status {
            Status::Stopped => return Err(finished()),
            Status::Created if req.exec_id.is_empty() && (pid == 0 || c.in_pod()) => {
                // A restore that has not started, or a pod container that has not: there is
                // no process to signal yet (a pod container's pid is its sandbox's). Decided
                // under the lock Start holds, so a Start in between is seen.
                let mut st = c.state.lock().unwrap();
                if st.init.status == Status::Created {
                    self.record_exit(&req.id, &mut st.init, 128 + req.signal as i32);
                    return Ok(());
                }
            }
            Status::Created if req.exec_id.is_empty() => {
                // Not started yet: runsc cannot signal it, but the sandbox process is ours.
                let sig = nix::sys::signal::Signal::try_from(req.signal as i32).map_err(|e| {
                    ShimError::InvalidArgument(format!("signal {}: {e}", req.signal))
                })?;
                return nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig)
                    .map_err(|e| ShimError::internal(format!("kill sandbox of {}", req.id), e));
            }
            Status::Created => {
                return Err(ShimError::FailedPrecondition(format!(
                    "exec {} of {} has not started",
                    req.exec_id, req.id
                )))
            }
            _ => {}
        }
        let target = (!req.exec_id.is_empty()).then_some(pid as i32);
        let mut killed = c.runsc.kill(&req.id, req.signal, req.all, target);
        if killed.is_ok() && req.all && req.exec_id.is_empty() && c.was_restored() {
            // runsc 2022's `kill --all` misses the init of a restored sandbox.
            killed = c.runsc.kill(&req.id, req.signal, false, None);
        }
        match killed {
            Ok(()) => Ok(()),
            Err(e) => {
                // It may have exited while we were signalling it, its exit not yet handled.
                let cell = c
                    .state
                    .lock()
                    .unwrap()
                    .process(&req.exec_id)
                    .map(|p| p.exit.clone());
                match cell {
                    None => Err(finished()),
                    Some(cell) if cell.wait_timeout(Duration::from_millis(300)).is_some() => {
                        Err(finished())
                    }
                    // runsc no longer knows the container (its state was removed behind us).
                    Some(_) if e.to_string().contains("does not exist") => Err(finished()),
                    Some(_) => Err(e.into()),
                }
            }
        }
    }

    pub fn wait(&self, id: &str, exec_id: &str) -> Result<ExitInfo> {
        let c = self.container(id)?;
        let cell = {
            let st = c.state.lock().unwrap();
            st.process(exec_id)
                .ok_or_else(|| ShimError::NotFound(format!("exec {exec_id} not found in {id}")))?
                .exit
                .clone()
        };
        Ok(cell.wait())
    }

    pub fn state(&self, id: &str, exec_id: &str) -> Result<StateResponse> {
        let c = self.container(id)?;
        let st = c.state.lock().unwrap();
        let p = st
            .process(exec_id)
            .ok_or_else(|| ShimError::NotFound(format!("exec {exec_id} not found in {id}")))?;
        let mut resp = StateResponse::new();
        resp.id = if exec_id.is_empty() {
            id.to_string()
        } else {
            exec_id.to_string()
        };
        resp.exec_id = exec_id.to_string();
        resp.bundle = c.bundle.display().to_string();
        resp.pid = p.pid;
        resp.status = api_status(p.status).into();
        resp.stdin = p.stdio.stdin.clone();
        resp.stdout = p.stdio.stdout.clone();
        resp.stderr = p.stdio.stderr.clone();
        resp.terminal = p.stdio.terminal;
        if let Some(exit) = p.exit.get() {
            resp.exit_status = exit.status;
            resp.exited_at = Some(timestamp(exit.at)).into();
        }
        Ok(resp)
    }

    // ---- delete / shutdown ----------------------------------------------------------------

    pub fn delete(&self, id: &str, exec_id: &str) -> Result<(u32, ExitInfo)> {
        let c = self.container(id)?;
        if !exec_id.is_empty() {
            let mut st = c.state.lock().unwrap();
            let p = st
                .execs
                .get(exec_id)
                .ok_or_else(|| ShimError::NotFound(format!("exec {exec_id} not found in {id}")))?;
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
            state::check_deletable(id, st.init.status)?;
            (st.init.pid, st.init.exit.clone(), st.init.status)
        };
        if pid > 0 {
            match c.runsc.delete(id, true) {
                Ok(()) => {}
                // A stopped pod container whose sandbox is gone has nothing left to delete.
                Err(e) if c.in_pod() && cell.get().is_some() && !self.sandbox_runs(&c) => {
                    log::warn!("container {id}: {e}; its sandbox is gone with it")
                }
                Err(e) => return Err(e.into()),
            }
            if c.in_pod() && status == Status::Created {
                // Never started: no watcher will report an exit (its pid is the sandbox's).
                cell.set(ExitInfo {
                    status: 137,
                    at: SystemTime::now(),
                });
            }
        } else {
            // A restore that never started has no sandbox and no exit to wait for.
            cell.set(ExitInfo {
                status: 137,
                at: SystemTime::now(),
            });
        }
        // A stopped init has its exit already. A created one was just killed by the forced
        // delete: report that exit as reaped, and SIGKILL's status only if it never arrives.
        let exit = cell
            .wait_timeout(Duration::from_secs(5))
            .unwrap_or_else(|| {
                cell.set(ExitInfo {
                    status: 137,
                    at: SystemTime::now(),
                })
            });
        {
            // Nothing may wait forever on a process of a deleted container.
            let mut st = c.state.lock().unwrap();
            st.init.status = Status::Stopped;
            for p in st.execs.values_mut() {
                p.status = Status::Stopped;
                p.exit.set(ExitInfo {
                    status: 255,
                    at: SystemTime::now(),
                });
            }
        }
        cleanup_bundle(&c.bundle, c.rootfs_mounted, c.netns.as_deref());
        let _ = std::fs::remove_file(c.init_pid_path());
        self.inner.containers.lock().unwrap().remove(id);

        let mut ev = TaskDelete::new();
        ev.container_id = id.to_string();
        ev.id = id.to_string();
        ev.pid = pid;
        ev.exit_status = exit.status;
        ev.exited_at = Some(timestamp(exit.at)).into();
        self.events().send(topics::TASK_DELETE_EVENT_TOPIC, ev);
        Ok((pid, exit))
    }

    pub fn shutdown(&self) {
        if self.inner.containers.lock().unwrap().is_empty() {
            self.events().flush(Duration::from_secs(5));
            self.inner.exit.signal();
        }
    }

    // ---- the rest -------------------------------------------------------------------------

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
        let mut st = c.state.lock().unwrap();
        let next = state::transition(id, st.init.status, what)?;
        if what == Transition::Pause {
            c.runsc.pause(id)?;
            st.init.status = next;
            let mut ev = TaskPaused::new();
            ev.container_id = id.to_string();
            self.events().send(topics::TASK_PAUSED_EVENT_TOPIC, ev);
        } else {
            c.runsc.resume(id)?;
            st.init.status = next;
            let mut ev = TaskResumed::new();
            ev.container_id = id.to_string();
            self.events().send(topics::TASK_RESUMED_EVENT_TOPIC, ev);
        }
        Ok(())
    }

    pub fn pids(&self, id: &str) -> Result<Vec<ProcessInfo>> {
        let c = self.container(id)?;
        let pids = c.runsc.ps(id)?;
        let exec_of: HashMap<u32, String> = {
            let st = c.state.lock().unwrap();
            st.execs
                .values()
                .filter(|p| p.status == Status::Running)
                .map(|p| (p.pid, p.exec_id.clone()))
                .collect()
        };
        pids.into_iter()
            .map(|pid| {
                let mut info = ProcessInfo::new();
                info.pid = pid as u32;
                if let Some(exec_id) = exec_of.get(&(pid as u32)) {
                    let mut details = ProcessDetails::new();
                    details.exec_id = exec_id.clone();
                    let mut any = Any::new();
                    any.type_url = "containerd.runc.v1.ProcessDetails".into();
                    any.value = details
                        .write_to_bytes()
                        .map_err(|e| ShimError::internal("encode process details", e))?;
                    info.info = MessageField::some(any);
                }
                Ok(info)
            })
            .collect()
    }

    pub fn stats(&self, id: &str) -> Result<Any> {
        let c = self.container(id)?;
        let ev = c.runsc.stats(id)?;
        metrics::to_any(&ev.data).map_err(|e| ShimError::internal("encode metrics", e))
    }

    /// New limits go to the sandbox's host cgroup, which is what bounds the whole sandbox.
    pub fn update(&self, id: &str, resources: Option<&Any>) -> Result<()> {
        let c = self.container(id)?;
        let Some(resources) = resources.filter(|r| !r.value.is_empty()) else {
            return Ok(());
        };
        let parsed: oci_spec::runtime::LinuxResources = serde_json::from_slice(&resources.value)
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
            write_private(&file, &resources.value)?;
            let result = c.runsc.update(id, &file);
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
            .map_err(|e| ShimError::internal(format!("cgroup of {id}"), e))?;
        containerd_shim::cgroup::update_resources(&cgroup, &parsed)
            .map_err(|e| ShimError::internal(format!("update resources of {id}"), e))
    }

    pub fn close_io(&self, id: &str, exec_id: &str) -> Result<()> {
        let c = self.container(id)?;
        let mut st = c.state.lock().unwrap();
        let p = st
            .process_mut(exec_id)
            .ok_or_else(|| ShimError::NotFound(format!("exec {exec_id} not found in {id}")))?;
        p.io.close_stdin();
        Ok(())
    }

    pub fn resize_pty(&self, id: &str, exec_id: &str, width: u32, height: u32) -> Result<()> {
        log::debug!("resize terminal of {id} {exec_id:?} to {width}x{height}");
        let c = self.container(id)?;
        let mut st = c.state.lock().unwrap();
        let p = st
            .process_mut(exec_id)
            .ok_or_else(|| ShimError::NotFound(format!("exec {exec_id} not found in {id}")))?;
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

    pub fn connect(&self, id: &str) -> ConnectResponse {
        let mut resp = ConnectResponse::new();
        resp.shim_pid = std::process::id();
        resp.version = env!("CARGO_PKG_VERSION").to_string();
        if let Ok(c) = self.container(id) {
            resp.task_pid = c.state.lock().unwrap().init.pid;
        }
        resp
    }
}

/// runsc's refusal of a network it cannot have on this host, with what to do about it.
fn network_hint(e: ShimError) -> ShimError {
    let text = e.to_string();
    if !text.contains(chalk_runtime::runsc::probe::NO_NETWORK_HERE) {
        return e;
    }
    ShimError::FailedPrecondition(format!(
        "{text} (this runsc cannot give a sandbox a network of its own on this host: set \
         network = \"none\" under [runsc_config] in the runtime options, or leave network out \
         for the shim to pick what works, or install a runsc from 2024 on)"
    ))
}

fn display_exec(exec_id: &str) -> &str {
    if exec_id.is_empty() {
        "init"
    } else {
        exec_id
    }
}

fn create_private_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| ShimError::internal(format!("create {}", dir.display()), e))
}

pub(crate) fn write_private(path: &Path, data: &[u8]) -> Result<()> {
    use std::{io::Write, os::unix::fs::OpenOptionsExt};
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| f.write_all(data))
        .map_err(|e| ShimError::internal(format!("write {}", path.display()), e))
}

/// The spec as runsc gets it: pointed at the network namespace the shim made, and the
/// process adapted as [`adapt_process`] says.
fn adapted_spec(
    spec: &serde_json::Value,
    netns: Option<&Path>,
    terminal: bool,
) -> serde_json::Value {
    let mut adapted = spec.clone();
    if let Some(path) = netns {
        netns::set_netns_path(&mut adapted, path);
    }
    adapt_process(&mut adapted["process"], terminal);
    // The shim sets the sandbox's OOM score itself (runsc 2022 fails writing it for a pod's
    // gofer, and a sandbox holding a pod must take its workload's score, not the pause one).
    if let Some(process) = adapted["process"].as_object_mut() {
        process.remove("oomScoreAdj");
    }
    adapted
}

/// Writes `adapted` over the bundle's config.json when it differs from `spec`.
fn write_spec(bundle: &Path, spec: &serde_json::Value, adapted: &serde_json::Value) -> Result<()> {
    if adapted == spec {
        return Ok(());
    }
    let config = bundle.join("config.json");
    let bytes = serde_json::to_vec(adapted).map_err(|e| ShimError::internal("encode spec", e))?;
    std::fs::write(&config, bytes)
        .map_err(|e| ShimError::internal(format!("write {}", config.display()), e))
}

/// Capabilities narrowed as Linux's execve would (see [`caps`]), and the terminal flag set to
/// what the request's stdio is: containerd's clients may ask for a pty with a process spec
/// that says `terminal: false`, and gVisor's writes to a pty it was not told of fail once the
/// pty's buffer is full.
fn adapt_process(process: &mut serde_json::Value, terminal: bool) {
    caps::narrow_to_exec_semantics(process);
    let asked = process.get("terminal").and_then(|t| t.as_bool());
    if process.is_object() && asked.unwrap_or(false) != terminal {
        process["terminal"] = terminal.into();
    }
}

/// Mounts containerd's rootfs mounts at `<bundle>/rootfs`; false when there were none.
fn mount_rootfs(
    bundle: &Path,
    mounts: &[containerd_shim::protos::types::mount::Mount],
) -> Result<bool> {
    if mounts.is_empty() {
        return Ok(false);
    }
    let target = bundle.join("rootfs");
    std::fs::create_dir_all(&target)
        .map_err(|e| ShimError::internal(format!("create {}", target.display()), e))?;
    for m in mounts {
        let fs_type = (!m.type_.is_empty()).then_some(m.type_.as_str());
        let source = (!m.source.is_empty()).then_some(m.source.as_str());
        if let Err(e) = containerd_shim::mount::mount_rootfs(fs_type, source, &m.options, &target) {
            unmount_rootfs(bundle);
            return Err(ShimError::internal(
                format!("mount {} rootfs at {}", m.type_, target.display()),
                e,
            ));
        }
    }
    Ok(true)
}

pub fn unmount_rootfs(bundle: &Path) {
    let target = bundle.join("rootfs");
    if let Some(t) = target.to_str() {
        if let Err(e) = containerd_shim::mount::umount_recursive(Some(t), libc::MNT_DETACH) {
            log::warn!("unmount {t}: {e}");
        }
    }
}

/// Removes what the shim made for a container: the rootfs mount, the network namespace and
/// the record in the bundle.
pub fn cleanup_bundle(bundle: &Path, rootfs_mounted: bool, netns: Option<&Path>) {
    // The sandbox's runsc root goes with its last container (a pod's others keep it).
    if let Ok(Some(record)) = Record::read(bundle) {
        let _ = std::fs::remove_dir(&record.root);
    }
    if rootfs_mounted {
        unmount_rootfs(bundle);
    }
    if let Some(path) = netns {
        netns::remove(path);
    }
    let _ = std::fs::remove_file(bundle.join(chalk_runtime::bundle::RECORD_FILE));
}

// ---- ttrpc adapter --------------------------------------------------------------------------

fn rpc<T>(r: Result<T>) -> ttrpc::Result<T> {
    r.map_err(|e| {
        log::warn!("{e}");
        e.into()
    })
}

impl Task for TaskService {
    fn create(
        &self,
        _: &TtrpcContext,
        req: CreateTaskRequest,
    ) -> ttrpc::Result<CreateTaskResponse> {
        log::info!("create {}", req.id);
        rpc(TaskService::create(self, &req).map(|pid| {
            let mut resp = CreateTaskResponse::new();
            resp.pid = pid;
            resp
        }))
    }

    fn start(&self, _: &TtrpcContext, req: StartRequest) -> ttrpc::Result<StartResponse> {
        rpc(TaskService::start(self, &req.id, &req.exec_id).map(|pid| {
            let mut resp = StartResponse::new();
            resp.pid = pid;
            resp
        }))
    }

    fn exec(&self, _: &TtrpcContext, req: ExecProcessRequest) -> ttrpc::Result<Empty> {
        rpc(TaskService::exec(self, &req).map(|()| Empty::new()))
    }

    fn kill(&self, _: &TtrpcContext, req: KillRequest) -> ttrpc::Result<Empty> {
        rpc(TaskService::kill(self, &req).map(|()| Empty::new()))
    }

    fn wait(&self, _: &TtrpcContext, req: WaitRequest) -> ttrpc::Result<WaitResponse> {
        rpc(TaskService::wait(self, &req.id, &req.exec_id).map(|exit| {
            let mut resp = WaitResponse::new();
            resp.exit_status = exit.status;
            resp.exited_at = Some(timestamp(exit.at)).into();
            resp
        }))
    }

    fn state(&self, _: &TtrpcContext, req: StateRequest) -> ttrpc::Result<StateResponse> {
        rpc(TaskService::state(self, &req.id, &req.exec_id))
    }

    fn delete(&self, _: &TtrpcContext, req: DeleteRequest) -> ttrpc::Result<DeleteResponse> {
        rpc(
            TaskService::delete(self, &req.id, &req.exec_id).map(|(pid, exit)| {
                let mut resp = DeleteResponse::new();
                resp.pid = pid;
                resp.exit_status = exit.status;
                resp.exited_at = Some(timestamp(exit.at)).into();
                resp
            }),
        )
    }

    fn pids(&self, _: &TtrpcContext, req: PidsRequest) -> ttrpc::Result<PidsResponse> {
        rpc(TaskService::pids(self, &req.id).map(|processes| {
            let mut resp = PidsResponse::new();
            resp.processes = processes;
            resp
        }))
    }

    fn pause(&self, _: &TtrpcContext, req: PauseRequest) -> ttrpc::Result<Empty> {
        rpc(TaskService::pause(self, &req.id).map(|()| Empty::new()))
    }

    fn resume(&self, _: &TtrpcContext, req: ResumeRequest) -> ttrpc::Result<Empty> {
        rpc(TaskService::resume(self, &req.id).map(|()| Empty::new()))
    }

    fn stats(&self, _: &TtrpcContext, req: StatsRequest) -> ttrpc::Result<StatsResponse> {
        rpc(TaskService::stats(self, &req.id).map(|any| {
            let mut resp = StatsResponse::new();
            resp.stats = Some(any).into();
            resp
        }))
    }

    fn update(&self, _: &TtrpcContext, req: UpdateTaskRequest) -> ttrpc::Result<Empty> {
        rpc(TaskService::update(self, &req.id, req.resources.as_ref()).map(|()| Empty::new()))
    }

    fn close_io(&self, _: &TtrpcContext, req: CloseIORequest) -> ttrpc::Result<Empty> {
        rpc(TaskService::close_io(self, &req.id, &req.exec_id).map(|()| Empty::new()))
    }

    fn resize_pty(&self, _: &TtrpcContext, req: ResizePtyRequest) -> ttrpc::Result<Empty> {
        rpc(
            TaskService::resize_pty(self, &req.id, &req.exec_id, req.width, req.height)
                .map(|()| Empty::new()),
        )
    }

    fn connect(&self, _: &TtrpcContext, req: ConnectRequest) -> ttrpc::Result<ConnectResponse> {
        Ok(TaskService::connect(self, &req.id))
    }

    fn shutdown(&self, _: &TtrpcContext, _: ShutdownRequest) -> ttrpc::Result<Empty> {
        TaskService::shutdown(self);
        Ok(Empty::new())
    }

    fn checkpoint(
        &self,
        _: &TtrpcContext,
        req: containerd_shim::api::CheckpointTaskRequest,
    ) -> ttrpc::Result<Empty> {
        rpc(self.checkpoint(&req).map(|_| Empty::new()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn process_terminal_follows_the_request() {
        let mut p = json!({"args": ["sh"], "terminal": false});
        adapt_process(&mut p, true);
        assert_eq!(p["terminal"], json!(true));
        adapt_process(&mut p, false);
        assert_eq!(p["terminal"], json!(false));
        // Absent reads as false: nothing to rewrite.
        let mut p = json!({"args": ["sh"]});
        adapt_process(&mut p, false);
        assert_eq!(p, json!({"args": ["sh"]}));
    }

    #[test]
    fn adapted_spec_is_written_only_when_it_changes() {
        let dir = tempfile::tempdir().unwrap();
        let spec = json!({"process": {"args": ["sh"], "user": {"uid": 0}}});
        write_spec(dir.path(), &spec, &adapted_spec(&spec, None, false)).unwrap();
        assert!(!dir.path().join("config.json").exists());
        write_spec(dir.path(), &spec, &adapted_spec(&spec, None, true)).unwrap();
        let written = read_spec(dir.path()).unwrap();
        assert_eq!(written["process"]["terminal"], json!(true));
    }
}
