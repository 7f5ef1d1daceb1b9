//! `chalkctl fork`: new sandboxes from a snapshot, on the base image by digest.

use std::{collections::HashMap, time::Instant};

use chalk_runtime::{registry::Status, snapshot::hash::sha256_hex};
use containerd_client::{
    services::v1::{container::Runtime, Container},
    types::Descriptor,
};
use prost::Message;
use serde_json::Value;

use crate::{
    client::{Client, Result},
    progress::Progress,
    snapshots::{self, CHECKPOINT_TAR, RUNTIME},
};

const CHECKPOINT_SPEC: &str = "application/vnd.containerd.container.checkpoint.config.v1+proto";
/// Set on every fork: the snapshot it came from.
pub const FORKED_FROM: &str = "chalk.io/forked-from";

/// One fork's outcome.
pub struct Forked {
    pub id: String,
    pub pid: Result<u32>,
    pub elapsed_ms: u64,
}

/// What a snapshot's index holds for a restore.
pub(crate) struct Parts {
    pub checkpoint: Descriptor,
    spec: prost_types::Any,
    snapshotter: String,
    image: String,
    base: Descriptor,
    chain_id: String,
}

fn descriptor(v: &Value) -> Descriptor {
    Descriptor {
        media_type: v["mediaType"].as_str().unwrap_or_default().to_string(),
        digest: v["digest"].as_str().unwrap_or_default().to_string(),
        size: v["size"].as_i64().unwrap_or_default(),
        annotations: HashMap::new(),
    }
}

fn read_json(client: &Client, digest: &str) -> Result<Value> {
    serde_json::from_slice(&client.read_blob(digest)?).map_err(|e| format!("{digest}: {e}"))
}

pub(crate) fn parts(client: &Client, index_digest: &str) -> Result<Parts> {
    let index = read_json(client, index_digest)?;
    let manifests: Vec<&Value> = index["manifests"]
        .as_array()
        .into_iter()
        .flatten()
        .collect();
    let by_type = |t: &str| {
        manifests
            .iter()
            .find(|m| m["mediaType"] == t)
            .map(|m| descriptor(m))
    };
    let checkpoint = by_type(CHECKPOINT_TAR).ok_or("the snapshot holds no checkpoint")?;
    let spec_desc = by_type(CHECKPOINT_SPEC).ok_or("the snapshot holds no spec")?;
    let base = manifests
        .iter()
        .find(|m| {
            let t = m["mediaType"].as_str().unwrap_or_default();
            t.contains("manifest") || t.ends_with("image.index.v1+json")
        })
        .map(|m| descriptor(m))
        .ok_or("the snapshot names no base image")?;
    let spec = prost_types::Any::decode(&client.read_blob(&spec_desc.digest)?[..])
        .map_err(|e| format!("the snapshot's spec: {e}"))?;
    let note = |k: &str| {
        index["annotations"][k]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    Ok(Parts {
        chain_id: image_config(client, &base)?.1,
        checkpoint,
        spec,
        snapshotter: note("io.containerd.checkpoint.snapshotter"),
        image: note("org.opencontainers.image.ref.name"),
        base,
    })
}

/// An image's config (for this platform's manifest when the image is an index) and the
/// chain id of its root filesystem (the name of its unpacked snapshot).
pub(crate) fn image_config(client: &Client, target: &Descriptor) -> Result<(Value, String)> {
    let mut manifest = read_json(client, &target.digest)?;
    if manifest["manifests"].is_array() {
        let arch = snapshots::oci_arch();
        let digest = manifest["manifests"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|m| m["platform"]["os"] == "linux" && m["platform"]["architecture"] == arch)
            .and_then(|m| m["digest"].as_str())
            .ok_or_else(|| format!("image {} has no linux/{arch} manifest", target.digest))?
            .to_string();
        manifest = read_json(client, &digest)?;
    }
    let config_digest = manifest["config"]["digest"]
        .as_str()
        .ok_or("the image's manifest has no config")?;
    let config = read_json(client, config_digest)?;
    let diff_ids: Vec<&str> = config["rootfs"]["diff_ids"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let mut chain = diff_ids
        .first()
        .ok_or("the image has no layers")?
        .to_string();
    for diff in &diff_ids[1..] {
        chain = format!(
            "sha256:{}",
            sha256_hex(format!("{chain} {diff}").as_bytes())
        );
    }
    Ok((config, chain))
}

/// The ids of `count` forks: `id` for one, `id-1`.. for several; `<sandbox>-fork-<time>` by
/// default.
pub fn fork_ids(id: Option<&str>, sandbox: &str, stamp: &str, count: usize) -> Vec<String> {
    let base = id.map_or_else(|| format!("{sandbox}-fork-{stamp}"), str::to_string);
    match count {
        1 => vec![base],
        n => (1..=n).map(|i| format!("{base}-{i}")).collect(),
    }
}

/// Forks snapshot `query` into `count` running sandboxes, made concurrently and each reported
/// on its own: one that fails is removed and does not undo the others.
pub fn fork(
    client: &mut Client,
    query: &str,
    id: Option<&str>,
    count: usize,
    progress: &Progress,
) -> Result<Vec<Forked>> {
    if count == 0 {
        return Err("--count must be at least 1".into());
    }
    let snap = snapshots::find(client, query)?;
    match snap.status {
        Status::Completed => {}
        Status::Pending | Status::InProgress => {
            return Err(format!(
                "snapshot {} is still in progress ({}): fork it once \
                 `chalkctl snapshot get --snapshot-id {}` reads completed",
                snap.name, snap.status, snap.name
            ))
        }
        Status::Failed => {
            return Err(format!(
                "snapshot {} failed ({}): there is nothing to fork; take a new one",
                snap.name,
                snap.error.as_deref().unwrap_or("no error recorded")
            ))
        }
    }
    let p = parts(client, &snap.digest)?;
    progress.step(&format!(
        "snapshot {} of {} verified; forking {count}",
        short(&snap.digest),
        snap.sandbox_id
    ));
    let stamp: String = snapshots::now()
        .chars()
        .filter(char::is_ascii_digit)
        .collect();
    client.lease(&format!("chalkctl-fork-{stamp}"))?;
    let client = &*client;
    let p = &p;
    let digest = snap.digest.as_str();
    // All at once: each restore is mostly runsc's own work, and independent.
    let out = std::thread::scope(|s| {
        let running: Vec<_> = fork_ids(id, &snap.sandbox_id, &stamp, count)
            .into_iter()
            .map(|new| {
                s.spawn(move || {
                    let started = Instant::now();
                    progress.step(&format!("restoring {new} ..."));
                    let pid = one(client, p, &new, digest);
                    match &pid {
                        Ok(pid) => progress.step(&format!("{new} running (pid {pid})")),
                        Err(e) => {
                            progress.step(&format!("{new} failed: {e}"));
                            client.delete_task(&new);
                            client.delete_container(&new);
                            client.remove_snapshot(&p.snapshotter, &new);
                        }
                    }
                    Forked {
                        id: new,
                        pid,
                        elapsed_ms: started.elapsed().as_millis() as u64,
                    }
                })
            })
            .collect();
        running
            .into_iter()
            .map(|h| h.join().expect("a fork thread panicked"))
            .collect::<Vec<_>>()
    });
    Ok(out)
}

fn one(client: &Client, p: &Parts, id: &str, snapshot: &str) -> Result<u32> {
    chalk_runtime::ids::container_id(id).map_err(|e| e.to_string())?;
    client.prepare_snapshot(&p.snapshotter, id, &p.chain_id)?;
    let mut labels = HashMap::new();
    labels.insert(FORKED_FROM.to_string(), snapshot.to_string());
    let container = Container {
        id: id.to_string(),
        labels,
        // Pinned by digest: the restore checks this digest, whatever the tag says now.
        image: format!("{}@{}", p.image, p.base.digest),
        runtime: Some(Runtime {
            name: RUNTIME.into(),
            options: None,
        }),
        spec: Some(p.spec.clone()),
        snapshotter: p.snapshotter.clone(),
        snapshot_key: id.to_string(),
        ..Default::default()
    };
    client.create_container(container.clone())?;
    client.start_task(&container, Some(&p.checkpoint))
}

/// Brings suspended sandbox `id` back under the same id from the snapshot it records.
pub fn resume(client: &mut Client, id: &str, progress: &Progress) -> Result<(String, u32)> {
    let container = client.container(id)?;
    let Some(digest) = container.labels.get(snapshots::SUSPENDED_FROM).cloned() else {
        return Err(format!("sandbox {id} is not suspended"));
    };
    let p = parts(client, &digest)?;
    client.lease(&format!("chalkctl-resume-{id}"))?;
    let pid = progress.during(&format!("restoring {id} from {}", short(&digest)), || {
        client.start_task(&container, Some(&p.checkpoint))
    })?;
    client.set_container_label(id, snapshots::SUSPENDED_FROM, None)?;
    Ok((digest, pid))
}

/// The first 12 hex digits of a digest, as `ctr` and `docker` shorten ids.
pub fn short(digest: &str) -> &str {
    let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
    hex.get(..12).unwrap_or(hex)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fork_ids_are_numbered_only_when_there_are_several() {
        assert_eq!(fork_ids(Some("f"), "web", "1", 1), ["f"]);
        assert_eq!(fork_ids(Some("f"), "web", "1", 3), ["f-1", "f-2", "f-3"]);
        assert_eq!(fork_ids(None, "web", "2026", 1), ["web-fork-2026"]);
    }

    #[test]
    fn short_digests_keep_twelve_digits() {
        assert_eq!(short("sha256:0123456789abcdef"), "0123456789ab");
        assert_eq!(short("abc"), "abc");
    }
}
