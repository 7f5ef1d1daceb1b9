//! Task.Checkpoint: snapshot (the source keeps running) or suspend (it stops after), with
//! the hooks and the GPU handoff around runsc's checkpoint and the manifest written last.
//! runsc's checkpoint runs with the init marked busy, not under its lock. Any failure leaves
//! the source as it was (or, where this runsc's checkpoint stops the sandbox, cleanly gone
//! with its exit reported) and the directory empty.

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use chalk_hooks::Stage;
use chalk_runtime::{
    runsc::{delta, LeaveRunning, MemoryLoad},
    snapshot::{
        describe::describe,
        dir,
        follow::Follower,
        manifest::{self, PodFacts, PodMember, Source},
        owner::Owner,
        space,
        store::{Pointer, Store, POINTER},
        Kind, Manifest,
    },
    state::Status,
};
use containerd_shim::protos::{events::task::TaskCheckpointed, topics};

use super::{
    launch::Launch,
    seal::{finish_hashing, Sealing},
    Sandboxes,
};
use crate::container::{kill_pid, Busy, Container};
use crate::{
    errors::{Result, ShimError},
    runtime_options::CheckpointRequest,
};

/// How long the sentry may take to let go of a killed exec's host files.
const EXEC_SETTLE: Duration = Duration::from_millis(500);
/// How long a suspended sandbox may take to exit after its checkpoint.
const SUSPEND_EXIT_TIMEOUT: Duration = Duration::from_secs(10);

impl Sandboxes {
    /// Checkpoints the sandbox of `id` into `path` (containerd's directory) or the request's
    /// `image_path`. The source keeps running unless the request asks for `exit` (suspend).
    pub fn checkpoint(&self, id: &str, path: &str, want: CheckpointRequest) -> Result<()> {
        let asked_at = Instant::now();
        let _in_flight = self.inner.seals.begin();
        let c = self.container(id)?;
        if c.in_pod() {
            return Err(ShimError::FailedPrecondition(format!(
                "container {} is one of a pod's: a checkpoint is of the whole sandbox, taken \
                 through the pod's sandbox container {}",
                c.id, c.sandbox_id
            )));
        }
        let members = self.pod_members(&c.id);
        if !members.is_empty() {
            check_pod_checkpoint(&c, members.len(), want.exit)?;
        }
        let asked = want.image_path.unwrap_or_else(|| PathBuf::from(path));
        // An ingest directory of the store: the snapshot is stored as blobs once sealed, and
        // usable from its fresh directory before. A fresh directory asked for: runsc writes
        // into an ingest all the same, only never sealed (a checkpoint taken to be forked).
        let store_root = &c.snapshot.store;
        let (ingest, seal) = match (
            Store::ingest_token_under(store_root, &asked),
            Store::fresh_token_under(store_root, &asked),
        ) {
            (Some(token), _) => (Some(token), true),
            (None, Some(token)) => (Some(token), false),
            (None, None) => (None, true),
        };
        let ingest = match ingest {
            Some(token) => {
                let store = Store::open(store_root)?;
                let ingest = store.begin_ingest(&token)?;
                Some((store, ingest))
            }
            None => None,
        };
        let dir = ingest
            .as_ref()
            .map_or(asked.clone(), |(_, i)| i.dir().to_path_buf());
        if ingest.is_none() {
            dir::prepare(&dir).map_err(ShimError::FailedPrecondition)?;
        }
        // A checkpoint that fills the disk half-way can cost the source (its sandbox stops
        // on runsc builds that cannot checkpoint in place): refused before anything is done.
        let memory = c.runtime.stats(&c.id).map(|s| s.data.memory.usage.usage);
        if c.snapshot.check_free_space {
            let memory = memory.as_ref().map_err(|e| {
                ShimError::FailedPrecondition(format!(
                    "container {}: cannot tell how much memory it uses, so not how much room \
                     its checkpoint needs: {e}",
                    c.id
                ))
            })?;
            let free = space::available(&dir)
                .map_err(|e| ShimError::failed(format!("free space of {}", dir.display()), e))?;
            space::check(&dir, *memory, free)
                .map_err(|e| ShimError::FailedPrecondition(format!("container {}: {e}", c.id)))?;
        }
        // A failing pre-checkpoint hook aborts the checkpoint before the sandbox is touched.
        hooks_while_running(&c, Stage::PreCheckpoint, &dir)?;
        // A GPU sandbox's CUDA state leaves the GPU (or nothing moves and the error says why).
        let handed = match &c.gpu {
            Some(gpu) => Some((
                gpu,
                while_running(&c, || crate::gpu::before_checkpoint(&c, gpu))?,
            )),
            None => None,
        };
        let put_back = |when: &str| match &handed {
            Some((gpu, h)) if !h.moved.is_empty() => {
                while_running(&c, || crate::gpu::restore(&c, &gpu.options, &h.moved))
                    .inspect_err(|e| log::error!("container {}: CUDA processes {when}: {e}", c.id))
            }
            _ => Ok(()),
        };
        // What the manifest says about the source is gathered before the sandbox is touched.
        let kind = if want.exit {
            Kind::Suspend
        } else {
            Kind::Snapshot
        };
        let mut manifest = self.describe(&c, kind)?;
        // And what the stored snapshot records of the container: containerd is not asked after
        // runsc's checkpoint, when a suspended sandbox is already gone (a containerd restarting
        // then would cost the snapshot).
        let facts = match (&ingest, seal) {
            (Some(_), true) => Some(self.records().snapshot_facts(&c.id)?),
            _ => None,
        };
        manifest.memory_bytes = memory.ok();
        manifest.terminal = c.state.lock().unwrap().init.io.terminal_state();
        let started = Instant::now();
        chalk_runtime::fault::point("checkpoint", &c.id);
        // runsc's files are hashed as they are written: the seal ends soon after runsc does
        // (a checkpoint never sealed is not hashed at all).
        let follower = seal.then(|| Follower::start(&dir));
        let outcome = if want.exit {
            self.suspend(&c, &dir)
        } else {
            self.snapshot(&c, &dir)
        };
        // A pod container started or ended meanwhile: the checkpoint and the list disagree.
        let ids = |ms: &[Arc<Container>]| ms.iter().map(|m| m.id.clone()).collect::<Vec<_>>();
        let outcome = outcome.and_then(|()| {
            let now = self.pod_members(&c.id);
            let (mut before, mut after) = (ids(&members), ids(&now));
            before.sort();
            after.sort();
            if before != after {
                return Err(ShimError::FailedPrecondition(format!(
                    "container {}: the pod's containers changed during the checkpoint \
                     ({before:?}, then {after:?}); take it again",
                    c.id
                )));
            }
            Ok(())
        });
        let follower = match outcome {
            Ok(()) => follower,
            Err(e) => {
                cancel(follower);
                dir::empty(&dir);
                if !want.exit {
                    let _ = put_back("after a failed checkpoint");
                }
                return Err(e);
            }
        };
        let runsc_time = started.elapsed();
        manifest.extra.gpu = handed.as_ref().map(|(_, h)| h.facts.clone());
        if !members.is_empty() {
            let completed = c.completed_members.lock().unwrap().clone();
            manifest.extra.pod = Some(pod_facts(&members, completed, |id| {
                self.records().image_of(id).ok().flatten().map(|i| i.digest)
            }));
        }
        if let Err(e) = manifest::restrict_permissions(&dir) {
            cancel(follower);
            dir::empty(&dir);
            return Err(e.into());
        }
        if !want.exit {
            // The snapshot is written, but a source left without its GPU state fails it.
            if let Err(e) = put_back("after the checkpoint") {
                cancel(follower);
                dir::empty(&dir);
                return Err(e);
            }
            // The snapshot is taken: a failing post-checkpoint hook is the source's business.
            if let Err(e) = hooks_while_running(&c, Stage::PostCheckpoint, &dir) {
                log::warn!("container {}: {e}", c.id);
            }
        }
        let op = if want.exit { "suspend" } else { "snapshot" };
        let Some((store, ingest)) = ingest else {
            // A directory outside the store: sealed here, before the reply.
            let known = follower.map_or_else(Default::default, |f| finish_hashing(&c.id, f));
            chalk_runtime::fault::point("seal", &c.id);
            if let Err(e) = manifest.seal_with(&dir, &known, 0) {
                dir::empty(&dir);
                return Err(e.into());
            }
            let hash_time = started.elapsed() - runsc_time;
            log::info!(
                "container {}: {op} of {} bytes in {:?} (runsc {runsc_time:?}, hashing \
                 {hash_time:?}) at {}",
                c.id,
                manifest.total_size(),
                started.elapsed(),
                dir.display()
            );
            self.checkpointed(&c.id, &dir);
            return Ok(());
        };
        // Usable from here on: a restore may start from the fresh directory's links.
        let token = ingest.token().to_string();
        let fresh = match store.publish_fresh(ingest.dir(), &token, &manifest) {
            Ok(fresh) => fresh,
            Err(e) => {
                cancel(follower);
                return Err(e.into());
            }
        };
        let usable_time = started.elapsed();
        // containerd 1.6 ignores a non-runc shim's image_path and stores what its own
        // directory holds: a pointer to this snapshot by its token (the form a restore takes),
        // which also keeps its stored tar from being the same empty one every time.
        let theirs = Path::new(path);
        if !path.is_empty() && theirs != asked && theirs.is_dir() {
            let pointer = Pointer::to_token(&token);
            chalk_runtime::bundle::write_private(&theirs.join(POINTER), &pointer.to_bytes())?;
        }
        let (Some(follower), Some(facts)) = (follower.filter(|_| seal), facts) else {
            fresh.hand_over();
            drop(ingest);
            log::info!(
                "container {}: {op} of {} bytes usable in {usable_time:?} (runsc \
                 {runsc_time:?}), not sealed: fresh {token}",
                c.id,
                manifest.total_size(),
            );
            self.checkpointed(&c.id, &dir);
            return Ok(());
        };
        let sealing = Sealing {
            id: c.id.clone(),
            op,
            namespace: self.namespace().to_string(),
            sandbox_id: c.sandbox_id.clone(),
            kind,
            facts,
            manifest,
            started,
            runsc_time,
            usable_time,
            before_runsc: started - asked_at,
        };
        self.inner
            .seals
            .spawn(move || sealing.run(follower, store, ingest, fresh));
        self.checkpointed(&c.id, &dir);
        Ok(())
    }

    fn checkpointed(&self, id: &str, dir: &Path) {
        let mut ev = TaskCheckpointed::new();
        ev.container_id = id.to_string();
        ev.checkpoint = dir.display().to_string();
        self.events()
            .publish(topics::TASK_CHECKPOINTED_EVENT_TOPIC, ev);
    }

    /// The manifest's account of container `c`, before its files are hashed.
    fn describe(&self, c: &Container, kind: Kind) -> Result<Manifest> {
        let config = c.bundle.join("config.json");
        let spec = std::fs::read(&config)
            .map_err(|e| ShimError::failed(format!("read {}", config.display()), e))?;
        let source = Source {
            namespace: self.namespace().to_string(),
            container_id: c.id.clone(),
            sandbox_id: c.sandbox_id.clone(),
        };
        let image = self.records().image_of(&c.id)?;
        let mut m = describe(
            kind,
            source,
            &c.features.version,
            c.runtime.global(),
            &spec,
            image,
        )
        .map_err(|e| ShimError::Internal(format!("{}: {e}", config.display())))?;
        // Who it belongs to: CRI's annotations on the spec, the node agent's label on the
        // record (never what a pod's own annotations say).
        let sandbox = self
            .records()
            .label(&c.id, chalk_labels::OWNER_SANDBOX_LABEL)?;
        let parsed: serde_json::Value = serde_json::from_slice(&spec).unwrap_or_default();
        m.owner = Some(Owner::of_container(
            self.namespace(),
            &parsed,
            sandbox.as_deref(),
        ));
        Ok(m)
    }

    /// Ends the container's exec'd processes and waits for their exits to be recorded.
    /// They cannot cross a restore: runsc restores a sandbox with only its init's host stdio,
    /// and an exec's stdio would be missing (the 2022 build fails the restore over it).
    fn end_execs(&self, c: &Container) {
        let (running, paused): (Vec<_>, bool) = {
            let st = c.state.lock().unwrap();
            let running = st
                .execs
                .values()
                .filter(|p| p.status == Status::Running && p.pid > 0)
                .map(|p| (p.exec_id.clone(), p.pid, p.exit.clone()))
                .collect();
            (running, st.init.status == Status::Paused)
        };
        if running.is_empty() {
            return;
        }
        // containerd pauses a task around Checkpoint, and runsc signals nothing in a paused
        // sandbox: it runs just long enough for the kills.
        if paused {
            if let Err(e) = c.runtime.resume(&c.id) {
                log::warn!("container {}: resume to end execs: {e}", c.id);
            }
        }
        for (exec_id, pid, _) in &running {
            if let Err(e) = c.runtime.kill(&c.id, 9, false, Some(*pid as i32)) {
                log::warn!(
                    "container {}: kill exec {exec_id} before checkpoint: {e}",
                    c.id
                );
            }
        }
        for (exec_id, _, exit) in running {
            if exit.wait_timeout(Duration::from_secs(5)).is_none() {
                log::warn!("container {}: exec {exec_id} outlived its SIGKILL", c.id);
            }
        }
        // The sentry drops a dead process's host files asynchronously; a checkpoint taken at
        // once can still hold them (seen with the 2022 build).
        std::thread::sleep(EXEC_SETTLE);
        if paused {
            if let Err(e) = c.runtime.pause(&c.id) {
                log::warn!("container {}: pause again after ending execs: {e}", c.id);
            }
        }
    }

    /// Marks `c`'s init busy with a checkpoint (once no other long work is on it): whether it
    /// was paused.
    fn begin_checkpoint(&self, c: &Container) -> Result<bool> {
        let st = c.state.lock().unwrap();
        let mut st = c.wait_idle_bounded(st)?;
        let was_paused = checkpointable(c, st.init.status)?;
        st.init.busy = Some(Busy::Checkpointing);
        Ok(was_paused)
    }

    fn end_checkpoint(&self, c: &Container) {
        let mut st = c.state.lock().unwrap();
        self.finish_busy(c, &mut st);
    }

    /// Checkpoint that leaves the source running, by the path this runsc needs.
    fn snapshot(&self, c: &Arc<Container>, dir: &Path) -> Result<()> {
        let _no_terminal_helpers = c.terminal_gate.lock().unwrap();
        let leave_running = c.features.leave_running();
        if leave_running == LeaveRunning::RestoreAfter {
            // The source sandbox is about to be replaced: its execs end with it anyway.
            self.end_execs(c);
        }
        let was_paused = self.begin_checkpoint(c)?;
        let outcome = match leave_running {
            LeaveRunning::InPlace => self.checkpoint_in_place(c, dir, was_paused),
            LeaveRunning::RestoreAfter => self.checkpoint_and_restore(c, dir, was_paused),
        };
        self.end_checkpoint(c);
        outcome
    }

    fn checkpoint_in_place(&self, c: &Container, dir: &Path, was_paused: bool) -> Result<()> {
        checkpoint_to(c, dir, true)?;
        // The sandbox must read as containerd last saw it: paused stays paused.
        let now = c.runtime.state(&c.id)?;
        let pid = c.state.lock().unwrap().init.pid;
        if now.pid > 0 && now.pid as u32 != pid {
            log::warn!(
                "container {}: sandbox pid {} after checkpoint",
                c.id,
                now.pid
            );
        }
        match (was_paused, now.status.as_str()) {
            (true, "running") => c.runtime.pause(&c.id)?,
            (false, "paused") => c.runtime.resume(&c.id)?,
            _ => {}
        }
        Ok(())
    }

    /// This runsc's checkpoint stops the sandbox: it comes back from what was just written,
    /// under the same id, with the same IO; the old sandbox's exit is never reported.
    fn checkpoint_and_restore(
        &self,
        c: &Arc<Container>,
        dir: &Path,
        was_paused: bool,
    ) -> Result<()> {
        let (stdio, old_pid) = {
            let st = c.state.lock().unwrap();
            (st.init.stdio.clone(), st.init.pid)
        };
        // Its client must not read end-of-file between the two sandboxes.
        let held = crate::io::hold_outputs(&stdio);
        if let Err(e) = checkpoint_to(c, dir, false) {
            // A failed save ends the sandbox on this runsc (at once, if it does).
            let alive = (0..10).all(|_| {
                std::thread::sleep(Duration::from_millis(100));
                process_alive(old_pid)
            });
            return Err(if alive {
                e.into()
            } else {
                ShimError::Internal(format!(
                    "container {}: {e}; this runsc's checkpoint stops the sandbox, which \
                     stopped with it (its exit is reported)",
                    c.id
                ))
            });
        }
        let _ = c.runtime.delete(&c.id, true);
        let previous = std::mem::take(&mut c.state.lock().unwrap().init.io);
        let started = Instant::now();
        let launched = self.launch_sandbox(
            c,
            &stdio,
            Launch::Restore {
                image: dir,
                previous: Some(&previous),
                terminal: None,
                signals: Some(crate::terminal::signals_for(c)),
                memory: MemoryLoad::default(),
            },
        );
        drop(held);
        match launched {
            Ok((pid, pio)) => {
                {
                    let mut st = c.state.lock().unwrap();
                    st.init.pid = pid as u32;
                    st.init.io = pio;
                }
                self.watch_init(c, pid, started);
                if was_paused {
                    c.runtime.pause(&c.id)?;
                }
                Ok(())
            }
            Err(e) => {
                c.state.lock().unwrap().init.io = previous;
                Err(ShimError::Internal(format!(
                    "container {}: the checkpoint was written but the sandbox could not be \
                     resumed from it, so it has stopped: {e}",
                    c.id
                )))
            }
        }
    }

    /// Checkpoint, then let the sandbox end: its exit is reported as the init's.
    fn suspend(&self, c: &Arc<Container>, dir: &Path) -> Result<()> {
        let _no_terminal_helpers = c.terminal_gate.lock().unwrap();
        self.end_execs(c);
        self.begin_checkpoint(c)?;
        let checkpointed = checkpoint_to(c, dir, false);
        self.end_checkpoint(c);
        checkpointed?;
        let (pid, exit) = {
            let st = c.state.lock().unwrap();
            (st.init.pid, st.init.exit.clone())
        };
        // containerd reads the task as stopped once Checkpoint returns.
        if exit.wait_timeout(SUSPEND_EXIT_TIMEOUT).is_none() {
            log::warn!(
                "container {}: sandbox {pid} outlived its checkpoint: killed",
                c.id
            );
            kill_pid(pid);
            exit.wait_timeout(SUSPEND_EXIT_TIMEOUT);
        }
        Ok(())
    }
}

/// Has runsc checkpoint `c` into `dir`. Where `c` maps the pages file it was restored from
/// (`--share-pages`) and this runsc can, runsc writes only the memory that is not that file's
/// (a delta: the source's pause and the bytes written scale with what changed), and the shim
/// then puts `pages.img` together from the two. `dir` is an ordinary image either way.
fn checkpoint_to(c: &Container, dir: &Path, leave_running: bool) -> chalk_runtime::Result<()> {
    let mut flags = crate::gpu::runsc_flags(c);
    flags.extend(c.features.uncompressed_checkpoint_flags());
    let base = delta_base(c);
    if let Some(base) = &base {
        flags.push(format!("--base-pages={}", base.display()));
    }
    let started = Instant::now();
    c.runtime.checkpoint(&c.id, dir, leave_running, &flags)?;
    let runsc = started.elapsed();
    let (mut from_base, mut assembled) = (0, Duration::ZERO);
    if let Some(base) = base {
        let runs = delta::assemble(dir, &base).map_err(|e| chalk_runtime::Error::Snapshot {
            dir: dir.to_path_buf(),
            message: format!(
                "runsc wrote a delta checkpoint against {}, but its pages.img could not be put \
                 together from it: {e}",
                base.display()
            ),
        })?;
        assembled = started.elapsed() - runsc;
        from_base = runs.from_base();
        log::info!(
            "container {}: delta checkpoint: {from_base} of {} bytes of memory taken from {}, \
             put together in {assembled:?}",
            c.id,
            runs.size,
            base.display(),
        );
    }
    // The bench's figure of the source's pause: runsc's checkpoint (a delta's pages.img is
    // put together after the sandbox runs again).
    log::info!(
        "chalk-timing op=checkpoint id={} runsc_ms={} assemble_ms={} from_base_bytes={from_base}",
        c.id,
        runsc.as_millis(),
        assembled.as_millis()
    );
    Ok(())
}

/// The pages file a checkpoint of `c` can be a delta against: the one its sandbox maps, held
/// in the store for as long as the container lives (see `keep_while_mapped`).
fn delta_base(c: &Container) -> Option<PathBuf> {
    let from = c.restore_from.as_ref()?;
    (from.memory.share_pages && c.features.checkpoint_base_pages())
        .then(|| from.dir.join(delta::PAGES_FILE))
}

/// Runs the hooks of `stage` with the sandbox running.
fn hooks_while_running(c: &Container, stage: Stage, dir: &Path) -> Result<()> {
    if !c.hooks.iter().any(|h| h.stage == stage) {
        return Ok(());
    }
    while_running(c, || Ok(crate::hooks::run(c, stage, Some(dir))))?
        .map(drop)
        .map_err(|e| {
            let what = match stage {
                Stage::PreCheckpoint => "checkpoint not taken",
                _ => "checkpoint taken",
            };
            ShimError::FailedPrecondition(format!("container {}: {what}: {e}", c.id))
        })
}

/// A pod's sandbox is checkpointed as a whole, and only where the pod survives it.
fn check_pod_checkpoint(c: &Container, members: usize, suspend: bool) -> Result<()> {
    if suspend {
        return Err(ShimError::FailedPrecondition(format!(
            "container {} is a pod's sandbox with {members} more container(s): a pod is not \
             suspended (its containers could not be brought back under their ids); snapshot it \
             instead",
            c.id
        )));
    }
    if c.features.leave_running() == LeaveRunning::RestoreAfter {
        return Err(ShimError::FailedPrecondition(format!(
            "container {} is a pod's sandbox with {members} more container(s), and this runsc \
             ({}) cannot checkpoint a pod and keep it running (its checkpoint stops the \
             sandbox, which could then only come back without the pod's containers); use a \
             runsc from 2024 or later, whose checkpoint leaves the sandbox running in place",
            c.id, c.features.version
        )));
    }
    Ok(())
}

/// What a manifest records of a pod's other containers: id, CRI name, image (with the digest
/// `digest_of` finds for a container) and spec of each running one, and the names of those
/// that had run to completion (`completed`, less any that runs again).
fn pod_facts(
    members: &[Arc<Container>],
    mut completed: Vec<String>,
    digest_of: impl Fn(&str) -> Option<String>,
) -> PodFacts {
    let containers = members
        .iter()
        .map(|m| {
            let mut spec = chalk_runtime::bundle::read_spec(&m.bundle).unwrap_or_default();
            let annotation = |k: &str| spec["annotations"][k].as_str().unwrap_or("").to_string();
            let (name, image) = (
                annotation("io.kubernetes.cri.container-name"),
                annotation("io.kubernetes.cri.image-name"),
            );
            // The shim took the OOM score out of what runsc sees; the fork asks for it again.
            if let (Some(score), Some(process)) = (m.oom_score_adj, spec["process"].as_object_mut())
            {
                process.insert("oomScoreAdj".into(), score.into());
            }
            // The spec as runsc saw it: a fork recreates the container from it.
            PodMember {
                id: m.id.clone(),
                name,
                image,
                image_digest: digest_of(&m.id),
                spec,
            }
        })
        .collect::<Vec<PodMember>>();
    completed.retain(|n| !containers.iter().any(|m| &m.name == n));
    PodFacts {
        containers,
        completed,
    }
}

/// Runs `f` with the sandbox running: containerd pauses a task around Checkpoint, and what
/// runs inside it (hooks, cuda-checkpoint) needs it running; it is paused again after.
fn while_running<T>(c: &Container, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let paused = c.state.lock().unwrap().init.status == Status::Paused;
    if paused {
        c.runtime.resume(&c.id)?;
    }
    let out = f();
    if paused {
        c.runtime.pause(&c.id)?;
    }
    out
}

/// Whether the init is paused; an error unless it is running or paused.
fn checkpointable(c: &Container, status: Status) -> Result<bool> {
    match status {
        Status::Running => Ok(false),
        Status::Paused => Ok(true),
        other => Err(ShimError::FailedPrecondition(format!(
            "container {} is {other}: only a running or paused sandbox can be checkpointed",
            c.id
        ))),
    }
}

/// Whether process `pid` still runs (not gone, not a zombie).
fn process_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')')?.1.trim_start().chars().next())
        .is_some_and(|state| !matches!(state, 'Z' | 'X'))
}

/// Stops a follower, if one runs (the checkpoint failed).
fn cancel(follower: Option<Follower>) {
    if let Some(f) = follower {
        f.cancel();
    }
}
