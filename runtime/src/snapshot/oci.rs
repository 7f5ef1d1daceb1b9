//! A stored snapshot as an OCI 1.1 image manifest: an artifact of our own type, the empty
//! config, one layer per file runsc wrote (named by its title annotation, typed by what it
//! holds), the chalk manifest and the container's spec as two more layers, and `subject` the
//! base image by digest. Any OCI 1.1 registry takes it as it is. Maps are ordered, so the same
//! snapshot has the same bytes (and digest) wherever it is built.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const ARTIFACT: &str = "application/vnd.chalk.snapshot.v1";
pub const EMPTY: &str = "application/vnd.oci.empty.v1+json";
/// The empty JSON object `{}`: OCI's config for an artifact that needs none.
pub const EMPTY_DATA: &[u8] = b"{}";
pub const CHALK_MANIFEST: &str = "application/vnd.chalk.manifest.v1+json";
/// The container's spec as containerd holds it (what a fork is created from).
pub const SPEC: &str = "application/vnd.chalk.container.spec.v1+json";
pub const RUNSC_STATE: &str = "application/vnd.chalk.runsc.checkpoint.v1";
pub const RUNSC_PAGES_META: &str = "application/vnd.chalk.runsc.pages-meta.v1";
pub const RUNSC_PAGES: &str = "application/vnd.chalk.runsc.pages.v1";
pub const RUNSC_FILE: &str = "application/vnd.chalk.runsc.file.v1";
pub const TITLE: &str = "org.opencontainers.image.title";
pub const CREATED: &str = "org.opencontainers.image.created";
pub const SPEC_TITLE: &str = "spec.json";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    pub media_type: String,
    pub digest: String,
    pub size: u64,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
}

impl Descriptor {
    pub fn new(media_type: &str, digest: &str, size: u64) -> Self {
        Descriptor {
            media_type: media_type.to_string(),
            digest: digest.to_string(),
            size,
            annotations: BTreeMap::new(),
            data: None,
        }
    }

    fn titled(mut self, title: &str) -> Self {
        self.annotations.insert(TITLE.into(), title.into());
        self
    }

    pub fn title(&self) -> Option<&str> {
        self.annotations.get(TITLE).map(String::as_str)
    }

    /// The descriptor of OCI's empty config, with its two bytes inline.
    pub fn empty() -> Self {
        Descriptor {
            data: Some("e30=".into()),
            ..Descriptor::new(EMPTY, &sha256_digest(EMPTY_DATA), EMPTY_DATA.len() as u64)
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageManifest {
    pub schema_version: u32,
    pub media_type: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_type: Option<String>,
    pub config: Descriptor,
    pub layers: Vec<Descriptor>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<Descriptor>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// The media type a runsc file is stored under, by its name.
pub fn media_type_of(file: &str) -> &'static str {
    match file {
        "checkpoint.img" => RUNSC_STATE,
        "pages_meta.img" => RUNSC_PAGES_META,
        "pages.img" => RUNSC_PAGES,
        _ => RUNSC_FILE,
    }
}

/// `sha256:<hex>` of `bytes`.
pub fn sha256_digest(bytes: &[u8]) -> String {
    format!("sha256:{}", super::hash::sha256_hex(bytes))
}

/// The hex part of a `sha256:` digest, if it is one (64 lowercase hex digits).
pub fn sha256_hex_of(digest: &str) -> Option<&str> {
    let hex = digest.strip_prefix("sha256:")?;
    (hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))).then_some(hex)
}

/// The parts of a snapshot's manifest: its files as `(name, size, hex sha256)`.
pub struct Parts<'a> {
    pub files: &'a [(String, u64, String)],
    pub chalk_manifest: Descriptor,
    pub spec: Descriptor,
    pub subject: Option<Descriptor>,
    pub annotations: BTreeMap<String, String>,
}

/// The OCI manifest of a snapshot.
pub fn snapshot_manifest(p: Parts) -> ImageManifest {
    let mut layers = vec![
        p.chalk_manifest.titled(super::manifest::FILE_NAME),
        p.spec.titled(SPEC_TITLE),
    ];
    layers.extend(p.files.iter().map(|(name, size, hex)| {
        Descriptor::new(media_type_of(name), &format!("sha256:{hex}"), *size).titled(name)
    }));
    ImageManifest {
        schema_version: 2,
        media_type: MANIFEST.into(),
        artifact_type: Some(ARTIFACT.into()),
        config: Descriptor::empty(),
        layers,
        subject: p.subject,
        annotations: p.annotations,
    }
}

/// What a snapshot manifest holds, checked: where its chalk manifest and spec are, and its
/// runsc files by name.
#[derive(Debug, Clone)]
pub struct Layout {
    pub chalk_manifest: Descriptor,
    pub spec: Descriptor,
    pub files: Vec<Descriptor>,
    pub subject: Option<Descriptor>,
}

impl Layout {
    /// Whether its file layers are the files chalk manifest `m` lists: the same names, sizes
    /// and digests, in order (a snapshot whose two manifests disagree is not one).
    pub fn lists(&self, m: &super::Manifest) -> bool {
        let from_layers = self.files.iter().map(|d| {
            (
                d.title().unwrap_or_default(),
                d.size,
                sha256_hex_of(&d.digest).unwrap_or_default(),
            )
        });
        let from_manifest = m
            .files
            .iter()
            .map(|f| (f.path.as_str(), f.size, f.sha256.as_str()));
        from_layers.eq(from_manifest)
    }
}

impl ImageManifest {
    /// An OCI manifest of a snapshot from its bytes, within the bounds of a chalk manifest
    /// (its size; a layer per file, two more).
    pub fn parse(bytes: &[u8]) -> Result<Self, String> {
        use super::manifest::{MAX_FILES, MAX_MANIFEST_BYTES};
        if bytes.len() > MAX_MANIFEST_BYTES {
            return Err(format!(
                "the OCI manifest has {} bytes, more than the {MAX_MANIFEST_BYTES} a snapshot's may have",
                bytes.len()
            ));
        }
        let m: Self =
            serde_json::from_slice(bytes).map_err(|e| format!("not an OCI image manifest: {e}"))?;
        if m.layers.len() > MAX_FILES + 2 {
            return Err(format!(
                "the OCI manifest has {} layers, more than the {} of a snapshot of {MAX_FILES} files",
                m.layers.len(),
                MAX_FILES + 2
            ));
        }
        Ok(m)
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec_pretty(self).expect("a manifest serializes")
    }

    /// The snapshot layout, or what makes this manifest not one of ours.
    pub fn layout(&self) -> Result<Layout, String> {
        if self.artifact_type.as_deref() != Some(ARTIFACT) {
            return Err(format!(
                "artifact type {:?}, not {ARTIFACT}: not a chalk snapshot",
                self.artifact_type
            ));
        }
        let mut chalk_manifest = None;
        let mut spec = None;
        let mut files = Vec::new();
        for l in &self.layers {
            if sha256_hex_of(&l.digest).is_none() {
                return Err(format!(
                    "layer digest {:?} is not a sha256 digest",
                    l.digest
                ));
            }
            let title = l.title().unwrap_or_default();
            match l.media_type.as_str() {
                CHALK_MANIFEST => chalk_manifest = Some(l.clone()),
                SPEC => spec = Some(l.clone()),
                _ if super::manifest::is_plain_relative(title) => {
                    if files.iter().any(|f: &Descriptor| f.title() == Some(title)) {
                        return Err(format!("two layers name file {title:?}"));
                    }
                    files.push(l.clone())
                }
                _ => {
                    return Err(format!(
                        "layer {} names file {title:?}, which is not a plain relative name",
                        l.digest
                    ))
                }
            }
        }
        Ok(Layout {
            chalk_manifest: chalk_manifest.ok_or("no chalk manifest layer")?,
            spec: spec.ok_or("no spec layer")?,
            files,
            subject: self.subject.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(files: &[(String, u64, String)]) -> Parts<'_> {
        Parts {
            files,
            chalk_manifest: Descriptor::new(CHALK_MANIFEST, &sha256_digest(b"m"), 1),
            spec: Descriptor::new(SPEC, &sha256_digest(b"s"), 1),
            subject: Some(Descriptor::new(MANIFEST, &sha256_digest(b"base"), 4)),
            annotations: BTreeMap::from([(CREATED.to_string(), "2026-12-01T00:00:00Z".into())]),
        }
    }

    #[test]
    fn a_snapshot_is_an_artifact_with_one_layer_per_file_and_the_base_as_subject() {
        let files = vec![
            ("checkpoint.img".to_string(), 10, "a".repeat(64)),
            ("pages.img".to_string(), 20, "b".repeat(64)),
        ];
        let m = snapshot_manifest(parts(&files));
        let json: serde_json::Value = serde_json::from_slice(&m.to_bytes()).unwrap();
        assert_eq!(json["artifactType"], ARTIFACT);
        assert_eq!(json["config"]["mediaType"], EMPTY);
        assert_eq!(
            json["config"]["digest"],
            "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
        );
        assert_eq!(json["layers"][2]["mediaType"], RUNSC_STATE);
        assert_eq!(json["layers"][3]["mediaType"], RUNSC_PAGES);
        assert_eq!(json["layers"][3]["annotations"][TITLE], "pages.img");
        assert_eq!(json["subject"]["digest"], sha256_digest(b"base"));
        let layout = ImageManifest::parse(&m.to_bytes())
            .unwrap()
            .layout()
            .unwrap();
        assert_eq!(layout.files.len(), 2);
        assert_eq!(layout.files[1].title(), Some("pages.img"));
        assert_eq!(layout.chalk_manifest.title(), Some("chalk.manifest.json"));
        // The same snapshot has the same bytes.
        assert_eq!(m.to_bytes(), snapshot_manifest(parts(&files)).to_bytes());
    }

    #[test]
    fn foreign_or_unsafe_manifests_are_refused() {
        let files = vec![("../etc/passwd".to_string(), 1, "c".repeat(64))];
        let m = snapshot_manifest(parts(&files));
        assert!(m
            .layout()
            .unwrap_err()
            .contains("not a plain relative name"));
        let mut other = snapshot_manifest(parts(&[]));
        other.artifact_type = None;
        assert!(other.layout().unwrap_err().contains("not a chalk snapshot"));
        let mut bad = snapshot_manifest(parts(&[]));
        bad.layers[0].digest = "sha256:../x".into();
        assert!(bad.layout().unwrap_err().contains("not a sha256 digest"));
        assert!(sha256_hex_of(&"A".repeat(64)).is_none());
    }
}
