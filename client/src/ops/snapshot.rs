//! Taking a snapshot: the record begun, the checkpoint into the shim's store, the record
//! completed (or failed); suspend is a snapshot that stops the sandbox.

use crate::containerd::RUNTIME;
use crate::records::snapshots::{
    all, base_image, create_record, find, lease_of, record, record_index,
};

use chalk_runtime::snapshot::store::{Seal, Store};

/// How long a snapshot may take to be sealed once runsc has written it (hashing runs at
/// about 1.4 GB/s a core, most of it while runsc writes).
/// How long a stored snapshot's record is retried while containerd does not answer.
const RECORD_RETRY: std::time::Duration = std::time::Duration::from_secs(30);

pub(crate) const SEAL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(900);

use crate::records::registry::{self, Snapshot, Status};
use containerd_client::types::Descriptor;

use crate::{
    containerd::{runtime_name, Client, Result},
    progress::Progress,
    Error,
};

/// A snapshot whose record exists, before its checkpoint.
pub struct Begun {
    pub snap: Snapshot,
    /// What the record points at until the snapshot is completed (see [`placeholder`]).
    held: Descriptor,
}

/// Checks sandbox `id` and makes the snapshot's record, with `status` (`pending` when the
/// checkpoint is left to a background process, else `in_progress`). Until the checkpoint is
/// stored the record points at a placeholder that keeps the base image alive.
pub fn begin(
    client: &mut Client,
    id: &str,
    labels: Vec<(String, String)>,
    status: Status,
) -> Result<Begun> {
    begin_named(client, id, labels, None, status)
}

/// As [`begin`], the snapshot given `name` (refused when another snapshot has it).
pub fn begin_named(
    client: &mut Client,
    id: &str,
    labels: Vec<(String, String)>,
    name: Option<&str>,
    status: Status,
) -> Result<Begun> {
    if let Some(name) = name {
        crate::records::names::check(name)?;
        if let Some(other) = all(client)?
            .iter()
            .find(|s| s.given_name.as_deref() == Some(name))
        {
            return Err(format!(
                "snapshot name {name} is taken (by {}): choose another, or delete that one",
                if other.digest.is_empty() {
                    &other.name
                } else {
                    &other.digest
                }
            )
            .into());
        }
    }
    if labels.len() > registry::MAX_USER_LABELS {
        return Err(format!(
            "{} labels: a snapshot carries at most {}",
            labels.len(),
            registry::MAX_USER_LABELS
        )
        .into());
    }
    let container = client.container(id)?;
    if runtime_name(&container) != RUNTIME {
        return Err(format!(
            "sandbox {id} runs {:?}, not {RUNTIME}: only chalk sandboxes can be snapshotted",
            runtime_name(&container)
        )
        .into());
    }
    if container.image.is_empty() {
        return Err(format!(
            "sandbox {id} was made without an image: a snapshot must name the image it restores onto"
        ).into());
    }
    // Refused here too (the shim refuses it), so that no failed record is left of it.
    if let Some(pod) = pod_of_member(&container) {
        return Err(format!(
            "container {id} is one of a pod's: a checkpoint is of the whole sandbox, taken \
             through the pod's sandbox container {pod} (chalkctl snapshot create --id {pod})"
        )
        .into());
    }
    let (image, base) = base_image(client, &container.image)?;
    let created = crate::clock::now();
    let snap = Snapshot {
        name: registry::record_name(id, &created),
        digest: String::new(),
        index: String::new(),
        sandbox_id: id.to_string(),
        status,
        created,
        error: None,
        base_image: Some(format!("{image}@{}", base.digest)),
        owner: (status == Status::InProgress)
            .then(crate::records::owner::me)
            .flatten(),
        given_name: name.map(String::from),
        labels: labels.into_iter().collect(),
    };
    let held = create_record(client, &snap, &base)?;
    Ok(Begun { snap, held })
}

/// The pod sandbox of a container that CRI made in a pod (not the pod's own sandbox).
fn pod_of_member(container: &containerd_client::services::v1::Container) -> Option<String> {
    use chalk_runtime::spec::{CRI_CONTAINER_TYPE, CRI_SANDBOX_ID};
    let notes = &crate::containerd::spec_of(container)["annotations"];
    (notes[CRI_CONTAINER_TYPE] == "container")
        .then(|| notes[CRI_SANDBOX_ID].as_str().map(String::from))
        .flatten()
}

/// Picks up a `pending` snapshot by its record name (what `--no-wait` leaves behind).
pub fn pending(client: &Client, name: &str) -> Result<Begun> {
    let image = client.image(name)?;
    let labels = image.labels.clone().into_iter().collect();
    let held = image
        .target
        .ok_or_else(|| Error::from(format!("snapshot {name} has no target")))?;
    let snap = Snapshot::from_record(name, &held.digest, &labels)
        .ok_or_else(|| Error::from(format!("{name} is not a snapshot")))?;
    if snap.status != Status::Pending {
        return Err(format!("snapshot {name} is {}, not pending", snap.status).into());
    }
    Ok(Begun { snap, held })
}

/// A begun snapshot whose checkpoint Checkpoint has answered for: runsc's files are written
/// and usable (see [`Written::token`]) while the shim seals them.
pub struct Written {
    snap: Snapshot,
    held: Descriptor,
    suspend: bool,
    checkpointed: Result<()>,
}

impl Written {
    /// The store token a restore may name the snapshot by before it is sealed (through its
    /// fresh directory) and after; None when the checkpoint failed.
    pub fn token(&self, client: &Client) -> Option<String> {
        self.checkpointed
            .is_ok()
            .then(|| Store::token(client.namespace(), &self.snap.name))
    }

    pub fn name(&self) -> &str {
        &self.snap.name
    }
}

/// Checkpoints the sandbox of a begun snapshot into the store; answers once runsc's files are
/// written (the seal runs on: [`complete`]).
pub fn write(
    client: &mut Client,
    begun: Begun,
    suspend: bool,
    progress: &Progress,
) -> Result<Written> {
    let Begun { mut snap, held } = begun;
    let id = snap.sandbox_id.clone();
    client.lease(&lease_of(&snap.name))?;
    if snap.status != Status::InProgress {
        // A pending snapshot's taker is the process that picks it up.
        snap.status = Status::InProgress;
        snap.owner = crate::records::owner::me();
        client.update_image(record(&snap, held.clone()))?;
    }
    let what = if suspend {
        format!("checkpointing {id}, then stopping it")
    } else {
        format!("checkpointing {id} (it keeps running)")
    };
    let checkpointed = progress.during(&what, || {
        checkpoint_into_store(client, &id, &snap.name, &snap.created, suspend)
    });
    Ok(Written {
        snap,
        held,
        suspend,
        checkpointed,
    })
}

/// Waits for a written snapshot's seal and completes its record (or marks it failed with the
/// error). With `suspend` the sandbox stopped after the checkpoint: its task is removed (no
/// runsc process is left) and its record names the snapshot it resumes from.
pub fn complete(client: &mut Client, written: Written, progress: &Progress) -> Result<Snapshot> {
    let Written {
        mut snap,
        held,
        suspend,
        checkpointed,
    } = written;
    let id = snap.sandbox_id.clone();
    let index = match checkpointed {
        Ok(()) => progress.during("sealing", || sealed_index(client, &id, &snap.name)),
        Err(e) => {
            // Stored all the same (containerd failed after the shim): kept.
            match sealed_index(client, &id, &snap.name) {
                Ok(index) => {
                    eprintln!("chalkctl: {e} (after the snapshot was stored: kept)");
                    Ok(index)
                }
                Err(_) => Err(e),
            }
        }
    };
    match index {
        Ok((index, manifest, size)) => {
            progress.step(&format!(
                "stored {} of checkpoint",
                crate::progress::megabytes(size)
            ));
            snap.status = Status::Completed;
            snap.digest = manifest;
            snap.index = index.digest.clone();
            client.update_image(record(&snap, index))?;
            if suspend {
                client.set_container_label(
                    &id,
                    chalk_labels::SUSPENDED_FROM,
                    Some(&snap.digest),
                )?;
                client.delete_stopped_task(&id)?;
                progress.step(&format!("released {id}'s sandbox"));
            }
            Ok(snap)
        }
        Err(e) => {
            snap.status = Status::Failed;
            snap.error = Some(e.to_string());
            client.update_image(record(&snap, held))?;
            Err(e)
        }
    }
}

/// Checkpoints the sandbox of a begun snapshot and completes its record once it is sealed
/// ([`write`], then [`complete`]).
pub fn finish(
    client: &mut Client,
    begun: Begun,
    suspend: bool,
    progress: &Progress,
) -> Result<Snapshot> {
    let written = write(client, begun, suspend, progress)?;
    complete(client, written, progress)
}

/// Snapshots sandbox `id` and returns the completed snapshot (see [`finish`]).
pub fn create(
    client: &mut Client,
    id: &str,
    labels: Vec<(String, String)>,
    suspend: bool,
    progress: &Progress,
) -> Result<Snapshot> {
    create_named(client, id, labels, None, suspend, progress)
}

/// As [`create`], the snapshot given `name`.
pub fn create_named(
    client: &mut Client,
    id: &str,
    labels: Vec<(String, String)>,
    name: Option<&str>,
    suspend: bool,
    progress: &Progress,
) -> Result<Snapshot> {
    let begun = begin_named(client, id, labels, name, Status::InProgress)?;
    progress.step(&format!("recorded {} (in_progress)", begun.snap.name));
    finish(client, begun, suspend, progress)
}

/// Waits until snapshot `query` is completed (returned) or failed (its error), for at most
/// `timeout`.
pub fn wait(
    client: &Client,
    query: &str,
    timeout: Option<std::time::Duration>,
) -> Result<Snapshot> {
    let deadline = timeout.map(|t| std::time::Instant::now() + t);
    loop {
        let snap = find(client, query)?;
        match snap.status {
            Status::Completed => return Ok(snap),
            Status::Failed => {
                return Err(format!(
                    "snapshot {query} failed: {}",
                    snap.error.as_deref().unwrap_or("no error recorded")
                )
                .into())
            }
            Status::Pending | Status::InProgress => {}
        }
        if deadline.is_some_and(|d| std::time::Instant::now() >= d) {
            return Err(format!(
                "snapshot {query} is still {} after {}: wait longer (--timeout) or follow it \
                 with chalkctl snapshot get",
                snap.status,
                crate::clock::seconds(timeout.unwrap_or_default())
            )
            .into());
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// Checkpoints `id` into an ingest directory of the snapshot store; the shim answers once
/// runsc's files are written, and seals them after (moves each file in as a blob, writes the
/// snapshot's OCI manifest and, last, its ref).
fn checkpoint_into_store(
    client: &Client,
    id: &str,
    record: &str,
    created: &str,
    exit: bool,
) -> Result<()> {
    let store = client.store()?;
    let token = Store::token(client.namespace(), record);
    let container = client.container(id)?;
    // containerd 1.6 stores the spec on every checkpoint and refuses one it already holds.
    client.mark_spec(&container, chalk_labels::CHECKPOINTED_AT, created)?;
    client
        .checkpoint(id, exit, Some(&store.ingest_path(&token)))
        .map(drop)
}

/// Waits for the seal of snapshot `record` of sandbox `id`, then stores the index the record
/// points at, in the form `ctr container restore` reads: a pointer to the stored snapshot as
/// its checkpoint (a few hundred bytes), the spec, the base image and the snapshot's OCI
/// manifest, each kept from containerd's garbage collector by the index's labels. Returns the
/// index, the stored snapshot's manifest digest (the snapshot's id) and the checkpoint's size.
fn sealed_index(client: &Client, id: &str, record: &str) -> Result<(Descriptor, String, u64)> {
    let store = client.store()?;
    let token = Store::token(client.namespace(), record);
    // The snapshot's id is known once it is sealed: its ref, written last, once every blob
    // is in. With the ref the snapshot is whole, even if containerd failed at what it did
    // after the shim (a suspended sandbox is then not lost).
    let r = match store.seal_state(&token) {
        // Not in this store at all: the shim writes to another.
        Seal::Lost if !store.fresh_path(&token).exists() => {
            return Err(Error::from(format!(
                "the shim of {id} did not store the snapshot in {}: give chalkctl the runtime \
                 options the shim uses (--config, or CHALK_SHIM_CONFIG), whose [snapshot] store \
                 names the store",
                store.root().display()
            )))
        }
        _ => store
            .wait_sealed(&token, SEAL_TIMEOUT)
            .map_err(|e| Error::from(e.to_string()))?,
    };
    let stored = store
        .open_snapshot(&r.manifest)
        .map_err(|e| Error::from(e.to_string()))?;
    // The snapshot is whole. A containerd restarting (which may be why the checkpoint's answer
    // was lost) is waited for, so that a suspended sandbox is not left without its record.
    let deadline = std::time::Instant::now() + RECORD_RETRY;
    let index = loop {
        let snapshotter = client.container(id).map(|c| c.snapshotter);
        match snapshotter.and_then(|s| record_index(client, &stored, &s)) {
            Ok(index) => break index,
            Err(e) if std::time::Instant::now() >= deadline => return Err(e),
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(500)),
        }
    };
    Ok((index, r.manifest, stored.manifest.total_size()))
}
