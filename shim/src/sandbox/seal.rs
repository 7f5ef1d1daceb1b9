//! A checkpoint's seal into the store, after Checkpoint has answered: its files hashed (most of
//! them while runsc wrote them), moved in as blobs under its OCI manifest, its ref written
//! last, then the fresh directory restores used meanwhile removed. A failure is recorded for
//! whoever waits on the snapshot (`Store::seal_state`); the fresh directory goes either way.
//! The shim's process waits for its seals before it exits ([`Seals::wait`]).

use std::{
    collections::BTreeMap,
    sync::{Condvar, Mutex},
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

/// The checkpoints this shim is taking and the seals it runs after their Checkpoint answered.
#[derive(Default)]
pub struct Seals {
    state: Mutex<Running>,
    changed: Condvar,
}

#[derive(Default)]
struct Running {
    checkpoints: usize,
    seals: Vec<JoinHandle<()>>,
}

/// A checkpoint in progress: the process does not exit until it is dropped.
pub(super) struct InFlight<'a>(&'a Seals);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.state.lock().unwrap().checkpoints -= 1;
        self.0.changed.notify_all();
    }
}

impl Seals {
    /// Marks a checkpoint begun. A suspended sandbox's task can be deleted, and its shim shut
    /// down, by a containerd that restarted while its Checkpoint ran: the checkpoint must
    /// still get to store what runsc wrote.
    pub(super) fn begin(&self) -> InFlight<'_> {
        self.state.lock().unwrap().checkpoints += 1;
        InFlight(self)
    }

    pub fn spawn(&self, seal: impl FnOnce() + Send + 'static) {
        let mut state = self.state.lock().unwrap();
        state.seals.retain(|h| !h.is_finished());
        state.seals.push(std::thread::spawn(seal));
    }

    /// Waits for every checkpoint in progress and every seal to end: the process exits only
    /// after.
    pub fn wait(&self) {
        let state = self.state.lock().unwrap();
        let mut state = self
            .changed
            .wait_while(state, |s| s.checkpoints > 0)
            .unwrap();
        let seals = std::mem::take(&mut state.seals);
        drop(state);
        for seal in seals {
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
