//! agent-sandbox's Sandboxes on chalk: a suspend keeps the pod's memory, a resume restores
//! it, and a deleted Sandbox takes its snapshots with it. Each node's agent watches the pods
//! on its node that a Sandbox owns:
//! - **running**: it arms the shim's hold on the pod's stop (`chalk.io/hold-stop`);
//! - **being deleted**: if its Sandbox was suspended, the agent snapshots the pod while its
//!   stop is held, pushes the snapshot to the Sandbox's repository, records the push in the
//!   agents' own record of the Sandbox (`records`), writes `chalk.io/resume-from` where the
//!   next pod's metadata comes from, and only then lets the stop go through as a SIGKILL.
//!   Otherwise the stop goes through at once. A failure lets the stop go through and marks
//!   the Sandbox `chalk.io/suspend-failed`;
//! - **Ready again**: a pod that resumed gets `chalk.io/resumed-from`, and the agent clears
//!   `resume-from`, so that a later crash cannot bring back stale memory. A pod that started
//!   fresh after a failed suspend gets `chalk.io/started-fresh` with why.
//!
//! A Sandbox deleted takes its copies on this node with it (those pulled from its own
//! repository for its namespace); the registry's are the cluster agent's (`cluster`), which
//! keeps the finalizer and the retention. agent-sandbox itself is unchanged: the agent only
//! reads it and writes metadata.

use std::{
    collections::HashSet,
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime},
};

use chalk_labels::RESUME_FROM;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::{
    api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams},
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
    records,
    sandbox::{self, Going},
};

/// On a snapshot a suspend took: `namespace/name` of its Sandbox.
pub const SANDBOX_LABEL: &str = "sandbox";

/// What a node's agent does with Sandboxes.
#[derive(Clone)]
pub struct Settings {
    /// `host[:port]/path`: a Sandbox's snapshots go to `PREFIX/NAMESPACE/NAME`.
    pub suspend_to: String,
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
    futures::join!(log_failures(pods), log_failures(sandboxes), sweep(&ctx));
}

/// How often the copies of Sandboxes that are gone are looked for.
const SWEEP: Duration = Duration::from_secs(300);

/// Removes, every [`SWEEP`], the copies on this node pulled from a Sandbox's own repository
/// whose Sandbox is gone (a deletion this agent did not see, while it was down).
async fn sweep(ctx: &Context) {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => return log::warn!("no sweeps: SIGTERM cannot be watched ({e})"),
    };
    loop {
        if let Err(e) = sweep_once(ctx).await {
            log::warn!("sweeping the copies of deleted Sandboxes: {e}");
        }
        // The controllers end on these too.
        tokio::select! {
            _ = tokio::time::sleep(SWEEP) => {}
            _ = tokio::signal::ctrl_c() => return,
            _ = term.recv() => return,
        }
    }
}

async fn sweep_once(ctx: &Context) -> Result<(), Error> {
    let copies = on_node(&ctx.node, |n| n.pulled_copies()).await?;
    for (record, from, of) in copies {
        let Some((ns, name)) = sandbox::owner_of_repository(&ctx.settings.suspend_to, &from) else {
            continue;
        };
        if of.as_deref() != Some(ns.as_str()) || ctx.sandboxes(&ns).get_opt(&name).await?.is_some()
        {
            continue;
        }
        on_node(&ctx.node, move |n| n.delete(&record)).await?;
        log::info!("{ns}/{name} is gone: its copy {from} left this node");
    }
    Ok(())
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

/// Snapshot, push, recorded, resume-from written, then the stop as SIGKILL: what the event
/// says.
async fn suspend(
    ctx: &Context,
    ns: &str,
    name: &str,
    sb: &DynamicObject,
    id: &str,
) -> Result<String, Error> {
    let api = ctx.sandboxes(ns);
    let key = format!("{ns}/{name}");
    let (sandbox_id, of) = (id.to_string(), name.to_string());
    let began = Instant::now();
    let taken = on_node(&ctx.node, move |n| {
        n.snapshot_labelled(&sandbox_id, SANDBOX_LABEL, &key, Some(&of))
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
    let (snap, key) = (taken.id.clone(), format!("{ns}/{name}"));
    let _ = on_node(&ctx.node, move |n| {
        n.delete_taken(&snap, SANDBOX_LABEL, &key)
    })
    .await;
    let pushed = pushed?;
    // Recorded before anything points at it: what retention and cleanup may remove.
    let record = records::Record {
        namespace: ns.to_string(),
        name: name.to_string(),
        uid: sb.uid().unwrap_or_default(),
        repository: repo.clone(),
        pushed: Vec::new(),
    };
    if let Err(e) = record_push(ctx, record, &pushed).await {
        let (gone, access) = (pushed.clone(), ctx.node.access.clone());
        let _ = tokio::task::spawn_blocking(move || {
            chalk_client::remote::prune::remove(&access, std::slice::from_ref(&gone))
        })
        .await;
        return Err(e);
    }
    let value = serde_json::to_value(sb).unwrap_or_default();
    let claim = sandbox::claim_of(&value).map(String::from);
    write_resume(ctx, ns, name, claim.as_deref(), Some(&pushed)).await?;
    // For the Sandbox's readers: never what anything is removed by.
    let listed = sandbox::appended(
        sb.annotations().get(sandbox::SNAPSHOTS).map(String::as_str),
        &pushed,
        LISTED,
    );
    let patch = json!({"metadata": {"annotations": {
        sandbox::SNAPSHOTS: listed,
        sandbox::SUSPEND_FAILED: null,
    }}});
    merge(&api, name, &patch).await?;
    release(ctx, id, "kill").await;
    Ok(format!(
        "memory kept: {pushed} ({} bytes; snapshot {snapshot_ms} ms, push {push_ms} ms)",
        taken.size
    ))
}

/// How many of a Sandbox's snapshots its annotation lists.
const LISTED: usize = 5;

/// Adds `pushed` to the agents' record of the Sandbox `fresh` describes (made if none), with
/// the record's latest version: another node's agent may write it too.
async fn record_push(ctx: &Context, fresh: records::Record, pushed: &str) -> Result<(), Error> {
    let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), records::NAMESPACE);
    let name = records::name_of(&fresh.namespace, &fresh.name);
    for _ in 0..5 {
        let existing = api.get_opt(&name).await?;
        let done = match &existing {
            None => {
                let cm = fresh.clone().with(pushed).to_config_map();
                api.create(&PostParams::default(), &cm).await.map(drop)
            }
            Some(cm) => {
                let record = records::Record::from_config_map(cm)
                    .filter(|r| r.uid == fresh.uid)
                    .ok_or_else(|| {
                        Error::Node(format!(
                            "the record {name} is of an earlier Sandbox {}/{}, whose snapshots \
                             the cluster agent has not removed yet: suspend again later",
                            fresh.namespace, fresh.name
                        ))
                    })?;
                let mut updated = record.with(pushed).to_config_map();
                updated.metadata.resource_version = cm.metadata.resource_version.clone();
                api.replace(&name, &PostParams::default(), &updated)
                    .await
                    .map(drop)
            }
        };
        match done {
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            other => return other.map_err(Error::from),
        }
    }
    Err(Error::Node(format!(
        "the record {name} kept changing: the push is not recorded"
    )))
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

/// A Sandbox being deleted takes its copies on this node with it: those pulled from its own
/// repository for its namespace, by their records' full digests. The registry's are the
/// cluster agent's.
async fn reconcile_sandbox(sb: Arc<DynamicObject>, ctx: Arc<Context>) -> Result<Action, Error> {
    if sb.meta().deletion_timestamp.is_none() {
        return Ok(Action::await_change());
    }
    let (ns, name) = (sb.namespace().unwrap_or_default(), sb.name_any());
    let repo = sandbox::repository(&ctx.settings.suspend_to, &ns, &name);
    let of = ns.clone();
    let gone = on_node(&ctx.node, move |n| n.delete_pulled_from(&repo, &of)).await?;
    if gone > 0 {
        log::info!("{ns}/{name}: deleted; its {gone} copies on this node went with it");
    }
    Ok(Action::await_change())
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
