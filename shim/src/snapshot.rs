//! Snapshot, fork and suspend/resume through containerd's checkpoint API: Task.Checkpoint,
//! and the restore that Create (with a checkpoint) and Start perform.

use std::{
    os::unix::fs::DirBuilderExt,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use chalk_hooks::Stage;
use chalk_runtime::{
    runsc::{Features, LeaveRunning, Runsc},
    snapshot::{
        hash::sha256_hex,
        manifest::{self, ExcludedMount, HostInfo, RunscInfo, Source, SpecInfo},
        space, Isolation, Kind, Manifest,
    },
    state::Status,
};
use containerd_shim::{
    api::CheckpointTaskRequest,
    protos::{events::task::TaskCheckpointed, topics},
};

use crate::{
    container::{Container, RestoreFrom},
    containerd,
    errors::{Result, ShimError},
    runtime_options,
    task::{Launch, TaskService},
};

/// How long the sentry may take to let go of a killed exec's host files.
const EXEC_SETTLE: Duration = Duration::from_millis(500);
/// How long a suspended sandbox may take to exit after its checkpoint.
const SUSPEND_EXIT_TIMEOUT: Duration = Duration::from_secs(10);

impl TaskService {
    /// Checkpoints the sandbox of `req.id` into containerd's directory (or the options'
    /// `image_path`). The source keeps running unless the options ask for `exit` (suspend).
    /// On failure the source is left as it was and the directory is emptied.
    pub fn checkpoint(&self, req: &CheckpointTaskRequest) -> Result<()> {
        let c = self.container(&req.id)?;
        if c.in_pod() {
            return Err(ShimError::FailedPrecondition(format!(
                "container {} is one of a pod's: a checkpoint is of the whole sandbox, taken \
                 through the pod's sandbox container {}",
                c.id, c.sandbox_id
            )));
        }
        let want = runtime_options::checkpoint_options(req.options.as_ref())?;
        let members = self.pod_members(&c.id);
        if !members.is_empty() {
            check_pod_checkpoint(&c, members.len(), want.exit)?;
        }
        let dir = want
            .image_path
            .clone()
            .unwrap_or_else(|| PathBuf::from(&req.path));
        prepare_dir(&dir)?;
        // A checkpoint that fills the disk half-way can cost the source (its sandbox stops
        // on runsc builds that cannot checkpoint in place): refused before anything is done.
        let memory = c.runsc.stats(&c.id).map(|s| s.data.memory.usage.usage);
        if c.check_free_space {
            let memory = memory.as_ref().map_err(|e| {
                ShimError::FailedPrecondition(format!(
                    "container {}: cannot tell how much memory it uses, so not how much room \
                     its checkpoint needs: {e}",
                    c.id
                ))
            })?;
            let free = space::available(&dir)
                .map_err(|e| ShimError::internal(format!("free space of {}", dir.display()), e))?;
            space::check(&dir, *memory, free)
                .map_err(|e| ShimError::FailedPrecondition(format!("container {}: {e}", c.id)))?;
        }
        // A failing pre-checkpoint hook aborts the checkpoint before the sandbox is touched.
        self.hooks_while_running(&c, Stage::PreCheckpoint, &dir)?;
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
        let mut manifest = self.describe(
            &c,
            if want.exit {
                Kind::Suspend
            } else {
                Kind::Snapshot
            },
        )?;
        manifest.memory_bytes = memory.ok();
        manifest.terminal = c.state.lock().unwrap().init.io.terminal_state();
        let started = Instant::now();
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
        if let Err(e) = outcome {
            empty_dir(&dir);
            if !want.exit {
                let _ = put_back("after a failed checkpoint");
            }
            return Err(e);
        }
        if let Some((_, h)) = &handed {
            manifest
                .extra
                .insert(crate::gpu::MANIFEST_KEY.into(), h.facts.clone());
        }
        if !members.is_empty() {
            manifest
                .extra
                .insert(POD_MANIFEST_KEY.into(), pod_facts(&members));
        }
        let runsc_time = started.elapsed();
        let sealed = manifest::restrict_permissions(&dir).and_then(|_| manifest.seal(&dir, 0));
        if let Err(e) = sealed {
            empty_dir(&dir);
            return Err(e.into());
        }
        log::info!(
            "container {}: {} of {} bytes in {:?} (runsc {runsc_time:?}, manifest {:?}) at {}",
            c.id,
            if want.exit { "suspend" } else { "snapshot" },
            manifest.total_size(),
            started.elapsed(),
            started.elapsed() - runsc_time,
            dir.display()
        );
        if !want.exit {
            // The snapshot is on disk, but a source left without its GPU state fails it.
            if let Err(e) = put_back("after the checkpoint") {
                empty_dir(&dir);
                return Err(e);
            }
            // The snapshot is taken: a failing post-checkpoint hook is the source's business.
            if let Err(e) = self.hooks_while_running(&c, Stage::PostCheckpoint, &dir) {
                log::warn!("container {}: {e}", c.id);
            }
        }
        let mut ev = TaskCheckpointed::new();
        ev.container_id = c.id.clone();
        ev.checkpoint = dir.display().to_string();
        self.events()
            .send(topics::TASK_CHECKPOINTED_EVENT_TOPIC, ev);
        Ok(())
    }

    /// Runs the hooks of `stage` with the sandbox running.
    fn hooks_while_running(&self, c: &Container, stage: Stage, dir: &Path) -> Result<()> {
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
            if let Err(e) = c.runsc.resume(&c.id) {
                log::warn!("container {}: resume to end execs: {e}", c.id);
            }
        }
        for (exec_id, pid, _) in &running {
            if let Err(e) = c.runsc.kill(&c.id, 9, false, Some(*pid as i32)) {
                log::warn!(
                    "container {}: kill exec {exec_id} before checkpoint: {e}",
                    c.id
                );
            }
        }
        let killed = !running.is_empty();
        for (exec_id, _, exit) in running {
            if exit.wait_timeout(Duration::from_secs(5)).is_none() {
                log::warn!("container {}: exec {exec_id} outlived its SIGKILL", c.id);
            }
        }
        if killed {
            // The sentry drops a dead process's host files asynchronously; a checkpoint taken
            // at once can still hold them (seen with the 2022 build).
            std::thread::sleep(EXEC_SETTLE);
        }
        if paused {
            if let Err(e) = c.runsc.pause(&c.id) {
                log::warn!("container {}: pause again after ending execs: {e}", c.id);
            }
        }
    }

    /// Checkpoint that leaves the source running, by the path this runsc needs.
    fn snapshot(&self, c: &Arc<Container>, dir: &Path) -> Result<()> {
        let _no_terminal_helpers = c.terminal_gate.lock().unwrap();
        if c.features.leave_running() == LeaveRunning::RestoreAfter {
            // The source sandbox is about to be replaced: its execs end with it anyway.
            self.end_execs(c);
        }
        let mut st = c.state.lock().unwrap();
        let was_paused = checkpointable(c, st.init.status)?;
        match c.features.leave_running() {
            LeaveRunning::InPlace => {
                c.runsc
                    .checkpoint(&c.id, dir, true, &crate::gpu::runsc_flags(c))?;
                // The sandbox must read as containerd last saw it: paused stays paused.
                let now = c.runsc.state(&c.id)?;
                if now.pid > 0 && now.pid as u32 != st.init.pid {
                    log::warn!(
                        "container {}: sandbox pid {} after checkpoint",
                        c.id,
                        now.pid
                    );
                }
                match (was_paused, now.status.as_str()) {
                    (true, "running") => c.runsc.pause(&c.id)?,
                    (false, "paused") => c.runsc.resume(&c.id)?,
                    _ => {}
                }
                Ok(())
            }
            LeaveRunning::RestoreAfter => {
                // Its client must not read end-of-file between the two sandboxes.
                let held = crate::io::hold_outputs(&st.init.stdio);
                if let Err(e) = c
                    .runsc
                    .checkpoint(&c.id, dir, false, &crate::gpu::runsc_flags(c))
                {
                    // A failed save ends the sandbox on this runsc (at once, if it does).
                    let alive = (0..10).all(|_| {
                        std::thread::sleep(Duration::from_millis(100));
                        process_alive(st.init.pid)
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
                // The source sandbox has stopped. It comes back from what was just written,
                // under the same id, with the same IO; its exit is never reported (its pid
                // is no longer the init's when the watcher gets the lock).
                let _ = c.runsc.delete(&c.id, true);
                let previous = std::mem::take(&mut st.init.io);
                let stdio = st.init.stdio.clone();
                let started = Instant::now();
                let launched = self.launch_sandbox(
                    c,
                    &stdio,
                    Launch::Restore {
                        image: dir,
                        previous: Some(&previous),
                        terminal: None,
                        signals: Some(crate::terminal::signals_for(c)),
                    },
                );
                drop(held);
                match launched {
                    Ok((pid, pio)) => {
                        st.init.pid = pid as u32;
                        st.init.io = pio;
                        self.watch_init(c, pid, started);
                        if was_paused {
                            c.runsc.pause(&c.id)?;
                        }
                        Ok(())
                    }
                    Err(e) => {
                        st.init.io = previous;
                        Err(ShimError::Internal(format!(
                            "container {}: the checkpoint was written but the sandbox could not \
                             be resumed from it, so it has stopped: {e}",
                            c.id
                        )))
                    }
                }
            }
        }
    }

    /// Checkpoint, then let the sandbox end: its exit is reported as the init's.
    fn suspend(&self, c: &Arc<Container>, dir: &Path) -> Result<()> {
        let _no_terminal_helpers = c.terminal_gate.lock().unwrap();
        self.end_execs(c);
        let (pid, exit) = {
            let st = c.state.lock().unwrap();
            checkpointable(c, st.init.status)?;
            c.runsc
                .checkpoint(&c.id, dir, false, &crate::gpu::runsc_flags(c))?;
            (st.init.pid, st.init.exit.clone())
        };
        // containerd reads the task as stopped once Checkpoint returns.
        if exit.wait_timeout(SUSPEND_EXIT_TIMEOUT).is_none() {
            log::warn!(
                "container {}: sandbox {pid} outlived its checkpoint: killed",
                c.id
            );
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            exit.wait_timeout(SUSPEND_EXIT_TIMEOUT);
        }
        Ok(())
    }

    /// The manifest's account of container `c`, before its files are hashed.
    fn describe(&self, c: &Container, kind: Kind) -> Result<Manifest> {
        let config = c.bundle.join("config.json");
        let spec_bytes = std::fs::read(&config)
            .map_err(|e| ShimError::internal(format!("read {}", config.display()), e))?;
        let spec: serde_json::Value = serde_json::from_slice(&spec_bytes)
            .map_err(|e| ShimError::internal(format!("parse {}", config.display()), e))?;
        let network = network_of(&c.runsc);
        Ok(Manifest {
            schema_version: manifest::SCHEMA_VERSION,
            kind,
            created: manifest::rfc3339_now(),
            source: Source {
                namespace: self.namespace().to_string(),
                container_id: c.id.clone(),
                sandbox_id: c.sandbox_id.clone(),
            },
            runsc: RunscInfo {
                version: c.features.version.clone(),
                platform: platform_of(&c.runsc),
                network: network.clone(),
                overlay: overlay_of(&c.runsc),
                flags: c.runsc.global().flags.clone(),
            },
            host: HostInfo::current(),
            image: containerd::image_of(self.containerd_address(), self.namespace(), &c.id)?,
            spec: SpecInfo {
                sha256: sha256_hex(&spec_bytes),
                resources: spec["linux"]["resources"].clone(),
                isolation: Isolation::from_spec(&spec, &network),
            },
            excluded_mounts: excluded_mounts(&spec),
            files: Vec::new(),
            memory_bytes: None,
            terminal: None,
            extra: Default::default(),
        })
    }

    /// Checks, before anything is made, that the snapshot in `dir` may be restored as
    /// container `id` with `spec` (as runsc will get it): its files are intact, this host and
    /// runsc fit, the sandbox would reach no further, and the image is the same by digest.
    pub(crate) fn verify_restore(
        &self,
        id: &str,
        dir: &Path,
        runsc: &Runsc,
        features: &Features,
        spec: &serde_json::Value,
    ) -> Result<RestoreFrom> {
        if !dir.is_absolute() {
            return Err(ShimError::InvalidArgument(format!(
                "checkpoint directory {} is not absolute",
                dir.display()
            )));
        }
        let started = Instant::now();
        let m = Manifest::load(dir)?;
        m.verify_files(dir, 0)?;
        let mut problems = m.check_runtime(
            &features.version,
            &platform_of(runsc),
            std::env::consts::ARCH,
        );
        let overlay = overlay_of(runsc);
        if m.runsc.overlay != overlay {
            problems.push(format!(
                "root filesystem overlay: snapshot {:?}, here {overlay:?}",
                m.runsc.overlay
            ));
        }
        if !problems.is_empty() {
            return Err(ShimError::FailedPrecondition(format!(
                "snapshot {} cannot be restored here: {}",
                dir.display(),
                problems.join("; ")
            )));
        }
        let target = Isolation::from_spec(spec, &network_of(runsc));
        let wider = m.spec.isolation.widenings(&target);
        if !wider.is_empty() {
            return Err(ShimError::FailedPrecondition(format!(
                "restoring {} as {id} would let the sandbox reach further than its source: {}",
                dir.display(),
                wider.join("; ")
            )));
        }
        if let Some(source) = &m.image {
            let here = containerd::image_of(self.containerd_address(), self.namespace(), id)?;
            match here {
                Some(image) if image.digest == source.digest => {}
                Some(image) => {
                    return Err(ShimError::FailedPrecondition(format!(
                        "container {id} uses image {} at {}, but the snapshot was taken from {} at \
                         {}: restore onto the image by that digest",
                        image.name, image.digest, source.name, source.digest
                    )))
                }
                None => {
                    return Err(ShimError::FailedPrecondition(format!(
                        "container {id} has no image, but the snapshot was taken from {} at {}",
                        source.name, source.digest
                    )))
                }
            }
        }
        let pod_members = pod_member_count(&m.extra);
        log::info!(
            "container {id}: snapshot {} ({} bytes) verified in {:?}",
            dir.display(),
            m.total_size(),
            started.elapsed()
        );
        Ok(RestoreFrom {
            dir: dir.to_path_buf(),
            cuda_pids: crate::gpu::moved_pids(&m.extra),
            pod_members,
            terminal: m.terminal.clone(),
            unpacked: Default::default(),
        })
    }
}

/// The manifest's `extra` key listing the other containers of a pod's sandbox.
const POD_MANIFEST_KEY: &str = "pod";

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

/// What a manifest records of a pod's other containers: id, CRI name and image.
fn pod_facts(members: &[Arc<Container>]) -> serde_json::Value {
    let containers: Vec<serde_json::Value> = members
        .iter()
        .map(|m| {
            let mut spec = std::fs::read(m.bundle.join("config.json"))
                .ok()
                .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                .unwrap_or_default();
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
            serde_json::json!({ "id": m.id, "name": name, "image": image, "spec": spec })
        })
        .collect();
    serde_json::json!({ "containers": containers })
}

/// How many pod containers a manifest records besides the sandbox's own.
fn pod_member_count(extra: &std::collections::BTreeMap<String, serde_json::Value>) -> usize {
    extra
        .get(POD_MANIFEST_KEY)
        .and_then(|p| p["containers"].as_array())
        .map_or(0, Vec::len)
}

/// Runs `f` with the sandbox running: containerd pauses a task around Checkpoint, and what
/// runs inside it (hooks, cuda-checkpoint) needs it running; it is paused again after.
fn while_running<T>(c: &Container, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let paused = c.state.lock().unwrap().init.status == Status::Paused;
    if paused {
        c.runsc.resume(&c.id)?;
    }
    let out = f();
    if paused {
        c.runsc.pause(&c.id)?;
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

/// Makes `dir` (root-only) if needed; runsc writes fresh files, so it must be empty.
fn prepare_dir(dir: &Path) -> Result<()> {
    if !dir.is_absolute() {
        return Err(ShimError::InvalidArgument(format!(
            "checkpoint directory {} is not absolute",
            dir.display()
        )));
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| ShimError::internal(format!("create {}", dir.display()), e))?;
    let mut entries = std::fs::read_dir(dir)
        .map_err(|e| ShimError::internal(format!("list {}", dir.display()), e))?;
    if entries.next().is_some() {
        return Err(ShimError::FailedPrecondition(format!(
            "checkpoint directory {} is not empty: give a new or empty one",
            dir.display()
        )));
    }
    Ok(())
}

/// Removes what a failed checkpoint left in `dir` (which was empty before it).
fn empty_dir(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let _ = if path.is_dir() && !path.is_symlink() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
    }
}

fn platform_of(runsc: &Runsc) -> String {
    runsc
        .flag_value("platform")
        .unwrap_or("default")
        .to_string()
}

fn network_of(runsc: &Runsc) -> String {
    runsc.flag_value("network").unwrap_or("sandbox").to_string()
}

fn overlay_of(runsc: &Runsc) -> Option<String> {
    let flags = &runsc.global().flags;
    flags
        .iter()
        .rfind(|f| {
            let name = f.trim_start_matches('-');
            name == "overlay" || name.starts_with("overlay=") || name.starts_with("overlay2=")
        })
        .cloned()
}

/// Bind mounts: their content lives on the host and is not in the snapshot.
fn excluded_mounts(spec: &serde_json::Value) -> Vec<ExcludedMount> {
    spec["mounts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| chalk_runtime::spec::is_bind_mount(m))
        .map(|m| ExcludedMount {
            destination: m["destination"].as_str().unwrap_or_default().to_string(),
            source: m["source"].as_str().unwrap_or_default().to_string(),
            kind: m["type"].as_str().unwrap_or("bind").to_string(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn bind_mounts_are_listed_as_outside_the_snapshot() {
        let spec = json!({"mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/data", "type": "bind", "source": "/srv/data", "options": ["rbind"]},
            {"destination": "/etc/hosts", "source": "/var/hosts", "options": ["bind", "ro"]},
            {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs"}
        ]});
        let got = excluded_mounts(&spec);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].destination, "/data");
        assert_eq!(got[1].source, "/var/hosts");
    }

    #[test]
    fn checkpoint_directory_must_be_absolute_and_empty() {
        assert!(prepare_dir(Path::new("relative")).is_err());
        let dir = tempfile::tempdir().unwrap();
        let fresh = dir.path().join("a/b");
        prepare_dir(&fresh).unwrap();
        std::fs::write(fresh.join("old.img"), b"x").unwrap();
        let err = prepare_dir(&fresh).unwrap_err().to_string();
        assert!(err.contains("not empty"), "{err}");
        std::fs::create_dir(fresh.join("sub")).unwrap();
        empty_dir(&fresh);
        prepare_dir(&fresh).unwrap();
    }
}
