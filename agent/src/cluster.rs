//! The cluster agent (`chalk-agent cluster`, one Deployment with a role of its own): the
//! work no node should do for every tenant. It keeps the finalizer on each Sandbox that has
//! snapshots in the registry, keeps each Sandbox's newest few, and removes a deleted
//! Sandbox's: always from the agents' own record of what they pushed for that Sandbox
//! (`records`), by full digest, for the Sandbox whose UID the record names. A finalizer a
//! user adds to a Sandbox without a record makes it remove nothing. It reaches no node and
//! no pod: only Sandboxes, the records and the registry.

use std::{sync::Arc, time::Duration};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    api::{
        ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
    },
    runtime::{
        controller::{Action, Controller},
        watcher,
    },
    Api, Resource, ResourceExt,
};
use serde_json::json;

use crate::{
    reconcile::{log_failures, retry_later, Error},
    records::{self, Record},
    sandbox,
};

pub struct Context {
    pub client: kube::Client,
    /// How to reach the registry (to delete from it).
    pub access: chalk_client::remote::Access,
    /// How many snapshots of a Sandbox the registry keeps.
    pub keep: usize,
    sandboxes: ApiResource,
}

impl Context {
    pub fn new(client: kube::Client, access: chalk_client::remote::Access, keep: usize) -> Self {
        Context {
            client,
            access,
            keep: keep.max(1),
            sandboxes: ApiResource::from_gvk(&GroupVersionKind::gvk(
                sandbox::SANDBOX_GROUP,
                sandbox::VERSION,
                "Sandbox",
            )),
        }
    }

    fn sandboxes(&self, ns: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), ns, &self.sandboxes)
    }

    fn records(&self) -> Api<ConfigMap> {
        Api::namespaced(self.client.clone(), records::NAMESPACE)
    }
}

/// Runs the cluster agent's controllers until SIGTERM or Ctrl-C.
pub async fn run(ctx: Arc<Context>) {
    let marked = watcher::Config::default().labels(records::RECORD_LABEL);
    let records = Controller::new(ctx.records(), marked)
        .shutdown_on_signal()
        .run(reconcile_record, retry_later, ctx.clone());
    let all: Api<DynamicObject> = Api::all_with(ctx.client.clone(), &ctx.sandboxes);
    let sandboxes = Controller::new_with(all, watcher::Config::default(), ctx.sandboxes.clone())
        .shutdown_on_signal()
        .run(reconcile_sandbox, retry_later, ctx.clone());
    futures::join!(log_failures(records), log_failures(sandboxes));
}

/// Removes `references` from the registry, those `record` covers only: what went.
async fn remove(ctx: &Context, record: &Record, references: Vec<String>) -> Result<usize, Error> {
    let ours: Vec<String> = references
        .into_iter()
        .filter(|r| record.covers(r))
        .collect();
    if ours.is_empty() {
        return Ok(0);
    }
    let access = ctx.access.clone();
    let gone =
        tokio::task::spawn_blocking(move || chalk_client::remote::prune::remove(&access, &ours))
            .await
            .map_err(|e| Error::Node(e.to_string()))?
            .map_err(|e| Error::Node(e.to_string()))?;
    Ok(gone.len())
}

/// A record: its Sandbox keeps the finalizer and its newest snapshots while it lives (the one
/// whose UID the record names); once it is gone, every recorded snapshot goes, then the record.
async fn reconcile_record(cm: Arc<ConfigMap>, ctx: Arc<Context>) -> Result<Action, Error> {
    let Some(record) = Record::from_config_map(&cm) else {
        log::warn!("{}: not a whole record: left alone", cm.name_any());
        return Ok(Action::await_change());
    };
    let sb = ctx
        .sandboxes(&record.namespace)
        .get_opt(&record.name)
        .await?;
    let alive = sb.as_ref().filter(|s| {
        s.uid().as_deref() == Some(record.uid.as_str()) && s.meta().deletion_timestamp.is_none()
    });
    let Some(sb) = alive else {
        let n = remove(&ctx, &record, record.pushed.clone()).await?;
        ctx.records()
            .delete(&cm.name_any(), &DeleteParams::default())
            .await
            .map(drop)
            .or_else(gone_already)?;
        log::info!(
            "{}/{}: its {n} recorded snapshots removed from the registry, with its record",
            record.namespace,
            record.name
        );
        return Ok(Action::await_change());
    };
    ensure_finalizer(&ctx.sandboxes(&record.namespace), sb).await?;
    let old = record.beyond(ctx.keep);
    if !old.is_empty() {
        let n = remove(&ctx, &record, old.clone()).await?;
        let kept = Record {
            pushed: record
                .pushed
                .iter()
                .filter(|r| !old.contains(r))
                .cloned()
                .collect(),
            ..record.clone()
        };
        let mut cm2 = kept.to_config_map();
        cm2.metadata.resource_version = cm.metadata.resource_version.clone();
        ctx.records()
            .replace(&cm.name_any(), &PostParams::default(), &cm2)
            .await?;
        log::info!(
            "{}/{}: {n} older snapshots removed (keeping {})",
            record.namespace,
            record.name,
            ctx.keep
        );
    }
    Ok(Action::requeue(Duration::from_secs(600)))
}

/// A Sandbox being deleted with chalk's finalizer: its recorded snapshots go (if the record
/// is of this very Sandbox), then the finalizer.
async fn reconcile_sandbox(sb: Arc<DynamicObject>, ctx: Arc<Context>) -> Result<Action, Error> {
    if sb.meta().deletion_timestamp.is_none()
        || !sb.finalizers().iter().any(|f| f == sandbox::FINALIZER)
    {
        return Ok(Action::await_change());
    }
    let (ns, name) = (sb.namespace().unwrap_or_default(), sb.name_any());
    let found = ctx
        .records()
        .get_opt(&records::name_of(&ns, &name))
        .await?
        .and_then(|cm| Record::from_config_map(&cm).map(|r| (cm, r)));
    let mut removed = 0;
    if let Some((cm, record)) = found.filter(|(_, r)| sb.uid().as_deref() == Some(&r.uid)) {
        removed = remove(&ctx, &record, record.pushed.clone()).await?;
        ctx.records()
            .delete(&cm.name_any(), &DeleteParams::default())
            .await
            .map(drop)
            .or_else(gone_already)?;
    }
    let finalizers: Vec<&String> = sb
        .finalizers()
        .iter()
        .filter(|f| *f != sandbox::FINALIZER)
        .collect();
    let patch = json!({"metadata": {
        "finalizers": finalizers,
        "resourceVersion": sb.resource_version(),
    }});
    ctx.sandboxes(&ns)
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(drop)
        .or_else(gone_already)?;
    log::info!("{ns}/{name}: deleted with its {removed} recorded snapshots in the registry");
    Ok(Action::await_change())
}

/// Adds chalk's finalizer to Sandbox `sb` unless it has it, against its latest version.
async fn ensure_finalizer(api: &Api<DynamicObject>, sb: &DynamicObject) -> Result<(), Error> {
    if sb.finalizers().iter().any(|f| f == sandbox::FINALIZER) {
        return Ok(());
    }
    let mut finalizers = sb.finalizers().to_vec();
    finalizers.push(sandbox::FINALIZER.into());
    let patch = json!({"metadata": {
        "finalizers": finalizers,
        "resourceVersion": sb.resource_version(),
    }});
    api.patch(
        &sb.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .map(drop)
    .or_else(|e| match e {
        // Changed meanwhile: the next look at the record adds it.
        kube::Error::Api(a) if a.code == 409 => Ok(()),
        e => Err(e),
    })
    .map_err(Error::from)
}

fn gone_already(e: kube::Error) -> Result<(), kube::Error> {
    match e {
        kube::Error::Api(a) if a.code == 404 || a.code == 409 => Ok(()),
        e => Err(e),
    }
}
