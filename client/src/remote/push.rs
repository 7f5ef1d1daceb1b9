//! `chalkctl snapshot push`: a completed snapshot from the store to a registry, with its base
//! image when the repository lacks it; blobs the registry already has are not sent again, and
//! a memory file goes as pieces (`packed`): only those the repository lacks, compressed. With recipients, every blob but
//! the empty config is encrypted on this host first (`sealed`), so nothing of the memory
//! reaches the registry readable; with a key, the pushed manifest is signed as cosign signs.

use chalk_runtime::snapshot::{
    manifest::ImageRef,
    oci::{self, ImageManifest},
    packed as packed_form, sealed,
    store::{Store, Stored as StoredSnapshot},
};
use oci_client::{Reference, RegistryOperation};
use serde_json::{json, Value};

use super::{crypt, hosts::Use, image, packed, session, sign::SigningKey, Access, Transfer};
use crate::{
    containerd::Client, progress::megabytes, progress::Progress, records::registry::Status,
    records::snapshots, Error, Result,
};

pub struct Pushed {
    /// `repo:tag@digest`: what a pull names.
    pub reference: String,
    pub id: String,
    pub transfer: Transfer,
    /// Encrypted for recipients (then the reference's digest is not the id).
    pub encrypted: bool,
    /// The signing key's file, when signed.
    pub signed_with: Option<std::path::PathBuf>,
}

/// Pushes snapshot `query` (an id, a prefix or a record name) to `target`.
pub fn push(
    client: &Client,
    access: &Access,
    query: &str,
    target: &str,
    progress: &Progress,
) -> Result<Pushed> {
    // Keys and recipients that cannot be used are refused before anything moves.
    let recipients = access.recipients()?;
    let signer = access
        .sign_with
        .as_deref()
        .map(SigningKey::load)
        .transpose()?;
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

    let options = client.options()?.snapshot;
    let pieces = match options.push_pieces {
        true => packed::push::push(
            s,
            &r,
            &store,
            &stored,
            recipients.as_ref(),
            options.max_chain_depth,
            &mut t,
            progress,
        )?,
        false => None,
    };
    let (manifest, digest, artifact) = match (&pieces, &recipients) {
        (Some(ready), _) => (
            ready.manifest.clone(),
            ready.digest.clone(),
            packed_form::ARTIFACT,
        ),
        (None, None) => {
            push_plain(s, &r, &store, &stored, &mut t, progress)?;
            (stored.manifest_bytes.clone(), id.clone(), oci::ARTIFACT)
        }
        (None, Some(to)) => {
            let m = push_sealed(s, &r, &store, &stored, to, &mut t, progress)?;
            let bytes = m.to_bytes();
            let digest = oci::sha256_digest(&bytes);
            (bytes, digest, sealed::ARTIFACT)
        }
    };
    let size = manifest.len();
    s.push_manifest(&r, manifest, oci::MANIFEST)?;
    if let Some(ready) = pieces {
        ready.remember(&store, progress);
    }
    if let Some(subject) = &stored.layout.subject {
        add_referrer(s, &r, &subject.digest, &digest, size, artifact)?;
    }
    if let (Some(key), Some(path)) = (&signer, &access.sign_with) {
        super::trust::sign(s, &r, &digest, key)?;
        progress.step(&format!(
            "signed {} with {}",
            crate::progress::short(&digest),
            path.display()
        ));
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
        reference: format!("{}@{digest}", tagged.whole()),
        id,
        transfer: t,
        encrypted: recipients.is_some(),
        signed_with: access.sign_with.clone(),
    })
}

/// The snapshot's blobs as the store keeps them (those the registry has are not sent).
fn push_plain(
    s: &session::Session,
    r: &Reference,
    store: &Store,
    stored: &StoredSnapshot,
    t: &mut Transfer,
    progress: &Progress,
) -> Result<()> {
    let blobs = std::iter::once(&stored.oci.config).chain(&stored.oci.layers);
    for d in blobs {
        let name = d.title().unwrap_or(&d.media_type).to_string();
        if s.has_blob(r, &d.digest)? {
            t.present(d.size);
            continue;
        }
        let path = store
            .blob_path(&d.digest)
            .map_err(|e| Error::from(e.to_string()))?;
        progress.during(&format!("pushing {name} ({})", megabytes(d.size)), || {
            s.push_file(r, &path, &d.digest, d.size)
        })?;
        t.moved(d.size);
    }
    Ok(())
}

/// Each blob encrypted for `to` in a scratch directory of the store (root-only, removed
/// after), then pushed: the encrypted snapshot's manifest. Encryption is randomized, so every
/// push sends every blob.
fn push_sealed(
    s: &session::Session,
    r: &Reference,
    store: &Store,
    stored: &StoredSnapshot,
    to: &crypt::Recipients,
    t: &mut Transfer,
    progress: &Progress,
) -> Result<ImageManifest> {
    super::send_config(s, r, stored, t)?;
    let inner = crypt::encrypt_bytes(to, &stored.manifest_bytes)?;
    let inner_desc = (oci::sha256_digest(&inner), inner.len() as u64);
    s.push_bytes(r, inner, &inner_desc.0)?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let scratch = store
        .begin_ingest(&format!("seal-{}-{nanos}", std::process::id()))
        .map_err(|e| Error::from(e.to_string()))?;
    let mut layers = Vec::with_capacity(stored.oci.layers.len());
    for (i, d) in stored.oci.layers.iter().enumerate() {
        let name = d.title().unwrap_or(&d.media_type).to_string();
        let path = store
            .blob_path(&d.digest)
            .map_err(|e| Error::from(e.to_string()))?;
        let out = scratch.dir().join(format!("{i}.age"));
        let sent = progress.during(
            &format!("encrypting and pushing {name} ({})", megabytes(d.size)),
            || {
                let (digest, size) = crypt::encrypt_file(to, &path, &out)?;
                let pushed = s.push_file(r, &out, &digest, size);
                let _ = std::fs::remove_file(&out);
                pushed.map(|_| (digest, size))
            },
        )?;
        t.moved(sent.1);
        layers.push(sent);
    }
    drop(scratch);
    sealed::seal(&stored.oci, inner_desc, &layers).map_err(Error::from)
}

/// Lists snapshot `digest` among the referrers of `subject` in the tag that registries
/// without the referrers API keep (`sha256-<hex>`, an index), as OCI 1.1 asks of clients.
fn add_referrer(
    s: &session::Session,
    r: &Reference,
    subject: &str,
    digest: &str,
    size: usize,
    artifact: &str,
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
                       "artifactType": artifact});
    match index["manifests"].as_array_mut() {
        Some(list) => list.push(entry),
        None => index["manifests"] = json!([entry]),
    }
    let bytes = serde_json::to_vec(&index).map_err(|e| Error::from(e.to_string()))?;
    s.push_manifest(&tag, bytes, INDEX)
}
