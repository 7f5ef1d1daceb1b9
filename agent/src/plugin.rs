//! `kubectl chalk`: a PodSnapshot made and waited for, and pods made from one (fork: new
//! pods the scheduler places; resume: a suspended pod made again under its own name).

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::{
    api::{ObjectMeta, PostParams},
    Api, ResourceExt,
};
use serde_json::Value;

use crate::{
    crd::{Phase, PodSnapshot, PodSnapshotSpec, PodSnapshotStatus, Then},
    pods::{self, Naming},
};

pub type Result<T> = std::result::Result<T, String>;

/// What `kubectl chalk snapshot` asks.
pub struct SnapshotAsk {
    pub pod: String,
    pub name: Option<String>,
    pub push_to: Option<String>,
    pub suspend: bool,
    pub keep_on_node: bool,
    pub wait: Duration,
}

/// Creates the PodSnapshot and waits for its agent to complete it (or fail, with why).
pub async fn snapshot(client: &kube::Client, ns: &str, ask: SnapshotAsk) -> Result<PodSnapshot> {
    let api: Api<PodSnapshot> = Api::namespaced(client.clone(), ns);
    let name = ask.name.clone().unwrap_or_else(|| {
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        format!("{}-{secs}", ask.pod)
    });
    let ps = PodSnapshot {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            ..Default::default()
        },
        spec: PodSnapshotSpec {
            pod_name: ask.pod.clone(),
            push_to: ask.push_to.clone(),
            then: if ask.suspend {
                Then::Suspended
            } else {
                Then::Running
            },
            keep_on_node: ask.keep_on_node,
        },
        status: None,
    };
    api.create(&PostParams::default(), &ps)
        .await
        .map_err(|e| format!("create PodSnapshot {ns}/{name}: {e}"))?;
    wait_done(&api, &name, ask.wait).await
}

/// Waits until PodSnapshot `name` is Completed (its object) or Failed (its error).
pub async fn wait_done(api: &Api<PodSnapshot>, name: &str, wait: Duration) -> Result<PodSnapshot> {
    let deadline = Instant::now() + wait;
    loop {
        let ps = api
            .get(name)
            .await
            .map_err(|e| format!("PodSnapshot {name}: {e}"))?;
        let status = ps.status.clone().unwrap_or_default();
        match status.phase {
            Some(Phase::Completed) => return Ok(ps),
            Some(Phase::Failed) => {
                return Err(format!(
                    "PodSnapshot {name} failed: {}",
                    status.error.unwrap_or_default()
                ))
            }
            _ if Instant::now() > deadline => {
                return Err(format!(
                    "PodSnapshot {name} is not done after {wait:?} (is chalk-agent running on \
                     the pod's node? `kubectl describe podsnapshot {name}`)"
                ))
            }
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// A completed PodSnapshot's status, or why it cannot be started from.
async fn completed(api: &Api<PodSnapshot>, name: &str) -> Result<PodSnapshotStatus> {
    let ps = api
        .get(name)
        .await
        .map_err(|e| format!("PodSnapshot {name}: {e}"))?;
    let status = ps.status.unwrap_or_default();
    if status.phase != Some(Phase::Completed) {
        return Err(format!(
            "PodSnapshot {name} is {:?}, not Completed: {}",
            status.phase,
            status.error.clone().unwrap_or_default()
        ));
    }
    Ok(status)
}

/// Makes `count` pods from PodSnapshot `name`, each starting from its snapshot; on `node`
/// if given, else where the scheduler places them. Returns their names.
pub async fn fork(
    client: &kube::Client,
    ns: &str,
    name: &str,
    count: usize,
    node: Option<&str>,
) -> Result<Vec<String>> {
    let api: Api<PodSnapshot> = Api::namespaced(client.clone(), ns);
    let status = completed(&api, name).await?;
    let (template, restore_from, node) = starting_point(&status, node)?;
    let prefix = format!(
        "{}-fork",
        template["metadata"]["name"].as_str().unwrap_or(name)
    );
    let mut made = Vec::new();
    for _ in 0..count {
        let pod = pods::restored_pod(
            &template,
            Naming::Generated(&prefix),
            name,
            &restore_from,
            node,
        );
        made.push(create_pod(client, ns, pod).await?);
    }
    Ok(made)
}

/// Makes the suspended pod of PodSnapshot `name` again, under its own name.
pub async fn resume(
    client: &kube::Client,
    ns: &str,
    name: &str,
    node: Option<&str>,
) -> Result<String> {
    let api: Api<PodSnapshot> = Api::namespaced(client.clone(), ns);
    let status = completed(&api, name).await?;
    if !status.suspended {
        return Err(format!(
            "PodSnapshot {name} left its pod running: `kubectl chalk fork {name}` makes new pods \
             from it"
        ));
    }
    let (template, restore_from, node) = starting_point(&status, node)?;
    let pod = pods::restored_pod(&template, Naming::Same, name, &restore_from, node);
    create_pod(client, ns, pod).await
}

fn starting_point<'a>(
    status: &'a PodSnapshotStatus,
    asked: Option<&'a str>,
) -> Result<(Value, String, Option<&'a str>)> {
    let template = status
        .pod
        .clone()
        .ok_or("the PodSnapshot keeps no pod template")?;
    let restore_from = status
        .restore_from
        .clone()
        .ok_or("the PodSnapshot names no snapshot")?;
    let pushed = restore_from.contains('@');
    let node = pods::placement(pushed, status.node.as_deref(), asked)?;
    Ok((template, restore_from, node))
}

async fn create_pod(client: &kube::Client, ns: &str, pod: Value) -> Result<String> {
    let pod: Pod = serde_json::from_value(pod).map_err(|e| format!("the pod: {e}"))?;
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let made = api
        .create(&PostParams::default(), &pod)
        .await
        .map_err(|e| format!("create pod in {ns}: {e}"))?;
    Ok(made.name_any())
}
