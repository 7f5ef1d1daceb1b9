//! Snapshot records: labelled images in containerd's image store, in the index format
//! `ctr container restore` reads, each naming a snapshot in the shim's store; listed, found,
//! settled, deleted and collected here.

use crate::containerd::RUNTIME;
use std::collections::HashMap;

use chalk_runtime::snapshot::{
    manifest::ImageRef,
    oci,
    store::{GcReport, Pointer, Seal, Store, Stored, POINTER},
    Manifest,
};

use crate::records::registry::{self, Filter, Snapshot, Status};
use containerd_client::{services::v1::Image, types::Descriptor};
use serde_json::{json, Value};

use crate::{
    containerd::{Client, Result},
    Error,
};

pub const CHECKPOINT_TAR: &str = "application/vnd.containerd.container.criu.checkpoint.criu.tar";
pub const CHECKPOINT_SPEC: &str = "application/vnd.containerd.container.checkpoint.config.v1+proto";
const INDEX: &str = "application/vnd.oci.image.index.v1+json";

/// The media type of what a snapshot's record points at before it is completed.
pub const PLACEHOLDER: &str = "application/vnd.chalk.snapshot.placeholder.v1+json";

/// The blob a snapshot's record points at until it is completed (and after it failed): it
/// names the base image, and its label keeps that image from containerd's garbage collector.
/// The record does not point at the base image itself: containerd's CRI (1.6 and 1.7) reads
/// every record in `k8s.io` that resolves to an image as another name of that image, sorts
/// it first among the names, and then starts pods on the pause image through the record.
/// A placeholder, like a completed record's index, resolves to no image, so CRI leaves it.
pub(crate) fn placeholder(client: &Client, base: &Descriptor) -> Result<Descriptor> {
    let body = json!({
        "mediaType": PLACEHOLDER,
        "base": {"mediaType": base.media_type, "digest": base.digest, "size": base.size},
    });
    let bytes = serde_json::to_vec(&body).map_err(|e| Error::from(e.to_string()))?;
    client.write_blob(
        PLACEHOLDER,
        bytes,
        HashMap::from([(BASE_REF.to_string(), base.digest.clone())]),
    )
}

/// The image a sandbox runs, as the name a snapshot records and the descriptor of its
/// manifest (or index). A fork's container names its image by digest (`name@sha256:...`,
/// no image record has that name): the digest is the descriptor, read from the content
/// store, whatever the tag says now.
pub fn base_image(client: &Client, reference: &str) -> Result<(String, Descriptor)> {
    let Some((name, digest)) = ImageRef::pinned(reference) else {
        let target = client
            .image(reference)?
            .target
            .ok_or_else(|| Error::from(format!("image {reference} has no target")))?;
        return Ok((reference.to_string(), target));
    };
    // Verified against its digest on the way, like every blob chalkctl reads.
    let blob = client.read_blob(digest).map_err(|e| {
        format!("image {reference}: its manifest is not in containerd's content store ({e})")
    })?;
    let manifest: Value = serde_json::from_slice(&blob)
        .map_err(|e| Error::from(format!("image {reference}: its manifest is not JSON: {e}")))?;
    let media_type = match manifest["mediaType"].as_str() {
        Some(t) => t.to_string(),
        // OCI lets a manifest leave its own type out: an index lists manifests.
        None if manifest["manifests"].is_array() => INDEX.to_string(),
        None => "application/vnd.oci.image.manifest.v1+json".to_string(),
    };
    Ok((
        name.to_string(),
        Descriptor {
            media_type,
            digest: digest.to_string(),
            size: blob.len() as i64,
            annotations: HashMap::new(),
        },
    ))
}

/// Stores the index a snapshot record points at for stored snapshot `stored` (see
/// [`checkpoint_into_store`]); the same snapshot gives the same index on every host.
/// `snapshotter` is used when the snapshot does not name its own.
pub fn record_index(client: &Client, stored: &Stored, snapshotter: &str) -> Result<Descriptor> {
    let base = stored
        .layout
        .subject
        .as_ref()
        .ok_or("the stored snapshot names no base image")?;
    let note = |k: &str| stored.oci.annotations.get(k).cloned().unwrap_or_default();
    let spec = prost_types::Any {
        type_url: note(chalk_labels::SPEC_TYPE_ANNOTATION),
        value: stored.spec.clone(),
    };
    let pointer = pointer_tar(&stored.digest)?;
    // Three independent writes, at once: each is a round trip or more to containerd.
    let (snapshot, pointer, spec) = std::thread::scope(|s| {
        let snapshot = s.spawn(|| {
            client.write_blob(
                oci::MANIFEST,
                stored.manifest_bytes.clone(),
                HashMap::from([(BASE_REF.to_string(), base.digest.clone())]),
            )
        });
        let pointer = s.spawn(|| client.write_blob(CHECKPOINT_TAR, pointer, HashMap::new()));
        let spec = client.write_blob(
            CHECKPOINT_SPEC,
            prost::Message::encode_to_vec(&spec),
            HashMap::new(),
        );
        let joined = |h: std::thread::ScopedJoinHandle<'_, Result<Descriptor>>| {
            h.join()
                .unwrap_or_else(|_| Err(Error::from("a content write panicked")))
        };
        (joined(snapshot), joined(pointer), spec)
    });
    let (snapshot, pointer, spec) = (snapshot?, pointer?, spec?);
    let image = stored
        .manifest
        .image
        .as_ref()
        .map_or("", |i| ImageRef::unpinned(&i.name));
    let snapshotter = match note(chalk_labels::SNAPSHOTTER_ANNOTATION) {
        s if s.is_empty() => snapshotter.to_string(),
        s => s,
    };
    let platform = json!({"os": "linux", "architecture": oci_arch()});
    let manifests = vec![
        json!({"mediaType": pointer.media_type, "digest": pointer.digest, "size": pointer.size,
               "platform": platform}),
        json!({"mediaType": spec.media_type, "digest": spec.digest, "size": spec.size,
               "platform": platform}),
        json!({"mediaType": base.media_type, "digest": base.digest, "size": base.size}),
        json!({"mediaType": snapshot.media_type, "digest": snapshot.digest,
               "size": snapshot.size, "artifactType": oci::ARTIFACT}),
    ];
    let index = json!({
        "schemaVersion": 2,
        "mediaType": INDEX,
        "manifests": manifests,
        "annotations": {
            "org.opencontainers.image.ref.name": image,
            "io.containerd.checkpoint.runtime": RUNTIME,
            "io.containerd.checkpoint.snapshotter": snapshotter,
        },
    });
    let labels = manifests
        .iter()
        .enumerate()
        .filter_map(|(i, m)| {
            let d = m["digest"].as_str()?;
            Some((format!("containerd.io/gc.ref.content.{i}"), d.to_string()))
        })
        .collect();
    let bytes = serde_json::to_vec(&index).map_err(|e| Error::from(e.to_string()))?;
    client.write_blob(INDEX, bytes, labels)
}

/// The one-file checkpoint tar that names stored snapshot `digest` (the same bytes for the
/// same snapshot): what containerd unpacks for the shim, which then restores from the store.
pub fn pointer_tar(digest: &str) -> Result<Vec<u8>> {
    tar_of_pointer(&Pointer::to_snapshot(digest))
}

/// A checkpoint in containerd's form holding `pointer` alone.
pub fn tar_of_pointer(pointer: &Pointer) -> Result<Vec<u8>> {
    let body = pointer.to_bytes();
    let mut header = tar::Header::new_gnu();
    header
        .set_path(POINTER)
        .map_err(|e| Error::from(e.to_string()))?;
    header.set_size(body.len() as u64);
    header.set_mode(0o600);
    header.set_cksum();
    let mut tar = tar::Builder::new(Vec::new());
    tar.append(&header, &body[..])
        .map_err(|e| Error::from(e.to_string()))?;
    tar.into_inner().map_err(|e| Error::from(e.to_string()))
}

/// The stored snapshot (its OCI manifest digest) a record's index names, if it names one.
pub fn stored_in(index: &Value) -> Option<String> {
    index["manifests"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["artifactType"] == oci::ARTIFACT)
        .and_then(|m| m["digest"].as_str())
        .map(String::from)
}

/// containerd's garbage collector keeps what a blob's `gc.ref.content` labels name.
const BASE_REF: &str = "containerd.io/gc.ref.content.subject";

/// This machine's architecture as OCI names it.
pub fn oci_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// The lease a snapshot's checkpoint is taken under.
pub(crate) fn lease_of(record: &str) -> String {
    format!("chalkctl-{}", record.replace(['/', ':'], "-"))
}

/// Every snapshot in the namespace; one left `in_progress` by a taker that is gone is
/// settled first (see [`settle`]).
pub fn all(client: &Client) -> Result<Vec<Snapshot>> {
    let images = client.images(&format!(
        "labels.\"{}\"==true",
        chalk_labels::LABEL_SNAPSHOT
    ))?;
    Ok(images
        .iter()
        .filter_map(|i| {
            let labels = i.labels.clone().into_iter().collect();
            let digest = i.target.as_ref().map(|t| t.digest.as_str()).unwrap_or("");
            let mut s = Snapshot::from_record(&i.name, digest, &labels)?;
            if s.status == Status::InProgress && is_orphan(&s) {
                if let Some(target) = &i.target {
                    if let Err(e) = settle(client, &mut s, target) {
                        eprintln!("chalkctl: snapshot {} was left in progress: {e}", s.name);
                    }
                }
            }
            if s.status != Status::Completed {
                // Until completed the target is a placeholder (the base image, before this
                // build).
                s.digest.clear();
                s.index.clear();
            }
            Some(s)
        })
        .collect())
}

/// Whether the process taking in-progress snapshot `s` is gone (one recorded without a
/// taker, by an older build, after an hour).
fn is_orphan(s: &Snapshot) -> bool {
    match &s.owner {
        Some(o) => !crate::records::owner::is_alive(o),
        None => {
            let whole = s
                .created
                .split('.')
                .next()
                .unwrap_or_default()
                .trim_end_matches('Z');
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            chalk_runtime::snapshot::manifest::rfc3339_secs(&format!("{whole}Z"))
                .is_some_and(|at| now.saturating_sub(at) > 3600)
        }
    }
}

/// Settles snapshot `s`, `in_progress` with nobody taking it any more (its record's target
/// `held`): completed from the store when the shim stored it (a suspend's sandbox then reads
/// suspended, its task removed), left alone while a shim still writes its ingest, else
/// failed with what happened. The dead taker's lease goes.
fn settle(client: &Client, s: &mut Snapshot, held: &Descriptor) -> Result<()> {
    let store = client.store()?;
    let token = Store::token(client.namespace(), &s.name);
    let taker = s.owner.as_ref().map_or("the chalkctl".to_string(), |o| {
        format!("the chalkctl (pid {})", o.pid)
    });
    let seal = store.seal_state(&token);
    if let Seal::Sealed(r) = seal {
        let stored = store
            .open_snapshot(&r.manifest)
            .map_err(|e| Error::from(e.to_string()))?;
        let container = client.container(&s.sandbox_id).ok();
        let snapshotter = container
            .as_ref()
            .map_or("overlayfs".to_string(), |c| c.snapshotter.clone());
        s.status = Status::Completed;
        s.digest = r.manifest.clone();
        s.owner = None;
        // The index's blobs are held until the record refers to them (a gc meanwhile would
        // leave it naming content that is gone).
        let settling = format!("chalkctl-settle-{}", std::process::id());
        client.under_own_lease(&settling, || {
            let index = record_index(client, &stored, &snapshotter)?;
            s.index = index.digest.clone();
            client.update_image(record(s, index))
        })?;
        let suspended = stored.manifest.kind == chalk_runtime::snapshot::manifest::Kind::Suspend;
        if suspended && container.is_some() {
            client.set_container_label(
                &s.sandbox_id,
                chalk_labels::SUSPENDED_FROM,
                Some(&s.digest),
            )?;
            // The checkpoint stopped it: its task goes once containerd has its exit.
            client.delete_stopped_task(&s.sandbox_id)?;
        }
        eprintln!(
            "chalkctl: snapshot {} was stored but {taker} taking it ended before recording it: completed",
            s.name
        );
    } else if seal == Seal::Sealing {
        // Its shim is still writing or sealing it.
        return Ok(());
    } else {
        s.status = Status::Failed;
        s.error = Some(match seal {
            Seal::Failed(why) => format!("it could not be sealed: {why}"),
            _ => {
                // Nobody holds what was written of it: it goes.
                let _ = store.remove_fresh(&token);
                format!(
                    "{taker} taking it ended before the snapshot was stored: nothing of it \
                     was kept; take it again"
                )
            }
        });
        s.owner = None;
        client.update_image(record(s, held.clone()))?;
    }
    client.delete_lease(&lease_of(&s.name));
    Ok(())
}

/// The one snapshot `query` names (a digest, a 12+ digit prefix of one, or a record name).
pub fn find(client: &Client, query: &str) -> Result<Snapshot> {
    let mut found: Vec<Snapshot> = all(client)?
        .into_iter()
        .filter(|s| s.matches(query))
        .collect();
    match found.len() {
        0 => Err(format!("snapshot {query}: not found").into()),
        1 => Ok(found.remove(0)),
        n => Err(
            format!("snapshot {query} is ambiguous: {n} snapshots match; give more digits").into(),
        ),
    }
}

/// The snapshot whose record is named `name` exactly (never a prefix or a digest): what a
/// program that acts for someone else deletes by.
pub fn find_exact(client: &Client, name: &str) -> Result<Snapshot> {
    all(client)?
        .into_iter()
        .find(|s| s.name == name)
        .ok_or_else(|| format!("snapshot record {name}: not found").into())
}

/// `list`: one page.
pub fn list(
    client: &Client,
    filter: &Filter,
    limit: usize,
    cursor: Option<&str>,
) -> Result<registry::Page> {
    registry::page(&all(client)?, filter, limit, cursor).map_err(|e| Error::from(e.to_string()))
}

/// `delete`: the record goes, then its ref in the snapshot store, then every blob no other
/// snapshot needs (the disk is freed at once). Sources and forks are containers of their own:
/// untouched.
pub fn delete(client: &Client, snap: &Snapshot) -> Result<GcReport> {
    let needing: Vec<String> = client
        .containers()?
        .into_iter()
        // One suspended to a registry and released resumes from there.
        .filter(|c| {
            c.labels
                .get(chalk_labels::SUSPENDED_FROM)
                .map(String::as_str)
                == Some(snap.digest.as_str())
                && !snap.digest.is_empty()
                && !c.labels.contains_key(chalk_labels::RELEASED_TO)
        })
        .map(|c| c.id)
        .collect();
    if !needing.is_empty() {
        return Err(format!(
            "snapshot {} is what suspended sandbox(es) {} resume from: resume or remove them first",
            snap.digest,
            needing.join(", ")
        )
        .into());
    }
    remove(client, snap)
}

/// The record, then its ref, then the blobs nothing else needs.
fn remove(client: &Client, snap: &Snapshot) -> Result<GcReport> {
    client.delete_image(&snap.name)?;
    let store = client.store()?;
    store
        .remove_ref(&Store::token(client.namespace(), &snap.name))
        .map_err(|e| Error::from(e.to_string()))?;
    collect(client, &store)
}

/// The store's garbage collection for this namespace: refs whose record is gone (removed with
/// `ctr images rm`, say) are dropped first; what suspended sandboxes resume from is kept
/// whatever happened to its record.
pub fn collect(client: &Client, store: &Store) -> Result<GcReport> {
    let records: std::collections::HashSet<String> = all(client)?
        .into_iter()
        .map(|s| Store::token(client.namespace(), &s.name))
        .collect();
    for r in store.refs().map_err(|e| Error::from(e.to_string()))? {
        if r.namespace == client.namespace() && !records.contains(&r.token) {
            store
                .remove_ref(&r.token)
                .map_err(|e| Error::from(e.to_string()))?;
        }
    }
    // A sandbox suspended to a registry and released resumes from there, not from the store.
    let suspended: Vec<String> = client
        .containers()?
        .into_iter()
        .filter(|c| !c.labels.contains_key(chalk_labels::RELEASED_TO))
        .filter_map(|c| c.labels.get(chalk_labels::SUSPENDED_FROM).cloned())
        .collect();
    store.gc(&suspended).map_err(|e| Error::from(e.to_string()))
}

/// The manifest's main fields, read from the stored checkpoint.
pub fn manifest_summary(client: &Client, snap: &Snapshot) -> Result<Value> {
    if snap.status != Status::Completed {
        return Ok(Value::Null);
    }
    let m = stored_manifest(client, &snap.index)?
        .ok_or("the checkpoint holds no chalk.manifest.json")?;
    Ok(json!({
        "kind": m.kind,
        "created": m.created,
        "runsc": m.runsc.version,
        "platform": m.runsc.platform,
        "image": m.image,
        "host": m.host.hostname,
        "files": m.files.len(),
        "size": m.total_size(),
        "memory": m.memory_bytes,
        "gpu": m.extra.gpu,
        // A pod sandbox's other containers (CRI names), captured with it.
        "pod_containers": m.extra.pod.map(|p| {
            p.containers.into_iter().map(|c| c.name).collect::<Vec<_>>()
        }),
    }))
}

/// The chalk manifest of the snapshot whose index is `digest`: from the store, or from the checkpoint tar of a
/// snapshot taken before snapshots were stored as blobs (None if that has none, which the
/// shim refuses at restore).
pub fn stored_manifest(client: &Client, digest: &str) -> Result<Option<Manifest>> {
    let index: Value = serde_json::from_slice(&client.read_blob(digest)?)
        .map_err(|e| Error::from(format!("{digest}: {e}")))?;
    manifest_of(client, &index)
}

/// The chalk manifest a record's `index` leads to (see [`stored_manifest`]); a stored
/// snapshot is opened, and so checked, on the way.
pub fn manifest_of(client: &Client, index: &Value) -> Result<Option<Manifest>> {
    if let Some(stored) = stored_in(index) {
        return client
            .store()?
            .open_snapshot(&stored)
            .map(|s| Some(s.manifest))
            .map_err(|e| Error::from(e.to_string()));
    }
    let tar_digest = index["manifests"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["mediaType"] == CHECKPOINT_TAR)
        .and_then(|m| m["digest"].as_str())
        .ok_or("the snapshot's index has no checkpoint")?;
    // The checkpoint tar can be gigabytes: walk its headers and read the manifest alone.
    let Some(text) = tar_entry(client, tar_digest, "chalk.manifest.json")? else {
        return Ok(None);
    };
    serde_json::from_slice(&text)
        .map(Some)
        .map_err(|e| Error::from(format!("the snapshot's manifest: {e}")))
}

/// The content of entry `name` of the tar in blob `digest`, read header by header with
/// ranged reads (entries are not loaded on the way).
pub(crate) fn tar_entry(client: &Client, digest: &str, name: &str) -> Result<Option<Vec<u8>>> {
    const BLOCK: u64 = 512;
    let mut offset = 0;
    loop {
        let block = client.read_range(digest, offset, BLOCK)?;
        if block.len() < BLOCK as usize || block.iter().all(|b| *b == 0) {
            return Ok(None); // the end-of-archive marker, or the blob's end
        }
        let mut header = tar::Header::new_old();
        header.as_mut_bytes().copy_from_slice(&block);
        let size = header
            .entry_size()
            .map_err(|e| Error::from(format!("{digest}: {e}")))?;
        let path = header
            .path()
            .map_err(|e| Error::from(format!("{digest}: {e}")))?;
        if path.to_string_lossy().trim_start_matches("./") == name {
            // A ranged read of size 0 means "to the end" to containerd.
            if size == 0 {
                return Ok(Some(Vec::new()));
            }
            return client.read_range(digest, offset + BLOCK, size).map(Some);
        }
        offset += BLOCK + size.div_ceil(BLOCK) * BLOCK;
    }
}

pub fn to_json(s: &Snapshot) -> Value {
    json!({
        "id": if s.digest.is_empty() { Value::Null } else { s.digest.clone().into() },
        "index": if s.index.is_empty() { Value::Null } else { s.index.clone().into() },
        "name": s.name,
        "sandbox_id": s.sandbox_id,
        "status": s.status.as_str(),
        "created": s.created,
        "error": s.error,
        "base_image": s.base_image,
        "given_name": s.given_name,
        "labels": s.labels,
    })
}

pub(crate) fn record(snap: &Snapshot, target: Descriptor) -> Image {
    Image {
        name: snap.name.clone(),
        labels: snap.to_labels().into_iter().collect(),
        target: Some(target),
        created_at: None,
        updated_at: None,
    }
}
/// Makes the record of snapshot `snap`, not yet completed, on base image `base`; returns the
/// placeholder it points at.
pub fn create_record(client: &Client, snap: &Snapshot, base: &Descriptor) -> Result<Descriptor> {
    // The placeholder is held until the record refers to it.
    let lease = format!("chalkctl-record-{}", std::process::id());
    client.under_own_lease(&lease, || {
        let held = placeholder(client, base)?;
        client.create_image(record(snap, held.clone()))?;
        Ok(held)
    })
}
