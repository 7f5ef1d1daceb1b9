//! `chalkctl list`, `get` and `expire`: the sandboxes of this runtime, their status, lineage,
//! lifetime and snapshots, and what happens when a lifetime ends.

use crate::{clock::now_secs, containerd::spec_of};
use chalk_runtime::{
    lifetime::{self, Lifetime, EXPIRES_AT_LABEL},
    snapshot::manifest::rfc3339_secs,
};
use containerd_client::services::v1::Container;
use serde_json::{json, Value};

use crate::{
    containerd::RUNTIME,
    containerd::{runtime_name, Client, Result},
    records::snapshots,
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
    let c = chalk_container(client, id)?;
    describe(client, &c, &snapshots::all(client)?)
}

/// Container `id`, refused unless it runs with this runtime.
pub fn chalk_container(client: &Client, id: &str) -> Result<Container> {
    let c = client.container(id)?;
    if runtime_name(&c) != RUNTIME {
        return Err(format!("sandbox {id} runs {:?}, not {RUNTIME}", runtime_name(&c)).into());
    }
    Ok(c)
}

/// How long a resume gives a suspend that labelled the sandbox to remove the task its
/// checkpoint stopped, before it takes that task for one an interrupted suspend left.
const SUSPEND_REMOVES_ITS_TASK: std::time::Duration = std::time::Duration::from_secs(5);

/// The task of sandbox `c` (its status and pid). The stopped task of a sandbox labelled
/// suspended is its suspend's, which removes it just after the label (or, interrupted, left
/// it for [`left_task_gone`]): the sandbox reads suspended. A reader never removes it:
/// `chalkctl get`, polled while a suspend runs, would delete the task as the suspend does,
/// and two deletes of one task at once can leave containerd's bundle directory behind
/// (FLAKES.md row 7).
pub fn task_of(client: &Client, c: &Container) -> Result<Option<(String, u32)>> {
    Ok(client
        .task_status(&c.id)?
        .filter(|(status, _)| !left_by_suspend(status, c)))
}

/// How long the shim of a removed task may take to go once its task is removed.
const REMOVED_TASK_GOES: std::time::Duration = std::time::Duration::from_secs(10);

/// For a resume: waits for the suspend that labelled `c` to remove the task its checkpoint
/// stopped (removing it itself once that suspend has had [`SUSPEND_REMOVES_ITS_TASK`]: it was
/// interrupted), then for that task's shim to be gone. containerd unpacks a checkpoint before
/// it checks that no task has the id, and never removes what it unpacked when that check fails
/// (containerd 2.4, services/tasks/local.go): a restore's Create tried while the old shim is
/// on its way out would leave that directory behind (FLAKES.md row 25).
pub fn left_task_gone(client: &Client, c: &Container) -> Result<()> {
    let deadline = std::time::Instant::now() + SUSPEND_REMOVES_ITS_TASK;
    let mut seen = false;
    loop {
        match client.task_status(&c.id)? {
            Some((status, _)) if left_by_suspend(&status, c) => {
                seen = true;
                if std::time::Instant::now() >= deadline {
                    client.delete_stopped_task(&c.id)?;
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            _ if seen => break,
            _ => return Ok(()),
        }
    }
    wait_task_gone(client, &c.id, std::time::Instant::now() + REMOVED_TASK_GOES)
}

/// Waits until sandbox `id` has no task at all (a task whose shim is on its way out still
/// answers, or fails to), or `deadline` passes: then it says which task is still there.
fn wait_task_gone(client: &Client, id: &str, deadline: std::time::Instant) -> Result<()> {
    loop {
        let left = match client.task_status(id) {
            Ok(None) => return Ok(()),
            Ok(Some((status, _))) => status,
            Err(e) => e.to_string(),
        };
        if std::time::Instant::now() >= deadline {
            return Err(format!(
                "the task {id} had before its suspend is still there ({left}): try the resume \
                 again in a moment"
            )
            .into());
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Whether a task in `status` is the one a suspend of `c` stopped.
fn left_by_suspend(status: &str, c: &Container) -> bool {
    status == "stopped" && c.labels.contains_key(chalk_labels::SUSPENDED_FROM)
}

fn describe(
    client: &Client,
    c: &Container,
    snaps: &[crate::records::registry::Snapshot],
) -> Result<Value> {
    let task = task_of(client, c)?;
    let status = match (&task, c.labels.get(chalk_labels::SUSPENDED_FROM)) {
        (None, Some(_)) => "suspended".to_string(),
        (None, None) => "stopped".to_string(),
        (Some((s, _)), _) => s.clone(),
    };
    let mine: Vec<Value> = snaps
        .iter()
        .filter(|s| s.sandbox_id == c.id)
        .map(snapshots::to_json)
        .collect();
    let mut v = json!({
        "id": c.id,
        "name": c.labels.get(chalk_labels::NAME_LABEL),
        "status": status,
        "pid": task.as_ref().map(|(_, pid)| *pid),
        "image": c.image,
        "parent_sandbox_id": c.labels.get(chalk_labels::PARENT_SANDBOX),
        "parent_snapshot_id": c.labels.get(chalk_labels::FORKED_FROM),
        "suspended_from": c.labels.get(chalk_labels::SUSPENDED_FROM),
        // Suspended to a registry, its local copy released: where it resumes from.
        "released_to": c.labels.get(chalk_labels::RELEASED_TO),
        "resumed_from": c.labels.get(chalk_labels::RESUMED_FROM),
        // Why the shim ended it (its memory could not be fetched, say).
        "ended_because": c.labels.get(chalk_labels::ENDED_BECAUSE),
        "snapshots": mine,
    });
    let spec = spec_of(c);
    let annotation = |k: &str| chalk_runtime::spec::annotation(&spec, k).map(str::to_string);
    let live = matches!(status.as_str(), "running" | "paused" | "created");
    v["network"] = match c.labels.get(chalk_labels::NO_NETWORK_LABEL) {
        Some(_) => chalk_runtime::network::NO_NETWORK.into(),
        None => annotation(chalk_labels::NETWORK_ANNOTATION)
            .unwrap_or_else(|| chalk_runtime::network::NO_NETWORK.into())
            .into(),
    };
    // Its address and ports are its sandbox's: they went with it.
    if live {
        v["address"] = c.labels.get(chalk_labels::ADDRESS_LABEL).cloned().into();
        v["ports"] = annotation(chalk_labels::PORTS_ANNOTATION).into();
    }
    if let Some(why) = c.labels.get(chalk_labels::NO_NETWORK_LABEL) {
        v["no_network_because"] = why.clone().into();
    }
    // A lifetime counts from each start; only a running sandbox has time left.
    if let Ok(Some(l)) = Lifetime::of_spec(&spec) {
        v["lifetime"] = lifetime::format_duration(l.duration).into();
        v["on_timeout"] = l.on_timeout.as_str().into();
        if let Some(at) = c.labels.get(EXPIRES_AT_LABEL).filter(|_| live) {
            v["expires_at"] = at.clone().into();
            if let Some(end) = rfc3339_secs(at) {
                v["time_left"] = format!("{}s", end.saturating_sub(now_secs())).into();
            }
        }
    }
    Ok(v)
}
