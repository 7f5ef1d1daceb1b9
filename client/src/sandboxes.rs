//! `chalkctl list`, `get` and `expire`: the sandboxes of this runtime, their status, lineage,
//! lifetime and snapshots, and what happens when a lifetime ends.

use chalk_runtime::{
    lifetime::{self, Lifetime, EXPIRES_AT_LABEL},
    snapshot::manifest::rfc3339_secs,
};
use containerd_client::services::v1::Container;
use serde_json::{json, Value};

use crate::{
    client::{runtime_name, Client, Result},
    fork::{FORKED_FROM, PARENT_SANDBOX},
    progress::Progress,
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

/// The spec of a container record (Null when it has none or it is not JSON).
pub fn spec_of(c: &Container) -> Value {
    c.spec
        .as_ref()
        .and_then(|s| serde_json::from_slice(&s.value).ok())
        .unwrap_or(Value::Null)
}

/// Seconds since the epoch, now.
fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn describe(client: &Client, c: &Container, snaps: &[crate::registry::Snapshot]) -> Result<Value> {
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
    let mut v = json!({
        "id": c.id,
        "name": c.labels.get(crate::names::NAME_LABEL),
        "status": status,
        "pid": task.as_ref().map(|(_, pid)| *pid),
        "image": c.image,
        "parent_sandbox_id": c.labels.get(PARENT_SANDBOX),
        "parent_snapshot_id": c.labels.get(FORKED_FROM),
        "suspended_from": c.labels.get(SUSPENDED_FROM),
        // Suspended to a registry, its local copy released: where it resumes from.
        "released_to": c.labels.get(snapshots::RELEASED_TO),
        "resumed_from": c.labels.get(crate::fork::RESUMED_FROM),
        "snapshots": mine,
    });
    // A lifetime counts from each start; only a running sandbox has time left.
    if let Ok(Some(l)) = Lifetime::of_spec(&spec_of(c)) {
        v["lifetime"] = lifetime::format_duration(l.duration).into();
        v["on_timeout"] = l.on_timeout.as_str().into();
        let running = matches!(status.as_str(), "running" | "paused" | "created");
        if let Some(at) = c.labels.get(EXPIRES_AT_LABEL).filter(|_| running) {
            v["expires_at"] = at.clone().into();
            if let Some(end) = rfc3339_secs(at) {
                v["time_left"] = format!("{}s", end.saturating_sub(now_secs())).into();
            }
        }
    }
    Ok(v)
}

/// What the shim asks for when sandbox `id`'s lifetime is up: suspend it (a snapshot the
/// same as `chalkctl suspend` takes, labelled reason=lifetime) or destroy it (its task
/// killed and deleted, the container and its root filesystem removed).
pub fn expire(client: &mut Client, id: &str, action: &str, progress: &Progress) -> Result<Value> {
    let c = chalk_container(client, id)?;
    match action {
        "suspend" => {
            let labels = vec![("reason".to_string(), "lifetime".to_string())];
            let snap = snapshots::create(client, id, labels, true, progress)?;
            Ok(json!({"status": "suspended", "snapshot": snap.digest}))
        }
        _ => {
            if !client.kill_and_delete_task(id) {
                return Err(format!("sandbox {id}: its task could not be deleted").into());
            }
            client.delete_container(id);
            client.remove_snapshot(&c.snapshotter, &c.snapshot_key);
            Ok(json!({"status": "destroyed"}))
        }
    }
}

/// `d` as `12.3s`, for messages.
pub fn seconds(d: std::time::Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

/// What `chalkctl wait` waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Until {
    /// The sandbox's task runs (made and started, a resume or fork complete).
    Running,
    /// Its init has exited: the exit status.
    Exited,
}

/// Waits, at most `timeout`, until sandbox `id` is as `until` says; the exit status for
/// [`Until::Exited`].
pub fn wait(
    client: &Client,
    id: &str,
    until: Until,
    timeout: Option<std::time::Duration>,
) -> Result<Option<u32>> {
    use std::time::{Duration, Instant};
    let started = Instant::now();
    let late = |what: String| -> crate::Error {
        format!(
            "sandbox {id} {what} after {}: wait longer (--timeout)",
            seconds(started.elapsed())
        )
        .into()
    };
    match until {
        Until::Running => loop {
            let status = client.task_status(id)?;
            if matches!(&status, Some((s, _)) if s == "running") {
                return Ok(None);
            }
            if matches!(&status, Some((s, _)) if s == "stopped") {
                return Err(format!("sandbox {id} has stopped: it will not run again").into());
            }
            if timeout.is_some_and(|t| started.elapsed() >= t) {
                let now = match status {
                    Some((s, _)) => format!("is {s}"),
                    None if client.container(id).is_ok() => "has no task".to_string(),
                    None => "does not exist".to_string(),
                };
                return Err(late(now));
            }
            std::thread::sleep(Duration::from_millis(100));
        },
        Until::Exited => {
            chalk_container(client, id)?;
            let no_task = || -> crate::Error {
                format!("sandbox {id} has no task: it is not running (see chalkctl get --id {id})")
                    .into()
            };
            let Some(t) = timeout else {
                return client.wait(id)?.map(Some).ok_or_else(no_task);
            };
            // containerd's Wait has no deadline: watch the status, then collect the exit.
            loop {
                match client.task_status(id)? {
                    None => return Err(no_task()),
                    Some((s, _)) if s == "stopped" => {
                        return client.wait(id)?.map(Some).ok_or_else(no_task)
                    }
                    Some(_) if started.elapsed() >= t => return Err(late("still runs".into())),
                    Some(_) => std::thread::sleep(Duration::from_millis(100)),
                }
            }
        }
    }
}
