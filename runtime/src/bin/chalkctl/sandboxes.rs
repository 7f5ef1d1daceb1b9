//! `chalkctl list` and `get`: the sandboxes of this runtime, their status and snapshots.

use serde_json::{json, Value};

use crate::{
    client::{runtime_name, Client, Result},
    snapshots::{self, RUNTIME, SUSPENDED_FROM},
};

/// Sandboxes of this runtime; stopped and suspended ones only with `all`.
pub fn list(client: &Client, all: bool) -> Result<Vec<Value>> {
    let snaps = snapshots::all(client)?;
    let mut out = Vec::new();
    for c in client.containers()? {
        if runtime_name(&c) != RUNTIME {
            continue;
        }
        let v = describe(client, &c, &snaps)?;
        if all || matches!(v["status"].as_str(), Some("running" | "paused" | "created")) {
            out.push(v);
        }
    }
    out.sort_by(|a, b| a["id"].as_str().cmp(&b["id"].as_str()));
    Ok(out)
}

pub fn get(client: &Client, id: &str) -> Result<Value> {
    let c = client.container(id)?;
    if runtime_name(&c) != RUNTIME {
        return Err(format!(
            "sandbox {id} runs {:?}, not {RUNTIME}",
            runtime_name(&c)
        ));
    }
    describe(client, &c, &snapshots::all(client)?)
}

fn describe(
    client: &Client,
    c: &containerd_client::services::v1::Container,
    snaps: &[chalk_runtime::registry::Snapshot],
) -> Result<Value> {
    let task = client.task_status(&c.id)?;
    let status = match (&task, c.labels.get(SUSPENDED_FROM)) {
        (None, Some(_)) => "suspended".to_string(),
        (None, None) => "stopped".to_string(),
        (Some((s, _)), _) => s.clone(),
    };
    let mine: Vec<Value> = snaps
        .iter()
        .filter(|s| s.sandbox_id == c.id)
        .map(snapshots::to_json)
        .collect();
    Ok(json!({
        "id": c.id,
        "status": status,
        "pid": task.as_ref().map(|(_, pid)| *pid),
        "image": c.image,
        "suspended_from": c.labels.get(SUSPENDED_FROM),
        "snapshots": mine,
    }))
}
