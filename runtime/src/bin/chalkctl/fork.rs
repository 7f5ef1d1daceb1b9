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

/// A container of a pod that was in the snapshot's sandbox besides its sandbox container.
struct PodMember {
    id: String,
    name: String,
    image: String,
    spec: Value,
}

/// What a snapshot's index holds for a restore.
pub(crate) struct Parts {
    pub checkpoint: Descriptor,
    /// What only a fork needs: the sandbox the snapshot was taken of (from its record) and
    /// the other containers of its pod, recreated in each fork.
    source: String,
    members: Vec<PodMember>,
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
        source: String::new(),
        members: Vec::new(),
        checkpoint,
        spec,
        snapshotter: note("io.containerd.checkpoint.snapshotter"),
        image: note("org.opencontainers.image.ref.name"),
        base,
    })
}

/// The pod containers the snapshot's manifest records (none for a plain sandbox).
fn pod_members(client: &Client, checkpoint: &str) -> Result<Vec<PodMember>> {
    let Some(text) = snapshots::tar_entry(client, checkpoint, "chalk.manifest.json")? else {
        return Ok(Vec::new());
    };
    let m: Value = serde_json::from_slice(&text).map_err(|e| format!("the manifest: {e}"))?;
    m["extra"]["pod"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            let field = |k: &str| c[k].as_str().unwrap_or_default().to_string();
            let member = PodMember {
                id: field("id"),
                name: field("name"),
                image: field("image"),
                spec: c["spec"].clone(),
            };
            if member.name.is_empty() || member.image.is_empty() || !member.spec.is_object() {
                return Err(format!(
                    "the snapshot records pod container {} without its name, image or spec",
                    member.id
                ));
            }
            Ok(member)
        })
        .collect()
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
    let mut p = parts(client, &snap.digest)?;
    p.source = snap.sandbox_id.clone();
    p.members = pod_members(client, &p.checkpoint.digest)?;
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
                            client.kill_and_delete_task(&new);
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
    let mut spec: Value =
        serde_json::from_slice(&p.spec.value).map_err(|e| format!("the snapshot's spec: {e}"))?;
    // A pod's sandbox container (with or without other containers) becomes a pod of its own.
    let is_pod = spec["annotations"][chalk_runtime::spec::CRI_SANDBOX_ID].is_string();
    let pod = is_pod.then_some((p.source.as_str(), id));
    chalk_runtime::spec::fork_spec(&mut spec, &p.source, id, pod);
    // Pinned by digest: the restore checks this digest, whatever the tag says now.
    let image = format!("{}@{}", p.image, p.base.digest);
    let container = fork_container(p, id, image, &spec, snapshot)?;
    client.create_container(container.clone())?;
    let pid = client.start_task(&container, Some(&p.checkpoint))?;
    // The sandbox waits for its pod's containers: starting each restores it into the
    // sandbox (runsc matches them by their CRI names), the last one completes the restore.
    let mut made = Vec::new();
    let ids = member_ids(id, &p.members)?;
    for (m, member_id) in p.members.iter().zip(&ids) {
        let started = member(client, p, m, member_id, id, snapshot, &mut made);
        if let Err(e) = started {
            for member in made.iter().rev() {
                client.kill_and_delete_task(member);
                client.delete_container(member);
                client.remove_snapshot(&p.snapshotter, member);
            }
            return Err(format!("pod container {} of the fork: {e}", m.name));
        }
    }
    Ok(pid)
}

/// The ids of a pod fork's containers: `<name>-<fork>`. runsc finds a container by any
/// prefix of its id and refuses an id that prefixes another in the same sandbox (even an
/// exact one), so no id of the fork may begin another: `<fork>-<name>` always would.
fn member_ids(fork: &str, members: &[PodMember]) -> Result<Vec<String>> {
    let ids: Vec<String> = members
        .iter()
        .map(|m| format!("{}-{fork}", m.name))
        .collect();
    for id in &ids {
        chalk_runtime::ids::container_id(id).map_err(|e| e.to_string())?;
    }
    let all: Vec<&str> = std::iter::once(fork)
        .chain(ids.iter().map(String::as_str))
        .collect();
    for a in &all {
        if let Some(b) = all.iter().find(|b| b != &a && b.starts_with(a)) {
            return Err(format!(
                "fork id {fork}: the fork's containers would be {a} and {b}, and runsc cannot \
                 tell ids apart when one begins another; pick another --id"
            ));
        }
    }
    Ok(ids)
}

/// Creates and starts pod container `m` as `id` in fork `pod`, on its image by digest;
/// records its id in `made` as soon as there is something to remove.
fn member(
    client: &Client,
    p: &Parts,
    m: &PodMember,
    id: &str,
    pod: &str,
    snapshot: &str,
    made: &mut Vec<String>,
) -> Result<()> {
    let image = client.image(&m.image)?;
    let target = image
        .target
        .ok_or_else(|| format!("image {} has no target", m.image))?;
    let (_, chain_id) = image_config(client, &target)?;
    client.prepare_snapshot(&p.snapshotter, id, &chain_id)?;
    made.push(id.to_string());
    let mut spec = m.spec.clone();
    chalk_runtime::spec::fork_spec(&mut spec, &m.id, id, Some((&p.source, pod)));
    let image = format!("{}@{}", m.image, target.digest);
    let container = fork_container(p, id, image, &spec, snapshot)?;
    client.create_container(container.clone())?;
    client.start_task(&container, None).map(drop)
}

/// The container record of fork container `id`: this runtime, `spec`, `image` (by digest),
/// its own root filesystem snapshot, labelled with the snapshot it came from.
fn fork_container(
    p: &Parts,
    id: &str,
    image: String,
    spec: &Value,
    snapshot: &str,
) -> Result<Container> {
    Ok(Container {
        id: id.to_string(),
        labels: HashMap::from([(FORKED_FROM.to_string(), snapshot.to_string())]),
        image,
        runtime: Some(Runtime {
            name: RUNTIME.into(),
            options: None,
        }),
        spec: Some(prost_types::Any {
            type_url: p.spec.type_url.clone(),
            value: serde_json::to_vec(spec).map_err(|e| e.to_string())?,
        }),
        snapshotter: p.snapshotter.clone(),
        snapshot_key: id.to_string(),
        ..Default::default()
    })
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
    fn pod_fork_ids_never_begin_one_another() {
        let member = |name: &str| PodMember {
            id: "x".into(),
            name: name.into(),
            image: "i".into(),
            spec: Value::Null,
        };
        let ids = member_ids("pf", &[member("web"), member("side")]).unwrap();
        assert_eq!(ids, ["web-pf", "side-pf"]);
        // "w" begins "web-w": runsc could not tell them apart.
        let err = member_ids("w", &[member("web")]).unwrap_err();
        assert!(err.contains("pick another --id"), "{err}");
        assert!(member_ids("pf", &[member("a"), member("a-pf")]).is_err());
    }

    #[test]
    fn short_digests_keep_twelve_digits() {
        assert_eq!(short("sha256:0123456789abcdef"), "0123456789ab");
        assert_eq!(short("abc"), "abc");
    }
}
