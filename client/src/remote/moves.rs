//! Sandboxes that move between hosts: `suspend --to` pushes the suspend snapshot (and with
//! `--release` drops the local copy: the node keeps only the sandbox's record, naming where
//! its memory went), `resume --from` brings it back here, pulling what this host lacks, on
//! this host or on one that never ran it.

use crate::stdio::keeper::Keeping;
use chalk_runtime::snapshot::store::GcReport;

use super::{
    pull::{self, Pulled},
    push::{self, Pushed},
    Access,
};
use crate::{
    containerd::Client, progress::Progress, records::registry::Snapshot, records::snapshots, Error,
    Result,
};

pub struct Suspended {
    pub snapshot: Snapshot,
    pub pushed: Pushed,
    /// What `--release` freed.
    pub released: Option<GcReport>,
}

/// Suspends sandbox `id` and pushes its snapshot to `to`; with `release`, the local snapshot
/// goes once the registry has it. A failed push leaves the sandbox suspended here, whole.
pub fn suspend_to(
    client: &mut Client,
    access: &Access,
    id: &str,
    to: &str,
    release: bool,
    progress: &Progress,
) -> Result<Suspended> {
    // A reference, recipients or a key that cannot be used are refused before the sandbox
    // stops.
    super::reference(to)?;
    access.check_push()?;
    let snapshot = crate::ops::snapshot::create(client, id, Vec::new(), true, progress)?;
    let pushed = push::push(client, access, &snapshot.digest, to, progress).map_err(|e| {
        Error::from(format!(
            "{id} is suspended here, but its snapshot was not pushed: {e} (push it with \
             chalkctl snapshot push --snapshot-id {} {to}, or resume it here)",
            snapshot.digest
        ))
    })?;
    let released = if release {
        client.set_container_label(id, chalk_labels::RELEASED_TO, Some(&pushed.reference))?;
        let gc = snapshots::delete(client, &snapshot)?;
        progress.step(&format!(
            "released the local copy ({} freed): {id} resumes from {}",
            crate::progress::megabytes(gc.bytes_freed),
            pushed.reference
        ));
        Some(gc)
    } else {
        None
    };
    Ok(Suspended {
        snapshot,
        pushed,
        released,
    })
}

/// Resumes sandbox `id`: from its own snapshot when this host has it, else pulled from
/// `from` (or from where `suspend --to --release` pushed it). On a host with no record of `id`, the
/// sandbox is made again from the pulled snapshot. The snapshot and the pid.
pub fn resume_from(
    client: &mut Client,
    access: &Access,
    id: &str,
    from: Option<&str>,
    keep: Option<&Keeping>,
    progress: &Progress,
) -> Result<(String, u32, Option<Pulled>)> {
    let container = match client.container(id) {
        Ok(c) => Some(c),
        Err(e) if e.is_not_found() => None,
        Err(e) => return Err(e),
    };
    let Some(container) = container else {
        let from = from.ok_or_else(|| {
            Error::from(format!(
                "sandbox {id} is not on this host: give --from REF, the snapshot it was \
                 suspended to"
            ))
        })?;
        let pulled = pull::pull(client, access, from, progress)?;
        let source = &pulled.snapshot.sandbox_id;
        if source != id {
            return Err(format!(
                "{from} is a snapshot of {source}, not {id}: resume it as {source}, or make a \
                 new sandbox from it with chalkctl fork --snapshot {from}"
            )
            .into());
        }
        let pid = crate::ops::resume::resume_here(client, &pulled.snapshot, keep, progress)?;
        return Ok((pulled.snapshot.digest.clone(), pid, Some(pulled)));
    };
    let Some(wanted) = container.labels.get(chalk_labels::SUSPENDED_FROM).cloned() else {
        return Err(format!("sandbox {id} is not suspended").into());
    };
    let mut pulled = None;
    if snapshots::find(client, &wanted).is_err() {
        let reference = from
            .map(String::from)
            .or_else(|| container.labels.get(chalk_labels::RELEASED_TO).cloned())
            .ok_or_else(|| {
                Error::from(format!(
                    "the snapshot {id} resumes from ({wanted}) is not on this host: give \
                     --from REF"
                ))
            })?;
        let got = pull::pull(client, access, &reference, progress)?;
        if got.snapshot.digest != wanted {
            return Err(format!(
                "{reference} holds snapshot {}, but {id} was suspended as {wanted}: refused",
                got.snapshot.digest
            )
            .into());
        }
        pulled = Some(got);
    }
    let (digest, pid) = crate::ops::resume::resume(client, id, keep, progress)?;
    client.set_container_label(id, chalk_labels::RELEASED_TO, None)?;
    Ok((digest, pid, pulled))
}
