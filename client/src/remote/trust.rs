//! Signatures of snapshots in registries (cosign's format and tag, see
//! `chalk_runtime::snapshot::signature`), and the `[trust]` policy every pull obeys: its
//! verdict comes from the manifest's digest and the signatures alone, before anything else
//! of the snapshot is fetched.

use std::path::PathBuf;

use chalk_runtime::snapshot::{
    oci::{self, ImageManifest},
    signature::{self, Entry},
};
use chalk_runtime::trust::{Requirement, TrustOptions, Verdict};
use oci_client::{Reference, RegistryOperation};

use super::{
    session::Session,
    sign::{PublicKey, SigningKey},
};
use crate::{Error, Result};

const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";

/// Where the signatures of manifest `digest` of `r`'s repository are kept.
fn signature_tag(r: &Reference, digest: &str) -> Result<Reference> {
    let tag = signature::tag_for(digest)
        .ok_or_else(|| Error::from(format!("{digest} is not a sha256 digest")))?;
    Ok(Reference::with_tag(
        r.registry().to_string(),
        r.repository().to_string(),
        tag,
    ))
}

/// Signs manifest `digest` of `r`'s repository with `key`, beside any signatures it has.
pub fn sign(s: &Session, r: &Reference, digest: &str, key: &SigningKey) -> Result<()> {
    s.login(r, RegistryOperation::Push)?;
    let payload = signature::payload(&format!("{}/{}", r.registry(), r.repository()), digest);
    let entry = Entry {
        payload: oci::Descriptor::new(
            signature::PAYLOAD,
            &oci::sha256_digest(&payload),
            payload.len() as u64,
        ),
        signature: key.sign(&payload),
    };
    let at = signature_tag(r, digest)?;
    let existing = existing(s, &at)?;
    let (m, config) = signature::with_entry(existing.as_ref(), &entry);
    for (bytes, d) in [(payload, &entry.payload.digest), (config, &m.config.digest)] {
        if !s.has_blob(r, d)? {
            s.push_bytes(r, bytes, d)?;
        }
    }
    s.push_manifest(&at, m.to_bytes(), oci::MANIFEST)
}

fn existing(s: &Session, at: &Reference) -> Result<Option<ImageManifest>> {
    match s.try_manifest(at, &[oci::MANIFEST, DOCKER_MANIFEST])? {
        None => Ok(None),
        Some((bytes, _)) => ImageManifest::parse(&bytes)
            .map(Some)
            .map_err(|e| Error::from(format!("the signatures at {}: {e}", at.whole()))),
    }
}

/// What the signatures of one manifest say.
pub struct Checked {
    /// The first key one of them verifies with.
    pub signed_by: Option<PathBuf>,
    /// Signatures found.
    pub count: usize,
    /// Why each one that did not verify did not.
    pub problems: Vec<String>,
    /// The tag they were looked for under.
    pub tag: String,
}

/// Checks the signatures of manifest `digest` of `r`'s repository against `keys`.
pub fn check(s: &Session, r: &Reference, digest: &str, keys: &[PublicKey]) -> Result<Checked> {
    let at = signature_tag(r, digest)?;
    let entries = existing(s, &at)?
        .map(|m| signature::entries(&m))
        .unwrap_or_default();
    let mut out = Checked {
        signed_by: None,
        count: entries.len(),
        problems: Vec::new(),
        tag: at.tag().unwrap_or_default().to_string(),
    };
    for (i, e) in entries.iter().enumerate() {
        let n = i + 1;
        if e.payload.size > signature::MAX_PAYLOAD {
            out.problems
                .push(format!("signature {n}'s payload is too big"));
            continue;
        }
        let payload = s.blob(r, &e.payload.digest, signature::MAX_PAYLOAD)?;
        let Some(key) = keys.iter().find(|k| k.verifies(&payload, &e.signature)) else {
            out.problems.push(format!(
                "signature {n} does not verify with any of the keys"
            ));
            continue;
        };
        let repository = format!("{}/{}", r.registry(), r.repository());
        match signature::signed(&payload) {
            Ok(v) if v.digest != digest => out.problems.push(format!(
                "signature {n} (by {}) vouches for manifest {}, not this one: the manifest was \
                 changed or swapped after signing",
                key.path.display(),
                v.digest
            )),
            Ok(v) if !signature::same_repository(&v.repository, &repository) => {
                out.problems.push(format!(
                    "signature {n} (by {}) was made for repository {}, not {repository}: the \
                     snapshot was copied from where it was signed",
                    key.path.display(),
                    v.repository
                ))
            }
            Ok(_) => {
                out.signed_by = Some(key.path.clone());
                return Ok(out);
            }
            Err(e) => out.problems.push(format!("signature {n}: {e}")),
        }
    }
    Ok(out)
}

/// The policy's verdict on manifest `digest` of `r` (`shown` as the user named it): what let
/// it in, or a refusal that names the snapshot, what was found and the policy line.
pub fn enforce(
    policy: &TrustOptions,
    s: &Session,
    r: &Reference,
    shown: &str,
    digest: &str,
) -> Result<Option<String>> {
    let req = policy.requirement(r.registry(), r.repository());
    let refuse = |why: String| {
        Error::from(format!(
            "snapshot {shown} ({digest}) is refused by the trust policy: {why}; the policy \
             line that refused it: {}. Nothing was fetched but its manifest and signatures \
             (sign it with chalkctl snapshot sign, or change [trust] in the runtime options)",
            req.describe()
        ))
    };
    let rule = match &req {
        Requirement::Open => return Ok(None),
        Requirement::Closed { .. } => {
            return Err(refuse(
                "no rule covers its registry or repository".to_string(),
            ))
        }
        Requirement::Rule { rule, .. } => rule,
    };
    let keys = rule
        .keys
        .iter()
        .map(|k| PublicKey::load(k))
        .collect::<Result<Vec<_>>>()?;
    s.login(r, RegistryOperation::Pull)?;
    let found = check(s, r, digest, &keys)?;
    if let Some(key) = found.signed_by {
        return Ok(Some(format!("signed by {}", key.display())));
    }
    if found.count == 0 {
        if rule.unsigned == Verdict::Allow {
            return Ok(Some(format!("unsigned, allowed by {}", req.describe())));
        }
        return Err(refuse(format!(
            "it has no signature (nothing at {}:{})",
            r.repository(),
            found.tag
        )));
    }
    Err(refuse(format!(
        "none of its {} signature(s) is good: {}",
        found.count,
        found.problems.join("; ")
    )))
}

/// The session that has manifest `reference`, and its digest.
fn resolve(access: &super::Access, reference: &str) -> Result<(Session, Reference, String)> {
    let r = super::reference(reference)?;
    let (s, _, digest) = super::session::find_manifest(access, &r)?;
    Ok((s, r, digest))
}

/// `chalkctl snapshot sign`: signs the manifest `reference` names with the key at `key`;
/// the digest signed.
pub fn sign_reference(
    access: &super::Access,
    reference: &str,
    key: &std::path::Path,
) -> Result<String> {
    let key = SigningKey::load(key)?;
    let (s, r, digest) = resolve(access, reference)?;
    sign(&s, &r, &digest, &key)?;
    Ok(digest)
}

/// What `chalkctl snapshot verify` found.
pub struct Verified {
    pub digest: String,
    pub signed_by: Option<PathBuf>,
    pub signatures: usize,
    pub problems: Vec<String>,
}

/// Checks the signatures of `reference` against `keys`.
pub fn verify_reference(
    access: &super::Access,
    reference: &str,
    keys: &[PathBuf],
) -> Result<Verified> {
    let keys = keys
        .iter()
        .map(|k| PublicKey::load(k))
        .collect::<Result<Vec<_>>>()?;
    let (s, r, digest) = resolve(access, reference)?;
    s.login(&r, RegistryOperation::Pull)?;
    let c = check(&s, &r, &digest, &keys)?;
    Ok(Verified {
        digest,
        signed_by: c.signed_by,
        signatures: c.count,
        problems: c.problems,
    })
}

/// What the runtime options' policy decides on `reference`, as a pull would.
pub fn judge_reference(
    access: &super::Access,
    policy: &TrustOptions,
    reference: &str,
) -> Result<(String, Option<String>)> {
    let (s, r, digest) = resolve(access, reference)?;
    let verdict = enforce(policy, &s, &r, reference, &digest)?;
    Ok((digest, verdict))
}
