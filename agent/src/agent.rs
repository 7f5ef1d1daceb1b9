//! The node agent: every node runs one; each carries out the PodSnapshots whose pods run on
//! its node (kube-runtime's controller, a finalizer per PodSnapshot), and reports on the
//! PodSnapshot's status and events. A failure leaves the pod running, the PodSnapshot Failed
//! with why, and no snapshot on the node.

use std::{sync::Arc, time::Duration, time::Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::{
    api::{DeleteParams, Patch, PatchParams},
    runtime::{
        controller::{Action, Controller},
        events::{Event as KubeEvent, EventType, Recorder, Reporter},
        finalizer::{finalizer, Event},
        watcher,
    },
    Api, Resource, ResourceExt,
};
use serde_json::json;

use crate::{
    crd::{Phase, PodSnapshot, PodSnapshotStatus, Then, Timings, FINALIZER},
    node::Node,
    pods,
    reconcile::{log_failures, on_node, retry_later, Error},
};

pub struct Context {
    pub client: kube::Client,
    /// This node's name, as its kubelet registers it.
    pub node_name: String,
    pub node: Node,
    pub recorder: Recorder,
    /// PodSnapshots (by UID) this agent has taken up: the controller's cache may show one
    /// without the status this agent has since written.
    taken_up: std::sync::Mutex<std::collections::HashSet<String>>,
}

impl Context {
    pub fn new(client: kube::Client, node_name: String, node: Node) -> Self {
        let reporter = Reporter {
            controller: "chalk-agent".into(),
            instance: Some(node_name.clone()),
        };
        Context {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            node_name,
            node,
            taken_up: Default::default(),
        }
    }
}

/// Runs the agent until SIGTERM or Ctrl-C.
pub async fn run(ctx: Arc<Context>) {
    let api: Api<PodSnapshot> = Api::all(ctx.client.clone());
    let results = Controller::new(api, watcher::Config::default())
        .shutdown_on_signal()
        .run(reconcile, retry_later, ctx);
    log_failures(results).await;
}

async fn reconcile(ps: Arc<PodSnapshot>, ctx: Arc<Context>) -> Result<Action, Error> {
    let ns = ps.namespace().unwrap_or_default();
    let api: Api<PodSnapshot> = Api::namespaced(ctx.client.clone(), &ns);
    let status = ps.status.clone().unwrap_or_default();
    let owner = match &status.node {
        Some(n) => Some(n.clone()),
        None => {
            let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
            match pods.get_opt(&ps.spec.pod_name).await? {
                Some(pod) => pod.spec.and_then(|s| s.node_name),
                None if status.phase.is_none() && ps.meta().deletion_timestamp.is_none() => {
                    // No node will take it: any agent says so (they would all say the same).
                    let why = format!(
                        "pod {ns}/{} does not exist: create the PodSnapshot for a running pod",
                        ps.spec.pod_name
                    );
                    fail(&ctx, &api, &ps, &why).await?;
                    return Ok(Action::await_change());
                }
                None => None,
            }
        }
    };
    match owner {
        Some(n) if n == ctx.node_name => {}
        // Another node's, or a pod not scheduled yet. A copy pulled here goes with it.
        Some(_) => {
            if ps.meta().deletion_timestamp.is_some() {
                drop_pulled_copy(&ctx, &ps).await;
            }
            return Ok(Action::await_change());
        }
        None => return Ok(Action::requeue(Duration::from_secs(2))),
    }
    finalizer(&api, FINALIZER, ps, |event| async {
        match event {
            Event::Apply(ps) => apply(&ctx, &api, &ps).await,
            Event::Cleanup(ps) => cleanup(&ctx, &ps).await,
        }
    })
    .await
    .map_err(|e| match e {
        kube::runtime::finalizer::Error::ApplyFailed(e)
        | kube::runtime::finalizer::Error::CleanupFailed(e) => e,
        other => Error::Node(other.to_string()),
    })
}

async fn apply(ctx: &Context, api: &Api<PodSnapshot>, ps: &PodSnapshot) -> Result<Action, Error> {
    let status = ps.status.clone().unwrap_or_default();
    if ctx
        .taken_up
        .lock()
        .unwrap()
        .contains(&ps.uid().unwrap_or_default())
    {
        return Ok(Action::await_change());
    }
    match status.phase {
        Some(Phase::Completed) | Some(Phase::Failed) => return Ok(Action::await_change()),
        Some(Phase::InProgress) => {
            // Taken up by this node's agent before it restarted: what it left is removed.
            let why = "the node agent restarted while taking this snapshot: delete the \
                       PodSnapshot and create it again";
            remove_taken(ctx, ps).await;
            fail(ctx, api, ps, why).await?;
            return Ok(Action::await_change());
        }
        None => {}
    }
    let uid = ps.uid().unwrap_or_default();
    if !ctx.taken_up.lock().unwrap().insert(uid) {
        return Ok(Action::await_change());
    }
    match take(ctx, api, ps).await {
        Ok(()) => Ok(Action::await_change()),
        Err(e) => {
            remove_taken(ctx, ps).await;
            fail(ctx, api, ps, &e.to_string()).await?;
            Ok(Action::await_change())
        }
    }
}

/// `namespace/name` of a PodSnapshot: the label on its snapshots.
fn key(ps: &PodSnapshot) -> String {
    format!("{}/{}", ps.namespace().unwrap_or_default(), ps.name_any())
}

async fn take(ctx: &Context, api: &Api<PodSnapshot>, ps: &PodSnapshot) -> Result<(), Error> {
    let started = Instant::now();
    let ns = ps.namespace().unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let pod_name = ps.spec.pod_name.clone();
    let pod = pods.get(&pod_name).await?;
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let sandbox = on_node(&ctx.node, move |n| n.sandbox_of(&uid))
        .await?
        .ok_or_else(|| {
            Error::Node(format!(
                "pod {ns}/{pod_name} has no running chalk-shim sandbox on node {}: only pods \
                 of a RuntimeClass whose handler is chalk-shim can be snapshotted",
                ctx.node_name
            ))
        })?;
    patch_status(
        api,
        ps,
        json!({"phase": Phase::InProgress, "node": ctx.node_name}),
    )
    .await?;
    // The node's credentials go only where the administrator lets this namespace push.
    if let Some(to) = ps.spec.push_to.clone() {
        let of = ns.clone();
        on_node(&ctx.node, move |n| {
            crate::push_policy::check(&n.options()?.restore_from, &of, &to)
        })
        .await?;
    }
    let label = key(ps);
    let taken = on_node(&ctx.node, move |n| n.snapshot(&sandbox, &label)).await?;
    let snapshot_ms = started.elapsed().as_millis() as u64;
    publish(
        ctx,
        ps,
        EventType::Normal,
        "Snapshotted",
        &format!("{} ({} bytes) in {snapshot_ms} ms", taken.id, taken.size),
    )
    .await;
    let (restore_from, push_ms) = match ps.spec.push_to.clone() {
        Some(to) => {
            let pushed_at = Instant::now();
            let id = taken.id.clone();
            let r = on_node(&ctx.node, move |n| n.push(&id, &to)).await?;
            (r, Some(pushed_at.elapsed().as_millis() as u64))
        }
        None => (taken.id.clone(), None),
    };
    let template = pods::template_of(&serde_json::to_value(&pod).unwrap_or_default());
    let suspended = ps.spec.then == Then::Suspended;
    if suspended {
        pods.delete(&pod_name, &DeleteParams::default().grace_period(0))
            .await?;
        if ps.spec.push_to.is_some() && !ps.spec.keep_on_node {
            let (id, label) = (taken.id.clone(), key(ps));
            on_node(&ctx.node, move |n| {
                n.delete_taken(&id, crate::node::POD_SNAPSHOT_LABEL, &label)
            })
            .await?;
        }
    }
    let status = PodSnapshotStatus {
        phase: Some(Phase::Completed),
        node: Some(ctx.node_name.clone()),
        snapshot_id: Some(taken.id.clone()),
        restore_from: Some(restore_from),
        size_bytes: Some(taken.size),
        timings: Some(Timings {
            snapshot_ms,
            push_ms,
            total_ms: started.elapsed().as_millis() as u64,
        }),
        suspended,
        pod: Some(template),
        error: None,
    };
    patch_status(api, ps, serde_json::to_value(&status).unwrap_or_default()).await?;
    let what = if suspended { "Suspended" } else { "Completed" };
    publish(
        ctx,
        ps,
        EventType::Normal,
        what,
        &format!("snapshot {}", taken.id),
    )
    .await;
    Ok(())
}

/// Deleting a PodSnapshot deletes its snapshot from its node.
async fn cleanup(ctx: &Context, ps: &PodSnapshot) -> Result<Action, Error> {
    remove_taken(ctx, ps).await;
    Ok(Action::await_change())
}

/// Removes this node's snapshots of `ps` (a failure's, or a deleted PodSnapshot's): those it
/// took, and copies of its snapshot pulled for its namespace.
async fn remove_taken(ctx: &Context, ps: &PodSnapshot) {
    let label = key(ps);
    let ns = ps.namespace().unwrap_or_default();
    let id = ps.status.as_ref().and_then(|s| s.snapshot_id.clone());
    let gone = on_node(&ctx.node, move |n| {
        let mut gone = Vec::new();
        for name in n.held_for(&label, &ns, id.as_deref())? {
            n.delete(&name)?;
            gone.push(name);
        }
        Ok(gone)
    })
    .await;
    match gone {
        Ok(g) if !g.is_empty() => log::info!("{}: deleted {g:?}", key(ps)),
        Ok(_) => {}
        Err(e) => log::warn!("{}: its snapshot stays on this node: {e}", key(ps)),
    }
}

/// A copy of another node's snapshot that a pod here pulled: deleted with its PodSnapshot
/// (refused, and kept, while a pod here still runs from it).
async fn drop_pulled_copy(ctx: &Context, ps: &PodSnapshot) {
    if ps
        .status
        .as_ref()
        .and_then(|s| s.snapshot_id.as_ref())
        .is_some()
    {
        remove_taken(ctx, ps).await;
    }
}

async fn fail(
    ctx: &Context,
    api: &Api<PodSnapshot>,
    ps: &PodSnapshot,
    why: &str,
) -> Result<(), Error> {
    log::warn!("{}: {why}", key(ps));
    patch_status(
        api,
        ps,
        json!({"phase": Phase::Failed, "node": ctx.node_name, "error": why}),
    )
    .await?;
    publish(ctx, ps, EventType::Warning, "Failed", why).await;
    Ok(())
}

async fn patch_status(
    api: &Api<PodSnapshot>,
    ps: &PodSnapshot,
    status: serde_json::Value,
) -> Result<(), Error> {
    api.patch_status(
        &ps.name_any(),
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": status })),
    )
    .await?;
    Ok(())
}

async fn publish(ctx: &Context, ps: &PodSnapshot, type_: EventType, reason: &str, note: &str) {
    let event = KubeEvent {
        type_,
        reason: reason.into(),
        note: Some(note.chars().take(1000).collect()),
        action: "Snapshot".into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &ps.object_ref(&())).await {
        log::warn!("{}: event {reason}: {e}", key(ps));
    }
}
