//! Resume: a suspended sandbox brought back from the snapshot it records, here or on a host
//! that never knew it (its snapshot pulled from a registry).

use super::fork::{fork_container, undo};
use super::parts::{parts, pod_members, rebuild_foreign, spec_json};

use crate::records::registry::Snapshot;
use crate::stdio::keeper::{self, Keeping};

use crate::{
    containerd::{Client, Result, Stdio},
    progress::Progress,
    records::snapshots::{self},
    Error,
};

/// Brings suspended sandbox `id` back under the same id from the snapshot it records, its
/// stdio kept by a keeper when `keep` is given.
pub fn resume(
    client: &mut Client,
    id: &str,
    keep: Option<&Keeping>,
    progress: &Progress,
) -> Result<(String, u32)> {
    let terminal = crate::containerd::spec_of(&client.container(id)?)["process"]["terminal"]
        .as_bool()
        .unwrap_or(false);
    // A suspended sandbox's log is its own: the new keeper appends to it.
    keeper::kept(keep, id, terminal, |io| {
        resume_with(client, id, io, progress)
    })
}

/// As [`resume`], the restored task's stdio on `io` (its terminal sized before it runs).
pub fn resume_with(
    client: &mut Client,
    id: &str,
    io: Option<(&Stdio, Option<(u32, u32)>)>,
    progress: &Progress,
) -> Result<(String, u32)> {
    let container = client.container(id)?;
    let Some(digest) = container.labels.get(chalk_labels::SUSPENDED_FROM).cloned() else {
        return Err(format!("sandbox {id} is not suspended").into());
    };
    // An interrupted suspend may have left the stopped task behind.
    crate::records::sandboxes::left_task_gone(client, &container)?;
    let p = parts(client, &snapshots::find(client, &digest)?.index)?;
    client.lease(&format!("chalkctl-resume-{id}"))?;
    let pid = progress.during(
        &format!("restoring {id} from {}", crate::progress::short(&digest)),
        || match io {
            Some((io, size)) => client.start_task_with(&container, Some(&p.checkpoint), io, size),
            None => client.start_task(&container, Some(&p.checkpoint)),
        },
    )?;
    client.set_container_label(id, chalk_labels::SUSPENDED_FROM, None)?;
    Ok((digest, pid))
}

/// Brings the sandbox snapshot `snap` was taken of back under its own id on a host that has
/// no record of it (its suspend snapshot pulled from a registry): its container is made again
/// from the snapshot (spec, image by digest, snapshotter) and restored. Undone whole when the
/// restore fails.
pub fn resume_here(
    client: &mut Client,
    snap: &Snapshot,
    keep: Option<&Keeping>,
    progress: &Progress,
) -> Result<u32> {
    let mut p = parts(client, &snap.index)?;
    if !pod_members(p.manifest.as_ref())?.is_empty() {
        return Err(format!(
            "snapshot {} is of a pod: a pod resumes on the host that ran it; fork it here \
             instead (chalkctl fork --snapshot-id)",
            crate::progress::short(&snap.digest)
        )
        .into());
    }
    let id = p
        .manifest
        .as_ref()
        .map_or(snap.sandbox_id.clone(), |m| m.source.container_id.clone());
    chalk_runtime::ids::container_id(&id).map_err(|e| Error::from(e.to_string()))?;
    p.source = snap.sandbox_id.clone();
    // It came from another host: its spec is rebuilt, never run as it came.
    rebuild_foreign(&mut p, client.namespace(), &id, progress)?;
    let spec = spec_json(&p)?;
    client.lease(&format!("chalkctl-resume-{id}"))?;
    let image = format!("{}@{}", p.image, p.base.digest);
    let mut container = fork_container(&p, &id, image, &p.base.digest, &spec, &snap.digest)?;
    container.labels.remove(chalk_labels::FORKED_FROM);
    container.labels.remove(chalk_labels::PARENT_SANDBOX);
    container
        .labels
        .insert(chalk_labels::RESUMED_FROM.to_string(), snap.digest.clone());
    if keep.is_some() {
        container
            .labels
            .insert(chalk_labels::STDIO_LABEL.into(), "chalkctl".into());
    }
    client.prepare_snapshot(&p.snapshotter, &id, &p.chain_id)?;
    if let Err(e) = client.create_container(container.clone()) {
        client.remove_snapshot(&p.snapshotter, &id);
        return Err(e);
    }
    let terminal = spec["process"]["terminal"].as_bool().unwrap_or(false);
    let started = progress.during(
        &format!(
            "restoring {id} from {}",
            crate::progress::short(&snap.digest)
        ),
        || {
            keeper::with_keeper(client, keep, &id, terminal, |io| match io {
                Some((io, size)) => {
                    client.start_task_with(&container, Some(&p.checkpoint), io, size)
                }
                None => client.start_task(&container, Some(&p.checkpoint)),
            })
        },
    );
    if started.is_err() {
        undo(client, &p.snapshotter, &id);
    }
    started
}
