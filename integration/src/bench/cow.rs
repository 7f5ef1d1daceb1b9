//! Forks that share memory: the same workloads on the unpatched runsc and on runsc-cow (the
//! patch in packaging/gvisor, `restore --share-pages`), each behind a private containerd of its
//! own, in one run. Two kinds of memory: a process's heap (memfill) and files written into the
//! sandbox's memory-backed root overlay (`dd` into /tmp).

use std::time::{Duration, Instant};

use super::{meminfo_kb, report::Plain, stats::summarize, stats::Unit, timed, via_ctr::ViaCtr};
use crate::memfill::{self, MEMFILL_IMAGE};

/// Where a sandbox keeps its memory.
#[derive(Clone, Copy)]
enum Kind {
    /// memfill's heap: private anonymous memory.
    Process,
    /// Files in /tmp, in the memory-backed root overlay.
    Files,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Process => "process memory",
            Kind::Files => "files",
        }
    }

    /// A shell command that reads all of this memory in the sandbox, once.
    fn read_all(self) -> &'static str {
        match self {
            // memfill checks every page on SIGUSR1 and then writes /tmp/verified.
            Kind::Process => "rm -f /tmp/verified; kill -USR1 1",
            Kind::Files => "cat /tmp/fill > /dev/null && touch /tmp/verified",
        }
    }

    fn command(self, mb: u64) -> Vec<String> {
        match self {
            Kind::Process => memfill::command(mb),
            Kind::Files => vec![
                "sh".into(),
                "-c".into(),
                format!(
                    "dd if=/dev/urandom of=/tmp/fill bs=1048576 count={mb} iflag=fullblock \
                     2>/dev/null; touch /tmp/ready; exec sleep 100000"
                ),
            ],
        }
    }
}

/// The two runscs, each behind its own containerd.
pub struct Pair<'a> {
    pub unpatched: &'a ViaCtr<'a>,
    pub patched: &'a ViaCtr<'a>,
}

impl<'a> Pair<'a> {
    fn both(&self) -> [(&'static str, &'a ViaCtr<'a>); 2] {
        [("unpatched", self.unpatched), ("patched", self.patched)]
    }
}

/// Host memory, MB, once the page cache that nothing maps is dropped, so that a snapshot's
/// pages mapped by its forks count once and nothing else cached counts at all.
#[derive(Clone, Copy, Default)]
struct Mem {
    /// MemTotal less MemFree: everything, kernel caches and memory still being freed
    /// included.
    used: f64,
    /// memfds: each sandbox's own memory.
    shmem: f64,
    /// File pages that could not be dropped, memfds aside: mapped, as the snapshot's pages
    /// files and binaries are.
    files: f64,
    /// The host processes' own memory: sentries, gofers, shims.
    anon: f64,
    /// Page tables and kernel stacks: what the kernel spends per process and mapping.
    kernel: f64,
}

impl Mem {
    /// What the sandboxes hold: their memfds, the file pages they map, their processes'
    /// memory, and their page tables and kernel stacks.
    fn held(&self) -> f64 {
        self.shmem + self.files + self.anon + self.kernel
    }
}

impl std::ops::Sub for Mem {
    type Output = Mem;
    fn sub(self, o: Mem) -> Mem {
        Mem {
            used: self.used - o.used,
            shmem: self.shmem - o.shmem,
            files: self.files - o.files,
            anon: self.anon - o.anon,
            kernel: self.kernel - o.kernel,
        }
    }
}

/// Reads [`Mem`]. Memory freed by sandboxes that just ended reaches MemFree over seconds: it
/// reads again until three readings a second apart agree within 16 MB (at most 60 s).
fn host_memory() -> Mem {
    let read = || {
        // SAFETY: sync(2) takes no arguments and cannot fail.
        unsafe { libc::sync() };
        let _ = std::fs::write("/proc/sys/vm/drop_caches", "3");
        let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let mb = |key: &str| meminfo_kb(&text, key).unwrap_or(0) as f64 / 1024.0;
        Mem {
            used: mb("MemTotal:") - mb("MemFree:"),
            shmem: mb("Shmem:"),
            // Cached counts memfd pages too.
            files: mb("Cached:") - mb("Shmem:"),
            anon: mb("AnonPages:"),
            kernel: mb("PageTables:") + mb("KernelStack:"),
        }
    };
    let mut seen = vec![read()];
    for _ in 0..60 {
        std::thread::sleep(Duration::from_secs(1));
        let now = read();
        seen.push(now);
        let recent = &seen[seen.len().saturating_sub(3)..];
        if recent.len() == 3 && recent.iter().all(|m| (now.held() - m.held()).abs() < 16.0) {
            return now;
        }
    }
    seen[seen.len() - 1]
}

/// A sandbox holding `mb` MB of `kind`, snapshotted and removed: the snapshot's digest.
fn snapshot_of(chalk: &ViaCtr, kind: Kind, mb: u64, id: &str) -> Result<String, String> {
    snapshot_running(chalk, &kind.command(mb), id)
}

/// A sandbox running `cmd` in the memfill image, snapshotted once it is ready and removed: the
/// snapshot's digest.
fn snapshot_running(chalk: &ViaCtr, cmd: &[String], id: &str) -> Result<String, String> {
    chalk.remove(id);
    let made = (|| {
        start_memfill(chalk, cmd, id, Duration::from_secs(1800))?;
        Ok::<_, String>(chalk.snapshot(id)?.1)
    })();
    chalk.remove(id);
    made
}

/// Runs `cmd` in the memfill image as `id`, and waits up to `within` until it is ready.
fn start_memfill(chalk: &ViaCtr, cmd: &[String], id: &str, within: Duration) -> Result<(), String> {
    let mut args = vec!["run", "--net", "none", MEMFILL_IMAGE, id, "--"];
    args.extend(cmd.iter().map(String::as_str));
    chalk.chalkctl(&args)?;
    chalk.wait_file(id, "/tmp/ready", within)
}

/// The ids chalkctl gives `count` forks named `prefix`.
fn fork_ids(prefix: &str, count: usize) -> Vec<String> {
    match count {
        1 => vec![prefix.to_string()],
        n => (1..=n).map(|k| format!("{prefix}-{k}")).collect(),
    }
}

/// `count` more forks of `digest`, named `prefix` (see [`fork_ids`]): how long until they all
/// run.
fn fork(chalk: &ViaCtr, digest: &str, prefix: &str, count: usize) -> Result<Duration, String> {
    let n = count.to_string();
    Ok(timed(|| {
        chalk.chalkctl(&[
            "fork",
            "--snapshot-id",
            digest,
            "--fork-id",
            prefix,
            "--count",
            &n,
            // chalkctl's estimate counts a full copy per fork.
            "--force",
        ])
    })?
    .0)
}

/// Has each of `ids` read all of its `kind` of memory.
fn read_all(chalk: &ViaCtr, kind: Kind, ids: &[String]) -> Result<(), String> {
    for id in ids {
        let out = chalk.c.ctr([
            "task",
            "exec",
            "--exec-id",
            "read-all",
            id,
            "sh",
            "-c",
            kind.read_all(),
        ]);
        if out.code != 0 {
            return Err(format!("{id}: reading its memory: {out:?}"));
        }
        chalk.wait_file(id, "/tmp/verified", Duration::from_secs(600))?;
    }
    Ok(())
}

fn remove_all(chalk: &ViaCtr, ids: &[String]) {
    for id in ids {
        chalk.remove(id);
    }
}

type Row = (String, Unit, Vec<f64>);

/// Host memory with 1, 8 and 16 forks of one snapshot of `mb` MB, for each kind and runsc;
/// where the memory is, for `breakdown`.
fn memory_rows(
    pair: &Pair,
    mb: u64,
    counts: &[usize],
    rows: &mut Vec<Row>,
    breakdown: &mut Vec<String>,
) -> Result<(), String> {
    for kind in [Kind::Process, Kind::Files] {
        for (runsc, chalk) in pair.both() {
            let digest = snapshot_of(chalk, kind, mb, "cowm-src")?;
            let mut ids = Vec::new();
            let measured = (|| {
                let base = host_memory();
                let mut out = Vec::new();
                for (batch, &n) in counts.iter().enumerate() {
                    let more = n - ids.len();
                    let prefix = format!("cowm{batch}");
                    ids.extend(fork_ids(&prefix, more));
                    fork(chalk, &digest, &prefix, more)?;
                    // Let background loading end before measuring.
                    std::thread::sleep(Duration::from_secs(3));
                    out.push((format!("{n} forks"), host_memory() - base));
                }
                // Forks that read all of their memory map all of the snapshot's pages: one
                // copy, shared.
                read_all(chalk, kind, &ids)?;
                out.push((
                    format!("{} forks that each read all of it", ids.len()),
                    host_memory() - base,
                ));
                Ok::<_, String>(out)
            })();
            remove_all(chalk, &ids);
            chalk.delete_snapshot(&digest);
            for (forks, grew) in measured? {
                rows.push((
                    format!("host memory, {forks}, {mb} MB of {}, {runsc}", kind.name()),
                    Unit::Megabytes,
                    vec![grew.held()],
                ));
                breakdown.push(format!(
                    "{forks} of {}, {runsc}: memfds {:+.0} MB, files {:+.0}, processes {:+.0}, \
                     page tables and stacks {:+.0}; MemTotal less MemFree {:+.0}",
                    kind.name(),
                    grew.shmem,
                    grew.files,
                    grew.anon,
                    grew.kernel,
                    grew.used
                ));
            }
        }
    }
    Ok(())
}

/// Fork time to running at each size (process memory), `reps` forks each.
fn fork_time_rows(
    pair: &Pair,
    sizes: &[u64],
    reps: usize,
    rows: &mut Vec<Row>,
) -> Result<(), String> {
    for &mb in sizes {
        for (runsc, chalk) in pair.both() {
            let digest = snapshot_of(chalk, Kind::Process, mb, "cowt-src")?;
            let mut samples = Vec::new();
            let timed_forks = (|| {
                for i in 0..reps {
                    let prefix = format!("cowt{i}");
                    let t = fork(chalk, &digest, &prefix, 1);
                    chalk.remove(&prefix);
                    samples.push(t?.as_secs_f64() * 1e3);
                }
                Ok::<_, String>(())
            })();
            chalk.delete_snapshot(&digest);
            timed_forks?;
            rows.push((
                format!("fork to running, {mb} MB of process memory, {runsc}"),
                Unit::Millis,
                samples,
            ));
        }
    }
    Ok(())
}

/// The worst case: a fork that rewrites all of its `mb` MB of process memory at once. Rows:
/// the fork plus the rewrite, from the fork's start to the rewrite's end; and the rewrite alone,
/// as memfill timed it inside the sandbox.
fn rewrite_rows(pair: &Pair, mb: u64, reps: usize, rows: &mut Vec<Row>) -> Result<(), String> {
    for (runsc, chalk) in pair.both() {
        let digest = snapshot_of(chalk, Kind::Process, mb, "cowr-src")?;
        let (mut total, mut inside) = (Vec::new(), Vec::new());
        let measured = (|| {
            for i in 0..reps {
                let id = format!("cowr{i}");
                let start = Instant::now();
                let result = (|| {
                    fork(chalk, &digest, &id, 1)?;
                    rewrite(chalk, &id)?;
                    let out = chalk.c.ctr([
                        "task",
                        "exec",
                        "--exec-id",
                        "rw",
                        &id,
                        "cat",
                        "/tmp/rewritten",
                    ]);
                    let ms = out
                        .stdout
                        .split_whitespace()
                        .nth(1)
                        .and_then(|v| v.parse::<f64>().ok())
                        .ok_or_else(|| format!("{id}: /tmp/rewritten reads {:?}", out.stdout))?;
                    Ok::<_, String>(ms)
                })();
                total.push(start.elapsed().as_secs_f64() * 1e3);
                chalk.remove(&id);
                inside.push(result?);
            }
            Ok::<_, String>(())
        })();
        chalk.delete_snapshot(&digest);
        measured?;
        rows.push((
            format!("fork, then rewrite all {mb} MB, {runsc}"),
            Unit::Millis,
            total,
        ));
        rows.push((
            format!("the rewrite alone (inside the fork), {runsc}"),
            Unit::Millis,
            inside,
        ));
    }
    Ok(())
}

/// Has memfill in `id` rewrite its changing part, and waits until it has.
fn rewrite(chalk: &ViaCtr, id: &str) -> Result<(), String> {
    let out = chalk.c.ctr([
        "task",
        "exec",
        "--exec-id",
        "usr2",
        id,
        "sh",
        "-c",
        "rm -f /tmp/rewritten; kill -USR2 1",
    ]);
    if out.code != 0 {
        return Err(format!("{id}: kill -USR2 1: {out:?}"));
    }
    chalk.wait_file(id, "/tmp/rewritten", Duration::from_secs(600))
}

/// `reps` snapshots of running sandbox `id`, each after `before` ran: how long runsc's
/// checkpoint took each time (the source's pause, the CLI's start and end included).
fn snapshot_pauses(
    chalk: &ViaCtr,
    id: &str,
    reps: usize,
    before: impl Fn() -> Result<(), String>,
) -> Result<Vec<f64>, String> {
    let mut paused = Vec::new();
    for nth in 0..reps {
        before()?;
        let (_, digest, _) = chalk.snapshot(id)?;
        chalk.delete_snapshot(&digest);
        let t = chalk
            .timing("checkpoint", id, nth)
            .ok_or_else(|| format!("{id}: no checkpoint timing in the shim's log"))?;
        paused.push(t.get("runsc_ms").copied().unwrap_or_default());
    }
    Ok(paused)
}

/// A fork that rewrote `change` MB of its `mb` MB, snapshotted while it runs, against a
/// sandbox of only `change` MB: runsc's checkpoint, `reps` each. On runsc-cow the fork maps
/// its snapshot's pages, and its checkpoint writes only the memory that is not theirs (patch
/// 0003, `checkpoint --base-pages`).
fn delta_rows(
    pair: &Pair,
    (mb, change): (u64, u64),
    reps: usize,
    rows: &mut Vec<Row>,
) -> Result<(), String> {
    for (runsc, chalk) in pair.both() {
        let digest = snapshot_running(chalk, &memfill::command_changing(mb, change), "cowd-src")?;
        let id = "cowd";
        let forked = (|| {
            fork(chalk, &digest, id, 1)?;
            snapshot_pauses(chalk, id, reps, || rewrite(chalk, id))
        })();
        chalk.remove(id);
        chalk.delete_snapshot(&digest);
        let small = "cowd-small";
        let alone = (|| {
            start_memfill(
                chalk,
                &memfill::command(change),
                small,
                Duration::from_secs(600),
            )?;
            snapshot_pauses(chalk, small, reps, || Ok(()))
        })();
        chalk.remove(small);
        rows.push((
            format!(
                "snapshot of a running fork that rewrote {change} of {mb} MB: runsc checkpoint, \
                 {runsc}"
            ),
            Unit::Millis,
            forked?,
        ));
        rows.push((
            format!("snapshot of a {change} MB sandbox: runsc checkpoint, {runsc}"),
            Unit::Millis,
            alone?,
        ));
    }
    Ok(())
}

/// The shared-memory group: memory with 1, 8 and 16 forks of a 1 GB snapshot of each kind,
/// fork time at 256 MB, 1 GB and 4 GB, and the rewrite worst case; `quick` shrinks it to a
/// smoke run.
pub fn measure(quick: bool, reps: usize, pair: &Pair) -> Result<Plain, String> {
    let mut rows = Vec::new();
    let (mb, counts, sizes): (u64, &[usize], &[u64]) = if quick {
        (16, &[1, 2], &[16])
    } else {
        (1024, &[1, 8, 16], &[256, 1024, 4096])
    };
    let mut breakdown = Vec::new();
    memory_rows(pair, mb, counts, &mut rows, &mut breakdown)?;
    fork_time_rows(pair, sizes, reps, &mut rows)?;
    rewrite_rows(pair, mb, reps, &mut rows)?;
    let change = if quick { 4 } else { 16 };
    delta_rows(pair, (mb, change), reps, &mut rows)?;
    let median = |label: &str| {
        rows.iter()
            .find(|(l, _, _)| l == label)
            .and_then(|(_, _, v)| summarize(v))
            .map_or(0.0, |s| s.median)
    };
    let n = counts[counts.len() - 1];
    let ratios: Vec<String> = [Kind::Process, Kind::Files]
        .iter()
        .map(|k| {
            let row = |runsc: &str| {
                median(&format!(
                    "host memory, {n} forks, {mb} MB of {}, {runsc}",
                    k.name()
                ))
            };
            format!(
                "{n} forks of {mb} MB of {}: {:.0} MB patched against {:.0} MB unpatched ({:.2}x)",
                k.name(),
                row("patched"),
                row("unpatched"),
                row("patched") / row("unpatched").max(f64::EPSILON)
            )
        })
        .collect();
    let pauses: Vec<String> = ["patched", "unpatched"]
        .iter()
        .map(|runsc| {
            let fork = median(&format!(
                "snapshot of a running fork that rewrote {change} of {mb} MB: runsc checkpoint, \
                 {runsc}"
            ));
            let small = median(&format!(
                "snapshot of a {change} MB sandbox: runsc checkpoint, {runsc}"
            ));
            format!(
                "{runsc}, {fork:.0} ms against {small:.0} ms ({:.2}x)",
                fork / small.max(f64::EPSILON)
            )
        })
        .collect();
    Ok(Plain {
        title: "Forks that share memory".into(),
        about: format!(
            "The unpatched runsc and runsc-cow (packaging/gvisor's `restore --share-pages`), each \
             behind its own containerd, in one run. A source sandbox holds {mb} MB of process \
             memory (memfill's heap) or of files (`dd` into /tmp, in the memory-backed root \
             overlay), is snapshotted and removed; its forks come from the snapshot. Host \
             memory: what the sandboxes hold, from /proc/meminfo after dropping the page cache \
             nothing maps, against the same before the first fork: Shmem (memfds), Cached less \
             Shmem (file pages still cached, so mapped: the snapshot's pages count once), \
             AnonPages, PageTables and KernelStack. MemTotal less MemFree moved by up to 500 MB \
             either way between readings, beyond what these fields account for, so it is \
             given below and not used. The forks are idle, and then each reads all of its memory (memfill's \
             check of every page; `cat` of the file). Fork to running: `chalkctl fork \
             --snapshot-id`, {reps} forks each. Rewrite: a fork that writes every page of its \
             memory at once, from the fork's start to the rewrite's end. {}. Where the memory \
             went: {}. A snapshot of a running fork that rewrote {change} MB of its {mb} MB \
             since the fork, against one of a sandbox of {change} MB, as runsc's checkpoint \
             (the source's pause; runsc-cow writes only what is not its snapshot's pages, \
             patch 0003): {}.",
            ratios.join("; "),
            breakdown.join("; "),
            pauses.join("; ")
        ),
        rows,
    })
}
