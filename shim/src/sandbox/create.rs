//! Create: a container's bundle made ready (spec adapted, network namespace, private files,
//! root filesystem), and its sandbox made by `runsc create`; a restore is only verified here
//! and happens at Start. A failure leaves nothing behind.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Instant,
};

use chalk_labels::{NETWORK_DEFAULT_ANNOTATION, NO_NETWORK_LABEL};
use chalk_runtime::{
    bundle::{self, Record},
    executable, ids,
    lifetime::Lifetime,
    netns, network,
    options::RuntimeOptions,
    spec::Placement,
};
use containerd_shim::protos::{
    events::task::{TaskCreate, TaskIO},
    topics,
    types::mount::Mount,
};
use serde_json::Value;

use super::{launch::Launch, Sandboxes};
use crate::container::{Container, ContainerState, Process};
use crate::{
    errors::{Result, ShimError},
    io::StdioPaths,
    rootfs::{self, RootfsMount},
    runtimes::network_hint,
    unpacked::{containerd_temp_dir, sweep_abandoned, UnpackedCheckpoint, ABANDONED_AFTER},
};

/// What containerd's Create asks for.
pub struct CreateRequest {
    pub id: String,
    pub bundle: PathBuf,
    pub rootfs: Vec<RootfsMount>,
    pub stdio: StdioPaths,
    /// A checkpoint directory to restore at Start (empty: start afresh).
    pub checkpoint: String,
    /// The runtime options, as decoded from the request (or why they could not be).
    pub options: Result<RuntimeOptions>,
}

/// Undoes what Create made for a container, unless it got as far as a running container.
struct Undo<'a> {
    bundle: &'a Path,
    rootfs_mounted: bool,
    netns: Option<PathBuf>,
    armed: bool,
}

impl Drop for Undo<'_> {
    fn drop(&mut self) {
        if self.armed {
            rootfs::cleanup(self.bundle, self.rootfs_mounted, self.netns.as_deref());
        }
    }
}

impl Sandboxes {
    pub fn create(&self, req: CreateRequest) -> Result<u32> {
        let CreateRequest {
            id,
            bundle: bundle_dir,
            rootfs,
            stdio,
            checkpoint,
            options,
        } = req;
        ids::container_id(&id)?;
        if self.inner.containers.lock().unwrap().contains_key(&id) {
            return Err(ShimError::AlreadyExists(format!(
                "container {id} already exists"
            )));
        }
        // containerd's unpacked copy of a checkpoint goes whatever becomes of this request.
        let temp = containerd_temp_dir();
        let mut unpacked = (!checkpoint.is_empty())
            .then(|| UnpackedCheckpoint::of(Path::new(&checkpoint), &temp))
            .flatten();
        if unpacked.is_some() {
            let swept = sweep_abandoned(&temp, ABANDONED_AFTER);
            if swept > 0 {
                log::info!(
                    "removed {swept} unpacked checkpoints of restores that never reached a shim"
                );
            }
        }
        let opts = options?;
        // The options may raise the shim's log level; containerd's -debug is never lowered.
        if let Some(level) = opts.log_level.as_deref().and_then(|l| l.parse().ok()) {
            if level > log::max_level() {
                log::set_max_level(level);
            }
        }
        let id = id.as_str();
        if !bundle_dir.is_absolute() || !bundle_dir.join("config.json").exists() {
            return Err(ShimError::InvalidArgument(format!(
                "bundle {} has no config.json",
                bundle_dir.display()
            )));
        }
        let spec = bundle::read_spec(&bundle_dir).ok_or_else(|| {
            ShimError::InvalidArgument(format!(
                "{}/config.json is not valid JSON",
                bundle_dir.display()
            ))
        })?;
        let invalid = |e: String| ShimError::InvalidArgument(format!("container {id}: {e}"));
        let placement = Placement::of(&spec).map_err(invalid)?;
        let skipped = match &placement {
            Placement::InPod { sandbox_id } => {
                self.check_pod_sandbox(id, sandbox_id, &checkpoint, &spec)?
            }
            Placement::OwnSandbox => false,
        };
        let hooks = chalk_hooks::config::container_hooks(
            &opts.hooks,
            opts.allow_annotation_hooks,
            spec.pointer(&format!(
                "/annotations/{}",
                chalk_hooks::config::HOOKS_ANNOTATION.replace('/', "~1")
            ))
            .and_then(|v| v.as_str()),
        )
        .map_err(|e| invalid(e.to_string()))?;
        let gpu = crate::gpu::of(&spec, &opts.gpu, &opts.runsc_flags().unwrap_or_default());
        let lifetime = lifetime_of(id, &spec).map_err(invalid)?;
        let sandbox_id = chalk_runtime::spec::sandbox_id_of(Some(&spec), id);
        let mut net_request = super::network::request_of(&spec, placement.in_pod())?;
        // chalkctl's default network, where this host can give it; else loopback only.
        let optional =
            chalk_runtime::spec::annotation(&spec, NETWORK_DEFAULT_ANNOTATION) == Some("true");
        let mut no_network_because = None;
        if let Some(request) = net_request.as_ref().filter(|_| optional) {
            if let Some(why) = network::missing_plugin(&opts.network, &request.network) {
                no_network_because = Some(why);
                net_request = None;
            }
        }
        let runtime_for = |network: bool| {
            self.inner.runtimes.runtime_for(
                &opts,
                self.namespace(),
                &bundle_dir,
                id,
                &sandbox_id,
                network,
            )
        };
        let (runtime, features) = match runtime_for(net_request.is_some()) {
            Err(ShimError::FailedPrecondition(why)) if optional && net_request.is_some() => {
                no_network_because = Some(why);
                net_request = None;
                runtime_for(false)?
            }
            made => made?,
        };
        if let Some(why) = &no_network_because {
            log::warn!("container {id}: loopback only, not the default network: {why}");
        }

        // A pod container lives in its sandbox's network, whatever its spec says.
        let network = runtime.global().flag_value("network");
        let netns = (!placement.in_pod() && netns::needs_private_netns(&spec, network))
            .then(|| netns::netns_path(&opts.root, self.namespace(), id));
        // Read before runsc takes them off the namespace's interfaces.
        let joined_addresses = super::network::joined_addresses(&spec, placement.in_pod(), network);
        let mut adapted = bundle::adapted_spec(&spec, netns.as_deref(), stdio.terminal);
        bundle::create_private_dir(&runtime.global().root)?;
        // Written before anything is made, so `shim delete` can undo any of it after a crash.
        let mut record = Record {
            binary: runtime.binary().to_path_buf(),
            root: runtime.global().root.clone(),
            flags: runtime.global().flags.clone(),
            rootfs_mounted: !rootfs.is_empty(),
            netns: netns.clone(),
            unpacked: unpacked.as_ref().map(|u| u.path().to_path_buf()),
            network: None,
        };
        record.write(&bundle_dir)?;
        let mut undo = Undo {
            bundle: &bundle_dir,
            rootfs_mounted: false,
            netns: None,
            armed: true,
        };
        // A restore is verified before anything but the record is made for it.
        let to = super::restore::Into {
            id,
            runtime: &*runtime,
            features: &features,
            spec: &adapted,
            asked: &spec,
            options: &opts.snapshot,
        };
        let restore_from = match checkpoint.as_str() {
            // A pod's sandbox may ask to start from a snapshot (chalk.io/restore-from).
            "" => self.pod_restore_from(&spec, &opts, to, &bundle_dir)?,
            dir => {
                let from = self.verify_restore(Path::new(dir), to)?;
                *from.unpacked.lock().unwrap() = unpacked.take();
                Some(from)
            }
        };
        if let Some(path) = &netns {
            netns::create(path).map_err(|e| {
                ShimError::failed(format!("create network namespace {}", path.display()), e)
            })?;
            undo.netns = netns.clone();
        }
        let attachment = match (&net_request, &netns) {
            (Some(request), Some(_)) => Some(self.attach_network(
                id,
                request,
                &opts,
                &bundle_dir,
                &mut record,
                &mut adapted,
            )?),
            _ => None,
        };
        crate::private_mounts::make_private(&mut adapted, &bundle_dir)
            .map_err(|e| invalid(e.to_string()))?;
        bundle::write_spec(&bundle_dir, &spec, &adapted)?;
        let volatile = runtime.global().root_writes_in_sandbox();
        undo.rootfs_mounted = rootfs::mount(&bundle_dir, &rootfs, volatile)?;
        // runsc would only notice at start; containerd clients expect Create to fail.
        executable::check(&spec, &bundle_dir)?;

        let container = Container {
            id: id.to_string(),
            sandbox_id,
            placement,
            oom_score_adj: chalk_runtime::spec::workload_oom_score_adj(&spec),
            pending_pod_members: Default::default(),
            completed_members: Default::default(),
            skipped,
            bundle: bundle_dir.clone(),
            runtime,
            features,
            rootfs_mounted: undo.rootfs_mounted,
            netns,
            network: Mutex::new(attachment),
            joined_addresses,
            restore_from,
            restored: Default::default(),
            hooks,
            gpu,
            snapshot: opts.snapshot.clone(),
            terminal_signals: Default::default(),
            terminal_gate: Default::default(),
            lifetime,
            state: Mutex::new(ContainerState {
                init: Process::new("", stdio.clone()),
                execs: HashMap::new(),
                waiting: 0,
            }),
            idle: Default::default(),
        };
        let started_at = Instant::now();
        // A restore runs at Start, as with runc: nothing runs until then.
        let pid = if container.restore_from.is_some() {
            0
        } else if skipped {
            // Nothing runs in the sandbox for it: its pid is the sandbox's, as a member's is.
            self.container(&container.sandbox_id)
                .map_or(0, |root| root.state.lock().unwrap().init.pid as i32)
        } else {
            match self.launch_sandbox(&container, &stdio, Launch::Create) {
                Ok((pid, pio)) => {
                    let mut st = container.state.lock().unwrap();
                    st.init.pid = pid as u32;
                    st.init.io = pio;
                    pid
                }
                Err(e) => {
                    // Leave nothing behind: no sandbox, no mount, no record.
                    let _ = container.runtime.delete(id, true);
                    return Err(network_hint(e));
                }
            }
        };
        undo.armed = false;
        if let Some(why) = &no_network_because {
            if let Err(e) = self.records().set_label(id, NO_NETWORK_LABEL, why) {
                log::warn!("container {id}: cannot label why it has no network: {e}");
            }
        }
        let container = Arc::new(container);
        self.inner
            .containers
            .lock()
            .unwrap()
            .insert(id.to_string(), container.clone());
        let event = create_event(id, &bundle_dir, &rootfs, &stdio, pid as u32);
        self.events()
            .publish(topics::TASK_CREATE_EVENT_TOPIC, event);
        // After TaskCreate: a sandbox that already died must not report its exit first. A pod
        // container's exit is watched from its start (its pid is the sandbox's).
        if pid > 0 && !container.in_pod() {
            self.watch_init(&container, pid, started_at);
        }
        Ok(pid as u32)
    }
}

/// A container's lifetime, from its annotations; none for a pod's containers: Kubernetes
/// owns a pod's life (activeDeadlineSeconds) and would only make the pod again.
fn lifetime_of(id: &str, spec: &Value) -> std::result::Result<Option<Lifetime>, String> {
    let lifetime = Lifetime::of_spec(spec)?;
    let cri = spec["annotations"][chalk_runtime::spec::CRI_CONTAINER_TYPE].is_string();
    if lifetime.is_some() && cri {
        log::warn!("container {id}: a lifetime is not kept for a pod's containers");
        return Ok(None);
    }
    Ok(lifetime)
}

fn create_event(
    id: &str,
    bundle: &Path,
    rootfs: &[RootfsMount],
    stdio: &StdioPaths,
    pid: u32,
) -> TaskCreate {
    let mut io = TaskIO::new();
    io.stdin = stdio.stdin.clone();
    io.stdout = stdio.stdout.clone();
    io.stderr = stdio.stderr.clone();
    io.terminal = stdio.terminal;
    let mut ev = TaskCreate::new();
    ev.container_id = id.to_string();
    ev.bundle = bundle.display().to_string();
    ev.rootfs = rootfs
        .iter()
        .map(|m| {
            let mut mount = Mount::new();
            mount.type_ = m.kind.clone();
            mount.source = m.source.clone();
            mount.target = m.target.clone();
            mount.options = m.options.clone();
            mount
        })
        .collect();
    ev.io = Some(io).into();
    ev.pid = pid;
    ev
}
