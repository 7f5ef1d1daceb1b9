//! The blocking chalk-client calls the operations share: removing a sandbox and its
//! snapshots, waiting for an exit, reading what the shim recorded; and the thread they run on.

use std::time::Duration;

use chalk_client::{
    containerd::Client,
    records::{registry, snapshots},
};

use super::error::{ApiError, ApiResult};

/// On every container the server makes, its value the server's state directory (one per
/// server): what a server reclaims at start is only its own.
pub const OWNER_LABEL: &str = chalk_labels::WEB_OWNER_LABEL;
/// On every snapshot the server takes: the sandbox it was taken for (deleted when unused)...
pub(super) const SNAPSHOT_LABEL: &str = "chalk-web";
/// ... and the server that took it (its state directory).
pub(super) const SNAPSHOT_SERVER_LABEL: &str = "chalk-web-server";

/// Runs blocking chalkctl work off the async threads.
pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> ApiResult<T> + Send + 'static,
) -> ApiResult<T> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(ApiError::new(500, format!("internal error: {e}"))))
}

/// Deletes the snapshots taken for `sandbox` (labelled so): all of them, or with
/// `only_failed` those that failed (a suspend that did not happen).
pub(super) fn delete_snapshots_for(client: &Client, sandbox: &str, only_failed: bool) {
    for snap in snapshots::all(client).unwrap_or_default() {
        let failed = snap.status == registry::Status::Failed;
        if snap.labels.get(SNAPSHOT_LABEL).map(String::as_str) == Some(sandbox)
            && (failed || !only_failed)
        {
            if let Err(e) = snapshots::delete(client, &snap) {
                eprintln!("chalk-web: delete snapshot {}: {e}", snap.name);
            }
        }
    }
}

/// The bytes of a snapshot's files (0 when its manifest cannot be read).
pub(super) fn snapshot_bytes(client: &Client, snap: &registry::Snapshot) -> u64 {
    snapshots::stored_manifest(client, &snap.index)
        .ok()
        .flatten()
        .map_or(0, |m| m.total_size())
}

/// Removes sandbox `id`: its task (killed), its container and root filesystem snapshot.
pub(super) fn remove_sandbox(client: &Client, snapshotter: &str, id: &str) {
    let snapshotter = match client.container(id) {
        Ok(c) => c.snapshotter,
        Err(_) => snapshotter.to_string(),
    };
    if !client.kill_and_delete_task(id) {
        eprintln!("chalk-web: the task of {id} could not be removed: its container is kept");
        return;
    }
    client.delete_container(id);
    if !snapshotter.is_empty() {
        client.remove_snapshot(&snapshotter, id);
    }
}

/// Waits for sandbox `id`'s init to exit: its exit status (None once it has no task). A
/// wait cut short (containerd restarting) is waited again while the task still runs.
pub(super) fn wait_for_exit(client: &Client, id: &str) -> Option<u32> {
    loop {
        match client.wait(id) {
            Ok(code) => return code,
            Err(e) => {
                eprintln!("chalk-web: wait for {id}: {e}");
                std::thread::sleep(Duration::from_secs(1));
                match client.task_status(id) {
                    Ok(Some((status, _))) if status != "stopped" => continue,
                    Ok(_) => return None,
                    // containerd not answering yet: keep waiting for it.
                    Err(_) => continue,
                }
            }
        }
    }
}

/// When the sandbox's lifetime ends, as the shim recorded it at start.
pub(super) fn expires_at(client: &Client, id: &str) -> Option<String> {
    client
        .container(id)
        .ok()?
        .labels
        .get(chalk_runtime::lifetime::EXPIRES_AT_LABEL)
        .cloned()
}
