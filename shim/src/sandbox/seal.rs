//! A checkpoint's seal into the store, after Checkpoint has answered: its files hashed (most of
//! them while runsc wrote them), moved in as blobs under its OCI manifest, its ref written
//! last, then the fresh directory restores used meanwhile removed. A failure is recorded for
//! whoever waits on the snapshot (`Store::seal_state`); the fresh directory goes either way.
//! The shim's process waits for its seals before it exits ([`Seals::wait`]).

use std::{
    collections::BTreeMap,
    sync::Mutex,
    thread::JoinHandle,
    time::{Duration, Instant},
};

use chalk_labels::{
    KIND_ANNOTATION, NAMESPACE_ANNOTATION, SANDBOX_ANNOTATION, SNAPSHOTTER_ANNOTATION,
    SPEC_TYPE_ANNOTATION,
};
use chalk_runtime::snapshot::{
    follow::Follower,
    hash::FileDigest,
    store::{Commit, Committed, Fresh, Ingest, Store},
    Kind, Manifest,
};

use crate::containerd::SnapshotFacts;

/// The seals this shim runs after their Checkpoint answered.
#[derive(Default)]
pub struct Seals(Mutex<Vec<JoinHandle<()>>>);

impl Seals {
    pub fn spawn(&self, seal: impl FnOnce() + Send + 'static) {
        let mut running = self.0.lock().unwrap();
        running.retain(|h| !h.is_finished());
        running.push(std::thread::spawn(seal));
    }

    /// Waits for every seal to end: the process exits only after (a suspended sandbox's
    /// shim is shut down as soon as its task is deleted).
    pub fn wait(&self) {
        let running = std::mem::take(&mut *self.0.lock().unwrap());
        for seal in running {
            let _ = seal.join();
        }
    }
}

/// What a seal needs of the checkpoint that answered before it.
pub(super) struct Sealing {
    pub id: String,
    pub op: &'static str,
    pub namespace: String,
    pub sandbox_id: String,
    pub kind: Kind,
    pub facts: SnapshotFacts,
    pub manifest: Manifest,
    pub started: Instant,
    pub runsc_time: Duration,
    pub usable_time: Duration,
    /// What the checkpoint did before runsc's (checks, hooks, the manifest's account).
    pub before_runsc: Duration,
}

impl Sealing {
    pub(super) fn run(mut self, follower: Follower, store: Store, ingest: Ingest, fresh: Fresh) {
        let token = ingest.token().to_string();
        match self.seal(follower, &store, ingest) {
            Ok(committed) => {
                let sealed_time = self.started.elapsed();
                // Its links gone, the blobs' identities are recorded again (they name their
                // inodes' change times), so the next restore does not hash them again.
                drop(fresh);
                if let Err(e) = store.record_identities(&self.manifest) {
                    log::warn!("container {}: {e}", self.id);
                }
                log::info!(
                    "container {}: {} of {} bytes usable in {:?}, sealed in {sealed_time:?} \
                     (runsc {:?}) as {} ({} bytes new, {} already in the store)",
                    self.id,
                    self.op,
                    self.manifest.total_size(),
                    self.usable_time,
                    self.runsc_time,
                    committed.manifest.digest,
                    committed.stored,
                    committed.reused
                );
                log::info!(
                    "chalk-timing op={} id={} before_ms={} runsc_ms={} usable_ms={} hash_ms={} \
                     sealed_ms={} bytes={}",
                    self.op,
                    self.id,
                    self.before_runsc.as_millis(),
                    self.runsc_time.as_millis(),
                    self.usable_time.as_millis(),
                    (sealed_time - self.runsc_time).as_millis(),
                    sealed_time.as_millis(),
                    self.manifest.total_size()
                );
            }
            Err(e) => {
                log::error!(
                    "container {}: the {} {token} could not be sealed: {e}",
                    self.id,
                    self.op
                );
                store.note_seal_failure(&token, &e.to_string());
                drop(fresh);
            }
        }
    }

    fn seal(
        &mut self,
        follower: Follower,
        store: &Store,
        ingest: Ingest,
    ) -> Result<Committed, String> {
        let known = finish_hashing(&self.id, follower);
        chalk_runtime::fault::point("seal", &self.id);
        self.manifest
            .seal_with(ingest.dir(), &known, 0)
            .map_err(|e| e.to_string())?;
        chalk_runtime::fault::point("store", &self.id);
        let annotations = BTreeMap::from([
            (KIND_ANNOTATION.to_string(), self.kind.as_str().to_string()),
            (SANDBOX_ANNOTATION.to_string(), self.sandbox_id.clone()),
            (NAMESPACE_ANNOTATION.to_string(), self.namespace.clone()),
            (
                SNAPSHOTTER_ANNOTATION.to_string(),
                self.facts.snapshotter.clone(),
            ),
            (
                SPEC_TYPE_ANNOTATION.to_string(),
                self.facts.spec_type.clone(),
            ),
        ]);
        store
            .commit(
                ingest,
                Commit {
                    namespace: &self.namespace,
                    spec: &self.facts.spec,
                    subject: self.facts.base.clone(),
                    annotations,
                },
            )
            .map_err(|e| e.to_string())
    }
}

/// The digests the follower took as runsc wrote; none (every file hashed again) when it failed.
pub(super) fn finish_hashing(id: &str, follower: Follower) -> BTreeMap<String, FileDigest> {
    follower.finish().unwrap_or_else(|e| {
        log::warn!("container {id}: {e}; its files are hashed again");
        Default::default()
    })
}
