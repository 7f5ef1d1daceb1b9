//! `chalkctl fork`: new sandboxes from a snapshot, on the base image by digest.

use std::{collections::HashMap, time::Instant};

use chalk_runtime::snapshot::manifest::PodMember;

use crate::records::registry::{Snapshot, Status};
use crate::stdio::keeper;
use containerd_client::services::v1::{container::Runtime, Container};
use serde_json::Value;

pub use super::fork_options::ForkOptions;
use super::parts::{
    image_config, memory_of, parts, pod_members, rebuild_foreign, spec_json, Parts,
};
use crate::{
    containerd::RUNTIME,
    containerd::{Client, Result, Stdio},
    progress::Progress,
    records::snapshots,
    Error,
};

/// containerd's garbage collector keeps the content a container's label names.
const BASE_IMAGE_REF: &str = "containerd.io/gc.ref.content.chalk-base";

/// One fork's outcome.
pub struct Forked {
    pub id: String,
    pub pid: Result<u32>,
    pub elapsed_ms: u64,
}

/// The ids of `count` forks: `id` for one, `id-1`.. for several; `<sandbox>-fork-<time>` by
/// default.
pub fn fork_ids(id: Option<&str>, sandbox: &str, stamp: &str, count: usize) -> Vec<String> {
    let base = id.map_or_else(|| format!("{sandbox}-fork-{stamp}"), str::to_string);
    match count {
        1 => vec![base],
        n => (1..=n).map(|i| format!("{base}-{i}")).collect(),
    }
}

/// Refuses fork ids that could not be made (`--count 0`, an id containerd or runsc would
/// refuse), before anything is done.
pub fn check_ids(id: Option<&str>, sandbox: &str, count: usize) -> Result<()> {
    if count == 0 {
        return Err("--count must be at least 1".into());
    }
    for new in fork_ids(id, sandbox, "20261201000000000", count) {
        chalk_runtime::ids::container_id(&new).map_err(|e| Error::from(e.to_string()))?;
    }
    Ok(())
}

/// Forks snapshot `query` into `count` running sandboxes, made by a pool sized to the host
/// and each reported on its own: one that fails is removed and does not undo the others.
pub fn fork(
    client: &mut Client,
    query: &str,
    id: Option<&str>,
    count: usize,
    opts: &ForkOptions,
    progress: &Progress,
) -> Result<Vec<Forked>> {
    let (snap, p) = forkable(client, query, opts, count, progress)?;
    let Planned { ids, names, stamp } = plan(client, id, &snap.sandbox_id, count, opts)?;
    let workers = pool_size(count);
    progress.step(&format!(
        "snapshot {} of {} verified; forking {count} ({workers} at a time)",
        crate::progress::short(&snap.digest),
        snap.sandbox_id
    ));
    // Two chalkctl processes may fork in the same millisecond: the pid keeps leases apart.
    client.lease(&format!("chalkctl-fork-{stamp}-{}", std::process::id()))?;
    Ok(fork_pool(client, &p, &ids, &names, &snap.digest, progress))
}

/// What `count` forks of sandbox `source` are called, checked before anything is made.
pub(crate) struct Planned {
    pub ids: Vec<String>,
    pub names: Vec<Option<String>>,
    /// The moment in their ids (and leases).
    pub stamp: String,
}

pub(crate) fn plan(
    client: &Client,
    id: Option<&str>,
    source: &str,
    count: usize,
    opts: &ForkOptions,
) -> Result<Planned> {
    check_ids(id, source, count)?;
    let names = crate::records::names::numbered(opts.name.as_deref(), count);
    crate::records::names::check_free(client, &names)?;
    let stamp: String = crate::clock::now()
        .chars()
        .filter(char::is_ascii_digit)
        .collect();
    Ok(Planned {
        ids: fork_ids(id, source, &stamp, count),
        names,
        stamp,
    })
}

/// Makes forks `ids` (named `names`) of `p`, [`pool_size`] at a time; `snapshot` is what
/// their lineage names.
pub(crate) fn fork_pool(
    client: &Client,
    p: &Parts,
    ids: &[String],
    names: &[Option<String>],
    snapshot: &str,
    progress: &Progress,
) -> Vec<Forked> {
    let workers = pool_size(ids.len());
    let next = std::sync::atomic::AtomicUsize::new(0);
    let done: std::sync::Mutex<Vec<Option<Forked>>> =
        std::sync::Mutex::new((0..ids.len()).map(|_| None).collect());
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let Some(new) = ids.get(i) else { break };
                let forked = fork_one(client, p, new, names[i].as_deref(), snapshot, progress);
                done.lock().unwrap()[i] = Some(forked);
            });
        }
    });
    done.into_inner().unwrap().into_iter().flatten().collect()
}

/// Snapshot `query` and what its restore needs, checked for `count` forks with `opts`.
fn forkable(
    client: &Client,
    query: &str,
    opts: &ForkOptions,
    count: usize,
    progress: &Progress,
) -> Result<(Snapshot, Parts)> {
    let snap = snapshots::find(client, query)?;
    match snap.status {
        Status::Completed => {}
        Status::Pending | Status::InProgress => {
            return Err(format!(
                "snapshot {} is still in progress ({}): fork it once \
                 `chalkctl snapshot get --snapshot-id {}` reads completed",
                snap.name, snap.status, snap.name
            )
            .into())
        }
        Status::Failed => {
            return Err(format!(
                "snapshot {} failed ({}): there is nothing to fork; take a new one",
                snap.name,
                snap.error.as_deref().unwrap_or("no error recorded")
            )
            .into())
        }
    }
    let mut p = parts(client, &snap.index)?;
    p.source = snap.sandbox_id.clone();
    p.members = pod_members(p.manifest.as_ref())?;
    let is_pod = spec_json(&p)?["annotations"][chalk_runtime::spec::CRI_SANDBOX_ID].is_string();
    if !p.members.is_empty() && !is_pod {
        return Err(format!(
            "snapshot {} lists pod containers, but its sandbox is no pod's (its spec has no \
             {}): refused, nothing was made",
            crate::progress::short(&snap.digest),
            chalk_runtime::spec::CRI_SANDBOX_ID
        )
        .into());
    }
    if snap
        .labels
        .contains_key(crate::records::registry::PULLED_FROM)
    {
        rebuild_foreign(&mut p, client.namespace(), &snap.sandbox_id, progress)?;
    }
    p.lifetime = opts.clone();
    check_memory(
        memory_of(p.manifest.as_ref()),
        count,
        host_available_memory(),
        opts.force,
    )?;
    Ok((snap, p))
}

/// One fork of snapshot `query` as sandbox `new`, its stdio on `io` and its terminal sized
/// `size` before it runs: a fork a terminal client attaches to (the web demo's panes).
/// Removed whole when it fails.
pub fn fork_to(
    client: &mut Client,
    query: &str,
    new: &str,
    opts: &ForkOptions,
    io: &Stdio,
    size: Option<(u32, u32)>,
) -> Result<u32> {
    let (snap, p) = forkable(client, query, opts, 1, &Progress::quiet())?;
    check_ids(Some(new), &snap.sandbox_id, 1)?;
    client.lease(&format!("chalkctl-fork-{new}"))?;
    let pid = one(client, &p, new, None, &snap.digest, Some((io, size)));
    if pid.is_err() {
        undo(client, &p.snapshotter, new);
    }
    client.release();
    pid
}

/// One fork of `p` as `new` on `io` (a fork of a checkpoint kept as no snapshot), removed
/// whole when it fails.
pub(crate) fn one_to(
    client: &Client,
    p: &Parts,
    new: &str,
    io: &Stdio,
    size: Option<(u32, u32)>,
) -> Result<u32> {
    let pid = one(client, p, new, None, "", Some((io, size)));
    if pid.is_err() {
        undo(client, &p.snapshotter, new);
    }
    pid
}

/// Makes fork `new` and reports it; one that fails is removed, whatever it got to.
fn fork_one(
    client: &Client,
    p: &Parts,
    new: &str,
    name: Option<&str>,
    digest: &str,
    progress: &Progress,
) -> Forked {
    let started = Instant::now();
    progress.step(&format!("restoring {new} ..."));
    let terminal = spec_json(p).is_ok_and(|s| s["process"]["terminal"] == true);
    let pid = keeper::with_keeper(client, p.lifetime.keep.as_ref(), new, terminal, |io| {
        one(client, p, new, name, digest, io)
    });
    match &pid {
        Ok(pid) => progress.step(&format!("{new} running (pid {pid})")),
        Err(e) => {
            progress.step(&format!("{new} failed: {e}"));
            undo(client, &p.snapshotter, new);
        }
    }
    Forked {
        id: new.to_string(),
        pid,
        elapsed_ms: started.elapsed().as_millis() as u64,
    }
}

/// How many forks are made at once: two per core (a restore spends about half its time
/// waiting on containerd and the shim, the rest is runsc's CPU and memory work), never more
/// than asked for. Measured on 2 cores, 16 forks of a small sandbox: 3.3-3.9 s by 2, 2.9-4.2 s
/// by 4, 2.7-3.0 s all at once; the bound is what keeps a large one from thrashing the host.
pub fn pool_size(count: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    count.min(2 * cores)
}

/// The host's available memory (MemAvailable), None when /proc/meminfo does not say.
pub(crate) fn host_available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_mem_available(&text)
}

fn parse_mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Refuses `count` forks of a snapshot whose restore takes `each` bytes when the host has
/// less memory available than all of them need (each fork is a full copy of its memory).
pub fn check_memory(each: u64, count: usize, available: Option<u64>, force: bool) -> Result<()> {
    let Some(available) = available else {
        return Ok(());
    };
    let need = each.saturating_mul(count as u64);
    if force || need <= available {
        return Ok(());
    }
    Err(format!(
        "{count} forks of this snapshot need about {count} x {} = {} of memory (each fork is \
         a full copy of the sandbox's memory), but this host has {} available (MemAvailable): \
         fork fewer, free memory, or pass --force to fork anyway",
        crate::progress::megabytes(each),
        crate::progress::megabytes(need),
        crate::progress::megabytes(available)
    )
    .into())
}

fn one(
    client: &Client,
    p: &Parts,
    id: &str,
    name: Option<&str>,
    snapshot: &str,
    io: Option<(&Stdio, Option<(u32, u32)>)>,
) -> Result<u32> {
    chalk_runtime::ids::container_id(id).map_err(|e| Error::from(e.to_string()))?;
    client.prepare_snapshot(&p.snapshotter, id, &p.chain_id)?;
    let mut spec = spec_json(p)?;
    // A pod's sandbox container (with or without other containers) becomes a pod of its own.
    let is_pod = spec["annotations"][chalk_runtime::spec::CRI_SANDBOX_ID].is_string();
    let pod = is_pod.then_some((p.source.as_str(), id));
    chalk_runtime::spec::fork_spec(&mut spec, &p.source, id, pod);
    set_lifetime(&mut spec, &p.lifetime);
    crate::ops::network::set_fork_ports(&mut spec, &p.lifetime.ports)?;
    // Pinned by digest: the restore checks this digest, whatever the tag says now.
    let image = format!("{}@{}", p.image, p.base.digest);
    let mut container = fork_container(p, id, image, &p.base.digest, &spec, snapshot)?;
    if let Some(name) = name {
        container
            .labels
            .insert(chalk_labels::NAME_LABEL.into(), name.into());
    }
    if p.lifetime.keep.is_some() {
        container
            .labels
            .insert(chalk_labels::STDIO_LABEL.into(), "chalkctl".into());
    }
    client.create_container(container.clone())?;
    let pid = match io {
        Some((io, size)) => client.start_task_with(&container, Some(&p.checkpoint), io, size)?,
        None => client.start_task(&container, Some(&p.checkpoint))?,
    };
    // The sandbox waits for its pod's containers: starting each restores it into the
    // sandbox (runsc matches them by their CRI names), the last one completes the restore.
    let mut made = Vec::new();
    let ids = member_ids(id, &p.members)?;
    for (m, member_id) in p.members.iter().zip(&ids) {
        let started = member(client, p, m, member_id, id, snapshot, &mut made);
        if let Err(e) = started {
            for member in made.iter().rev() {
                undo(client, &p.snapshotter, member);
            }
            return Err(format!("pod container {} of the fork: {e}", m.name).into());
        }
    }
    Ok(pid)
}

/// The ids of a pod fork's containers: `<name>-<fork>`. runsc finds a container by any
/// prefix of its id and refuses an id that prefixes another in the same sandbox (even an
/// exact one), so no id of the fork may begin another: `<fork>-<name>` always would.
fn member_ids(fork: &str, members: &[PodMember]) -> Result<Vec<String>> {
    let ids: Vec<String> = members
        .iter()
        .map(|m| format!("{}-{fork}", m.name))
        .collect();
    for id in &ids {
        chalk_runtime::ids::container_id(id).map_err(|e| Error::from(e.to_string()))?;
    }
    let all: Vec<&str> = std::iter::once(fork)
        .chain(ids.iter().map(String::as_str))
        .collect();
    for a in &all {
        if let Some(b) = all.iter().find(|b| b != &a && b.starts_with(a)) {
            return Err(format!(
                "fork id {fork}: the fork's containers would be {a} and {b}, and runsc cannot \
                 tell ids apart when one begins another; pick another --id"
            )
            .into());
        }
    }
    Ok(ids)
}

/// Creates and starts pod container `m` as `id` in fork `pod`, on its image by digest;
/// records its id in `made` as soon as there is something to remove.
fn member(
    client: &Client,
    p: &Parts,
    m: &PodMember,
    id: &str,
    pod: &str,
    snapshot: &str,
    made: &mut Vec<String>,
) -> Result<()> {
    let image = client.image(&m.image)?;
    let target = image
        .target
        .ok_or_else(|| Error::from(format!("image {} has no target", m.image)))?;
    let (_, chain_id) = image_config(client, &target)?;
    client.prepare_snapshot(&p.snapshotter, id, &chain_id)?;
    made.push(id.to_string());
    let mut spec = m.spec.clone();
    chalk_runtime::spec::fork_spec(&mut spec, &m.id, id, Some((&p.source, pod)));
    let image = format!("{}@{}", m.image, target.digest);
    let container = fork_container(p, id, image, &target.digest, &spec, snapshot)?;
    client.create_container(container.clone())?;
    client.start_task(&container, None).map(drop)
}

/// Replaces the lifetime annotations a fork inherits with the ones asked for.
fn set_lifetime(spec: &mut Value, opts: &ForkOptions) {
    use chalk_runtime::lifetime::{LIFETIME_ANNOTATION, ON_TIMEOUT_ANNOTATION};
    for (key, value) in [
        (LIFETIME_ANNOTATION, &opts.lifetime),
        (ON_TIMEOUT_ANNOTATION, &opts.on_timeout),
    ] {
        if let Some(v) = value {
            if !spec["annotations"].is_object() {
                spec["annotations"] = serde_json::json!({});
            }
            spec["annotations"][key] = v.clone().into();
        }
    }
}

/// The container record of fork container `id`: this runtime, `spec`, `image` (by digest),
/// its own root filesystem snapshot, labelled with where it came from (the snapshot and the
/// sandbox it was taken of). The label on `base` keeps the image's content from containerd's
/// garbage collector for as long as the fork exists, even once its snapshot is deleted and
/// the tag moved: a later snapshot of the fork restores onto it.
pub(crate) fn fork_container(
    p: &Parts,
    id: &str,
    image: String,
    base: &str,
    spec: &Value,
    snapshot: &str,
) -> Result<Container> {
    Ok(Container {
        id: id.to_string(),
        labels: HashMap::from([
            (chalk_labels::FORKED_FROM.to_string(), snapshot.to_string()),
            (chalk_labels::PARENT_SANDBOX.to_string(), p.source.clone()),
            (BASE_IMAGE_REF.to_string(), base.to_string()),
        ])
        .into_iter()
        // A fork of a checkpoint never kept as a snapshot names only its parent sandbox.
        .filter(|(_, v)| !v.is_empty())
        .collect(),
        image,
        runtime: Some(Runtime {
            name: RUNTIME.into(),
            options: None,
        }),
        spec: Some(prost_types::Any {
            type_url: p.spec.type_url.clone(),
            value: serde_json::to_vec(spec).map_err(|e| Error::from(e.to_string()))?,
        }),
        snapshotter: p.snapshotter.clone(),
        snapshot_key: id.to_string(),
        ..Default::default()
    })
}

/// Removes sandbox `id` that a fork or resume got part of the way to making: its task, its
/// container and its root filesystem snapshot, whichever exist.
pub(crate) fn undo(client: &Client, snapshotter: &str, id: &str) {
    if !client.kill_and_delete_task(id) {
        eprintln!(
            "chalkctl: the task of {id} could not be removed: the sandbox is kept (remove it \
             with `ctr task kill -s KILL {id}`, then `ctr container rm {id}`)"
        );
        return;
    }
    client.delete_container(id);
    client.remove_snapshot(snapshotter, id);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fork_ids_are_numbered_only_when_there_are_several() {
        assert_eq!(fork_ids(Some("f"), "web", "1", 1), ["f"]);
        assert_eq!(fork_ids(Some("f"), "web", "1", 3), ["f-1", "f-2", "f-3"]);
        assert_eq!(fork_ids(None, "web", "2026", 1), ["web-fork-2026"]);
    }

    #[test]
    fn pod_fork_ids_never_begin_one_another() {
        let member = |name: &str| PodMember {
            id: "x".into(),
            name: name.into(),
            image: "i".into(),
            image_digest: None,
            spec: Value::Null,
        };
        let ids = member_ids("pf", &[member("web"), member("side")]).unwrap();
        assert_eq!(ids, ["web-pf", "side-pf"]);
        // "w" begins "web-w": runsc could not tell them apart.
        let err = member_ids("w", &[member("web")]).unwrap_err();
        assert!(err.to_string().contains("pick another --id"), "{err}");
        assert!(member_ids("pf", &[member("a"), member("a-pf")]).is_err());
    }

    #[test]
    fn short_digests_keep_twelve_digits() {
        assert_eq!(
            crate::progress::short("sha256:0123456789abcdef"),
            "0123456789ab"
        );
        assert_eq!(crate::progress::short("abc"), "abc");
    }
}
