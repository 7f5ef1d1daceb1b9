//! `chalkctl rm`: a sandbox removed whole: its task (stopped first: SIGTERM, then SIGKILL
//! once the grace period is over), its container, its root filesystem snapshot and what
//! chalkctl keeps of it (the stdio keeper's directory, its log). Its snapshots stay: they are
//! records of their own (`chalkctl snapshot delete`), and a suspended sandbox's is named.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::{
    clock::seconds,
    containerd::Client,
    records::sandboxes::chalk_container,
    stdio::keeper::{self, Keeping},
    Result,
};

/// containerd's CRI marks the containers it makes: kubelet owns those.
const CRI_KIND: &str = "io.cri-containerd.kind";

/// What became of one sandbox.
pub struct Removed {
    pub id: String,
    /// Its status before (running, paused, created, stopped, suspended).
    pub was: String,
    /// How it stopped, when it ran: "exited" (after SIGTERM) or "killed".
    pub stopped: Option<&'static str>,
    /// The snapshot a suspended sandbox would have resumed from, kept.
    pub snapshot_kept: Option<String>,
}

impl Removed {
    pub fn to_json(&self) -> Value {
        json!({"id": self.id, "was": self.was, "stopped": self.stopped,
               "snapshot_kept": self.snapshot_kept})
    }
}

/// Removes sandbox `id`; one that runs only with `force`, given `grace` to exit on SIGTERM.
pub fn remove(
    client: &Client,
    keeping: &Keeping,
    id: &str,
    force: bool,
    grace: Duration,
) -> Result<Removed> {
    let c = chalk_container(client, id)?;
    if c.labels.contains_key(CRI_KIND) {
        return Err(format!(
            "sandbox {id} belongs to a Kubernetes pod (containerd's CRI made it): delete the pod \
             instead (kubectl delete pod, or crictl rmp)"
        )
        .into());
    }
    let task = client.task_status(id)?;
    let was = match (&task, c.labels.get(chalk_labels::SUSPENDED_FROM)) {
        (Some((s, _)), _) => s.clone(),
        (None, Some(_)) => "suspended".to_string(),
        (None, None) => "stopped".to_string(),
    };
    let live = !matches!(was.as_str(), "stopped" | "suspended");
    if live && !force {
        return Err(format!(
            "sandbox {id} is {was}: stop it first, or give --force (SIGTERM, then SIGKILL \
             after --grace)"
        )
        .into());
    }
    // A fork of a pod is a pod of its own: its other containers (`<name>-<fork>`) go first.
    for m in pod_members(client, id)? {
        if !client.kill_and_delete_task(&m.id) {
            return Err(format!(
                "sandbox {id}: the task of its pod container {} could not be removed: run \
                 chalkctl rm again",
                m.id
            )
            .into());
        }
        client.delete_container(&m.id);
        client.remove_snapshot(&m.snapshotter, &m.snapshot_key);
    }
    let mut stopped = None;
    if live {
        stopped = Some(stop(client, id, was == "running", grace));
        if !client.kill_and_delete_task(id) {
            return Err(format!(
                "sandbox {id}: its task could not be removed (is containerd answering?): \
                 nothing else was removed; run chalkctl rm again"
            )
            .into());
        }
    } else if task.is_some() {
        client.delete_stopped_task(id)?;
    }
    client.delete_container(id);
    client.remove_snapshot(&c.snapshotter, &c.snapshot_key);
    // Its keeper ends with the task; what it kept goes with the sandbox.
    let dir = keeping.dir(id)?;
    keeper::wait_ended(&dir);
    dir.remove()?;
    Ok(Removed {
        id: id.to_string(),
        was,
        stopped,
        snapshot_kept: c.labels.get(chalk_labels::SUSPENDED_FROM).cloned(),
    })
}

/// The containers that run in pod sandbox `id` (their spec names it as their sandbox).
fn pod_members(
    client: &Client,
    id: &str,
) -> Result<Vec<containerd_client::services::v1::Container>> {
    Ok(client
        .containers()?
        .into_iter()
        .filter(|c| c.id != id)
        .filter(|c| {
            crate::containerd::spec_of(c)["annotations"][chalk_runtime::spec::CRI_SANDBOX_ID] == id
        })
        .collect())
}

/// Asks a running init to exit (SIGTERM) and waits `grace` for it: "exited" when it did,
/// else "killed" (the caller's SIGKILL ends it). A paused one cannot take a signal: killed.
fn stop(client: &Client, id: &str, running: bool, grace: Duration) -> &'static str {
    if !running || client.kill(id, "", libc::SIGTERM, false).is_err() {
        return "killed";
    }
    let started = Instant::now();
    while started.elapsed() < grace {
        match client.task_status(id) {
            Ok(Some((s, _))) if s == "stopped" => return "exited",
            Ok(None) => return "exited",
            _ => std::thread::sleep(Duration::from_millis(100)),
        }
    }
    eprintln!(
        "chalkctl: {id} did not exit within {} of SIGTERM: killed",
        seconds(grace)
    );
    "killed"
}
