//! The form an encrypted snapshot takes in a registry: an artifact of its own type whose first
//! layer is the snapshot's own (plain) OCI manifest, encrypted, followed by each of that
//! manifest's layers, encrypted, in the same order. Readable in it: the empty config, the base
//! image (`subject`, a public image) and the encrypted blobs' descriptors. Whoever holds a key
//! reads the plain manifest back, whose digest is the snapshot's id on every host.

use super::oci::{self, Descriptor, ImageManifest};

pub const ARTIFACT: &str = "application/vnd.chalk.snapshot.encrypted.v1";
/// The media type suffix of a blob encrypted with age (X25519 recipients).
pub const SUFFIX: &str = "+age";

/// An encrypted snapshot's manifest: the encrypted plain manifest, then each encrypted
/// layer as `(digest, size)` in the plain manifest's order.
pub fn seal(
    plain: &ImageManifest,
    inner: (String, u64),
    layers: &[(String, u64)],
) -> Result<ImageManifest, String> {
    if layers.len() != plain.layers.len() {
        return Err(format!(
            "{} encrypted layers for a manifest of {}",
            layers.len(),
            plain.layers.len()
        ));
    }
    let mut sealed = vec![Descriptor::new(
        &format!("{}{SUFFIX}", oci::MANIFEST),
        &inner.0,
        inner.1,
    )];
    sealed.extend(plain.layers.iter().zip(layers).map(|(p, (digest, size))| {
        Descriptor::new(&format!("{}{SUFFIX}", p.media_type), digest, *size)
    }));
    Ok(ImageManifest {
        schema_version: 2,
        media_type: oci::MANIFEST.into(),
        artifact_type: Some(ARTIFACT.into()),
        config: Descriptor::empty(),
        layers: sealed,
        subject: plain.subject.clone(),
        annotations: Default::default(),
    })
}

/// An encrypted snapshot's manifest, read.
#[derive(Debug, Clone)]
pub struct Sealed {
    /// The plain manifest, encrypted.
    pub inner: Descriptor,
    pub layers: Vec<Descriptor>,
}

impl Sealed {
    /// None for a manifest that is not an encrypted snapshot.
    pub fn of(m: &ImageManifest) -> Result<Option<Sealed>, String> {
        if m.artifact_type.as_deref() != Some(ARTIFACT) {
            return Ok(None);
        }
        let (inner, layers) = m
            .layers
            .split_first()
            .ok_or("an encrypted snapshot with no layers")?;
        for l in &m.layers {
            if oci::sha256_hex_of(&l.digest).is_none() || !l.media_type.ends_with(SUFFIX) {
                return Err(format!(
                    "layer {} ({}) is not an age-encrypted sha256 blob",
                    l.digest, l.media_type
                ));
            }
        }
        if inner.media_type != format!("{}{SUFFIX}", oci::MANIFEST) {
            return Err(format!(
                "its first layer is {}, not an encrypted manifest",
                inner.media_type
            ));
        }
        Ok(Some(Sealed {
            inner: inner.clone(),
            layers: layers.to_vec(),
        }))
    }

    /// The encrypted blob of each layer of `plain` (the manifest the first layer held),
    /// checked to correspond one to one.
    pub fn bound<'a>(
        &'a self,
        plain: &'a ImageManifest,
    ) -> Result<Vec<(&'a Descriptor, &'a Descriptor)>, String> {
        if plain.layers.len() != self.layers.len() {
            return Err(format!(
                "its manifest names {} layers but {} are encrypted",
                plain.layers.len(),
                self.layers.len()
            ));
        }
        plain
            .layers
            .iter()
            .zip(&self.layers)
            .map(|(p, s)| {
                if s.media_type == format!("{}{SUFFIX}", p.media_type) {
                    Ok((p, s))
                } else {
                    Err(format!(
                        "encrypted layer {} is {}, but its plain layer is {}",
                        s.digest, s.media_type, p.media_type
                    ))
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn plain() -> ImageManifest {
        let files = vec![("pages.img".to_string(), 20, "b".repeat(64))];
        oci::snapshot_manifest(oci::Parts {
            files: &files,
            chalk_manifest: Descriptor::new(oci::CHALK_MANIFEST, &oci::sha256_digest(b"m"), 1),
            spec: Descriptor::new(oci::SPEC, &oci::sha256_digest(b"s"), 1),
            subject: Some(Descriptor::new(
                oci::MANIFEST,
                &oci::sha256_digest(b"base"),
                4,
            )),
            annotations: BTreeMap::from([(oci::CREATED.into(), "2026-12-01T00:00:00Z".into())]),
        })
    }

    fn enc(n: u8) -> (String, u64) {
        (oci::sha256_digest(&[n]), 100 + n as u64)
    }

    #[test]
    fn only_the_config_the_subject_and_encrypted_descriptors_are_readable() {
        let p = plain();
        let m = seal(&p, enc(0), &[enc(1), enc(2), enc(3)]).unwrap();
        let text = String::from_utf8(m.to_bytes()).unwrap();
        assert!(
            !text.contains("pages.img") && !text.contains("2026-12-01"),
            "{text}"
        );
        assert!(!text.contains(&"b".repeat(64)), "plain digests stay inside");
        assert_eq!(m.config, Descriptor::empty());
        assert_eq!(m.subject, p.subject);
        let s = Sealed::of(&ImageManifest::parse(&m.to_bytes()).unwrap())
            .unwrap()
            .unwrap();
        assert_eq!(s.inner.digest, enc(0).0);
        let pairs = s.bound(&p).unwrap();
        assert_eq!(pairs.len(), 3);
        assert_eq!(pairs[2].0.title(), Some("pages.img"));
        assert_eq!(pairs[2].1.media_type, format!("{}+age", oci::RUNSC_PAGES));
        assert!(m.layout().is_err(), "not readable as a plain snapshot");
    }

    #[test]
    fn plain_snapshots_are_not_sealed_and_mismatches_are_refused() {
        let p = plain();
        assert!(Sealed::of(&p).unwrap().is_none());
        assert!(seal(&p, enc(0), &[enc(1)]).is_err());
        let m = seal(&p, enc(0), &[enc(1), enc(2), enc(3)]).unwrap();
        let s = Sealed::of(&m).unwrap().unwrap();
        let mut other = p.clone();
        other.layers.pop();
        assert!(s.bound(&other).unwrap_err().contains("2 layers but 3"));
        let mut swapped = m.clone();
        swapped.layers.swap(1, 3);
        let e = Sealed::of(&swapped)
            .unwrap()
            .unwrap()
            .bound(&p)
            .unwrap_err();
        assert!(e.contains("but its plain layer is"), "{e}");
        let mut bare = m;
        bare.layers[2].media_type = oci::SPEC.into();
        assert!(Sealed::of(&bare)
            .unwrap_err()
            .contains("not an age-encrypted"));
    }
}
