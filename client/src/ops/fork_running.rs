//! `chalkctl fork --id`: forks of a running sandbox, made from its checkpoint the moment runsc
//! has written it. The checkpoint is asked for in the store's fresh directory, so the shim
//! never seals it (nothing is hashed or kept): the forks hard-link its files and it is removed
//! once they run, whatever became of them. With `--keep-snapshot` the checkpoint is a snapshot
//! like any other: the forks start from its files while the shim seals it, and its record is
//! completed after them.

use std::collections::HashMap;

use chalk_runtime::snapshot::store::{Pointer, Store};

use super::fork::{
    check_ids, check_memory, fork_pool, host_available_memory, plan, ForkOptions, Forked, Planned,
};
use super::parts::{image_config, memory_of, pod_members, Parts};
use super::snapshot;
use crate::{
    containerd::{runtime_name, Client, Result, Stdio, RUNTIME},
    progress::Progress,
    records::{
        registry::{Snapshot, Status},
        snapshots::{self, CHECKPOINT_TAR},
    },
    Error,
};

/// A running sandbox's checkpoint in the store's fresh directory, with what its restores
/// need; removed when dropped (the forks made from it hold their own links to its files).
pub struct FreshCheckpoint {
    _dir: FreshDir,
    pub(crate) parts: Parts,
    /// The size of runsc's files.
    pub bytes: u64,
    /// How long the checkpoint took, from the call.
    pub elapsed: std::time::Duration,
}

/// The fresh directory of a checkpoint, removed when dropped, whatever became of its forks.
struct FreshDir {
    store: Store,
    token: String,
}

impl Drop for FreshDir {
    fn drop(&mut self) {
        if let Err(e) = self.store.remove_fresh(&self.token) {
            eprintln!("chalkctl: {e}");
        }
    }
}

/// Checkpoints running sandbox `source` for forks only: its files in the store's fresh
/// directory, never sealed. The caller holds a lease.
pub fn checkpoint_for_forks(
    client: &Client,
    source: &str,
    opts: &ForkOptions,
    progress: &Progress,
) -> Result<FreshCheckpoint> {
    let started = std::time::Instant::now();
    let container = client.container(source)?;
    if runtime_name(&container) != RUNTIME {
        return Err(format!(
            "sandbox {source} runs {:?}, not {RUNTIME}: only chalk sandboxes can be forked",
            runtime_name(&container)
        )
        .into());
    }
    let stamp = crate::clock::now();
    let store = client.store()?;
    let token = Store::token(
        client.namespace(),
        &format!(
            "fork-{source}-{}-{}",
            stamp
                .chars()
                .filter(char::is_ascii_digit)
                .collect::<String>(),
            std::process::id()
        ),
    );
    // containerd 1.6 stores the spec on every checkpoint and refuses one it already holds.
    client.mark_spec(&container, chalk_labels::CHECKPOINTED_AT, &stamp)?;
    let checkpointed = progress.during(
        &format!("checkpointing {source} (it keeps running)"),
        || client.checkpoint(source, false, Some(&store.fresh_path(&token))),
    );
    let dir = FreshDir { store, token };
    checkpointed?;
    let parts = parts_of_running(client, &dir.store, &dir.token, source, opts)?;
    Ok(FreshCheckpoint {
        bytes: size_of(&dir.store.fresh_path(&dir.token)),
        _dir: dir,
        parts,
        elapsed: started.elapsed(),
    })
}

/// Forks `count` sandboxes of running sandbox `source` (`id`, or ids numbered from it).
pub fn fork_running(
    client: &mut Client,
    source: &str,
    id: Option<&str>,
    count: usize,
    opts: &ForkOptions,
    progress: &Progress,
) -> Result<Vec<Forked>> {
    let planned = plan(client, id, source, count, opts)?;
    client.lease(&format!(
        "chalkctl-fork-{}-{}",
        planned.stamp,
        std::process::id()
    ))?;
    let forks = checkpoint_for_forks(client, source, opts, progress)
        .and_then(|fresh| forks_of(client, &fresh.parts, &planned, source, opts, progress));
    client.release();
    forks
}

/// The forks of `planned` from checkpoint `p` of running sandbox `source`, once the host has
/// the memory for them.
fn forks_of(
    client: &Client,
    p: &Parts,
    planned: &Planned,
    source: &str,
    opts: &ForkOptions,
    progress: &Progress,
) -> Result<Vec<Forked>> {
    let count = planned.ids.len();
    check_memory(
        memory_of(p.manifest.as_ref()),
        count,
        host_available_memory(),
        opts.force,
    )?;
    progress.step(&format!(
        "checkpoint of {source} written; forking {count} from it"
    ));
    Ok(fork_pool(
        client,
        p,
        &planned.ids,
        &planned.names,
        "",
        progress,
    ))
}

/// As [`fork_running`], keeping the checkpoint as a snapshot: the forks start while it is
/// sealed. A seal that fails after forks were made from its files names them.
pub fn fork_running_keeping(
    client: &mut Client,
    source: &str,
    id: Option<&str>,
    count: usize,
    opts: &ForkOptions,
    progress: &Progress,
) -> Result<(Vec<Forked>, Snapshot)> {
    let planned = plan(client, id, source, count, opts)?;
    let begun = snapshot::begin(client, source, Vec::new(), Status::InProgress)?;
    progress.step(&format!("recorded {} (in_progress)", begun.snap.name));
    let written = snapshot::write(client, begun, false, progress)?;
    let forks: Result<Vec<Forked>> = match written.token(client) {
        Some(token) => (|| {
            let store = client.store()?;
            let p = parts_of_running(client, &store, &token, source, opts)?;
            forks_of(client, &p, &planned, source, opts, progress)
        })(),
        // The checkpoint failed: completing the record says why.
        None => Ok(Vec::new()),
    };
    let snap = snapshot::complete(client, written, progress);
    client.release();
    let forks = forks?;
    let made: Vec<&str> = forks
        .iter()
        .filter(|f| f.pid.is_ok())
        .map(|f| f.id.as_str())
        .collect();
    match snap {
        Ok(snap) => {
            for fork in &made {
                client.set_container_label(fork, chalk_labels::FORKED_FROM, Some(&snap.digest))?;
            }
            Ok((forks, snap))
        }
        Err(e) if made.is_empty() => Err(e),
        Err(e) => Err(format!(
            "{e}; {} made from its files before it failed, and run on (their lineage is \
             sandbox {source})",
            made.join(", ")
        )
        .into()),
    }
}

/// One fork of running sandbox `source` as `new`, its stdio on `io` and its terminal sized
/// `size` before it runs (the demo page's split): its pid, and the checkpoint it came from
/// (already removed). Removed whole when it fails.
pub fn fork_running_to(
    client: &mut Client,
    source: &str,
    new: &str,
    opts: &ForkOptions,
    io: &Stdio,
    size: Option<(u32, u32)>,
) -> Result<(u32, FreshCheckpoint)> {
    check_ids(Some(new), source, 1)?;
    client.lease(&format!("chalkctl-fork-{new}"))?;
    let forked = checkpoint_for_forks(client, source, opts, &Progress::quiet()).and_then(|fresh| {
        let pid = super::fork::one_to(client, &fresh.parts, new, io, size);
        pid.map(|pid| (pid, fresh))
    });
    client.release();
    forked
}

/// Bytes of the regular files under `dir`.
fn size_of(dir: &std::path::Path) -> u64 {
    chalk_runtime::snapshot::manifest::list_files(dir)
        .unwrap_or_default()
        .iter()
        .filter_map(|f| std::fs::metadata(dir.join(f)).ok())
        .map(|m| m.len())
        .sum()
}

/// What a restore of sandbox `source`'s fresh checkpoint `token` needs: the checkpoint as a
/// pointer to it, and the rest from the running sandbox's own record.
fn parts_of_running(
    client: &Client,
    store: &Store,
    token: &str,
    source: &str,
    opts: &ForkOptions,
) -> Result<Parts> {
    let bad = |e: chalk_runtime::Error| Error::from(format!("the checkpoint of {source}: {e}"));
    let manifest = match store.fresh_manifest(token) {
        Ok(m) => m,
        // Sealed already (a small one seals in milliseconds): the stored manifest is the same.
        Err(_) if !store.fresh_path(token).exists() => {
            let r = store
                .wait_sealed(token, super::snapshot::SEAL_TIMEOUT)
                .map_err(bad)?;
            store.open_snapshot(&r.manifest).map_err(bad)?.manifest
        }
        Err(e) => return Err(bad(e)),
    };
    let container = client.container(source)?;
    let (image, base) = snapshots::base_image(client, &container.image)?;
    let pointer = snapshots::tar_of_pointer(&Pointer::to_token(token))?;
    let checkpoint = client.write_blob(CHECKPOINT_TAR, pointer, HashMap::new())?;
    let spec = container
        .spec
        .clone()
        .ok_or_else(|| Error::from(format!("sandbox {source} has no spec")))?;
    Ok(Parts {
        checkpoint,
        source: source.to_string(),
        members: pod_members(Some(&manifest))?,
        lifetime: opts.clone(),
        spec,
        snapshotter: container.snapshotter.clone(),
        image: chalk_runtime::snapshot::manifest::ImageRef::unpinned(&image).to_string(),
        chain_id: image_config(client, &base)?.1,
        base,
        manifest: Some(manifest),
    })
}
