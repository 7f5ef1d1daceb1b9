//! `chalkctl snapshot pull`: a snapshot from a registry into this host's store and registry,
//! under the same id. Its manifests are fetched and this host checked against them before any
//! memory is fetched; blobs the store already has are not fetched again; each blob is
//! checked against its digest on the way and the whole snapshot read back before its record
//! is made. A pull that fails leaves no record, and its blobs go at the next gc.
//! The `[trust]` policy decides from the manifest's digest and its signatures first, whether
//! or not the snapshot is already here; an encrypted snapshot is opened with the
//! `[encryption]` keys (its memory then arrives whole). What the registry declares is bounded
//! before anything is fetched or sized: its two manifests must agree, and the blobs to fetch
//! must fit `[snapshot] max_pull_bytes` and the store's free space.

use chalk_runtime::hostcheck::{self, Host};
use chalk_runtime::snapshot::{
    manifest::ImageRef,
    memory::{index, MemoryIndex},
    oci::{self, Descriptor, ImageManifest},
    owner::{self, Owner},
    packed::Packed,
    sealed::Sealed,
    space,
    store::{Origin, Store},
    Manifest,
};
use oci_client::RegistryOperation;

use chalk_runtime::snapshot::pieces::{Pieces, LAZY_FILE};

use super::{auth::Credentials, crypt, image, lazy, packed, session, Access, Transfer};
use crate::{
    containerd::Client,
    progress::megabytes,
    progress::Progress,
    records::registry::{self, Snapshot, Status},
    records::snapshots,
    Error, Result,
};

/// Chalk manifests and specs are small; a bigger one is refused before it fills memory.
const SMALL: u64 = 16 << 20;

pub struct Pulled {
    pub snapshot: Snapshot,
    pub transfer: Transfer,
}

/// Pulls snapshot `reference` (a tag, or a digest) into this host. With
/// `access.lazy_server` (chalkctl, which serves a file while it arrives), its memory file is
/// left to arrive while a restore already reads it, where this host, its runsc and the
/// registry allow (else it is fetched whole, and the progress says why, once).
pub fn pull(
    client: &mut Client,
    access: &Access,
    reference: &str,
    progress: &Progress,
) -> Result<Pulled> {
    let r = super::reference(reference)?;
    if let Some(ns) = access
        .pulled_for
        .as_deref()
        .filter(|ns| !owner::is_namespace(ns))
    {
        return Err(format!(
            "{ns:?} is not a Kubernetes namespace name (lower-case letters, digits and '-', at \
             most 63)"
        )
        .into());
    }
    let (s, bytes, pinned) = session::find_manifest(access, &r)?;
    let opts = client.options()?;
    if let Some(verdict) = super::trust::enforce(&opts.trust_policy(), &s, &r, reference, &pinned)?
    {
        progress.step(&format!("{}: {verdict}", crate::progress::short(&pinned)));
    }
    let not_ours = |why: String| {
        Error::from(format!(
            "{reference} is not a chalk snapshot ({why}): nothing was fetched"
        ))
    };
    let fetched = ImageManifest::parse(&bytes).map_err(not_ours)?;
    // An encrypted or packed snapshot's first layer is its own manifest: its digest is the id.
    let sealed = Sealed::of(&fetched).map_err(not_ours)?;
    let packed = Packed::of(&fetched).map_err(not_ours)?;
    let packed_digest = pinned.clone();
    let (keys, bytes, id) = match (&sealed, &packed) {
        (None, Some(p)) => {
            let keys = match p.encrypted {
                true => Some(load_keys(&opts, reference)?),
                false => None,
            };
            s.login(&r, RegistryOperation::Pull)?;
            let inner = s.blob(&r, &p.plain.digest, SMALL)?;
            let inner = match &keys {
                Some(keys) => crypt::decrypt_any(keys, &inner).map_err(|e| {
                    Error::from(format!("{reference}: {e}; nothing else was fetched"))
                })?,
                None => inner,
            };
            let id = oci::sha256_digest(&inner);
            (keys, bytes::Bytes::from(inner), id)
        }
        (None, None) => (None, bytes, pinned),
        (Some(sealed), _) => {
            let keys = load_keys(&opts, reference)?;
            s.login(&r, RegistryOperation::Pull)?;
            let inner = s.blob(&r, &sealed.inner.digest, SMALL)?;
            let inner = crypt::decrypt_any(&keys, &inner)
                .map_err(|e| Error::from(format!("{reference}: {e}; nothing else was fetched")))?;
            let id = oci::sha256_digest(&inner);
            (Some(keys), bytes::Bytes::from(inner), id)
        }
    };
    let store = client.store()?;
    if let Ok(existing) = snapshots::find(client, &id) {
        if existing.status == Status::Completed && store.open_snapshot(&id).is_ok() {
            progress.step(&format!(
                "snapshot {} is already here",
                crate::progress::short(&id)
            ));
            return Ok(Pulled {
                snapshot: existing,
                transfer: Transfer::default(),
            });
        }
    }
    let oci_manifest = match (&sealed, &packed) {
        (None, None) => fetched,
        _ => ImageManifest::parse(&bytes).map_err(not_ours)?,
    };
    // Refuses any other artifact type.
    let layout = oci_manifest.layout().map_err(not_ours)?;
    // Each plain layer's encrypted blob, for an encrypted snapshot.
    let encrypted: Vec<(&Descriptor, &Descriptor)> = match (&sealed, &packed) {
        (Some(sealed), _) => sealed
            .bound(&oci_manifest)
            .map_err(|e| not_ours(format!("its encrypted layers: {e}")))?,
        (None, Some(p)) => p
            .bound(&oci_manifest)
            .map_err(|e| not_ours(format!("its layers: {e}")))?
            .into_iter()
            .filter_map(|(plain, sent)| sent.filter(|_| p.encrypted).map(|s| (plain, s)))
            .collect(),
        (None, None) => Vec::new(),
    };
    let sealed_of = |d: &Descriptor| encrypted.iter().find(|(p, _)| *p == d).map(|(_, s)| *s);
    let small = |d: &Descriptor| -> Result<Vec<u8>> {
        match (sealed_of(d), &keys) {
            (Some(e), Some(keys)) => {
                crypt::decrypt_bytes(keys, &s.blob(&r, &e.digest, SMALL)?, &d.digest)
            }
            _ => s.blob(&r, &d.digest, SMALL),
        }
    };
    s.login(&r, RegistryOperation::Pull)?;
    let chalk = small(&layout.chalk_manifest)?;
    let m = Manifest::parse(&chalk, store.root()).map_err(|e| Error::from(e.to_string()))?;
    if !layout.lists(&m) {
        return Err(not_ours(
            "its layers and its chalk manifest list different files".to_string(),
        ));
    }
    let host = check_host(client, &m, reference)?;
    // A packed snapshot's memory: the index over its pieces, checked against its packs.
    let memory_index = match &packed {
        Some(p) => {
            let raw = s.blob(&r, &p.index.digest, index::MAX_INDEX_BYTES as u64)?;
            let raw = match &keys {
                Some(keys) => crypt::decrypt_any(keys, &raw)?,
                None => raw,
            };
            let memory = layout.files.iter().find(|d| d.title() == Some(LAZY_FILE));
            let index = MemoryIndex::parse(&raw)
                .and_then(|i| p.check_index(&i, memory.map_or(0, |d| d.size)).map(|_| i))
                .map_err(|e| not_ours(format!("its memory index: {e}")))?;
            Some(index)
        }
        None => None,
    };
    let spec = small(&layout.spec)?;
    let config = s.blob(&r, &oci_manifest.config.digest, SMALL)?;
    // What would arrive, as the registry declares it (an encrypted blob as sent).
    let incoming: Vec<(String, u64)> = layout
        .files
        .iter()
        .filter(|d| !store.has_blob(&d.digest))
        .map(|d| {
            let sent = sealed_of(d).map_or(d.size, |e| e.size.max(d.size));
            (d.title().unwrap_or("a blob").to_string(), sent)
        })
        .collect();
    let free = space::available(store.root())
        .map_err(|e| Error::from(format!("free space of {}: {e}", store.root().display())))?;
    space::check_incoming(&incoming, free, opts.snapshot.max_pull_bytes).map_err(|e| {
        Error::from(format!(
            "{reference} is refused: {e}; nothing was fetched but its manifests"
        ))
    })?;

    let name = registry::record_name(&m.source.sandbox_id, &crate::clock::now());
    client.lease(&format!(
        "chalkctl-pull-{}-{}",
        crate::progress::short(&id),
        std::process::id()
    ))?;
    let mut t = Transfer::default();
    let snapshotter = oci_manifest
        .annotations
        .get(chalk_labels::SNAPSHOTTER_ANNOTATION)
        .cloned()
        .unwrap_or_else(|| "overlayfs".to_string());
    let base = layout
        .subject
        .clone()
        .ok_or_else(|| not_ours("it names no base image (subject)".to_string()))?;
    let base_desc = super::to_containerd(&base);
    image::fetch(
        client,
        &s,
        &r,
        &base_desc,
        &snapshotter,
        opts.snapshot.max_pull_bytes,
        &mut t,
        progress,
    )?;

    // The record comes first, in progress and holding the base image, as for a snapshot
    // taken here: a gc meanwhile keeps the ref it is about to get.
    let image = m
        .image
        .as_ref()
        .map_or_else(String::new, |i| ImageRef::unpinned(&i.name).to_string());
    let mut snapshot = Snapshot {
        name,
        digest: String::new(),
        index: String::new(),
        sandbox_id: m.source.sandbox_id.clone(),
        status: Status::InProgress,
        created: crate::clock::now(),
        error: None,
        base_image: Some(format!("{image}@{}", base.digest)),
        owner: crate::records::owner::me(),
        given_name: None,
        labels: [(crate::records::registry::PULLED_FROM.to_string(), r.whole())].into(),
    };
    snapshots::create_record(client, &snapshot, &base_desc)?;
    let token = Store::token(client.namespace(), &snapshot.name);
    // The blob left to its server, if one was: its hex and title.
    let mut arriving: Option<(String, String)> = None;
    // The page digests of a memory file put together from pieces, for the next push.
    let mut fetched_pages = None;
    let stored = (|| {
        let ingest = store
            .begin_ingest(&token)
            .map_err(|e| Error::from(e.to_string()))?;
        // The small files whole first: a restore reads them before anything else, and the
        // memory file's server starts last, once nothing else can fail the pull but import.
        let mut files: Vec<_> = layout.files.iter().collect();
        files.sort_by_key(|d| d.title() == Some(LAZY_FILE));
        let lazy_server = access.lazy_server.as_deref().and_then(|exe| {
            let memory = layout.files.iter().find(|d| d.title() == Some(LAZY_FILE));
            let why = match memory {
                Some(d) if store.has_blob(&d.digest) => return None,
                // Keys: an encrypted snapshot, in either form.
                Some(_) if keys.is_some() => Some(
                    "it is encrypted (its memory is decrypted whole before the sandbox runs)"
                        .to_string(),
                ),
                Some(d) => lazy_unavailable(&m, &host, d.size),
                None => Some(host_cannot_serve(&host).unwrap_or_else(|| {
                    "its memory is not a separate pages.img (written by another runsc)".into()
                })),
            };
            match why {
                None => Some(exe),
                Some(why) => {
                    progress.step(&format!("fetching the snapshot's memory whole: {why}"));
                    None
                }
            }
        });
        for d in files {
            if store.hold_blob(&ingest, &d.digest) {
                t.present(d.size);
                continue;
            }
            let hex = oci::sha256_hex_of(&d.digest)
                .ok_or_else(|| not_ours(format!("{} is not a sha256 digest", d.digest)))?;
            let title = d.title().unwrap_or("blob");
            if let Some(exe) = lazy_server.filter(|_| title == LAZY_FILE) {
                let served = {
                    let job = lazy::Job {
                        store: store.root().to_path_buf(),
                        reference: r.whole(),
                        digest: d.digest.clone(),
                        size: d.size,
                        pieces: pieces_of(&m).cloned().unwrap_or_else(|| Pieces {
                            size: 0,
                            sha256: Vec::new(),
                        }),
                        index: memory_index.clone(),
                        snapshot_id: Some(id.clone()),
                        packed: Some(packed_digest.clone()),
                        hosts_dir: access.hosts_dir.clone(),
                        plain_http: access.plain_http,
                        endpoint: s.endpoint.host.clone(),
                        credentials: match s.credentials() {
                            Credentials::Basic { user, password } => {
                                Some((user.clone(), password.clone()))
                            }
                            Credentials::Anonymous => None,
                        },
                        record: Some(lazy::Record {
                            address: client.address().to_string(),
                            namespace: client.namespace().to_string(),
                            name: snapshot.name.clone(),
                        }),
                        deadline_secs: lazy::deadline_secs(d.size),
                    };
                    lazy::start(exe, &job, access.deadline)
                };
                match served {
                    Ok(()) => {
                        progress.step(&format!(
                            "{title} ({}) arrives while the sandbox runs",
                            megabytes(d.size)
                        ));
                        arriving = Some((hex.to_string(), title.to_string()));
                        t.bytes_arriving += d.size;
                        continue;
                    }
                    Err(why) => {
                        progress.step(&format!("fetching the snapshot's memory whole: {why}"))
                    }
                }
            }
            let part = ingest.part_path(hex);
            if let Some(index) = memory_index.as_ref().filter(|_| title == LAZY_FILE) {
                let pages = progress.during(
                    &format!(
                        "fetching {title} as pieces ({} of {})",
                        megabytes(index.stored_bytes()),
                        megabytes(d.size)
                    ),
                    || packed::fetch::fetch(&s, &r, &store, index, keys.as_ref(), &d.digest, &part),
                )?;
                t.moved(index.stored_bytes());
                fetched_pages = Some(pages);
                continue;
            }
            match (sealed_of(d), &keys) {
                (Some(e), Some(keys)) => {
                    // Decrypted as it arrives: the encrypted bytes never reach the disk.
                    progress.during(
                        &format!("fetching and decrypting {title} ({})", megabytes(e.size)),
                        || {
                            crypt::decrypt_stream(keys, &part, &d.digest, |w| {
                                s.blob_to_writer(&r, &e.digest, e.size, w)
                            })
                        },
                    )?;
                    t.moved(e.size);
                }
                _ => {
                    progress
                        .during(&format!("fetching {title} ({})", megabytes(d.size)), || {
                            s.blob_to_file(&r, &d.digest, d.size, &part)
                        })?;
                    t.moved(d.size);
                }
            }
        }
        let small: [&[u8]; 3] = [&chalk, &spec, &config];
        let origin = Origin {
            owner: Some(Owner::puller(
                client.namespace(),
                access.pulled_for.as_deref(),
            )),
            pulled_from: Some(r.whole()),
        };
        let (_, stored) = store
            .import(ingest, client.namespace(), origin, &bytes, &small)
            .map_err(|e| Error::from(e.to_string()))?;
        if let (Some(index), Some(p)) = (&memory_index, &packed) {
            let pages = fetched_pages.take();
            packed::push::remember_pulled(&store, &r, p, &packed_digest, &stored, index, pages);
        }
        let index = snapshots::record_index(client, &stored, &snapshotter)?;
        snapshot.status = Status::Completed;
        snapshot.digest = id.clone();
        snapshot.index = index.digest.clone();
        client.update_image(snapshots::record(&snapshot, index))
    })();
    if let Err(e) = stored {
        // Nothing of a failed pull stays: its blobs go at the next gc.
        let _ = client.delete_image(&snapshot.name);
        let _ = store.remove_ref(&token);
        // A server that failed at once drops the record itself, which fails the import or
        // the record's update here: its reason is the one to give.
        let served = arriving.and_then(|(hex, title)| Some((store.never_arrived(&hex)?, title)));
        return Err(match served {
            Some((why, title)) => Error::from(format!("{title} {why}; nothing of the pull stays")),
            None => e,
        });
    }
    progress.step(&format!(
        "pulled {} ({} fetched, {} already here{})",
        crate::progress::short(&id),
        megabytes(t.bytes_moved),
        megabytes(t.bytes_present),
        if t.bytes_arriving > 0 {
            format!(", {} arriving", megabytes(t.bytes_arriving))
        } else {
            String::new()
        }
    ));
    Ok(Pulled {
        snapshot,
        transfer: t,
    })
}

/// The keys that open encrypted snapshots here, or why there are none.
fn load_keys(
    opts: &chalk_runtime::options::RuntimeOptions,
    reference: &str,
) -> Result<crypt::Keys> {
    let keys = opts.encryption.identities.as_deref().ok_or_else(|| {
        Error::from(format!(
            "{reference} is encrypted and this host has no key: set [encryption] identities in \
             the runtime options to a key file of one of its recipients (chalkctl snapshot \
             keygen makes one); nothing was fetched but its manifest"
        ))
    })?;
    crypt::Keys::load(keys)
}

/// The manifest's piece digests of the memory file.
fn pieces_of(m: &Manifest) -> Option<&Pieces> {
    m.files
        .iter()
        .find(|f| f.path == LAZY_FILE)
        .and_then(|f| f.pieces.as_ref())
}

/// Why this pull cannot leave the memory file to arrive while it is read, if it cannot.
fn lazy_unavailable(m: &Manifest, host: &Host, size: u64) -> Option<String> {
    if let Some(why) = host_cannot_serve(host) {
        return Some(why);
    }
    if !pieces_of(m).is_some_and(|p| p.fit(size)) {
        return Some("the snapshot has no piece digests (taken by an older chalk-shim)".into());
    }
    lazy::unavailable()
}

/// Why this host cannot restore from a memory file that still arrives, if it cannot.
fn host_cannot_serve(host: &Host) -> Option<String> {
    (!host.lazy_restore).then(|| {
        "this host's runsc does not restore in the background (or lazy_restore is off)".into()
    })
}

/// Refuses a snapshot this host cannot restore, naming what differs, before its memory is
/// fetched. This host, as probed.
fn check_host(client: &Client, m: &Manifest, reference: &str) -> Result<Host> {
    let opts = client.options()?;
    let here = Host::probe(&opts, m.extra.gpu.is_some()).map_err(|e| Error::from(e.to_string()))?;
    let differs = hostcheck::differences(m, &here);
    if !differs.is_empty() {
        return Err(format!(
            "{reference} cannot be restored on this host: {}; nothing was fetched (restore it \
             on a host that matches, or take the snapshot again under this host's runsc)",
            differs.join("; ")
        )
        .into());
    }
    Ok(here)
}
