//! The form a snapshot takes in a registry when its memory is kept as pieces: an artifact of
//! its own type whose first layer is the snapshot's own OCI manifest (so its id is the same on
//! every host), then each of that manifest's layers as sent, but for the memory file, then the
//! memory index ([`super::memory::index`]) and every pack the index refers to, the parent's
//! included: a registry's gc keeps what any kept snapshot needs, and the manifest's digest,
//! which a signature covers, covers every piece of the chain. The parent it took pieces from
//! is named in an annotation.
//!
//! Encrypted (age), every layer but the packs is one encrypted blob, and each piece in a pack
//! is encrypted on its own ([`super::memory::pack::SEALED_MEDIA_TYPE`]).

use std::collections::BTreeMap;

use super::{
    memory::{index, pack, MemoryIndex},
    oci::{self, Descriptor, ImageManifest},
    pieces::LAZY_FILE,
    sealed::SUFFIX,
};

pub const ARTIFACT: &str = "application/vnd.chalk.snapshot.packed.v1";

/// A packed snapshot's manifest, read.
#[derive(Debug, Clone)]
pub struct Packed {
    /// The snapshot's own manifest, as sent.
    pub plain: Descriptor,
    /// Its layers as sent, in its order, the memory file left out.
    pub layers: Vec<Descriptor>,
    pub index: Descriptor,
    pub packs: Vec<Descriptor>,
    /// The packed manifest the memory took pieces from.
    pub parent: Option<String>,
    pub encrypted: bool,
}

/// The parts of a packed manifest.
pub struct Parts<'a> {
    pub plain: &'a ImageManifest,
    pub packed: Packed,
    pub depth: u32,
}

fn suffix(encrypted: bool) -> &'static str {
    if encrypted {
        SUFFIX
    } else {
        ""
    }
}

/// The media type of a pack, encrypted or not.
pub fn pack_type(encrypted: bool) -> &'static str {
    if encrypted {
        pack::SEALED_MEDIA_TYPE
    } else {
        pack::MEDIA_TYPE
    }
}

/// The manifest of a packed snapshot.
pub fn manifest(p: Parts) -> ImageManifest {
    let mut layers = vec![p.packed.plain.clone()];
    layers.extend(p.packed.layers.iter().cloned());
    layers.push(p.packed.index.clone());
    layers.extend(p.packed.packs.iter().cloned());
    let mut annotations = BTreeMap::new();
    if let Some(parent) = &p.packed.parent {
        annotations.insert(chalk_labels::PARENT_ANNOTATION.to_string(), parent.clone());
    }
    annotations.insert(
        chalk_labels::DEPTH_ANNOTATION.to_string(),
        p.depth.to_string(),
    );
    ImageManifest {
        schema_version: 2,
        media_type: oci::MANIFEST.into(),
        artifact_type: Some(ARTIFACT.into()),
        config: Descriptor::empty(),
        layers,
        subject: p.plain.subject.clone(),
        annotations,
    }
}

impl Packed {
    /// None for a manifest that is not a packed snapshot; else its parts, checked for form:
    /// the snapshot's manifest first, the index after the files, then only packs.
    pub fn of(m: &ImageManifest) -> Result<Option<Packed>, String> {
        if m.artifact_type.as_deref() != Some(ARTIFACT) {
            return Ok(None);
        }
        if let Some(l) = m
            .layers
            .iter()
            .find(|l| oci::sha256_hex_of(&l.digest).is_none())
        {
            return Err(format!("layer {} is not a sha256 blob", l.digest));
        }
        let (plain, rest) = m
            .layers
            .split_first()
            .ok_or("a packed snapshot with no layers")?;
        let encrypted = match plain.media_type.strip_prefix(oci::MANIFEST) {
            Some("") => false,
            Some(SUFFIX) => true,
            _ => {
                return Err(format!(
                    "its first layer is {}, not a manifest",
                    plain.media_type
                ))
            }
        };
        let at = rest
            .iter()
            .position(|l| l.media_type == format!("{}{}", index::MEDIA_TYPE, suffix(encrypted)))
            .ok_or("it has no memory index layer")?;
        let packs = &rest[at + 1..];
        if let Some(l) = packs.iter().find(|l| l.media_type != pack_type(encrypted)) {
            return Err(format!(
                "layer {} after the memory index is {}, not {}",
                l.digest,
                l.media_type,
                pack_type(encrypted)
            ));
        }
        let parent = m.annotations.get(chalk_labels::PARENT_ANNOTATION).cloned();
        if let Some(p) = parent
            .as_deref()
            .filter(|p| oci::sha256_hex_of(p).is_none())
        {
            return Err(format!("its parent {p:?} is not a sha256 digest"));
        }
        Ok(Some(Packed {
            plain: plain.clone(),
            layers: rest[..at].to_vec(),
            index: rest[at].clone(),
            packs: packs.to_vec(),
            parent,
            encrypted,
        }))
    }

    /// Each layer of `plain` (the manifest the first layer held) with the blob that was sent
    /// for it: none for the memory file, whose bytes the index and packs hold.
    pub fn bound<'a>(
        &'a self,
        plain: &'a ImageManifest,
    ) -> Result<Vec<(&'a Descriptor, Option<&'a Descriptor>)>, String> {
        let memory: Vec<_> = plain
            .layers
            .iter()
            .filter(|l| l.title() == Some(LAZY_FILE))
            .collect();
        if memory.len() != 1 {
            return Err(format!(
                "its manifest has {} memory files, not one",
                memory.len()
            ));
        }
        if plain.layers.len() != self.layers.len() + 1 {
            return Err(format!(
                "its manifest names {} layers but {} were sent beside the memory",
                plain.layers.len(),
                self.layers.len()
            ));
        }
        let mut sent = self.layers.iter();
        plain
            .layers
            .iter()
            .map(|p| {
                if p.title() == Some(LAZY_FILE) {
                    return Ok((p, None));
                }
                let s = sent.next().expect("counted");
                let want = format!("{}{}", p.media_type, suffix(self.encrypted));
                if s.media_type != want || (!self.encrypted && s.digest != p.digest) {
                    return Err(format!(
                        "layer {} ({}) was sent for {} ({})",
                        s.digest, s.media_type, p.digest, p.media_type
                    ));
                }
                Ok((p, Some(s)))
            })
            .collect()
    }

    /// Whether `index` describes a memory file of `size` bytes from these packs: each pack it
    /// names is listed here and each piece lies within its pack.
    pub fn check_index(&self, index: &MemoryIndex, size: u64) -> Result<(), String> {
        if index.size != size {
            return Err(format!(
                "the memory index describes {} bytes, the memory file has {size}",
                index.size
            ));
        }
        let sizes: Vec<u64> = index
            .packs
            .iter()
            .map(|d| {
                self.packs
                    .iter()
                    .find(|p| p.digest == *d)
                    .map(|p| p.size)
                    .ok_or(format!(
                        "the memory index names pack {d}, which is not a layer"
                    ))
            })
            .collect::<Result<_, _>>()?;
        for (i, p) in index.pieces.iter().enumerate() {
            if p.offset + p.stored > sizes[p.pack as usize] {
                return Err(format!(
                    "piece {i} ends at {} in pack {}, which has {} bytes",
                    p.offset + p.stored,
                    index.packs[p.pack as usize],
                    sizes[p.pack as usize]
                ));
            }
        }
        Ok(())
    }

    /// The media type a layer of `plain_type` is sent as.
    pub fn sent_type(encrypted: bool, plain_type: &str) -> String {
        format!("{plain_type}{}", suffix(encrypted))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::memory::index::{Extent, PieceRef};

    fn d(media_type: &str, n: u8, size: u64) -> Descriptor {
        Descriptor::new(
            media_type,
            &format!("sha256:{}", format!("{n:02x}").repeat(32)),
            size,
        )
    }

    fn plain() -> ImageManifest {
        let mut pages = d(oci::RUNSC_PAGES, 3, 8192);
        pages
            .annotations
            .insert(oci::TITLE.into(), LAZY_FILE.into());
        ImageManifest {
            schema_version: 2,
            media_type: oci::MANIFEST.into(),
            artifact_type: Some(oci::ARTIFACT.into()),
            config: Descriptor::empty(),
            layers: vec![
                d(oci::CHALK_MANIFEST, 1, 10),
                d(oci::RUNSC_STATE, 2, 20),
                pages,
            ],
            subject: Some(d(oci::MANIFEST, 9, 5)),
            annotations: BTreeMap::new(),
        }
    }

    fn packed(encrypted: bool) -> Packed {
        let p = plain();
        let sent = |l: &Descriptor, n| {
            if encrypted {
                d(&Packed::sent_type(true, &l.media_type), n, l.size + 200)
            } else {
                l.clone()
            }
        };
        Packed {
            plain: d(&Packed::sent_type(encrypted, oci::MANIFEST), 4, 500),
            layers: vec![sent(&p.layers[0], 5), sent(&p.layers[1], 6)],
            index: d(&Packed::sent_type(encrypted, index::MEDIA_TYPE), 7, 300),
            packs: vec![d(pack_type(encrypted), 8, 1000)],
            parent: Some(format!("sha256:{}", "ab".repeat(32))),
            encrypted,
        }
    }

    #[test]
    fn a_packed_manifest_reads_back_plain_or_encrypted() {
        for encrypted in [false, true] {
            let m = manifest(Parts {
                plain: &plain(),
                packed: packed(encrypted),
                depth: 3,
            });
            assert_eq!(m.subject, plain().subject);
            assert_eq!(m.annotations[chalk_labels::DEPTH_ANNOTATION], "3");
            let back = Packed::of(&ImageManifest::parse(&m.to_bytes()).unwrap())
                .unwrap()
                .unwrap();
            assert_eq!(back.encrypted, encrypted);
            assert_eq!(back.packs, packed(encrypted).packs);
            assert_eq!(back.parent, packed(encrypted).parent);
            let p = plain();
            let bound = back.bound(&p).unwrap();
            assert_eq!(bound.len(), 3);
            assert!(bound[2].1.is_none());
            assert_eq!(bound[1].1, Some(&packed(encrypted).layers[1]));
        }
        assert!(Packed::of(&plain()).unwrap().is_none());
    }

    #[test]
    fn a_malformed_one_is_refused() {
        let good = manifest(Parts {
            plain: &plain(),
            packed: packed(false),
            depth: 0,
        });
        let mut m = good.clone();
        m.layers.last_mut().unwrap().media_type = oci::RUNSC_FILE.into();
        assert!(Packed::of(&m)
            .unwrap_err()
            .contains("after the memory index"));
        let mut m = good.clone();
        m.layers.retain(|l| l.media_type != index::MEDIA_TYPE);
        assert!(Packed::of(&m).unwrap_err().contains("no memory index"));
        let mut m = good.clone();
        m.layers[2].digest = format!("sha256:{}", "ee".repeat(32));
        let p = Packed::of(&m).unwrap().unwrap();
        assert!(p.bound(&plain()).unwrap_err().contains("was sent for"));
        let mut m = good;
        m.layers.remove(1);
        let p = Packed::of(&m).unwrap().unwrap();
        assert!(p.bound(&plain()).unwrap_err().contains("names 3 layers"));
    }

    #[test]
    fn an_index_must_stay_within_the_packs() {
        let p = packed(false);
        let mut index = MemoryIndex {
            size: 8192,
            depth: 0,
            packs: vec![p.packs[0].digest.clone()],
            pieces: vec![PieceRef {
                digest: "cd".repeat(32),
                len: 8192,
                pack: 0,
                offset: 900,
                stored: 100,
            }],
            extents: vec![Extent {
                offset: 0,
                len: 8192,
                piece: 0,
                at: 0,
            }],
        };
        p.check_index(&index, 8192).unwrap();
        assert!(p
            .check_index(&index, 4096)
            .unwrap_err()
            .contains("describes"));
        index.pieces[0].offset = 901;
        assert!(p
            .check_index(&index, 8192)
            .unwrap_err()
            .contains("ends at 1001"));
        index.packs[0] = format!("sha256:{}", "00".repeat(32));
        assert!(p
            .check_index(&index, 8192)
            .unwrap_err()
            .contains("not a layer"));
    }
}
