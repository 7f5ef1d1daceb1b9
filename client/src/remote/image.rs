//! A snapshot's base image between containerd and a registry: pushed beside the snapshot when
//! the repository lacks it (a registry keeps a `subject` in the same repository), and on the
//! other side fetched into containerd's content store and unpacked for the snapshotter the
//! snapshot uses, as `ctr images pull` would, for a host that never had it.

use std::collections::HashMap;

use containerd_client::types::Descriptor;
use oci_client::Reference;
use serde_json::Value;

use super::{session::Session, Transfer};
use crate::{
    containerd::Client, ops::parts, progress::Progress, records::snapshots, Error, Result,
};

const MANIFEST_TYPES: &[&str] = &[
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
];
/// Image configs and manifests are small; a bigger one is refused before it fills memory.
const SMALL: u64 = 4 << 20;

fn json(bytes: &[u8], what: &str) -> Result<Value> {
    serde_json::from_slice(bytes).map_err(|e| Error::from(format!("{what} is not JSON: {e}")))
}

/// The config and layers a manifest names.
fn blobs_of(manifest: &Value) -> Vec<Descriptor> {
    std::iter::once(&manifest["config"])
        .chain(manifest["layers"].as_array().into_iter().flatten())
        .filter(|d| d["digest"].is_string())
        .map(parts::descriptor)
        .collect()
}

/// Pushes image `d` (manifest or index) from containerd's content store into `r`'s repository
/// unless it is there: blobs mounted from `source`'s repository when the registry has them
/// there, else uploaded. An index's manifests that this host never fetched are left out.
pub fn push(
    client: &Client,
    s: &Session,
    r: &Reference,
    source: Option<&Reference>,
    d: &Descriptor,
    t: &mut Transfer,
    progress: &Progress,
) -> Result<()> {
    if s.has_manifest(r, &d.digest)? {
        return Ok(());
    }
    let bytes = client.read_blob(&d.digest)?;
    let manifest = json(&bytes, &format!("image manifest {}", d.digest))?;
    if let Some(children) = manifest["manifests"].as_array() {
        for child in children.iter().map(parts::descriptor) {
            if client.has_blob(&child.digest)? {
                push(client, s, r, source, &child, t, progress)?;
            }
        }
    } else {
        progress.step(&format!(
            "the registry lacks base image {}: pushing it",
            crate::progress::short(&d.digest)
        ));
        for b in blobs_of(&manifest) {
            if s.has_blob(r, &b.digest)? {
                continue;
            }
            let mounted = match source {
                Some(from) => s.mount_blob(r, from, &b.digest)?,
                None => false,
            };
            if !mounted {
                s.push_bytes(r, client.read_blob(&b.digest)?, &b.digest)?;
            }
            t.base_blobs += 1;
        }
    }
    let media_type = match manifest["mediaType"].as_str() {
        Some(m) => m.to_string(),
        None => d.media_type.clone(),
    };
    s.push_manifest(&r.clone_with_digest(d.digest.clone()), bytes, &media_type)
}

/// Makes image `d` whole in containerd and unpacked for `snapshotter`, fetching from `r`'s
/// repository what the content store lacks (this platform's manifest of an index only), at
/// most `max_bytes` as its manifest declares them. containerd's garbage collector keeps it
/// through the labels each blob gets, from the snapshot record that names it.
#[allow(clippy::too_many_arguments)]
pub fn fetch(
    client: &Client,
    s: &Session,
    r: &Reference,
    d: &Descriptor,
    snapshotter: &str,
    max_bytes: u64,
    t: &mut Transfer,
    progress: &Progress,
) -> Result<()> {
    let manifest_bytes = fetch_manifest(client, s, r, d)?;
    let mut manifest = json(&manifest_bytes, &format!("image manifest {}", d.digest))?;
    let mut writes: Vec<(Descriptor, Vec<u8>, HashMap<String, String>)> = Vec::new();
    let mut top = (d.clone(), manifest_bytes);
    if let Some(children) = manifest["manifests"].as_array() {
        let arch = snapshots::oci_arch();
        let child = children
            .iter()
            .find(|m| m["platform"]["os"] == "linux" && m["platform"]["architecture"] == arch)
            .map(parts::descriptor)
            .ok_or_else(|| {
                Error::from(format!(
                    "base image {} has no linux/{arch} manifest",
                    d.digest
                ))
            })?;
        let labels = HashMap::from([(
            "containerd.io/gc.ref.content.m.0".to_string(),
            child.digest.clone(),
        )]);
        writes.push((top.0.clone(), top.1.clone(), labels));
        let bytes = fetch_manifest(client, s, r, &child)?;
        manifest = json(&bytes, &format!("image manifest {}", child.digest))?;
        top = (child, bytes);
    }
    let blobs = blobs_of(&manifest);
    let mut missing = Vec::new();
    for b in &blobs {
        if !held(client, &b.digest)? {
            missing.push(b);
        }
    }
    let declared: u64 = missing.iter().map(|b| b.size.max(0) as u64).sum();
    if missing.iter().any(|b| b.size < 0) || declared > max_bytes {
        return Err(format!(
            "base image {} declares {declared} bytes of blobs to fetch, more than the \
             {max_bytes} a pull may bring ([snapshot] max_pull_bytes): refused, nothing of it \
             was fetched",
            d.digest
        )
        .into());
    }
    if !missing.is_empty() {
        progress.step(&format!(
            "fetching base image {} ({} blob(s))",
            crate::progress::short(&d.digest),
            missing.len()
        ));
    }
    for b in missing {
        let data = s.blob(r, &b.digest, b.size.max(0) as u64)?;
        client.write_blob(&b.media_type, data, HashMap::new())?;
        t.base_blobs += 1;
    }
    let mut labels = HashMap::new();
    if let Some(config) = blobs.first() {
        labels.insert(
            "containerd.io/gc.ref.content.config".into(),
            config.digest.clone(),
        );
    }
    for (i, l) in blobs.iter().skip(1).enumerate() {
        labels.insert(
            format!("containerd.io/gc.ref.content.l.{i}"),
            l.digest.clone(),
        );
    }
    writes.push((top.0.clone(), top.1, labels));
    // Children before the index, so a label never names what is not there yet.
    for (d, bytes, labels) in writes.into_iter().rev() {
        client.write_blob(&d.media_type, bytes, labels.clone())?;
        client.label_blob(&d.digest, labels)?;
    }
    unpack(client, &blobs, snapshotter, progress)
}

fn fetch_manifest(client: &Client, s: &Session, r: &Reference, d: &Descriptor) -> Result<Vec<u8>> {
    if held(client, &d.digest)? {
        return client.read_blob(&d.digest);
    }
    if d.size as u64 > SMALL {
        return Err(format!("image manifest {} is {} bytes: refused", d.digest, d.size).into());
    }
    let (bytes, _) = s.manifest(&r.clone_with_digest(d.digest.clone()), MANIFEST_TYPES)?;
    Ok(bytes.to_vec())
}

/// Whether containerd has blob `digest`, held in this command's lease first: a blob this
/// pull finds and does not write again must outlive another command that made it and fails.
fn held(client: &Client, digest: &str) -> Result<bool> {
    client.hold("content", digest)?;
    client.has_blob(digest)
}

/// Applies the image's layers that `snapshotter` lacks, each onto the one below, with
/// containerd's differ; the config's label keeps the result.
fn unpack(
    client: &Client,
    blobs: &[Descriptor],
    snapshotter: &str,
    progress: &Progress,
) -> Result<()> {
    let (config, layers) = blobs.split_first().ok_or("the base image has no config")?;
    let config_json = parts::read_json(client, &config.digest)?;
    let diff_ids = parts::diff_ids(&config_json);
    if diff_ids.len() != layers.len() {
        return Err(format!(
            "the base image's config lists {} layers, its manifest {}",
            diff_ids.len(),
            layers.len()
        )
        .into());
    }
    let chains = parts::chain_ids(&diff_ids);
    let mut parent = String::new();
    for ((layer, chain), diff) in layers.iter().zip(&chains).zip(&diff_ids) {
        // Held first, then looked up: what is found stays until the record names it.
        client.hold(&format!("snapshots/{snapshotter}"), chain)?;
        if !client.snapshot_exists(snapshotter, chain)? {
            progress.step(&format!(
                "unpacking layer {}",
                crate::progress::short(&layer.digest)
            ));
            let key = format!(
                "chalkctl-unpack-{}-{}",
                std::process::id(),
                crate::progress::short(chain)
            );
            let applied = client
                .prepare_mounts(snapshotter, &key, &parent)
                .and_then(|mounts| client.apply_layer(layer, mounts))
                .and_then(|applied| {
                    if applied.digest != *diff {
                        return Err(Error::from(format!(
                            "layer {} unpacks to {}, not {diff} as the image's config says",
                            layer.digest, applied.digest
                        )));
                    }
                    client.commit_snapshot(snapshotter, chain, &key)
                });
            match applied {
                Ok(()) => {}
                // Another pull unpacked the same layer meanwhile: theirs serves.
                Err(e) if e.is_already_exists() => client.remove_snapshot(snapshotter, &key),
                Err(e) => {
                    client.remove_snapshot(snapshotter, &key);
                    return Err(e);
                }
            }
        }
        parent = chain.clone();
    }
    client.label_blob(
        &config.digest,
        HashMap::from([(
            format!("containerd.io/gc.ref.snapshot.{snapshotter}"),
            parent,
        )]),
    )
}
