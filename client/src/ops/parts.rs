//! What a snapshot's index holds for a restore (its checkpoint, spec, base image and pod
//! members), read from containerd's content store; and the rebuild of the specs of a
//! snapshot that came from elsewhere.

use std::collections::HashMap;

use chalk_runtime::snapshot::{hash::sha256_hex, manifest::PodMember, Manifest};
use containerd_client::types::Descriptor;
use prost::Message;
use serde_json::Value;

use super::fork_options::ForkOptions;
use crate::{
    containerd::{Client, Result},
    progress::Progress,
    records::snapshots::{self, CHECKPOINT_SPEC, CHECKPOINT_TAR},
    Error,
};

/// What a snapshot's index holds for a restore.
pub(crate) struct Parts {
    pub checkpoint: Descriptor,
    /// What only a fork needs: the sandbox the snapshot was taken of (from its record) and
    /// the other containers of its pod, recreated in each fork.
    pub(crate) source: String,
    pub(crate) members: Vec<PodMember>,
    /// What the forks change of the source's lifetime.
    pub(crate) lifetime: ForkOptions,
    pub(crate) spec: prost_types::Any,
    pub(crate) snapshotter: String,
    pub(crate) image: String,
    pub(crate) base: Descriptor,
    pub(crate) chain_id: String,
    /// The snapshot's chalk manifest (None for an old checkpoint without one, which the shim
    /// refuses at restore).
    pub(crate) manifest: Option<Manifest>,
}

pub(crate) fn descriptor(v: &Value) -> Descriptor {
    Descriptor {
        media_type: v["mediaType"].as_str().unwrap_or_default().to_string(),
        digest: v["digest"].as_str().unwrap_or_default().to_string(),
        size: v["size"].as_i64().unwrap_or_default(),
        annotations: HashMap::new(),
    }
}

pub(crate) fn read_json(client: &Client, digest: &str) -> Result<Value> {
    serde_json::from_slice(&client.read_blob(digest)?)
        .map_err(|e| Error::from(format!("{digest}: {e}")))
}

/// What snapshot `digest` (its record's index) holds for a restore. The index's checkpoint is
/// what containerd is given: for a snapshot in the store, a pointer to it, so that the shim
/// restores from the store's own files whatever containerd's version; for one taken before
/// snapshots were stored as blobs, its checkpoint tar.
pub(crate) fn parts(client: &Client, digest: &str) -> Result<Parts> {
    let index = read_json(client, digest)?;
    // A stored snapshot is opened and checked here: a damaged store is refused before
    // anything is made.
    let manifest = snapshots::manifest_of(client, &index)?;
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
        // The snapshot's own OCI manifest (an artifact) is no image.
        .filter(|m| m["artifactType"].is_null())
        .find(|m| {
            let t = m["mediaType"].as_str().unwrap_or_default();
            t.contains("manifest") || t.ends_with("image.index.v1+json")
        })
        .map(|m| descriptor(m))
        .ok_or("the snapshot names no base image")?;
    let spec = prost_types::Any::decode(&client.read_blob(&spec_desc.digest)?[..])
        .map_err(|e| Error::from(format!("the snapshot's spec: {e}")))?;
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
        lifetime: ForkOptions::default(),
        checkpoint,
        spec,
        snapshotter: note("io.containerd.checkpoint.snapshotter"),
        // Snapshots of forks before this build recorded the pinned reference.
        image: chalk_runtime::snapshot::manifest::ImageRef::unpinned(&note(
            "org.opencontainers.image.ref.name",
        ))
        .to_string(),
        base,
        manifest,
    })
}

/// The snapshot's spec of the container, as JSON.
pub(crate) fn spec_json(p: &Parts) -> Result<Value> {
    serde_json::from_slice(&p.spec.value)
        .map_err(|e| Error::from(format!("the snapshot's spec: {e}")))
}

/// The pod containers a manifest records (none for a plain sandbox).
pub(crate) fn pod_members(m: Option<&Manifest>) -> Result<Vec<PodMember>> {
    let members = m
        .and_then(|m| m.extra.pod.clone())
        .map_or_else(Vec::new, |p| p.containers);
    for member in &members {
        if member.name.is_empty() || member.image.is_empty() || !member.spec.is_object() {
            return Err(format!(
                "the snapshot records pod container {} without its name, image or spec",
                member.id
            )
            .into());
        }
    }
    Ok(members)
}

/// How much host memory one restore of the snapshot takes: the sandbox's memory when it was
/// taken, as the manifest records it, else the size of its checkpoint files.
pub fn memory_of(m: Option<&Manifest>) -> u64 {
    m.map_or(0, |m| m.memory_bytes.unwrap_or_else(|| m.total_size()))
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
            .ok_or_else(|| {
                Error::from(format!(
                    "image {} has no linux/{arch} manifest",
                    target.digest
                ))
            })?
            .to_string();
        manifest = read_json(client, &digest)?;
    }
    let config_digest = manifest["config"]["digest"]
        .as_str()
        .ok_or("the image's manifest has no config")?;
    let config = read_json(client, config_digest)?;
    let chain = chain_ids(&diff_ids(&config))
        .pop()
        .ok_or("the image has no layers")?;
    Ok((config, chain))
}

/// An image config's layer digests, uncompressed (`rootfs.diff_ids`), bottom first.
pub(crate) fn diff_ids(config: &Value) -> Vec<&str> {
    config["rootfs"]["diff_ids"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect()
}

/// The chain id of each layer of an image whose layers have `diff_ids` (the name of the
/// snapshot that layer and those below it unpack to), bottom first.
pub(crate) fn chain_ids(diff_ids: &[&str]) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(diff_ids.len());
    for diff in diff_ids {
        let next = match out.last() {
            None => diff.to_string(),
            Some(below) => format!(
                "sha256:{}",
                sha256_hex(format!("{below} {diff}").as_bytes())
            ),
        };
        out.push(next);
    }
    out
}

/// Rebuilds the specs a snapshot pulled from a registry brought (its sandbox's, and each pod
/// member's) from the allow-list of `chalk_runtime::foreign_spec`, each placed in this
/// client's namespace's cgroup tree (`/<namespace>/<id>`, as containerd places a container):
/// nothing of them acts on this host. Refused when one binds host paths or joins namespaces
/// here; what was left out is said.
pub(crate) fn rebuild_foreign(
    p: &mut Parts,
    namespace: &str,
    source: &str,
    progress: &Progress,
) -> Result<()> {
    let rebuild = |spec: &Value, id: &str, what: &str| -> Result<Value> {
        let r = chalk_runtime::foreign_spec::rebuild(spec, Some(&format!("/{namespace}/{id}")))
            .map_err(|e| Error::from(format!("{what}: {e}")))?;
        if !r.dropped.is_empty() {
            progress.step(&format!(
                "{what} came from elsewhere: rebuilt without {}",
                r.dropped.join(", ")
            ));
        }
        Ok(r.spec)
    };
    let spec = rebuild(&spec_json(p)?, source, "the snapshot's spec")?;
    p.spec.value = serde_json::to_vec(&spec).map_err(|e| Error::from(e.to_string()))?;
    for m in &mut p.members {
        m.spec = rebuild(&m.spec, &m.id, &format!("pod container {}'s spec", m.name))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_foreign_snapshots_specs_are_rebuilt_for_its_sandbox_and_members() {
        let hostile = serde_json::json!({
            "process": {"args": ["sh"]},
            "hooks": {"prestart": [{"path": "/bin/sh"}]},
            "linux": {"devices": [{"path": "/dev/sda"}], "cgroupsPath": "/"}
        });
        let mut p = Parts {
            checkpoint: Descriptor::default(),
            source: "web".into(),
            members: vec![PodMember {
                id: "side-1".into(),
                name: "side".into(),
                image: "i".into(),
                image_digest: None,
                spec: hostile.clone(),
            }],
            lifetime: ForkOptions::default(),
            spec: prost_types::Any {
                type_url: "t".into(),
                value: serde_json::to_vec(&hostile).unwrap(),
            },
            snapshotter: String::new(),
            image: String::new(),
            base: Descriptor::default(),
            chain_id: String::new(),
            manifest: None,
        };
        rebuild_foreign(&mut p, "default", "web", &Progress::quiet()).unwrap();
        let spec = spec_json(&p).unwrap();
        assert!(spec.get("hooks").is_none() && spec["linux"].get("devices").is_none());
        assert_eq!(spec["linux"]["cgroupsPath"], "/default/web");
        assert!(p.members[0].spec.get("hooks").is_none());
        assert_eq!(p.members[0].spec["linux"]["cgroupsPath"], "/default/side-1");
        p.members[0].spec["mounts"] =
            serde_json::json!([{"destination": "/d", "type": "bind", "source": "/"}]);
        let err = rebuild_foreign(&mut p, "default", "web", &Progress::quiet()).unwrap_err();
        assert!(
            err.to_string().contains("pod container side's spec"),
            "{err}"
        );
    }
}
