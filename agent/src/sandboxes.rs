//! agent-sandbox's Sandboxes on chalk: a suspend keeps the pod's memory, a resume restores
//! it, and a deleted Sandbox takes its snapshots with it. Each node's agent watches the pods
//! on its node that a Sandbox owns:
//! - **running**: it arms the shim's hold on the pod's stop (`chalk.io/hold-stop`);
//! - **being deleted**: if its Sandbox was suspended, the agent snapshots the pod while its
//!   stop is held, pushes the snapshot to the Sandbox's repository, writes
//!   `chalk.io/resume-from` where the next pod's metadata comes from, and only then lets
//!   the stop go through as a SIGKILL. Otherwise the stop goes through at once. A failure
//!   lets the stop go through and marks the Sandbox `chalk.io/suspend-failed`;
//! - **Ready again**: a pod that resumed gets `chalk.io/resumed-from`, and the agent clears
//!   `resume-from`, so that a later crash cannot bring back stale memory. A pod that started
//!   fresh after a failed suspend gets `chalk.io/started-fresh` with why.
//!
//! agent-sandbox itself is unchanged: the agent only reads it and writes metadata.

use std::{
    collections::HashSet,
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime},
};

use chalk_labels::RESUME_FROM;
use k8s_openapi::api::core::v1::Pod;
use kube::{
    api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams},
    runtime::{
        controller::{Action, Controller},
        events::{Event as KubeEvent, EventType, Recorder, Reporter},
        watcher,
    },
    Api, Resource, ResourceExt,
};
use serde_json::{json, Value};

use crate::{
    node::Node,
    reconcile::{log_failures, on_node, retry_later, Error},
    sandbox::{self, Going},
};

/// On a snapshot a suspend took: `namespace/name` of its Sandbox.
pub const SANDBOX_LABEL: &str = "sandbox";

/// What a node's agent does with Sandboxes.
#[derive(Clone)]
pub struct Settings {
    /// `host[:port]/path`: a Sandbox's snapshots go to `PREFIX/NAMESPACE/NAME`.
    pub suspend_to: String,
    /// How many snapshots of a Sandbox the registry keeps.
    pub keep: usize,
    /// The RuntimeClasses whose handler is chalk-shim.
    pub runtime_classes: Vec<String>,
}

pub struct Context {
    pub client: kube::Client,
    pub node_name: String,
    pub node: Node,
    pub settings: Settings,
    recorder: Recorder,
    sandboxes: ApiResource,
    claims: ApiResource,
    /// Pods (by UID) whose stop this agent armed, and those whose deletion it took up.
    armed: Mutex<HashSet<String>>,
    taken_up: Mutex<HashSet<String>>,
}

impl Context {
    pub fn new(client: kube::Client, node_name: String, node: Node, settings: Settings) -> Self {
        let reporter = Reporter {
            controller: "chalk-agent".into(),
            instance: Some(node_name.clone()),
        };
        let gvk = |group: &str, kind: &str| {
            ApiResource::from_gvk(&GroupVersionKind::gvk(group, sandbox::VERSION, kind))
        };
        Context {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            node_name,
            node,
            settings,
            sandboxes: gvk(sandbox::SANDBOX_GROUP, "Sandbox"),
            claims: gvk(sandbox::EXTENSIONS_GROUP, "SandboxClaim"),
            armed: Default::default(),
            taken_up: Default::default(),
        }
    }

    fn sandboxes(&self, ns: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), ns, &self.sandboxes)
    }
}

/// Watches this node's pods, and every Sandbox for its deletion, until SIGTERM or Ctrl-C.
pub async fn run(ctx: Arc<Context>) {
    let pods: Api<Pod> = Api::all(ctx.client.clone());
    let on_node = watcher::Config::default().fields(&format!("spec.nodeName={}", ctx.node_name));
    let pods = Controller::new(pods, on_node).shutdown_on_signal().run(
        reconcile_pod,
        retry_later,
        ctx.clone(),
    );
    let all: Api<DynamicObject> = Api::all_with(ctx.client.clone(), &ctx.sandboxes);
    let sandboxes = Controller::new_with(all, watcher::Config::default(), ctx.sandboxes.clone())
        .shutdown_on_signal()
        .run(reconcile_sandbox, retry_later, ctx.clone());
    futures::join!(log_failures(pods), log_failures(sandboxes));
}

async fn reconcile_pod(pod: Arc<Pod>, ctx: Arc<Context>) -> Result<Action, Error> {
    let value = serde_json::to_value(pod.as_ref()).unwrap_or_default();
    let Some(name) = sandbox::sandbox_of(&value).map(String::from) else {
        return Ok(Action::await_change());
    };
    let class = value["spec"]["runtimeClassName"].as_str().unwrap_or("");
    if !ctx.settings.runtime_classes.iter().any(|c| c == class) {
        return Ok(Action::await_change());
    }
    let ns = pod.namespace().unwrap_or_default();
    let uid = pod.uid().unwrap_or_default();
    if pod.meta().deletion_timestamp.is_some() {
        if !ctx.taken_up.lock().unwrap().insert(uid.clone()) {
            return Ok(Action::await_change());
        }
        let found = on_node(&ctx.node, move |n| n.sandbox_of(&uid)).await?;
        if let Some(id) = found {
            going(&ctx, &ns, &name, &pod, &id).await;
        }
        return Ok(Action::await_change());
    }
    if value["status"]["phase"] != "Running" {
        return Ok(Action::await_change());
    }
    if !ctx.armed.lock().unwrap().contains(&uid) {
        let of = uid.clone();
        match on_node(&ctx.node, move |n| n.sandbox_of(&of)).await? {
            Some(id) => {
                on_node(&ctx.node, move |n| n.hold_stop(&id, "arm")).await?;
                ctx.armed.lock().unwrap().insert(uid);
            }
            // Running in the API before its sandbox is up here: look again shortly.
            None => return Ok(Action::requeue(Duration::from_secs(1))),
        }
    }
    if sandbox::is_ready(&value) {
        started(&ctx, &ns, &name, &pod, &value).await?;
    }
    Ok(Action::await_change())
}

/// A Sandbox's pod on this node is being deleted: snapshot it first if its Sandbox was
/// suspended, and let its stop go through.
async fn going(ctx: &Context, ns: &str, name: &str, pod: &Pod, id: &str) {
    let sb = match ctx.sandboxes(ns).get_opt(name).await {
        Ok(sb) => sb,
        Err(e) => {
            log::warn!("{ns}/{name}: the Sandbox could not be read ({e}): its pod stops");
            None
        }
    };
    let sb_value = sb
        .as_ref()
        .map(|s| serde_json::to_value(s).unwrap_or_default());
    match sandbox::why_going(sb_value.as_ref()) {
        Going::Stop(why) => {
            log::info!("{ns}/{}: {why}: its stop goes through", pod.name_any());
            release(ctx, id, "release").await;
        }
        Going::Suspend => {
            let sb = sb.expect("a suspend has its Sandbox");
            let started = Instant::now();
            match suspend(ctx, ns, name, &sb, id).await {
                Ok(note) => {
                    let note = format!(
                        "{note}; pod stopped {} ms after its delete was seen",
                        started.elapsed().as_millis()
                    );
                    log::info!("{ns}/{name}: suspended: {note}");
                    publish(ctx, &sb, EventType::Normal, "Suspended", &note).await;
                }
                Err(e) => {
                    let why = format!(
                        "its memory was not kept ({e}): the Sandbox's next pod starts fresh"
                    );
                    log::warn!("{ns}/{name}: {why}");
                    release(ctx, id, "release").await;
                    let patch =
                        json!({"metadata": {"annotations": {sandbox::SUSPEND_FAILED: why}}});
                    if let Err(e) = merge(&ctx.sandboxes(ns), name, &patch).await {
                        log::warn!("{ns}/{name}: mark the failed suspend: {e}");
                    }
                    publish(ctx, &sb, EventType::Warning, "SuspendFailed", &why).await;
                }
            }
        }
    }
}

/// Snapshot, push, resume-from written, then the stop as SIGKILL: what the event says.
async fn suspend(
    ctx: &Context,
    ns: &str,
    name: &str,
    sb: &DynamicObject,
    id: &str,
) -> Result<String, Error> {
    let api = ctx.sandboxes(ns);
    ensure_finalizer(&api, name).await?;
    let key = format!("{ns}/{name}");
    let sandbox_id = id.to_string();
    let began = Instant::now();
    let taken = on_node(&ctx.node, move |n| {
        n.snapshot_labelled(&sandbox_id, SANDBOX_LABEL, &key)
    })
    .await?;
    let snapshot_ms = began.elapsed().as_millis();
    let repo = sandbox::repository(&ctx.settings.suspend_to, ns, name);
    let millis = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis();
    let target = format!("{repo}:{}", chalk_client::remote::prune::timed_tag(millis));
    let (snap, pushed_at) = (taken.id.clone(), Instant::now());
    let pushed = on_node(&ctx.node, move |n| n.push(&snap, &target)).await;
    let push_ms = pushed_at.elapsed().as_millis();
    // The node keeps no copy either way: the registry's is the one a resume pulls.
    let snap = taken.id.clone();
    let _ = on_node(&ctx.node, move |n| n.delete(&snap)).await;
    let pushed = pushed?;
    let value = serde_json::to_value(sb).unwrap_or_default();
    let claim = sandbox::claim_of(&value).map(String::from);
    write_resume(ctx, ns, name, claim.as_deref(), Some(&pushed)).await?;
    let keep = ctx.settings.keep;
    let listed = sandbox::appended(
        sb.annotations().get(sandbox::SNAPSHOTS).map(String::as_str),
        &pushed,
        keep,
    );
    let patch = json!({"metadata": {"annotations": {
        sandbox::SNAPSHOTS: listed,
        sandbox::SUSPEND_FAILED: null,
    }}});
    merge(&api, name, &patch).await?;
    release(ctx, id, "kill").await;
    let pruned = on_node(&ctx.node, move |n| n.prune(&repo, keep)).await;
    let pruned = match pruned {
        Ok(gone) if gone.is_empty() => String::new(),
        Ok(gone) => format!("; {} older snapshots removed (keeping {keep})", gone.len()),
        Err(e) => format!("; older snapshots not removed: {e}"),
    };
    Ok(format!(
        "memory kept: {pushed} ({} bytes; snapshot {snapshot_ms} ms, push {push_ms} ms){pruned}",
        taken.size
    ))
}

/// Sets (or clears) the snapshot the Sandbox's next pod resumes from, where that pod's
/// metadata comes from: the claim that owns the Sandbox, else the Sandbox's pod template.
async fn write_resume(
    ctx: &Context,
    ns: &str,
    name: &str,
    claim: Option<&str>,
    value: Option<&str>,
) -> Result<(), Error> {
    let patch = sandbox::resume_patch(claim.is_some(), value);
    match claim {
        Some(c) => {
            let claims: Api<DynamicObject> =
                Api::namespaced_with(ctx.client.clone(), ns, &ctx.claims);
            merge(&claims, c, &patch).await
        }
        None => merge(&ctx.sandboxes(ns), name, &patch).await,
    }
}

/// A Sandbox's pod is Ready on this node: say whether it resumed, or started fresh after a
/// failed suspend, and clear what made it resume.
async fn started(
    ctx: &Context,
    ns: &str,
    name: &str,
    pod: &Pod,
    value: &Value,
) -> Result<(), Error> {
    let annotations = &value["metadata"]["annotations"];
    if annotations[sandbox::RESUMED_FROM].is_string()
        || annotations[sandbox::STARTED_FRESH].is_string()
    {
        return Ok(());
    }
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let Some(sb) = ctx.sandboxes(ns).get_opt(name).await? else {
        return Ok(());
    };
    let sb_value = serde_json::to_value(&sb).unwrap_or_default();
    if let Some(from) = annotations[RESUME_FROM].as_str() {
        let patch = json!({"metadata": {"annotations": {sandbox::RESUMED_FROM: from}}});
        merge(&pods, &pod.name_any(), &patch).await?;
        let claim = sandbox::claim_of(&sb_value).map(String::from);
        write_resume(ctx, ns, name, claim.as_deref(), None).await?;
        let note = format!(
            "pod {} resumed from {from} on node {}",
            pod.name_any(),
            ctx.node_name
        );
        log::info!("{ns}/{name}: {note}");
        publish(ctx, &sb, EventType::Normal, "Resumed", &note).await;
    } else if let Some(why) = sb.annotations().get(sandbox::SUSPEND_FAILED).cloned() {
        let patch = json!({"metadata": {"annotations": {sandbox::STARTED_FRESH: why}}});
        merge(&pods, &pod.name_any(), &patch).await?;
        let patch = json!({"metadata": {"annotations": {sandbox::SUSPEND_FAILED: null}}});
        merge(&ctx.sandboxes(ns), name, &patch).await?;
        let note = format!("pod {} started fresh: {why}", pod.name_any());
        publish(ctx, &sb, EventType::Warning, "StartedFresh", &note).await;
    }
    Ok(())
}

/// A Sandbox being deleted takes its snapshots with it: the registry's (any agent), and any
/// copy on this node.
async fn reconcile_sandbox(sb: Arc<DynamicObject>, ctx: Arc<Context>) -> Result<Action, Error> {
    if sb.meta().deletion_timestamp.is_none()
        || !sb.finalizers().iter().any(|f| f == sandbox::FINALIZER)
    {
        return Ok(Action::await_change());
    }
    let (ns, name) = (sb.namespace().unwrap_or_default(), sb.name_any());
    let repo = sandbox::repository(&ctx.settings.suspend_to, &ns, &name);
    let gone = on_node(&ctx.node, move |n| n.prune(&repo, 0)).await?;
    let listed: Vec<String> = sb
        .annotations()
        .get(sandbox::SNAPSHOTS)
        .map(|l| l.split(',').map(String::from).collect())
        .unwrap_or_default();
    let local = on_node(&ctx.node, move |n| {
        let mut removed = 0;
        for r in &listed {
            if let Some((_, digest)) = r.rsplit_once('@') {
                if n.delete(digest).unwrap_or(false) {
                    removed += 1;
                }
            }
        }
        Ok(removed)
    })
    .await?;
    let finalizers: Vec<&String> = sb
        .finalizers()
        .iter()
        .filter(|f| *f != sandbox::FINALIZER)
        .collect();
    let patch = json!({"metadata": {
        "finalizers": finalizers,
        "resourceVersion": sb.resource_version(),
    }});
    match merge(&ctx.sandboxes(&ns), &name, &patch).await {
        Ok(()) => log::info!(
            "{ns}/{name}: deleted with its {} snapshots in the registry ({local} on this node)",
            gone.len()
        ),
        // Another node's agent got there first.
        Err(Error::Kube(kube::Error::Api(e))) if e.code == 409 || e.code == 404 => {}
        Err(e) => return Err(e),
    }
    Ok(Action::await_change())
}

/// Adds chalk's finalizer to the Sandbox, against its latest version: its controller and
/// users change it too, so a conflict is looked at again rather than failing a suspend.
async fn ensure_finalizer(api: &Api<DynamicObject>, name: &str) -> Result<(), Error> {
    let mut tries = 0;
    loop {
        let sb = api.get(name).await?;
        if sb.finalizers().iter().any(|f| f == sandbox::FINALIZER) {
            return Ok(());
        }
        let mut finalizers = sb.finalizers().to_vec();
        finalizers.push(sandbox::FINALIZER.into());
        let patch = json!({"metadata": {
            "finalizers": finalizers,
            "resourceVersion": sb.resource_version(),
        }});
        match merge(api, name, &patch).await {
            Err(Error::Kube(kube::Error::Api(e))) if e.code == 409 && tries < 5 => tries += 1,
            done => return done,
        }
    }
}

async fn release(ctx: &Context, id: &str, verdict: &'static str) {
    let id = id.to_string();
    if let Err(e) = on_node(&ctx.node, move |n| n.hold_stop(&id, verdict)).await {
        log::warn!(
            "the hold on the stop could not be released ({e}): it ends at the pod's SIGKILL"
        );
    }
}

async fn merge<K>(api: &Api<K>, name: &str, patch: &Value) -> Result<(), Error>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await?;
    Ok(())
}

async fn publish(ctx: &Context, sb: &DynamicObject, type_: EventType, reason: &str, note: &str) {
    let event = KubeEvent {
        type_,
        reason: reason.into(),
        note: Some(note.chars().take(1000).collect()),
        action: "Suspend".into(),
        secondary: None,
    };
    if let Err(e) = ctx
        .recorder
        .publish(&event, &sb.object_ref(&ctx.sandboxes))
        .await
    {
        log::warn!("{}: event {reason}: {e}", sb.name_any());
    }
}
