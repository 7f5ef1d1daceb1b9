//! `chalkctl fork`: new sandboxes from a snapshot, on the base image by digest.

use std::{collections::HashMap, time::Instant};

use chalk_runtime::snapshot::{hash::sha256_hex, manifest::PodMember, Manifest};

use crate::records::registry::{Snapshot, Status};
use crate::stdio::keeper::{self, Keeping};
use containerd_client::{
    services::v1::{container::Runtime, Container},
    types::Descriptor,
};
use prost::Message;
use serde_json::Value;

use crate::{
    containerd::RUNTIME,
    containerd::{Client, Result, Stdio},
    progress::Progress,
    records::snapshots::{self, CHECKPOINT_SPEC, CHECKPOINT_TAR},
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

/// What a snapshot's index holds for a restore.
pub(crate) struct Parts {
    pub checkpoint: Descriptor,
    /// What only a fork needs: the sandbox the snapshot was taken of (from its record) and
    /// the other containers of its pod, recreated in each fork.
    pub(crate) source: String,
    pub(crate) members: Vec<PodMember>,
    /// What the forks change of the source's lifetime.
    pub(crate) lifetime: ForkOptions,
    pub(crate) spec: prost_types::Any,
    pub(crate) snapshotter: String,
    pub(crate) image: String,
    pub(crate) base: Descriptor,
    pub(crate) chain_id: String,
    /// The snapshot's chalk manifest (None for an old checkpoint without one, which the shim
    /// refuses at restore).
    pub(crate) manifest: Option<Manifest>,
}

pub(crate) fn descriptor(v: &Value) -> Descriptor {
    Descriptor {
        media_type: v["mediaType"].as_str().unwrap_or_default().to_string(),
        digest: v["digest"].as_str().unwrap_or_default().to_string(),
        size: v["size"].as_i64().unwrap_or_default(),
        annotations: HashMap::new(),
    }
}

pub(crate) fn read_json(client: &Client, digest: &str) -> Result<Value> {
    serde_json::from_slice(&client.read_blob(digest)?)
        .map_err(|e| Error::from(format!("{digest}: {e}")))
}

/// What snapshot `digest` (its record's index) holds for a restore. The index's checkpoint is
/// what containerd is given: for a snapshot in the store, a pointer to it, so that the shim
/// restores from the store's own files whatever containerd's version; for one taken before
/// snapshots were stored as blobs, its checkpoint tar.
pub(crate) fn parts(client: &Client, digest: &str) -> Result<Parts> {
    let index = read_json(client, digest)?;
    // A stored snapshot is opened and checked here: a damaged store is refused before
    // anything is made.
    let manifest = snapshots::manifest_of(client, &index)?;
    let manifests: Vec<&Value> = index["manifests"]
        .as_array()
        .into_iter()
        .flatten()
        .collect();
    let by_type = |t: &str| {
        manifests
            .iter()
            .find(|m| m["mediaType"] == t)
            .map(|m| descriptor(m))
    };
    let checkpoint = by_type(CHECKPOINT_TAR).ok_or("the snapshot holds no checkpoint")?;
    let spec_desc = by_type(CHECKPOINT_SPEC).ok_or("the snapshot holds no spec")?;
    let base = manifests
        .iter()
        // The snapshot's own OCI manifest (an artifact) is no image.
        .filter(|m| m["artifactType"].is_null())
        .find(|m| {
            let t = m["mediaType"].as_str().unwrap_or_default();
            t.contains("manifest") || t.ends_with("image.index.v1+json")
        })
        .map(|m| descriptor(m))
        .ok_or("the snapshot names no base image")?;
    let spec = prost_types::Any::decode(&client.read_blob(&spec_desc.digest)?[..])
        .map_err(|e| Error::from(format!("the snapshot's spec: {e}")))?;
    let note = |k: &str| {
        index["annotations"][k]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    Ok(Parts {
        chain_id: image_config(client, &base)?.1,
        source: String::new(),
        members: Vec::new(),
        lifetime: ForkOptions::default(),
        checkpoint,
        spec,
        snapshotter: note("io.containerd.checkpoint.snapshotter"),
        // Snapshots of forks before this build recorded the pinned reference.
        image: chalk_runtime::snapshot::manifest::ImageRef::unpinned(&note(
            "org.opencontainers.image.ref.name",
        ))
        .to_string(),
        base,
        manifest,
    })
}

/// The snapshot's spec of the container, as JSON.
pub(crate) fn spec_json(p: &Parts) -> Result<Value> {
    serde_json::from_slice(&p.spec.value)
        .map_err(|e| Error::from(format!("the snapshot's spec: {e}")))
}

/// The pod containers a manifest records (none for a plain sandbox).
pub(crate) fn pod_members(m: Option<&Manifest>) -> Result<Vec<PodMember>> {
    let members = m
        .and_then(|m| m.extra.pod.clone())
        .map_or_else(Vec::new, |p| p.containers);
    for member in &members {
        if member.name.is_empty() || member.image.is_empty() || !member.spec.is_object() {
            return Err(format!(
                "the snapshot records pod container {} without its name, image or spec",
                member.id
            )
            .into());
        }
    }
    Ok(members)
}

/// How much host memory one restore of the snapshot takes: the sandbox's memory when it was
/// taken, as the manifest records it, else the size of its checkpoint files.
pub fn memory_of(m: Option<&Manifest>) -> u64 {
    m.map_or(0, |m| m.memory_bytes.unwrap_or_else(|| m.total_size()))
}

/// An image's config (for this platform's manifest when the image is an index) and the
/// chain id of its root filesystem (the name of its unpacked snapshot).
pub(crate) fn image_config(client: &Client, target: &Descriptor) -> Result<(Value, String)> {
    let mut manifest = read_json(client, &target.digest)?;
    if manifest["manifests"].is_array() {
        let arch = snapshots::oci_arch();
        let digest = manifest["manifests"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|m| m["platform"]["os"] == "linux" && m["platform"]["architecture"] == arch)
            .and_then(|m| m["digest"].as_str())
            .ok_or_else(|| {
                Error::from(format!(
                    "image {} has no linux/{arch} manifest",
                    target.digest
                ))
            })?
            .to_string();
        manifest = read_json(client, &digest)?;
    }
    let config_digest = manifest["config"]["digest"]
        .as_str()
        .ok_or("the image's manifest has no config")?;
    let config = read_json(client, config_digest)?;
    let chain = chain_ids(&diff_ids(&config))
        .pop()
        .ok_or("the image has no layers")?;
    Ok((config, chain))
}

/// An image config's layer digests, uncompressed (`rootfs.diff_ids`), bottom first.
pub(crate) fn diff_ids(config: &Value) -> Vec<&str> {
    config["rootfs"]["diff_ids"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect()
}

/// The chain id of each layer of an image whose layers have `diff_ids` (the name of the
/// snapshot that layer and those below it unpack to), bottom first.
pub(crate) fn chain_ids(diff_ids: &[&str]) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(diff_ids.len());
    for diff in diff_ids {
        let next = match out.last() {
            None => diff.to_string(),
            Some(below) => format!(
                "sha256:{}",
                sha256_hex(format!("{below} {diff}").as_bytes())
            ),
        };
        out.push(next);
    }
    out
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

/// What a fork may change of its source (the rest it inherits).
#[derive(Default, Clone)]
pub struct ForkOptions {
    /// A lifetime of its own instead of the source's (`chalk.io/lifetime`).
    pub lifetime: Option<String>,
    /// What happens when it ends (`chalk.io/on-timeout`).
    pub on_timeout: Option<String>,
    /// Fork even where the host's available memory looks too small for every copy.
    pub force: bool,
    /// The forks' name (numbered when there are several).
    pub name: Option<String>,
    /// Each fork's stdio kept by a keeper of its own (chalkctl's command line); else a fork
    /// has none unless its caller gives it some (`fork_to`).
    pub keep: Option<Keeping>,
    /// Ports the fork publishes, as `-p` takes them: its source's belong to the source and
    /// are never inherited.
    pub ports: Vec<String>,
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

/// Rebuilds the specs a snapshot pulled from a registry brought (its sandbox's, and each pod
/// member's) from the allow-list of `chalk_runtime::foreign_spec`, each placed in this
/// client's namespace's cgroup tree (`/<namespace>/<id>`, as containerd places a container):
/// nothing of them acts on this host. Refused when one binds host paths or joins namespaces
/// here; what was left out is said.
pub(crate) fn rebuild_foreign(
    p: &mut Parts,
    namespace: &str,
    source: &str,
    progress: &Progress,
) -> Result<()> {
    let rebuild = |spec: &Value, id: &str, what: &str| -> Result<Value> {
        let r = chalk_runtime::foreign_spec::rebuild(spec, Some(&format!("/{namespace}/{id}")))
            .map_err(|e| Error::from(format!("{what}: {e}")))?;
        if !r.dropped.is_empty() {
            progress.step(&format!(
                "{what} came from elsewhere: rebuilt without {}",
                r.dropped.join(", ")
            ));
        }
        Ok(r.spec)
    };
    let spec = rebuild(&spec_json(p)?, source, "the snapshot's spec")?;
    p.spec.value = serde_json::to_vec(&spec).map_err(|e| Error::from(e.to_string()))?;
    for m in &mut p.members {
        m.spec = rebuild(&m.spec, &m.id, &format!("pod container {}'s spec", m.name))?;
    }
    Ok(())
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
    fn a_foreign_snapshots_specs_are_rebuilt_for_its_sandbox_and_members() {
        let hostile = serde_json::json!({
            "process": {"args": ["sh"]},
            "hooks": {"prestart": [{"path": "/bin/sh"}]},
            "linux": {"devices": [{"path": "/dev/sda"}], "cgroupsPath": "/"}
        });
        let mut p = Parts {
            checkpoint: Descriptor::default(),
            source: "web".into(),
            members: vec![PodMember {
                id: "side-1".into(),
                name: "side".into(),
                image: "i".into(),
                image_digest: None,
                spec: hostile.clone(),
            }],
            lifetime: ForkOptions::default(),
            spec: prost_types::Any {
                type_url: "t".into(),
                value: serde_json::to_vec(&hostile).unwrap(),
            },
            snapshotter: String::new(),
            image: String::new(),
            base: Descriptor::default(),
            chain_id: String::new(),
            manifest: None,
        };
        rebuild_foreign(&mut p, "default", "web", &Progress::quiet()).unwrap();
        let spec = spec_json(&p).unwrap();
        assert!(spec.get("hooks").is_none() && spec["linux"].get("devices").is_none());
        assert_eq!(spec["linux"]["cgroupsPath"], "/default/web");
        assert!(p.members[0].spec.get("hooks").is_none());
        assert_eq!(p.members[0].spec["linux"]["cgroupsPath"], "/default/side-1");
        p.members[0].spec["mounts"] =
            serde_json::json!([{"destination": "/d", "type": "bind", "source": "/"}]);
        let err = rebuild_foreign(&mut p, "default", "web", &Progress::quiet()).unwrap_err();
        assert!(
            err.to_string().contains("pod container side's spec"),
            "{err}"
        );
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
