//! Signatures of snapshots in cosign's format and place, so cosign verifies what chalkctl
//! signs and the other way round: a "simple signing" payload naming the manifest digest,
//! signed (ECDSA P-256, SHA-256, DER, base64) in an annotation of its layer, in an image
//! tagged `sha256-<hex>.sig` beside the snapshot. The crypto is the caller's.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::oci::{self, Descriptor, ImageManifest};

pub const PAYLOAD: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
pub const SIGNATURE: &str = "dev.cosignproject.cosign/signature";
const KIND: &str = "cosign container image signature";
const CONFIG: &str = "application/vnd.oci.image.config.v1+json";
/// A payload is a few hundred bytes; anything far bigger is not one.
pub const MAX_PAYLOAD: u64 = 64 << 10;

/// The tag cosign keeps the signatures of manifest `digest` under.
pub fn tag_for(digest: &str) -> Option<String> {
    oci::sha256_hex_of(digest).map(|hex| format!("sha256-{hex}.sig"))
}

/// What is signed: manifest `digest` of repository `repo` (`host/path`, no tag).
pub fn payload(repo: &str, digest: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "critical": {
            "identity": {"docker-reference": repo},
            "image": {"docker-manifest-digest": digest},
            "type": KIND,
        },
        "optional": null,
    }))
    .expect("json serializes")
}

/// What a payload vouches for: a manifest digest, in a repository.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signed {
    pub digest: String,
    /// `identity.docker-reference`: the repository the signer signed it in (`host/path`).
    pub repository: String,
}

/// What payload `payload` vouches for.
pub fn signed(payload: &[u8]) -> Result<Signed, String> {
    let v: Value =
        serde_json::from_slice(payload).map_err(|e| format!("its payload is not JSON: {e}"))?;
    let critical = &v["critical"];
    if critical["type"] != KIND {
        return Err(format!(
            "its payload's type is {}, not {KIND:?}",
            critical["type"]
        ));
    }
    let digest = critical["image"]["docker-manifest-digest"]
        .as_str()
        .filter(|d| oci::sha256_hex_of(d).is_some())
        .ok_or_else(|| "its payload names no sha256 manifest digest".to_string())?;
    let repository = critical["identity"]["docker-reference"]
        .as_str()
        .filter(|r| !r.is_empty())
        .ok_or_else(|| "its payload names no repository (identity.docker-reference)".to_string())?;
    Ok(Signed {
        digest: digest.to_string(),
        repository: repository.to_string(),
    })
}

/// Whether a signature's repository (`identity.docker-reference`, which may carry a tag or
/// digest) is `repository` (`host/path`), both in their one form.
pub fn same_repository(signed: &str, repository: &str) -> bool {
    let bare = signed.split_once('@').map_or(signed, |(r, _)| r);
    // A tag follows the last ':' after the last '/' (a port comes before the first '/').
    let bare = match bare.rsplit_once(':') {
        Some((r, tag)) if !tag.contains('/') && r.contains('/') => r,
        _ => bare,
    };
    crate::registry_name::canonical(bare) == crate::registry_name::canonical(repository)
}

/// One signature found: its payload's blob and the base64 signature over it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub payload: Descriptor,
    pub signature: String,
}

/// The signatures a signature image holds (layers of other kinds are skipped).
pub fn entries(m: &ImageManifest) -> Vec<Entry> {
    m.layers
        .iter()
        .filter(|l| l.media_type == PAYLOAD && oci::sha256_hex_of(&l.digest).is_some())
        .filter_map(|l| {
            let signature = l.annotations.get(SIGNATURE)?.clone();
            let mut payload = l.clone();
            payload.annotations = BTreeMap::new();
            Some(Entry { payload, signature })
        })
        .collect()
}

/// The signature image with `entry` added to what `existing` held (cosign keeps every
/// signer's), and the config blob it names.
pub fn with_entry(existing: Option<&ImageManifest>, entry: &Entry) -> (ImageManifest, Vec<u8>) {
    let mut layers: Vec<Descriptor> = existing.map(|m| m.layers.clone()).unwrap_or_default();
    let mut layer = entry.payload.clone();
    layer.media_type = PAYLOAD.into();
    layer
        .annotations
        .insert(SIGNATURE.into(), entry.signature.clone());
    if !layers.contains(&layer) {
        layers.push(layer);
    }
    let diff_ids: Vec<&str> = layers.iter().map(|l| l.digest.as_str()).collect();
    let config = serde_json::to_vec(&json!({
        "architecture": "",
        "os": "",
        "config": {},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }))
    .expect("json serializes");
    let m = ImageManifest {
        schema_version: 2,
        media_type: oci::MANIFEST.into(),
        artifact_type: None,
        config: Descriptor::new(CONFIG, &oci::sha256_digest(&config), config.len() as u64),
        layers,
        subject: None,
        annotations: BTreeMap::new(),
    };
    (m, config)
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn payloads_name_the_digest_as_cosign_writes_it() {
        let p = payload("reg:5000/snaps", D);
        let v: Value = serde_json::from_slice(&p).unwrap();
        assert_eq!(
            v["critical"]["identity"]["docker-reference"],
            "reg:5000/snaps"
        );
        let s = signed(&p).unwrap();
        assert_eq!(
            (s.digest.as_str(), s.repository.as_str()),
            (D, "reg:5000/snaps")
        );
        assert_eq!(tag_for(D).unwrap(), format!("sha256-{}.sig", &D[7..]));
        assert!(tag_for("sha256:xyz").is_none());
        let other = br#"{"critical":{"type":"something else","image":{}}}"#;
        assert!(signed(other).unwrap_err().contains("not \"cosign"));
        assert!(signed(b"{").unwrap_err().contains("not JSON"));
        let nameless = format!(
            r#"{{"critical":{{"type":"{KIND}","image":{{"docker-manifest-digest":"{D}"}}}}}}"#
        );
        assert!(signed(nameless.as_bytes())
            .unwrap_err()
            .contains("no repository"));
    }

    #[test]
    fn a_signature_belongs_to_one_repository_in_any_spelling() {
        assert!(same_repository("reg:5000/snaps", "reg:5000/snaps"));
        assert!(same_repository("Reg:5000/snaps:v1", "reg:5000/snaps"));
        assert!(same_repository(
            &format!("reg:5000/snaps@{D}"),
            "reg:5000/snaps"
        ));
        assert!(same_repository(
            "index.docker.io/library/x",
            "docker.io/library/x"
        ));
        assert!(!same_repository("reg:5000/snaps", "reg:5000/other"));
        assert!(!same_repository("reg:5000/snaps/a", "reg:5000/snaps"));
        assert!(!same_repository("reg:5001/snaps", "reg:5000/snaps"));
    }

    #[test]
    fn signature_images_keep_every_signer_once() {
        let body = payload("reg/snaps", D);
        let e = Entry {
            payload: Descriptor::new(PAYLOAD, &oci::sha256_digest(&body), body.len() as u64),
            signature: "MEUCIQ==".into(),
        };
        let (one, config) = with_entry(None, &e);
        assert_eq!(one.config.digest, oci::sha256_digest(&config));
        assert_eq!(entries(&one), vec![e.clone()]);
        let (again, _) = with_entry(Some(&one), &e);
        assert_eq!(again.layers.len(), 1);
        let f = Entry {
            signature: "MEYCIQ==".into(),
            ..e.clone()
        };
        let (two, _) = with_entry(Some(&one), &f);
        assert_eq!(entries(&two), vec![e, f]);
    }
}
