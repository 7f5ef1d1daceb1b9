//! Which runsc a container runs with, and with which flags: the options' `[runsc_config]`,
//! then what the shim adds where the options say nothing (a root per sandbox, the shared
//! root, in-sandbox seccomp, the memory-backed root overlay, a network this runsc can have
//! here). What a runsc binary can do is probed once per shim and cached on disk. Behind a
//! trait, so that the Task layer runs on a fake in its tests.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{Arc, LazyLock, Mutex},
};

use chalk_runtime::{
    options::RuntimeOptions,
    runsc::{
        probe::{self, NetworkProbe},
        FeatureCache, Features, GlobalArgs, Runsc, SandboxRuntime,
    },
};

use crate::{
    errors::{Result, ShimError},
    reaper::ReaperSpawner,
};

/// Makes the runtime of a container.
pub trait RuntimeFactory: Send + Sync {
    /// The runtime of container `id` (in sandbox `sandbox_id`) of containerd namespace
    /// `namespace`, with bundle `bundle`, under `opts`; and what it can do. `network`: the
    /// sandbox asks for a CNI network of its own (runsc's netstack must then have it).
    fn runtime_for(
        &self,
        opts: &RuntimeOptions,
        namespace: &str,
        bundle: &Path,
        id: &str,
        sandbox_id: &str,
        network: bool,
    ) -> Result<(Arc<dyn SandboxRuntime>, Features)>;
}

/// What each runsc binary supports, probed once per shim process.
static FEATURES: LazyLock<Mutex<HashMap<PathBuf, Features>>> = LazyLock::new(Default::default);

/// The real one: runsc.
pub struct RunscRuntimes;

impl RuntimeFactory for RunscRuntimes {
    fn runtime_for(
        &self,
        opts: &RuntimeOptions,
        namespace: &str,
        bundle: &Path,
        id: &str,
        sandbox_id: &str,
        network: bool,
    ) -> Result<(Arc<dyn SandboxRuntime>, Features)> {
        let (runsc, features) = runsc_for(opts, namespace, bundle, id, sandbox_id, network)?;
        Ok((Arc::new(runsc), features))
    }
}

fn runsc_for(
    opts: &RuntimeOptions,
    namespace: &str,
    bundle: &Path,
    id: &str,
    sandbox_id: &str,
    network: bool,
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
    let shared_root = opts.runsc_root(namespace)?;
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
    // runsc can have it on this host, else loopback only.
    if !opts.runsc_config.contains_key("network") || network {
        probe_network(&runsc, opts, &disk, &mut features)?;
    }
    if network {
        // A CNI network lives in the namespace: only runsc's netstack (`sandbox`) takes it.
        if opts.runsc_config.get("network").and_then(|v| v.as_str()) == Some("host") {
            return Err(ShimError::FailedPrecondition(format!(
                "container {id} asks for a network of its own ({}), but the runtime options \
                 set network = \"host\" under [runsc_config]: run it with --net none, or \
                 change that option",
                chalk_labels::NETWORK_ANNOTATION
            )));
        }
        if features.network_probe == Some(NetworkProbe::NoneOnly) {
            return Err(ShimError::FailedPrecondition(format!(
                "container {id} asks for a network of its own ({}), but this runsc ({}) cannot \
                 give a sandbox one on this host (it takes any network namespace for the host's \
                 and refuses to start): run it with --net none, or install a runsc from 2024 \
                 on",
                chalk_labels::NETWORK_ANNOTATION,
                binary.display()
            )));
        }
        runsc.set_flag("network", "sandbox");
    } else if !opts.runsc_config.contains_key("network")
        && features.network_probe == Some(NetworkProbe::NoneOnly)
    {
        runsc.add_flag("--network=none");
    }
    if let Some(flag) = opts.added_overlay_flag(&features) {
        runsc.add_flag(flag);
    }
    FEATURES
        .lock()
        .unwrap()
        .insert(binary.clone(), features.clone());
    log::info!(
        "container {id}: runsc {} ({}); resource updates via {}",
        binary.display(),
        features.version,
        if features.has_command("update") {
            "runsc update"
        } else {
            "the sandbox cgroup"
        }
    );
    Ok((runsc, features))
}

/// runsc's refusal of a network it cannot have on this host, with what to do about it.
pub fn network_hint(e: ShimError) -> ShimError {
    match &e {
        ShimError::Runtime(r) if probe::refuses_network(r) => {
            ShimError::FailedPrecondition(format!(
                "{e} (this runsc cannot give a sandbox a network of its own on this host: set \
                 network = \"none\" under [runsc_config] in the runtime options, or leave \
                 network out for the shim to pick what works, or install a runsc from 2024 on)"
            ))
        }
        _ => e,
    }
}

/// Finds out once (per binary while the cache lasts: under the options' root, and /run/chalk
/// is a tmpfs, so once per boot) whether this runsc can give a sandbox a network of its own
/// here; with no network chosen in the options, runsc's default stands where it can, else
/// loopback only.
fn probe_network(
    runsc: &Runsc,
    opts: &RuntimeOptions,
    disk: &FeatureCache,
    features: &mut Features,
) -> Result<()> {
    if features.network_probe.is_some() {
        return Ok(());
    }
    let binary = runsc.binary().to_path_buf();
    let work = opts.root.join(format!(".probe-{}", std::process::id()));
    features.network_probe = probe::network(runsc, &work)?;
    if features.network_probe.is_some() {
        disk.put(&binary, features);
    }
    if features.network_probe == Some(NetworkProbe::NoneOnly) {
        log::warn!(
            "{} cannot give sandboxes a network of their own on this host: they get \
             loopback only (network = \"none\"); set network under [runsc_config] \
             in the runtime options to choose",
            binary.display()
        );
    }
    Ok(())
}
