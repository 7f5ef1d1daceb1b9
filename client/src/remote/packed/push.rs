//! A snapshot pushed with its memory as pieces: its pages hashed, matched against what this
//! host knows the repository holds (the newest snapshot there of the same sandbox, else of any,
//! pushed or pulled here, whose packs the registry still has), and only the new pieces sent,
//! in one pack. The catalog entry is written once the manifest is in the registry.

use chalk_runtime::snapshot::{
    memory::{
        pack,
        plan::{self, Parent},
        MemoryIndex, PageTable,
    },
    oci::{self, Descriptor},
    packed::{self, Packed},
    pieces::LAZY_FILE,
    store::{CatalogEntry, Store, Stored},
};
use oci_client::Reference;

use super::super::{crypt, session::Session, Transfer};
use crate::{progress::megabytes, progress::Progress, Error, Result};

/// A packed push, ready for its manifest; [`Ready::remember`] once that is in the registry.
pub struct Ready {
    pub manifest: Vec<u8>,
    pub digest: String,
    repository: String,
    entry: CatalogEntry,
    pages: PageTable,
}

impl Ready {
    /// Records what the repository now holds, for the next push.
    pub fn remember(mut self, store: &Store, progress: &Progress) {
        self.entry.packed = self.digest.clone();
        if let Err(e) = store.catalog_save(&self.repository, &self.entry, Some(&self.pages)) {
            // The push stands; the next one sends all of its pieces.
            progress.step(&format!("the pushed pieces were not recorded here: {e}"));
        }
    }
}

/// `registry/repository`: what a catalog is kept by.
pub fn repository_of(r: &Reference) -> String {
    format!("{}/{}", r.registry(), r.repository())
}

/// Sends snapshot `stored` to `r` with its memory as pieces; None when it has no memory file
/// of its own (runsc's older checkpoints keep memory inside checkpoint.img), to be pushed whole.
#[allow(clippy::too_many_arguments)]
pub fn push(
    s: &Session,
    r: &Reference,
    store: &Store,
    stored: &Stored,
    to: Option<&crypt::Recipients>,
    max_depth: u32,
    t: &mut Transfer,
    progress: &Progress,
) -> Result<Option<Ready>> {
    let Some(memory) = stored
        .layout
        .files
        .iter()
        .find(|d| d.title() == Some(LAZY_FILE))
    else {
        return Ok(None);
    };
    let path = store
        .blob_path(&memory.digest)
        .map_err(|e| Error::from(e.to_string()))?;
    let pages = progress.during(
        &format!("reading the memory's pages ({})", megabytes(memory.size)),
        || PageTable::of_file(&path, 0).map_err(|e| Error::from(e.to_string())),
    )?;
    let repository = repository_of(r);
    let recipients = to.map(crypt::Recipients::fingerprint);
    let parent = choose_parent(
        s,
        r,
        store,
        &repository,
        &stored.manifest.source.sandbox_id,
        &recipients,
    )?;
    let plan = plan::plan(
        &pages,
        parent.as_ref().map(|(e, p)| Parent {
            index: &e.index,
            pages: p,
        }),
        max_depth,
    );
    let parent = parent.filter(|_| plan.took_from_parent).map(|(e, _)| e);
    let new_bytes = plan.new_bytes();
    let scratch = store
        .begin_ingest(&format!("pack-{}-{}", std::process::id(), nanos()))
        .map_err(|e| Error::from(e.to_string()))?;
    // The parent's packs come first in the index; the new one, if any, last.
    let old_packs = plan.index.packs.len() - usize::from(!plan.new.is_empty());
    let mut pack_sizes: Vec<u64> = match &parent {
        Some(p) => plan.index.packs[..old_packs]
            .iter()
            .map(|d| size_in(p, d))
            .collect(),
        None => Vec::new(),
    };
    let index = if plan.new.is_empty() {
        plan.index
    } else {
        let out = scratch.dir().join("pack");
        let seal = |frame: Vec<u8>| match to {
            Some(to) => crypt::encrypt_bytes(to, &frame).map_err(|e| e.to_string()),
            None => Ok(frame),
        };
        let written = progress.during(
            &format!("compressing {} of new memory", megabytes(new_bytes)),
            || {
                pack::write(&path, &plan.new, &out, &seal, 0)
                    .map_err(|e| Error::from(e.to_string()))
            },
        )?;
        if s.has_blob(r, &written.digest)? {
            t.present(written.size);
        } else {
            progress.during(
                &format!("pushing {} of pieces", megabytes(written.size)),
                || s.push_file(r, &out, &written.digest, written.size),
            )?;
            t.moved(written.size);
        }
        // Kept for a pull of this memory here (a resume after --release); its pieces are
        // checked as the registry's are.
        if store.keep_pack(&out, &written.digest).is_err() {
            let _ = std::fs::remove_file(&out);
        }
        pack_sizes.push(written.size);
        plan.place(&written.digest, &written.places)
    };
    drop(scratch);
    let taken = index.piece_bytes() - new_bytes;
    if taken > 0 {
        t.present(taken);
    }
    progress.step(&format!(
        "memory {}: {} new, {} already in {}, {} zeros left out",
        megabytes(index.size),
        megabytes(new_bytes),
        megabytes(taken),
        r.repository(),
        megabytes(index.zero_bytes()),
    ));
    let encrypted = to.is_some();
    let index_desc = send_small(
        s,
        r,
        to,
        t,
        &index.to_bytes(),
        chalk_runtime::snapshot::memory::index::MEDIA_TYPE,
    )?;
    let layers = other_layers(s, r, store, stored, to, t, progress)?;
    super::super::send_config(s, r, stored, t)?;
    let plain = send_small(s, r, to, t, &stored.manifest_bytes, oci::MANIFEST)?;
    let packs = index
        .packs
        .iter()
        .zip(&pack_sizes)
        .map(|(d, size)| Descriptor::new(packed::pack_type(encrypted), d, *size))
        .collect();
    let m = packed::manifest(packed::Parts {
        plain: &stored.oci,
        packed: Packed {
            plain,
            layers,
            index: index_desc,
            packs,
            parent: parent.as_ref().map(|p| p.packed.clone()),
            encrypted,
        },
        depth: index.depth,
    });
    let manifest = m.to_bytes();
    let digest = oci::sha256_digest(&manifest);
    Ok(Some(Ready {
        manifest,
        digest,
        repository,
        entry: CatalogEntry {
            id: stored.digest.clone(),
            packed: String::new(),
            sandbox_id: stored.manifest.source.sandbox_id.clone(),
            recipients,
            saved: nanos(),
            index,
            pack_sizes,
        },
        pages,
    }))
}

/// Sends small blob `bytes` (encrypted for `to`, if any) unless the registry has it.
fn send_small(
    s: &Session,
    r: &Reference,
    to: Option<&crypt::Recipients>,
    t: &mut Transfer,
    bytes: &[u8],
    plain_type: &str,
) -> Result<Descriptor> {
    let bytes = match to {
        Some(to) => crypt::encrypt_bytes(to, bytes)?,
        None => bytes.to_vec(),
    };
    let d = Descriptor::new(
        &Packed::sent_type(to.is_some(), plain_type),
        &oci::sha256_digest(&bytes),
        bytes.len() as u64,
    );
    if s.has_blob(r, &d.digest)? {
        t.present(d.size);
    } else {
        s.push_bytes(r, bytes, &d.digest)?;
        t.moved(d.size);
    }
    Ok(d)
}

fn nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

fn size_in(entry: &CatalogEntry, pack: &str) -> u64 {
    let i = entry
        .index
        .packs
        .iter()
        .position(|p| p == pack)
        .expect("a pack of the parent");
    entry.pack_sizes[i]
}

/// The snapshot of this repository to take pieces from: for the same recipients, the newest
/// of the same sandbox first, then the newest of any, whose packs the registry still has and
/// whose page digests are here.
fn choose_parent(
    s: &Session,
    r: &Reference,
    store: &Store,
    repository: &str,
    sandbox_id: &str,
    recipients: &Option<String>,
) -> Result<Option<(CatalogEntry, PageTable)>> {
    let mut entries: Vec<CatalogEntry> = store
        .catalog_entries(repository)
        .into_iter()
        .filter(|e| e.recipients == *recipients)
        .collect();
    // Stable: newest first within each group.
    entries.sort_by_key(|e| e.sandbox_id != sandbox_id);
    for e in entries.into_iter().take(3) {
        let mut all_there = true;
        for p in &e.index.packs {
            if !s.has_blob(r, p)? {
                all_there = false;
                break;
            }
        }
        if !all_there {
            continue;
        }
        if let Some(pages) = pages_of(store, repository, &e) {
            return Ok(Some((e, pages)));
        }
    }
    Ok(None)
}

/// The page digests of catalog entry `e`: as recorded, or (for a snapshot whose memory was
/// still arriving when it was pulled) read from its memory file in the store, then recorded.
fn pages_of(store: &Store, repository: &str, e: &CatalogEntry) -> Option<PageTable> {
    if let Ok(pages) = store.catalog_pages(repository, &e.id) {
        return Some(pages);
    }
    let stored = store.open_snapshot(&e.id).ok()?;
    let memory = stored
        .layout
        .files
        .iter()
        .find(|d| d.title() == Some(LAZY_FILE))?;
    let path = store
        .blob_path(&memory.digest)
        .ok()
        .filter(|p| p.exists())?;
    let pages = PageTable::of_file(&path, 0).ok()?;
    let _ = store.catalog_pages_save(repository, &e.id, &pages, None);
    Some(pages)
}

/// The snapshot's layers but its memory, as sent: plain blobs the registry lacks, or each
/// encrypted for `to`.
fn other_layers(
    s: &Session,
    r: &Reference,
    store: &Store,
    stored: &Stored,
    to: Option<&crypt::Recipients>,
    t: &mut Transfer,
    progress: &Progress,
) -> Result<Vec<Descriptor>> {
    let mut out = Vec::new();
    for d in stored
        .oci
        .layers
        .iter()
        .filter(|d| d.title() != Some(LAZY_FILE))
    {
        let name = d.title().unwrap_or(&d.media_type).to_string();
        let path = store
            .blob_path(&d.digest)
            .map_err(|e| Error::from(e.to_string()))?;
        let Some(to) = to else {
            if s.has_blob(r, &d.digest)? {
                t.present(d.size);
            } else {
                progress.during(&format!("pushing {name} ({})", megabytes(d.size)), || {
                    s.push_file(r, &path, &d.digest, d.size)
                })?;
                t.moved(d.size);
            }
            out.push(d.clone());
            continue;
        };
        let scratch = store
            .begin_ingest(&format!("seal-{}-{}", std::process::id(), nanos()))
            .map_err(|e| Error::from(e.to_string()))?;
        let sealed = scratch.dir().join("layer.age");
        let (digest, size) = progress.during(
            &format!("encrypting and pushing {name} ({})", megabytes(d.size)),
            || {
                let (digest, size) = crypt::encrypt_file(to, &path, &sealed)?;
                s.push_file(r, &sealed, &digest, size)
                    .map(|_| (digest, size))
            },
        )?;
        t.moved(size);
        out.push(Descriptor::new(
            &Packed::sent_type(true, &d.media_type),
            &digest,
            size,
        ));
    }
    Ok(out)
}

/// Records a packed snapshot this host pulled from `r`, so that the next push of its sandbox
/// there sends only what changed since (its page digests, where its memory came whole). An encrypted one is recorded for no
/// recipients this host knows: its pieces are only reused by a push that encrypted them.
pub fn remember_pulled(
    store: &Store,
    r: &Reference,
    packed: &Packed,
    packed_digest: &str,
    stored: &Stored,
    index: &MemoryIndex,
    pages: Option<PageTable>,
) {
    let sizes: Option<Vec<u64>> = index
        .packs
        .iter()
        .map(|d| packed.packs.iter().find(|p| p.digest == *d).map(|p| p.size))
        .collect();
    let Some(pack_sizes) = sizes else { return };
    let entry = CatalogEntry {
        id: stored.digest.clone(),
        packed: packed_digest.to_string(),
        sandbox_id: stored.manifest.source.sandbox_id.clone(),
        recipients: packed.encrypted.then(|| format!("pulled {packed_digest}")),
        saved: nanos(),
        index: index.clone(),
        pack_sizes,
    };
    // Best effort: without it the next push sends all of its pieces.
    let _ = store.catalog_save(&repository_of(r), &entry, pages.as_ref());
}
