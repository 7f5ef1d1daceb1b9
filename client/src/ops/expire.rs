//! What the shim asks for when a sandbox's lifetime is up: suspend it or destroy it.

use serde_json::{json, Value};

use crate::{
    containerd::{Client, Result},
    ops::snapshot,
    progress::Progress,
    records::sandboxes::chalk_container,
};

/// What the shim asks for when sandbox `id`'s lifetime is up: suspend it (a snapshot the
/// same as `chalkctl suspend` takes, labelled reason=lifetime) or destroy it (its task
/// killed and deleted, the container and its root filesystem removed).
pub fn expire(client: &mut Client, id: &str, action: &str, progress: &Progress) -> Result<Value> {
    let c = chalk_container(client, id)?;
    match action {
        "suspend" => {
            let labels = vec![("reason".to_string(), "lifetime".to_string())];
            let snap = snapshot::create(client, id, labels, true, progress)?;
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
