//! A Kubernetes pod that starts from a snapshot: its sandbox container's spec carries
//! `chalk.io/restore-from` (a pod annotation that CRI passes to the runtime), so its Create
//! becomes a restore of the snapshot's whole sandbox, verified here as any restore is and
//! under the new pod's spec; each of its containers then joins it by name (see `pod.rs`).
//! Off unless the runtime options' `[restore_from]` allow the pod's namespace, and then only
//! for snapshots the namespace owns or was given (`chalk_runtime::pod_restore::policy`): the
//! owner is checked before anything of the snapshot is read, a registry snapshot is pulled
//! (and so judged by the trust policy) every time, and a refusal tells the pod only the rule.

use chalk_runtime::{
    options::RuntimeOptions,
    pod_restore::CRI_SANDBOX_NAMESPACE,
    pod_restore::{
        self,
        policy::{self, Grant, Pod, Refusal},
        MemberRole, RestoreSource, CRI_CONTAINER_NAME, CRI_SANDBOX_NAME,
    },
    spec::{annotation, CRI_CONTAINER_TYPE},
};
use serde_json::Value;
use std::{
    sync::{atomic::Ordering, Arc},
    time::Duration,
};

use chalk_runtime::state::Status;

use super::{restore::Into, Sandboxes};
use crate::container::{Container, RestoreFrom};
use crate::errors::{Result, ShimError};

impl Sandboxes {
    /// The snapshot pod sandbox container `to.id` starts from, verified; None unless its spec
    /// asks for one. A refusal names its reason; nothing has been made yet.
    pub(super) fn pod_restore_from(
        &self,
        spec: &Value,
        opts: &RuntimeOptions,
        to: Into,
        bundle: &std::path::Path,
    ) -> Result<Option<RestoreFrom>> {
        let Some((key, asked)) = pod_restore::asked(spec) else {
            return Ok(None);
        };
        match annotation(spec, CRI_CONTAINER_TYPE) {
            Some("sandbox") => {}
            // CRI passes pod annotations to each container too: only the sandbox restores.
            Some(_) => return Ok(None),
            None => {
                return Err(ShimError::InvalidArgument(format!(
                    "container {}: {key} is a pod annotation (Kubernetes, through CRI); \
                     a container outside a pod starts from a snapshot with `chalkctl fork \
                     --snapshot-id {asked}` or `ctr containers restore`",
                    to.id
                )))
            }
        }
        let namespace = annotation(spec, CRI_SANDBOX_NAMESPACE).unwrap_or_default();
        let name = annotation(spec, CRI_SANDBOX_NAME).unwrap_or(to.id);
        pod_restore::admit(&opts.restore_from, namespace, name)
            .map_err(ShimError::FailedPrecondition)?;
        let source = RestoreSource::parse_from(key, asked).map_err(ShimError::InvalidArgument)?;
        let pod = Pod { namespace, name };
        // The pod's events get the rule; the node's log, what was asked and found.
        let refused = |r: Refusal| {
            log::warn!(
                "pod {namespace}/{name}: {key} {asked:?} refused: {} ({})",
                r.rule,
                r.detail
            );
            ShimError::FailedPrecondition(format!(
                "pod {namespace}/{name} may not start from the snapshot it names ({key}): {}",
                r.rule
            ))
        };
        let grant = policy::decide(&opts.restore_from, key, pod, &source).map_err(refused)?;
        let mut id = source.id().to_string();
        let store = chalk_runtime::snapshot::store::Store::open(&opts.snapshot.store)?;
        match &source {
            RestoreSource::Local { .. } => {
                let owned = grant != Grant::Own
                    || policy::owns_copy(
                        store.refs_of(&id)?.iter().map(|r| r.owner.as_ref()),
                        namespace,
                    );
                if !owned || !store.has_blob(&id) {
                    return Err(refused(Refusal {
                        rule: policy::NOT_OWNED.into(),
                        detail: format!(
                            "{id}: in the store {}: {}; owned by the namespace: {owned}",
                            opts.snapshot.store.display(),
                            store.has_blob(&id)
                        ),
                    }));
                }
            }
            // Pulled every time: the trust policy and the registry's access control decide
            // even when the node has the blobs already (it then fetches only the manifests).
            // A registry's digest may name the snapshot's packed or encrypted form: the id is
            // what the pull says it stored.
            RestoreSource::Remote { reference, .. } => {
                id = self
                    .pull_for_pod(&format!("{reference}@{id}"), namespace, opts, to.id, bundle)
                    .map_err(|e| {
                        ShimError::FailedPrecondition(format!(
                            "pod {namespace}/{name}: snapshot {reference}@{id} \
                             ({key}) could not be pulled to this node: {e}"
                        ))
                    })?;
            }
        }
        let owner = store.open_snapshot(&id)?.manifest.owner;
        policy::check_owner(grant, owner.as_ref(), pod).map_err(refused)?;
        let mut from = self
            .verify_stored(&id, to)
            .map_err(|e| prefixed(&format!("pod {namespace}/{name} from {id}"), e))?;
        from.members_wait = Some(std::time::Duration::from_secs(opts.restore_from.wait_secs));
        log::info!(
            "pod {namespace}/{name}: starts from snapshot {id} ({grant:?}) with containers {:?}",
            from.pod
                .containers
                .iter()
                .map(|m| &m.name)
                .collect::<Vec<_>>()
        );
        Ok(Some(from))
    }

    /// A container joining pod sandbox `sandbox` that starts from a snapshot must be one of
    /// the snapshot's containers, by its CRI name, on the same image by digest, or one the
    /// snapshot had run to completion (an init container), which is skipped: whether it is.
    pub(super) fn check_restored_member(
        &self,
        id: &str,
        sandbox: &Container,
        spec: &Value,
    ) -> Result<bool> {
        let Some(from) = sandbox.restore_from.as_ref() else {
            return Ok(false);
        };
        if from.snapshot.is_empty() && from.pod.containers.is_empty() {
            return Ok(false);
        }
        let refused = |e: String| ShimError::FailedPrecondition(format!("container {id}: {e}"));
        let name = annotation(spec, CRI_CONTAINER_NAME).unwrap_or(id);
        if pod_restore::match_member(&from.snapshot, &from.pod, name).map_err(refused)?
            == MemberRole::Completed
        {
            log::info!(
                "pod sandbox {}: container {name:?} had run to completion in snapshot {}: \
                 skipped",
                sandbox.id,
                from.snapshot
            );
            return Ok(true);
        }
        let member = from.pod.containers.iter().find(|m| m.name == name);
        if let Some(wanted) = member.and_then(|m| m.image_digest.as_deref()) {
            let runs = self.records().image_of(id)?;
            pod_restore::same_image(name, wanted, runs.as_ref().map(|i| i.digest.as_str()))
                .map_err(refused)?;
        }
        Ok(false)
    }
}

impl Sandboxes {
    /// Pod container `c` of a sandbox being restored has joined it.
    pub(super) fn note_joined(&self, c: &Container) {
        let Ok(root) = self.container(&c.sandbox_id) else {
            return;
        };
        if let Some(from) = &root.restore_from {
            from.joined.lock().unwrap().push(super::pod::cri_name(c));
        }
    }

    /// A restored pod sandbox (`root`, process `pid`) whose snapshot's containers have not all
    /// joined within `wait` ends, naming the missing ones: the new pod lacks them.
    pub(super) fn end_unless_joined(&self, root: &Arc<Container>, pid: i32, wait: Duration) {
        let root = root.clone();
        std::thread::spawn(move || {
            std::thread::sleep(wait);
            let Some(from) = &root.restore_from else {
                return;
            };
            if root.pending_pod_members.load(Ordering::SeqCst) == 0
                || root.state.lock().unwrap().init.status == Status::Stopped
            {
                return;
            }
            let expected: Vec<String> =
                from.pod.containers.iter().map(|m| m.name.clone()).collect();
            let joined = from.joined.lock().unwrap().clone();
            log::error!(
                "pod sandbox {}: container(s) {:?} of snapshot {} did not join within {wait:?}: \
                 the pod lacks them (a pod that starts from a snapshot has all its \
                 containers); the sandbox ends",
                root.id,
                pod_restore::missing(&expected, &joined),
                from.snapshot
            );
            crate::container::kill_pid(pid as u32);
        });
    }
}

impl Sandboxes {
    /// Pulls snapshot `reference` (pinned by digest) into this node's store through chalkctl,
    /// with the node's registry configuration (`[restore_from] hosts_dir`). chalkctl checks
    /// this host against the snapshot's manifest before it fetches any memory, checks every
    /// blob by digest, and makes no record of a pull that fails. The id of the snapshot it
    /// stored.
    fn pull_for_pod(
        &self,
        reference: &str,
        namespace: &str,
        opts: &RuntimeOptions,
        id: &str,
        bundle: &std::path::Path,
    ) -> Result<String, String> {
        let hosts_dir = opts.restore_from.hosts_dir.to_string_lossy().to_string();
        // chalkctl pulls into the store these options name (they may have come inline, from
        // CRI): it reads them from the bundle.
        let options = bundle.join(".pull-options.toml");
        let text = toml::to_string(opts).map_err(|e| format!("the runtime options: {e}"))?;
        std::fs::write(&options, text).map_err(|e| format!("{}: {e}", options.display()))?;
        let config = options.to_string_lossy().to_string();
        // chalkctl ends its own pull a little before it would be killed, and cleans up.
        let own_limit = opts
            .restore_from
            .pull_secs
            .saturating_sub(2)
            .max(1)
            .to_string();
        let args = [
            "--config",
            &config,
            "snapshot",
            "pull",
            // Memory arrives while the pod's sandbox restores, where the node allows.
            "--lazy",
            "--hosts-dir",
            &hosts_dir,
            "--pulled-for",
            namespace,
            "--timeout",
            &own_limit,
            reference,
        ];
        let log_file = bundle.join(".pull.log");
        let started = std::time::Instant::now();
        let timeout = Duration::from_secs(opts.restore_from.pull_secs);
        let auth = opts
            .restore_from
            .docker_config
            .as_deref()
            .map(|d| d.as_os_str());
        let env: Vec<(&str, &std::ffi::OsStr)> =
            auth.into_iter().map(|d| ("DOCKER_CONFIG", d)).collect();
        let to = crate::chalkctl::Target {
            address: &self.inner.containerd_address,
            namespace: &self.inner.namespace,
            env: &env,
            memory_max: Some(opts.restore_from.pull_memory_bytes),
        };
        let done = crate::chalkctl::run(&to, &args, &log_file, timeout);
        let _ = std::fs::remove_file(&options);
        let done = done.map_err(|e| e.to_string())?;
        if done.status != 0 {
            // Its own error line (a panic's first line, when it did).
            let said = done
                .said
                .lines()
                .find(|l| l.starts_with("chalkctl:") || l.contains("panicked"))
                .or_else(|| done.said.lines().last())
                .unwrap_or("")
                .to_string();
            return Err(format!(
                "chalkctl snapshot pull: exit {}: {said}",
                done.status
            ));
        }
        // Its own timed steps, for a pull that took long.
        log::info!(
            "container {id}: pulled {reference} in {:?}: {}",
            started.elapsed(),
            done.said.lines().collect::<Vec<_>>().join("; ")
        );
        let stored = done.printed.lines().next().unwrap_or_default();
        if chalk_runtime::snapshot::oci::sha256_hex_of(stored).is_none() {
            return Err(format!(
                "chalkctl snapshot pull printed {stored:?}, not the id of what it stored"
            ));
        }
        Ok(stored.to_string())
    }
}

/// The error with `what` in front, of the same kind.
fn prefixed(what: &str, e: ShimError) -> ShimError {
    match e {
        ShimError::InvalidArgument(m) => ShimError::InvalidArgument(format!("{what}: {m}")),
        ShimError::FailedPrecondition(m) => ShimError::FailedPrecondition(format!("{what}: {m}")),
        other => other,
    }
}
