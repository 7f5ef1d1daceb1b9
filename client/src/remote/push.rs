//! `chalkctl snapshot push`: a completed snapshot from the store to a registry, with its base
//! image when the repository lacks it; blobs the registry already has are not sent again (a
//! second snapshot of the same sandbox sends what changed).

use chalk_runtime::snapshot::{manifest::ImageRef, oci};
use oci_client::{Reference, RegistryOperation};
use serde_json::{json, Value};

use super::{hosts::Use, image, session, Access, Transfer};
use crate::{
    containerd::Client, progress::megabytes, progress::Progress, records::registry::Status,
    records::snapshots, Error, Result,
};

pub struct Pushed {
    /// `repo:tag@digest`: what a pull names.
    pub reference: String,
    pub id: String,
    pub transfer: Transfer,
}

/// Pushes snapshot `query` (an id, a prefix or a record name) to `target`.
pub fn push(
    client: &Client,
    access: &Access,
    query: &str,
    target: &str,
    progress: &Progress,
) -> Result<Pushed> {
    let snap = snapshots::find(client, query)?;
    if snap.status != Status::Completed {
        return Err(format!(
            "snapshot {} is {}: only a completed snapshot can be pushed",
            snap.name, snap.status
        )
        .into());
    }
    let index: Value = serde_json::from_slice(&client.read_blob(&snap.index)?)
        .map_err(|e| Error::from(format!("{}: {e}", snap.index)))?;
    let id = snapshots::stored_in(&index).ok_or_else(|| {
        Error::from(format!(
            "snapshot {} was taken before snapshots were stored as blobs: take a new one to \
             push it",
            snap.name
        ))
    })?;
    let store = client.store()?;
    let stored = store
        .open_snapshot(&id)
        .map_err(|e| Error::from(e.to_string()))?;
    let r = super::reference(target)?;
    if let Some(d) = r.digest() {
        if d != id {
            return Err(format!(
                "{target} names digest {d}, but snapshot {} is {id}: push to a tag",
                snap.name
            )
            .into());
        }
    }
    let sessions = session::sessions(access, &r, Use::Push)?;
    let s = &sessions[0];
    s.login(&r, RegistryOperation::Push)?;
    let mut t = Transfer::default();

    if let Some(base) = &stored.layout.subject {
        let base = super::to_containerd(base);
        // Blobs of the image's own repository on the same registry are mounted, not sent.
        let source = stored
            .manifest
            .image
            .as_ref()
            .and_then(|i| super::reference(ImageRef::unpinned(&i.name)).ok())
            .filter(|src| src.registry() == r.registry() && src.repository() != r.repository());
        image::push(client, s, &r, source.as_ref(), &base, &mut t, progress)?;
    }

    let blobs = std::iter::once(&stored.oci.config).chain(&stored.oci.layers);
    for d in blobs {
        let name = d.title().unwrap_or(&d.media_type).to_string();
        if s.has_blob(&r, &d.digest)? {
            t.present(d.size);
            continue;
        }
        let path = store
            .blob_path(&d.digest)
            .map_err(|e| Error::from(e.to_string()))?;
        progress.during(&format!("pushing {name} ({})", megabytes(d.size)), || {
            s.push_file(&r, &path, &d.digest, d.size)
        })?;
        t.moved(d.size);
    }
    s.push_manifest(&r, stored.manifest_bytes.clone(), oci::MANIFEST)?;
    if let Some(subject) = &stored.layout.subject {
        add_referrer(s, &r, &subject.digest, &id, stored.manifest_bytes.len())?;
    }
    progress.step(&format!(
        "pushed {} to {} ({} sent, {} already there)",
        crate::progress::short(&id),
        r.whole(),
        megabytes(t.bytes_moved),
        megabytes(t.bytes_present)
    ));
    let tagged = Reference::with_tag(
        r.registry().to_string(),
        r.repository().to_string(),
        r.tag().unwrap_or("latest").to_string(),
    );
    Ok(Pushed {
        reference: format!("{}@{id}", tagged.whole()),
        id,
        transfer: t,
    })
}

/// Lists snapshot `digest` among the referrers of `subject` in the tag that registries
/// without the referrers API keep (`sha256-<hex>`, an index), as OCI 1.1 asks of clients.
fn add_referrer(
    s: &session::Session,
    r: &Reference,
    subject: &str,
    digest: &str,
    size: usize,
) -> Result<()> {
    const INDEX: &str = "application/vnd.oci.image.index.v1+json";
    let tag = Reference::with_tag(
        r.registry().to_string(),
        r.repository().to_string(),
        subject.replace(':', "-"),
    );
    let mut index = match s.try_manifest(&tag, &[INDEX])? {
        Some((bytes, _)) => serde_json::from_slice::<Value>(&bytes)
            .unwrap_or_else(|_| json!({"schemaVersion": 2, "mediaType": INDEX, "manifests": []})),
        None => json!({"schemaVersion": 2, "mediaType": INDEX, "manifests": []}),
    };
    let listed = index["manifests"]
        .as_array()
        .is_some_and(|m| m.iter().any(|m| m["digest"] == digest));
    if listed {
        return Ok(());
    }
    let entry = json!({"mediaType": oci::MANIFEST, "digest": digest, "size": size,
                       "artifactType": oci::ARTIFACT});
    match index["manifests"].as_array_mut() {
        Some(list) => list.push(entry),
        None => index["manifests"] = json!([entry]),
    }
    let bytes = serde_json::to_vec(&index).map_err(|e| Error::from(e.to_string()))?;
    s.push_manifest(&tag, bytes, INDEX)
}
