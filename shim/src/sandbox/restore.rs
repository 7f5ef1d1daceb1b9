//! A restore is verified at Create, before anything is made for it: its files intact, this
//! host and runsc fit, the sandbox would reach no further, and the image is the same by
//! digest (see `chalk_runtime::snapshot::describe::check_restore`). A checkpoint that points
//! into the snapshot store is restored in place: runsc reads the stored blobs through links,
//! and the blobs are trusted by identity (hashed again only where that changed).

use std::{path::Path, time::Instant};

use chalk_runtime::{
    foreign_spec::acts_on_host,
    options::SnapshotOptions,
    runsc::{Features, MemoryLoad, SandboxRuntime},
    snapshot::{
        describe::{check_restore, Target},
        manifest::FileEntry,
        store::{Pointer, RestoreDir, Seal, Store},
        Manifest,
    },
    spec::{annotation, CRI_CONTAINER_TYPE},
};

use super::Sandboxes;
use crate::container::RestoreFrom;
use crate::errors::{Result, ShimError};

/// Where a restore is going: the container, its runtime and its spec as runsc will get it.
pub(super) struct Into<'a> {
    pub id: &'a str,
    pub runtime: &'a dyn SandboxRuntime,
    pub features: &'a Features,
    pub spec: &'a serde_json::Value,
    /// The spec as the request brought it, before the shim adapted it (its network
    /// namespace, ...): what a snapshot from elsewhere is checked against.
    pub asked: &'a serde_json::Value,
    pub options: &'a SnapshotOptions,
}

impl Sandboxes {
    /// Checks that the snapshot in `dir` (a checkpoint directory, or a pointer to a stored
    /// snapshot) may be restored as `to`.
    pub(super) fn verify_restore(&self, dir: &Path, to: Into) -> Result<RestoreFrom> {
        if !dir.is_absolute() {
            return Err(ShimError::InvalidArgument(format!(
                "checkpoint directory {} is not absolute",
                dir.display()
            )));
        }
        match Pointer::read(dir)? {
            Some(Pointer {
                token: Some(token), ..
            }) => self.verify_token(&token, to),
            Some(pointer) => self.verify(&pointer.snapshot, dir, to),
            None => self.verify("", dir, to),
        }
    }

    /// Checks that snapshot `id` of the store (a pod's `chalk.io/restore-from`) may be
    /// restored as `to`.
    pub(super) fn verify_stored(&self, id: &str, to: Into) -> Result<RestoreFrom> {
        self.verify(id, &to.options.store.clone(), to)
    }

    /// Checks that the snapshot of store token `token` may be restored as `to`: from its
    /// fresh directory while it is being sealed (its files as runsc wrote them, in the store's
    /// own root-only directories), else the stored snapshot its ref names.
    fn verify_token(&self, token: &str, to: Into) -> Result<RestoreFrom> {
        let started = Instant::now();
        let store = Store::open(&to.options.store)?;
        if let Some((m, linked)) = store.prepare_fresh_restore(token, &self.restore_token(&to))? {
            let m = Manifest {
                // Only its names count here (which files a lazy restore needs).
                files: fresh_entries(linked.dir()),
                ..m
            };
            let what = format!("{token} (fresh)");
            return self.verified(m, Some(linked), Path::new(""), &what, false, started, to);
        }
        match store.seal_state(token) {
            Seal::Sealed(r) => self.verify(&r.manifest, &to.options.store.clone(), to),
            Seal::Failed(error) => Err(ShimError::FailedPrecondition(format!(
                "snapshot {token} could not be sealed ({error}): there is nothing to restore; \
                 take a new one"
            ))),
            Seal::Sealing | Seal::Lost => Err(ShimError::FailedPrecondition(format!(
                "snapshot {token} is neither fresh nor stored (it was deleted, or the shim \
                 that took it ended before sealing it): take a new one"
            ))),
        }
    }

    fn restore_token(&self, to: &Into) -> String {
        format!(
            "{}+{}+{}",
            self.namespace(),
            to.id,
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        )
    }

    /// `stored`: the store's snapshot to restore from; empty: runsc's files in `dir`.
    fn verify(&self, stored: &str, dir: &Path, to: Into) -> Result<RestoreFrom> {
        let started = Instant::now();
        let (m, linked, foreign) = match stored {
            "" => {
                let m = Manifest::load(dir)?;
                m.verify_files(dir, 0)?;
                (m, None, false)
            }
            stored => {
                let store = Store::open(&to.options.store)?;
                let snap = store.open_snapshot(stored)?;
                // From elsewhere: every copy of it here was pulled from a registry.
                let refs = store.refs_of(stored)?;
                let foreign = !refs.is_empty() && refs.iter().all(|r| r.pulled_from.is_some());
                let linked = store.prepare_restore(&snap, &self.restore_token(&to))?;
                (snap.manifest, Some(linked), foreign)
            }
        };
        let what = if stored.is_empty() {
            dir.display().to_string()
        } else {
            stored.to_string()
        };
        self.verified(m, linked, dir, &what, foreign, started, to)
    }

    /// The checks every restore passes once its manifest and files are found; a `foreign`
    /// snapshot (pulled from a registry) also never runs on a spec that acts on this host.
    #[allow(clippy::too_many_arguments)]
    fn verified(
        &self,
        m: Manifest,
        linked: Option<RestoreDir>,
        dir: &Path,
        what: &str,
        foreign: bool,
        started: Instant,
        to: Into,
    ) -> Result<RestoreFrom> {
        // A pod's spec is the kubelet's, made on this node: the restoring side's, which
        // governs. Any other came with the request, perhaps straight from the snapshot.
        if foreign && annotation(to.asked, CRI_CONTAINER_TYPE).is_none() {
            let acts = acts_on_host(to.asked);
            if !acts.is_empty() {
                return Err(ShimError::FailedPrecondition(format!(
                    "container {}: snapshot {what} came from a registry, and the spec it would \
                     run on acts on this host ({}): a snapshot from elsewhere runs only on a \
                     spec rebuilt from the allow-list (chalkctl fork and resume rebuild it; \
                     see SECURITY.md)",
                    to.id,
                    acts.join("; ")
                )));
            }
        }
        // What the restore is of, for the pod's checks: the snapshot, unless runsc's files.
        let stored = if linked.is_some() { what } else { "" };
        let from = linked.as_ref().map_or(dir, RestoreDir::dir);
        let image = if m.image.is_some() {
            self.records().image_of(to.id)?
        } else {
            None
        };
        let target = Target {
            id: to.id,
            runsc_version: &to.features.version,
            global: to.runtime.global(),
            spec: to.spec,
            image: image.as_ref(),
        };
        check_restore(&m, from, &target).map_err(ShimError::FailedPrecondition)?;
        let memory = memory_load(
            &Source {
                stored: linked.is_some(),
                arriving: linked.as_ref().is_some_and(|l| !l.arriving().is_empty()),
                pod_members: m.extra.pod_members(),
                has_pages_file: m.files.iter().any(|f| f.path == "pages.img"),
            },
            to.options,
            to.features,
        );
        log::info!(
            "container {}: snapshot {what} ({} bytes) verified in {:?}{}",
            to.id,
            m.total_size(),
            started.elapsed(),
            if linked.is_some() {
                ", restored in place from the store"
            } else {
                ""
            }
        );
        log::info!(
            "chalk-timing op=verify id={} ms={} fresh={}",
            to.id,
            started.elapsed().as_millis(),
            what.ends_with("(fresh)")
        );
        chalk_runtime::fault::point("verified", to.id);
        Ok(RestoreFrom {
            dir: from.to_path_buf(),
            cuda_pids: m.extra.moved_pids(),
            pod: m.extra.pod.clone().unwrap_or_default(),
            joined: Default::default(),
            members_wait: None,
            snapshot: stored.to_string(),
            terminal: m.terminal.clone(),
            unpacked: Default::default(),
            arrivals: linked.as_ref().and_then(RestoreDir::arrivals),
            linked: std::sync::Mutex::new(linked),
            memory,
        })
    }
}

/// The files of a fresh restore directory, as manifest entries without digests.
fn fresh_entries(dir: &Path) -> Vec<FileEntry> {
    chalk_runtime::snapshot::manifest::list_files(dir)
        .unwrap_or_default()
        .into_iter()
        .map(|path| {
            let size = std::fs::metadata(dir.join(&path)).map_or(0, |m| m.len());
            FileEntry {
                path,
                size,
                sha256: String::new(),
                chunks: Vec::new(),
                pieces: None,
            }
        })
        .collect()
}

/// What a restore comes from, as far as how its memory loads is concerned.
struct Source {
    /// The store's own blobs (not a checkpoint directory of runsc's files).
    stored: bool,
    /// Some of those blobs still arriving from a registry, read through their server.
    arriving: bool,
    pod_members: usize,
    /// runsc's memory in a pages.img of its own (an uncompressed checkpoint).
    has_pages_file: bool,
}

/// How the restore of `from` loads its memory.
///
/// Only a stored snapshot loads lazily: its files are runsc's three uncompressed ones, and the
/// store keeps them until loading ends. A pod's sandbox loads whole before its containers join
/// it: with runsc 2026-09, a container started into a pod sandbox still loading in the
/// background twice ended the sandbox (exit 2) in the CRI tests. Shared pages map the store's
/// own blob for the sandbox's life: never a file still arriving (its server ends once it is in).
fn memory_load(from: &Source, options: &SnapshotOptions, features: &Features) -> MemoryLoad {
    let background = from.stored
        && options.lazy_restore
        && features.lazy_restore()
        && from.pod_members == 0
        && from.has_pages_file;
    MemoryLoad {
        background,
        share_pages: background && options.share_pages && features.share_pages() && !from.arriving,
    }
}

#[cfg(test)]
mod memory_load_tests {
    use super::*;

    fn runsc(restore_help: &str) -> Features {
        Features::default().with_restore_help(restore_help, "  -restore\n")
    }

    fn stored() -> Source {
        Source {
            stored: true,
            arriving: false,
            pod_members: 0,
            has_pages_file: true,
        }
    }

    #[test]
    fn a_patched_runsc_shares_the_stores_pages() {
        let patched = runsc("  -background\n  -share-pages\n");
        let load = memory_load(&stored(), &SnapshotOptions::default(), &patched);
        assert_eq!(
            load,
            MemoryLoad {
                background: true,
                share_pages: true
            }
        );
    }

    #[test]
    fn an_unpatched_runsc_loads_lazily_without_sharing() {
        let current = runsc("  -background\n");
        let load = memory_load(&stored(), &SnapshotOptions::default(), &current);
        assert!(load.background && !load.share_pages);
    }

    #[test]
    fn nothing_arriving_off_or_outside_the_store_is_shared() {
        let patched = runsc("  -background\n  -share-pages\n");
        let defaults = SnapshotOptions::default();
        let arriving = Source {
            arriving: true,
            ..stored()
        };
        assert!(!memory_load(&arriving, &defaults, &patched).share_pages);
        let off = SnapshotOptions {
            share_pages: false,
            ..SnapshotOptions::default()
        };
        assert!(!memory_load(&stored(), &off, &patched).share_pages);
        let directory = Source {
            stored: false,
            ..stored()
        };
        assert_eq!(
            memory_load(&directory, &defaults, &patched),
            MemoryLoad::default()
        );
        let pod = Source {
            pod_members: 2,
            ..stored()
        };
        assert_eq!(
            memory_load(&pod, &defaults, &patched),
            MemoryLoad::default()
        );
        let not_lazy = SnapshotOptions {
            lazy_restore: false,
            ..SnapshotOptions::default()
        };
        assert_eq!(
            memory_load(&stored(), &not_lazy, &patched),
            MemoryLoad::default()
        );
    }
}
