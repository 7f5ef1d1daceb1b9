//! `scripts/bench`: every operation through this shim, through containerd's runc shim driving
//! runsc, and with runsc alone, on a private containerd; writes RESULTS.md (and memory.png
//! when gnuplot is there) into the output directory.
//!
//!   chalk-bench [--quick] [--out DIR] [--sizes MB,..] [--only GROUP,..]
//!
//! `--sizes` and `--only` (lifecycle, snapshots, memory, many, shim, hashing, network, cow)
//! narrow a run while a change is measured; the committed results come from full runs. `cow`
//! (forks that share memory: the unpatched runsc against runsc-cow, CHALK_RUNSC_COW from
//! scripts/peers) runs in a full run where runsc-cow is built, or when named.
//!
//! `--quick` is the smoke mode CI runs: one or two runs of everything, small memory. Nothing
//! here fails on a timing; it fails only when an operation fails.

use std::{
    path::{Path, PathBuf},
    process::{Command, ExitCode, Stdio},
    time::{Duration, Instant},
};

use chalk_integration::{
    bench::{
        filled_counter, machine, meminfo_kb, reap_orphans,
        report::{self, Group, Meta, Plain, PlotPoint, Row, CHALK, RUNC_SHIM, RUNSC},
        runsc_alone::{openssl_sha256, size_of, RunscAlone},
        stats::{summarize, Unit},
        via_ctr::{write_runc_wrapper, ViaCtr},
        COUNTER,
    },
    containerd::program,
    image,
    procs::first_line,
    Containerd,
};

struct Opts {
    quick: bool,
    out: PathBuf,
    /// Runs of each lifecycle row.
    reps: usize,
    /// Runs of each snapshot row.
    snap_reps: usize,
    /// Runs of each memory row.
    mem_reps: usize,
    /// Megabytes the memory rows write.
    sizes: Vec<u64>,
    /// Sandboxes for the shim memory row.
    many: usize,
    /// Bytes of the file hashed.
    hash_bytes: u64,
    /// The groups to run (all when empty).
    only: Vec<String>,
}

const GROUPS: [&str; 9] = [
    "cow",
    "lifecycle",
    "snapshots",
    "memory",
    "many",
    "shim",
    "hashing",
    "network",
    "trace",
];

impl Opts {
    fn runs(&self, group: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|g| g == group)
    }
}

fn parse_opts() -> Result<Opts, String> {
    let mut quick = false;
    let mut out = PathBuf::from("bench");
    let mut sizes = None;
    let mut only = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--quick" => quick = true,
            "--out" => out = args.next().ok_or("--out needs a directory")?.into(),
            "--sizes" => {
                let list = args.next().ok_or("--sizes needs megabytes, as 64,1024")?;
                sizes = Some(
                    list.split(',')
                        .map(|v| {
                            v.parse::<u64>()
                                .map_err(|_| format!("--sizes: {v:?} is no number of megabytes"))
                        })
                        .collect::<Result<Vec<u64>, String>>()?,
                );
            }
            "--only" => {
                let list = args.next().ok_or("--only needs groups")?;
                for g in list.split(',') {
                    if !GROUPS.contains(&g) {
                        return Err(format!(
                            "--only: no group {g:?}; the groups: {}",
                            GROUPS.join(", ")
                        ));
                    }
                    only.push(g.to_string());
                }
            }
            other => {
                return Err(format!(
                    "unknown argument {other}; usage: chalk-bench [--quick] [--out DIR] \
                     [--sizes MB,..] [--only GROUP,..]"
                ))
            }
        }
    }
    let mut o = if quick {
        Opts {
            quick,
            out,
            reps: 2,
            snap_reps: 1,
            mem_reps: 1,
            sizes: vec![16],
            many: 3,
            hash_bytes: 64 << 20,
            only: Vec::new(),
        }
    } else {
        Opts {
            quick,
            out,
            reps: 10,
            snap_reps: 5,
            mem_reps: 3,
            sizes: vec![64, 256, 1024, 4096],
            many: 20,
            hash_bytes: 1 << 30,
            only: Vec::new(),
        }
    };
    if let Some(sizes) = sizes {
        o.sizes = sizes;
    }
    o.only = only;
    Ok(o)
}

fn main() -> ExitCode {
    match parse_opts().and_then(|o| run(&o)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("chalk-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn say(what: &str) {
    println!("== {what}");
}

fn run(o: &Opts) -> Result<(), String> {
    let started = Instant::now();
    reap_orphans();
    let c = Containerd::start().map_err(|e| format!("start containerd: {e}"))?;
    c.import_busybox()
        .map_err(|e| format!("import busybox: {e}"))?;
    let layer = image::busybox_layer(&program("CHALK_BUSYBOX", "/bin/busybox"))
        .map_err(|e| format!("busybox layer: {e}"))?;
    let alone = RunscAlone::new(&c.dir().join("alone"), &layer)?;
    let wrapper = write_runc_wrapper(c.dir(), alone.binary(), alone.flags())?;
    let chalk = ViaCtr::chalk(&c);
    let runc = ViaCtr::runc_shim(&c, &wrapper);

    let mut groups = Vec::new();
    if o.runs("lifecycle") {
        groups.push(lifecycle(o, &chalk, &runc, &alone)?);
    }
    if o.runs("snapshots") {
        groups.push(snapshots(o, &chalk, &alone)?);
    }
    let mut points = Vec::new();
    if o.runs("memory") {
        let (memory, p) = memory_scaling(o, &chalk, &alone)?;
        groups.push(memory);
        points = p;
    }
    if o.runs("many") {
        groups.push(many_forks(o, &chalk, &alone)?);
    }
    if o.runs("shim") {
        groups.push(shim_memory(o, &chalk, &runc)?);
    }
    // Not part of a full run: where a small sandbox's operations spend their time.
    if o.only.iter().any(|g| g == "trace") {
        trace(&chalk)?;
    }
    let mut hashing = if o.runs("hashing") {
        vec![hashing(o, c.dir())?]
    } else {
        Vec::new()
    };
    if o.runs("network") {
        say("networks");
        hashing.push(chalk_integration::bench::network::measure(o.reps, &chalk)?);
    }
    if let Some(cow) = cow_runsc(o)? {
        say("forks that share memory");
        chalk_integration::memfill::import(&c).map_err(|e| format!("import memfill: {e}"))?;
        let patched_c =
            Containerd::start_with_runsc(&cow).map_err(|e| format!("start containerd: {e}"))?;
        chalk_integration::memfill::import(&patched_c)
            .map_err(|e| format!("import memfill: {e}"))?;
        let patched = ViaCtr::chalk(&patched_c);
        let pair = chalk_integration::bench::cow::Pair {
            unpatched: &chalk,
            patched: &patched,
        };
        hashing.push(chalk_integration::bench::cow::measure(
            o.quick,
            o.reps.min(5),
            &pair,
        )?);
    }

    std::fs::create_dir_all(&o.out).map_err(|e| format!("{}: {e}", o.out.display()))?;
    let plot = plot(&o.out, &points, &alone.features.version);
    let meta = Meta {
        date: chalk_runtime::snapshot::manifest::rfc3339_now(),
        machine: machine(),
        containerd: first_line(&program("CHALK_CONTAINERD", "containerd"), &["--version"]),
        // A runsc built from a Go module reports no version: its path names the module's.
        runsc: format!(
            "{} at {} (flags {})",
            alone.features.version,
            alone.binary().display(),
            alone.flags().join(" ")
        ),
        mode: if o.quick {
            "--quick: smoke mode, few runs".into()
        } else if !o.only.is_empty() || o.sizes != [64, 256, 1024, 4096] {
            format!("partial run (groups {:?}, sizes {:?})", o.only, o.sizes)
        } else {
            "full run".into()
        },
    };
    let mut notes = vec![
        format!(
            "runsc alone takes snapshots the way the shim must on this runsc: {}.",
            match alone.features.leave_running() {
                chalk_runtime::runsc::features::LeaveRunning::InPlace =>
                    "`checkpoint --leave-running` resumes the same sandbox",
                chalk_runtime::runsc::features::LeaveRunning::RestoreAfter =>
                    "`checkpoint`, `delete`, then `restore` under the same id (this runsc's \
                     `--leave-running` restores a new sandbox as the checkpoint's child)",
            }
        ),
        "The runc shim runs runsc through a wrapper adding the same flags; it cannot \
         checkpoint a gVisor sandbox (runsc refuses runc's `--file-locks`), so its snapshot \
         rows are empty."
            .into(),
        "chalk and runc shim rows go through `ctr` (and `chalkctl` for snapshots), each a \
         process of its own talking to containerd: what a user types."
            .into(),
    ];
    if o.runs("memory") {
        notes.push(writeback_note());
    }
    if plot.is_none() && !points.is_empty() {
        notes.push("No plot: gnuplot is not installed (`scripts/bench` installs it).".into());
    }
    notes.push(format!(
        "The whole run took {:.0} s.",
        started.elapsed().as_secs_f64()
    ));
    let text = report::render(&meta, &groups, &hashing, plot.as_deref(), &notes);
    let path = o.out.join("RESULTS.md");
    std::fs::write(&path, &text).map_err(|e| format!("{}: {e}", path.display()))?;
    println!("{text}");
    println!("written: {}", path.display());
    Ok(())
}

/// Prints chalkctl's progress (its steps, to the millisecond) and the shim's log lines for a
/// small sandbox's snapshot, fork --id, suspend and resume: where their fixed cost goes.
fn trace(chalk: &ViaCtr) -> Result<(), String> {
    say("trace");
    let src = "trace-src";
    chalk.remove(src);
    chalk.run_detached(src, COUNTER)?;
    chalk.wait_file(src, "/tmp/count", Duration::from_secs(60))?;
    let shown = |args: &[&str]| -> Result<(), String> {
        let started = Instant::now();
        let out = chalk
            .c
            .chalkctl_command()
            .map_err(|e| e.to_string())?
            .args(args)
            .output()
            .map_err(|e| e.to_string())?;
        println!(
            "-- chalkctl {} ({:.1} ms, exit {})\n{}",
            args.join(" "),
            ms(started.elapsed()),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    };
    for i in 0..3 {
        shown(&["snapshot", "create", "--id", src])?;
        let fork = format!("trace-f{i}");
        shown(&["fork", "--id", src, "--fork-id", &fork])?;
        chalk.remove(&fork);
        shown(&["suspend", "--id", src])?;
        shown(&["resume", "--id", src])?;
    }
    chalk.remove(src);
    for line in chalk.c.log().lines().filter(|l| l.contains("trace-")) {
        println!("{line}");
    }
    Ok(())
}

/// run --rm, create+start, exec, kill+delete: every setup, interleaved run by run.
fn lifecycle(o: &Opts, chalk: &ViaCtr, runc: &ViaCtr, alone: &RunscAlone) -> Result<Group, String> {
    say("lifecycle");
    let echo = alone.bundle("echo", &["echo", "hi"])?;
    let counter = alone.bundle("counter", &["sh", "-c", COUNTER])?;
    let mut rows = [
        Row::new("`run --rm` of `echo hi`", Unit::Millis),
        Row::new("create + start (`ctr run -d`)", Unit::Millis),
        Row::new("exec of `true`", Unit::Millis),
        Row::new("kill + delete", Unit::Millis),
    ];
    // A first, untimed round warms caches.
    for i in 0..=o.reps {
        let keep = i > 0;
        for (s, setup) in [(CHALK, chalk), (RUNC_SHIM, runc)] {
            let id = format!("life-{s}-{i}");
            let t = [
                setup.run_echo(&format!("echo-{s}-{i}"))?,
                setup.run_detached(&id, COUNTER)?,
                setup.exec_true(&id, "bench")?,
                setup.kill_delete(&id)?,
            ];
            if keep {
                for (row, t) in rows.iter_mut().zip(t) {
                    row.samples[s].push(ms(t));
                }
            }
        }
        let id = format!("life-alone-{i}");
        let t = [
            alone.run(&echo, &format!("echo-alone-{i}"))?,
            alone.create_start(&counter, &id)?,
            alone.exec_true(&id)?,
            alone.kill_delete(&id)?,
        ];
        if keep {
            for (row, t) in rows.iter_mut().zip(t) {
                row.samples[RUNSC].push(ms(t));
            }
        }
    }
    Ok(Group {
        title: "Lifecycle".into(),
        about: format!(
            "{} runs each, after one warm-up. runsc alone: `runsc run`; `create` + `start`; \
             `exec`; `delete --force`. The sandbox runs a shell counter.",
            o.reps
        ),
        rows: rows.into(),
    })
}

/// What one source sandbox's cycles measured, each a sample per run (ms, size in MB).
#[derive(Default)]
struct Cycle {
    snapshot: Vec<f64>,
    /// How long the source was paused: runsc's checkpoint (the shim's figure for chalk).
    paused: Vec<f64>,
    /// Until a fork could start from it: the command's time less what it then waited for the
    /// seal (the shim's figures); for runsc alone, its checkpoint.
    forkable: Vec<f64>,
    /// The shim's seal after runsc ended (hashing what was left, storing); for runsc alone,
    /// the longer of its checkpoint and openssl's sha256 of its files on one core.
    sealing: Vec<f64>,
    sealed_vs: Vec<f64>,
    /// The shim's work on a snapshot before runsc's checkpoint.
    before: Vec<f64>,
    /// The host's dirty and writeback pages (MB) as each checkpoint began.
    dirty: Vec<f64>,
    /// `chalkctl fork --id`; runsc alone: its checkpoint and one restore.
    fork_running: Vec<f64>,
    /// Where a fork's time went in the shim: verifying the snapshot, runsc's restore until
    /// the sandbox ran.
    fork_verify: Vec<f64>,
    fork_runsc: Vec<f64>,
    fork: Vec<f64>,
    fork_loaded: Vec<f64>,
    /// runsc alone's `restore --background`: running, and fully loaded.
    fork_lazy: Vec<f64>,
    fork_lazy_loaded: Vec<f64>,
    fork4: Vec<f64>,
    suspend: Vec<f64>,
    resume: Vec<f64>,
    resume_loaded: Vec<f64>,
    size: Vec<f64>,
}

/// Snapshot, fork (1 and 4), suspend, resume and checkpoint size of the counter sandbox.
fn snapshots(o: &Opts, chalk: &ViaCtr, alone: &RunscAlone) -> Result<Group, String> {
    say("snapshot, fork, suspend, resume");
    let ours = chalk_cycle(o.snap_reps, chalk, "snap", COUNTER, true)?;
    let theirs = alone_cycle(o.snap_reps, alone, "snap", COUNTER, true)?;
    let rows = [
        (
            "snapshot, source keeps running",
            Unit::Millis,
            &ours.snapshot,
            &theirs.snapshot,
        ),
        (
            "snapshot: time until forkable",
            Unit::Millis,
            &ours.forkable,
            &theirs.forkable,
        ),
        (
            "snapshot: the shim before runsc's checkpoint",
            Unit::Millis,
            &ours.before,
            &Vec::new(),
        ),
        (
            "snapshot: runsc's checkpoint (shim), vs runsc alone",
            Unit::Millis,
            &ours.paused,
            &theirs.paused,
        ),
        ("fork, 1", Unit::Millis, &ours.fork, &theirs.fork),
        (
            "fork: runsc restore until running (shim), vs runsc alone",
            Unit::Millis,
            &ours.fork_runsc,
            &theirs.fork,
        ),
        (
            "`fork --id` (snapshot + fork), vs checkpoint + restore",
            Unit::Millis,
            &ours.fork_running,
            &theirs.fork_running,
        ),
        ("fork, 4 at once", Unit::Millis, &ours.fork4, &theirs.fork4),
        ("suspend", Unit::Millis, &ours.suspend, &theirs.suspend),
        ("resume", Unit::Millis, &ours.resume, &theirs.resume),
        ("checkpoint size", Unit::Megabytes, &ours.size, &theirs.size),
    ]
    .into_iter()
    .map(|(name, unit, a, b)| row(name, unit, a, b))
    .collect();
    Ok(Group {
        title: "Snapshot, fork, suspend and resume".into(),
        about: format!(
            "{} runs each on a running counter sandbox. chalk: `chalkctl snapshot create`, \
             `fork [--count 4]`, `suspend`, `resume` (snapshots in the shim's store, one blob \
             per runsc file; restores read them in place). runsc alone: `checkpoint` into a \
             directory, `restore --detach` (4 at once from one image), `checkpoint` + \
             `delete`, `restore`.",
            o.snap_reps
        ),
        rows,
    })
}

fn row(name: &str, unit: Unit, chalk: &[f64], runsc: &[f64]) -> Row {
    let mut r = Row::new(name, unit);
    r.samples[CHALK] = chalk.to_vec();
    r.samples[RUNSC] = runsc.to_vec();
    r
}

/// One source sandbox through chalkctl: per run a snapshot, a fork (and with `four`, four
/// forks at once), then suspend and resume of the source; with the shim's own timings.
fn chalk_cycle(
    reps: usize,
    chalk: &ViaCtr,
    name: &str,
    script: &str,
    four: bool,
) -> Result<Cycle, String> {
    let src = format!("{name}-src");
    chalk.remove(&src);
    chalk.run_detached(&src, script)?;
    let result = (|| {
        chalk.wait_file(&src, "/tmp/count", Duration::from_secs(900))?;
        let mut v = Cycle::default();
        for i in 0..reps {
            v.dirty.push(dirty_mb());
            let (t, digest, size) = chalk.snapshot(&src)?;
            v.snapshot.push(ms(t));
            v.size.push(size as f64 / 1e6);
            if let Some(t) = chalk.timing("snapshot", &src, i) {
                v.paused.push(t["runsc_ms"]);
                v.sealing.push(t["hash_ms"]);
                v.before.push(t["before_ms"]);
                let waited = t["sealed_ms"] - t["usable_ms"];
                v.forkable
                    .push(v.snapshot.last().copied().unwrap_or(0.0) - waited);
            }
            let id = format!("{name}-f{i}");
            let t = ms(chalk.fork(&digest, &id, 1)?);
            v.fork.push(t);
            v.fork_loaded.push(t + chalk.loading_after_running(&id, 0));
            if let Some(t) = chalk.timing("verify", &id, 0) {
                v.fork_verify.push(t["ms"]);
            }
            if let Some(t) = chalk.timing("restore", &id, 0) {
                v.fork_runsc.push(t["running_ms"]);
            }
            chalk.remove(&id);
            let id = format!("{name}-r{i}");
            let t = chalk.fork_running(&src, &id);
            chalk.remove(&id);
            v.fork_running.push(ms(t?));
            if four {
                let id = format!("{name}-g{i}");
                let t = chalk.fork(&digest, &id, 4);
                for k in 1..=4 {
                    chalk.remove(&format!("{id}-{k}"));
                }
                v.fork4.push(ms(t?));
            }
            chalk.delete_snapshot(&digest);
            let (t, digest) = chalk.suspend(&src)?;
            v.suspend.push(ms(t));
            let t = ms(chalk.resume(&src)?);
            v.resume.push(t);
            v.resume_loaded
                .push(t + chalk.loading_after_running(&src, i));
            chalk.delete_snapshot(&digest);
        }
        Ok(v)
    })();
    chalk.remove(&src);
    result
}

/// The same cycle with runsc alone, images in directories.
fn alone_cycle(
    reps: usize,
    alone: &RunscAlone,
    name: &str,
    script: &str,
    four: bool,
) -> Result<Cycle, String> {
    let bundle = alone.bundle(name, &["sh", "-c", script])?;
    let src = format!("{name}-src");
    let images = bundle.with_file_name(format!("{name}-images"));
    alone.remove(&src);
    alone.create_start(&bundle, &src)?;
    let result = (|| {
        alone.wait_file(&src, "/tmp/count", Duration::from_secs(900))?;
        let mut v = Cycle::default();
        for i in 0..reps {
            let _ = std::fs::remove_dir_all(&images);
            let image = images.join(format!("snap-{i}"));
            v.dirty.push(dirty_mb());
            let t = ms(alone.snapshot(&bundle, &src, &image)?);
            v.snapshot.push(t);
            v.paused.push(t);
            v.forkable.push(t);
            v.sealed_vs.push(t.max(ms(openssl_sha256(&image)?)));
            v.size.push(size_of(&image) as f64 / 1e6);
            let id = format!("{name}-f{i}");
            let t = alone.restore(&bundle, &image, &id);
            alone.remove(&id);
            v.fork.push(ms(t?));
            v.fork_running
                .push(v.snapshot.last().copied().unwrap_or(0.0) + v.fork.last().unwrap());
            v.fork_loaded.push(*v.fork.last().unwrap_or(&0.0));
            let id = format!("{name}-l{i}");
            let t = alone.restore_lazy(&bundle, &image, &id);
            alone.remove(&id);
            if let Some((running, loaded)) = t? {
                v.fork_lazy.push(ms(running));
                v.fork_lazy_loaded.push(ms(loaded));
            }
            if four {
                let ids: Vec<String> = (1..=4).map(|k| format!("{name}-g{i}-{k}")).collect();
                let t = alone.restore_many(&bundle, &image, &ids);
                for id in &ids {
                    alone.remove(id);
                }
                v.fork4.push(ms(t?));
            }
            let image = images.join(format!("susp-{i}"));
            v.suspend.push(ms(alone.suspend(&src, &image)?));
            v.resume.push(ms(alone.restore(&bundle, &image, &src)?));
            v.resume_loaded.push(*v.resume.last().unwrap_or(&0.0));
        }
        Ok(v)
    })();
    alone.remove(&src);
    let _ = std::fs::remove_dir_all(&images);
    result
}

/// Snapshot, fork and resume of sandboxes that first write `sizes` megabytes into memory.
fn memory_scaling(
    o: &Opts,
    chalk: &ViaCtr,
    alone: &RunscAlone,
) -> Result<(Group, Vec<PlotPoint>), String> {
    let mut rows = Vec::new();
    let mut points = Vec::new();
    for &mb in &o.sizes {
        say(&format!("memory: {mb} MB"));
        let script = filled_counter(mb);
        let name = format!("mem{mb}");
        // The biggest sandbox has fewer runs: each writes and checkpoints gigabytes.
        let reps = if mb >= 4096 {
            o.mem_reps.min(2)
        } else {
            o.mem_reps
        };
        let ours = chalk_cycle(reps, chalk, &name, &script, false)?;
        let theirs = alone_cycle(reps, alone, &name, &script, false)?;
        let median = |v: &Vec<f64>| summarize(v).map(|s| s.median / 1e3);
        points.push((
            mb,
            [
                median(&ours.snapshot),
                median(&ours.fork),
                median(&ours.resume),
                median(&theirs.snapshot),
                median(&theirs.fork),
                median(&theirs.resume),
            ],
        ));
        let none = Vec::new();
        let mut add = |what: &str, unit: Unit, a: &Vec<f64>, b: &Vec<f64>| {
            rows.push(row(&format!("{what}, {mb} MB written"), unit, a, b));
        };
        add("snapshot", Unit::Millis, &ours.snapshot, &theirs.snapshot);
        add(
            "snapshot: source paused",
            Unit::Millis,
            &ours.paused,
            &theirs.paused,
        );
        add(
            "snapshot: time until forkable",
            Unit::Millis,
            &ours.forkable,
            &theirs.forkable,
        );
        add(
            "snapshot: sealed, vs the longer of runsc's checkpoint and openssl's sha256",
            Unit::Millis,
            &ours.snapshot,
            &theirs.sealed_vs,
        );
        add(
            "snapshot: sealing after runsc ended (shim)",
            Unit::Millis,
            &ours.sealing,
            &none,
        );
        add(
            "`fork --id` (snapshot + fork), vs checkpoint + restore",
            Unit::Millis,
            &ours.fork_running,
            &theirs.fork_running,
        );
        add(
            "fork: time to running",
            Unit::Millis,
            &ours.fork,
            &theirs.fork,
        );
        add(
            "fork: fully loaded",
            Unit::Millis,
            &ours.fork_loaded,
            &theirs.fork_loaded,
        );
        add(
            "fork: verifying the snapshot (shim)",
            Unit::Millis,
            &ours.fork_verify,
            &none,
        );
        add(
            "fork: runsc restore until running (shim), vs runsc alone's",
            Unit::Millis,
            &ours.fork_runsc,
            if theirs.fork_lazy.is_empty() {
                &theirs.fork
            } else {
                &theirs.fork_lazy
            },
        );
        if !theirs.fork_lazy.is_empty() {
            add(
                "fork: running, vs runsc `--background`",
                Unit::Millis,
                &ours.fork,
                &theirs.fork_lazy,
            );
            add(
                "fork: fully loaded, vs runsc `--background`",
                Unit::Millis,
                &ours.fork_loaded,
                &theirs.fork_lazy_loaded,
            );
        }
        add("suspend", Unit::Millis, &ours.suspend, &theirs.suspend);
        add(
            "resume: time to running",
            Unit::Millis,
            &ours.resume,
            &theirs.resume,
        );
        add(
            "resume: fully loaded",
            Unit::Millis,
            &ours.resume_loaded,
            &theirs.resume_loaded,
        );
        add("checkpoint size", Unit::Megabytes, &ours.size, &theirs.size);
        add(
            "host: dirty and writeback pages as the snapshot began",
            Unit::Megabytes,
            &ours.dirty,
            &theirs.dirty,
        );
    }
    Ok((
        Group {
            title: "Cost against sandbox memory".into(),
            about: format!(
                "The counter sandbox after `dd if=/dev/urandom` of N MB into its /tmp (memory: \
                 the root overlay is in sandbox memory); {} runs each (2 at 4096 MB). Same \
                 operations as above. \"time to running\": until `chalkctl` (or `runsc \
                 restore`) returns with the sandbox running; \"fully loaded\": until all of its \
                 memory is in (the shim's `runsc wait --restore`; an eager restore is loaded \
                 when it runs). \"source paused\": runsc's checkpoint, during which the source's \
                 kernel is stopped (the shim's own figure); the shim hashes the files while runsc \
                 writes them and seals the snapshot after (\"sealing after runsc ended\"). \
                 \"time until forkable\": until a fork could start from runsc's files (the \
                 command's time less what it then waited for the seal); \"sealed\": until the \
                 snapshot's id is known, against the longer of runsc's checkpoint and openssl's \
                 sha256 of its files on one core. runsc alone checkpoints uncompressed, as the \
                 shim does.",
                o.mem_reps
            ),
            rows,
        },
        points,
    ))
}

/// Host memory and disk that `n` forks of one snapshot of a sandbox holding `mb` MB take.
fn many_forks(o: &Opts, chalk: &ViaCtr, alone: &RunscAlone) -> Result<Group, String> {
    let (n, mb) = if o.quick { (2, 16) } else { (8, 1024) };
    say(&format!("{n} forks of a {mb} MB snapshot"));
    let script = filled_counter(mb);
    let mut rows = [
        Row::new(
            &format!("host memory, {n} forks of a {mb} MB sandbox"),
            Unit::Megabytes,
        ),
        Row::new(
            &format!("disk, its snapshot with {n} forks running"),
            Unit::Megabytes,
        ),
        Row::new(&format!("{n} forks at once, fully loaded"), Unit::Millis),
    ];
    // chalk: one snapshot, n forks; memory is what the host's MemAvailable lost.
    let src = format!("many{mb}-src");
    chalk.remove(&src);
    chalk.run_detached(&src, &script)?;
    let ours = (|| {
        chalk.wait_file(&src, "/tmp/ready", Duration::from_secs(900))?;
        let (_, digest, _) = chalk.snapshot(&src)?;
        let store = chalk.c.snapshot_store().join("blobs");
        let content = chalk.c.dir().join("root/io.containerd.content.v1.content");
        let before = mem_available();
        let t = chalk.fork(&digest, "many", n);
        let ids: Vec<String> = (1..=n).map(|k| format!("many-{k}")).collect();
        let loaded = ids
            .iter()
            .map(|id| chalk.loading_after_running(id, 0))
            .fold(0.0, f64::max);
        std::thread::sleep(Duration::from_secs(2));
        let used = before.saturating_sub(mem_available());
        let disk = size_of(&store) + size_of(&content);
        for id in &ids {
            chalk.remove(id);
        }
        chalk.delete_snapshot(&digest);
        Ok::<_, String>((used, disk, ms(t?) + loaded))
    })();
    chalk.remove(&src);
    let (used, disk, t) = ours?;
    rows[0].samples[CHALK] = vec![used as f64 / 1e6];
    rows[1].samples[CHALK] = vec![disk as f64 / 1e6];
    rows[2].samples[CHALK] = vec![t];
    // runsc alone: one image directory, n restores.
    let bundle = alone.bundle("many", &["sh", "-c", &script])?;
    let image = bundle.with_file_name("many-image");
    alone.remove(&src);
    alone.create_start(&bundle, &src)?;
    let theirs = (|| {
        alone.wait_file(&src, "/tmp/ready", Duration::from_secs(900))?;
        let _ = std::fs::remove_dir_all(&image);
        alone.snapshot(&bundle, &src, &image)?;
        alone.remove(&src);
        let ids: Vec<String> = (1..=n).map(|k| format!("many-{k}")).collect();
        let before = mem_available();
        let t = alone.restore_many(&bundle, &image, &ids);
        std::thread::sleep(Duration::from_secs(2));
        let used = before.saturating_sub(mem_available());
        let disk = size_of(&image);
        for id in &ids {
            alone.remove(id);
        }
        Ok::<_, String>((used, disk, ms(t?)))
    })();
    alone.remove(&src);
    let _ = std::fs::remove_dir_all(&image);
    let (used, disk, t) = theirs?;
    rows[0].samples[RUNSC] = vec![used as f64 / 1e6];
    rows[1].samples[RUNSC] = vec![disk as f64 / 1e6];
    rows[2].samples[RUNSC] = vec![t];
    Ok(Group {
        title: format!("{n} forks of one {mb} MB snapshot"),
        about: "Host memory: how much the host's MemAvailable fell once the forks run (each \
                fork is a full copy of the sandbox's memory in runsc; what they share is the \
                page cache of the snapshot's files). Disk: the snapshot store and containerd's \
                content store (chalk), the image directory (runsc alone), with the forks \
                running. One run."
            .into(),
        rows: rows.into(),
    })
}

/// The host's dirty and writeback pages, in MB.
fn dirty_mb() -> f64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let kb = |key: &str| meminfo_kb(&meminfo, key).unwrap_or(0) as f64;
    (kb("Dirty:") + kb("Writeback:")) * 1024.0 / 1e6
}

/// A line on the host's writeback limits, which throttle the biggest checkpoints.
fn writeback_note() -> String {
    let sysctl = |k: &str| {
        std::fs::read_to_string(format!("/proc/sys/vm/{k}"))
            .map(|v| v.trim().to_string())
            .unwrap_or_else(|_| "?".into())
    };
    format!(
        "Writeback: vm.dirty_background_ratio {}%, vm.dirty_ratio {}% of the host's available \
         memory ({:.1} GB at the end). A writer whose pages would take the dirty total past \
         dirty_ratio is made to wait for the disk (the kernel's balance_dirty_pages), runsc's \
         checkpoint as much as anyone's: a 4096 MB checkpoint written while an earlier one is \
         still being written back is paced by the disk, in runsc alone as in the shim. The \
         \"host: dirty and writeback pages\" row says how much was waiting as each \
         checkpoint began: where it is small for both, writeback does not explain a difference \
         between them.",
        sysctl("dirty_background_ratio"),
        sysctl("dirty_ratio"),
        mem_available() as f64 / 1e9
    )
}

/// runsc-cow, when the shared-memory group runs: named by `--only`, or in a full run where
/// scripts/peers built it.
fn cow_runsc(o: &Opts) -> Result<Option<PathBuf>, String> {
    let named = o.only.iter().any(|g| g == "cow");
    let built = std::env::var_os("CHALK_RUNSC_COW")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from);
    match built {
        Some(path) if named || (o.only.is_empty() && !o.quick) => Ok(Some(path)),
        None if named => {
            Err("--only cow needs runsc-cow: CHALK_RUNSC_COW, from scripts/peers".into())
        }
        _ => Ok(None),
    }
}

/// The host's MemAvailable, in bytes.
fn mem_available() -> u64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    meminfo_kb(&meminfo, "MemAvailable:").map_or(0, |kb| kb * 1024)
}

/// Resident memory of the shim: with one sandbox, and per sandbox with many running.
fn shim_memory(o: &Opts, chalk: &ViaCtr, runc: &ViaCtr) -> Result<Group, String> {
    say("shim memory");
    let mut rows = [
        Row::new("shim RSS, 1 sandbox", Unit::Megabytes),
        Row::new(
            &format!("shim RSS per sandbox, {} running", o.many),
            Unit::Megabytes,
        ),
    ];
    for (s, setup) in [(CHALK, chalk), (RUNC_SHIM, runc)] {
        let ids: Vec<String> = (0..o.many).map(|i| format!("rss-{s}-{i}")).collect();
        let result = (|| {
            setup.run_detached(&ids[0], COUNTER)?;
            std::thread::sleep(Duration::from_secs(1));
            rows[0].samples[s] = setup.shim_rss().iter().map(|b| *b as f64 / 1e6).collect();
            for id in &ids[1..] {
                setup.run_detached(id, COUNTER)?;
            }
            std::thread::sleep(Duration::from_secs(1));
            rows[1].samples[s] = setup.shim_rss().iter().map(|b| *b as f64 / 1e6).collect();
            Ok::<_, String>(())
        })();
        for id in &ids {
            setup.remove(id);
        }
        result?;
    }
    Ok(Group {
        title: "Shim memory".into(),
        about: "VmRSS of each shim process serving the sandboxes (one shim per sandbox in \
                both), counter sandboxes started with `ctr run -d`. runsc alone has no shim."
            .into(),
        rows: rows.into(),
    })
}

/// The manifest's hasher next to sha256sum and openssl, on one core and on all.
fn hashing(o: &Opts, dir: &Path) -> Result<Plain, String> {
    say("hashing");
    let file = dir.join("hash-input");
    write_noise(&file, o.hash_bytes)?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let gbps = |d: Duration| o.hash_bytes as f64 / d.as_secs_f64() / 1e9;
    let runs = if o.quick { 1 } else { 3 };
    let mut ours1 = Vec::new();
    let mut ours_all = Vec::new();
    let mut sum = Vec::new();
    for _ in 0..runs {
        for (threads, into) in [(1, &mut ours1), (0, &mut ours_all)] {
            let started = Instant::now();
            chalk_runtime::snapshot::hash::hash_files(std::slice::from_ref(&file), threads)
                .map_err(|e| e.to_string())?;
            into.push(gbps(started.elapsed()));
        }
        let started = Instant::now();
        let ok = Command::new("sha256sum")
            .arg(&file)
            .stdout(Stdio::null())
            .status();
        if ok.is_ok_and(|s| s.success()) {
            sum.push(gbps(started.elapsed()));
        }
    }
    let _ = std::fs::remove_file(&file);
    let seconds = if o.quick { "1" } else { "3" };
    let mut rows = vec![
        (
            "chalk manifest hasher, 1 thread".to_string(),
            Unit::GigabytesPerSecond,
            ours1,
        ),
        (
            format!("chalk manifest hasher, {cores} threads"),
            Unit::GigabytesPerSecond,
            ours_all,
        ),
        ("`sha256sum`".to_string(), Unit::GigabytesPerSecond, sum),
    ];
    let openssl = |multi: Option<usize>| -> Vec<f64> {
        let mut cmd = Command::new("openssl");
        cmd.arg("speed");
        if let Some(n) = multi {
            cmd.args(["-multi", &n.to_string()]);
        }
        cmd.args(["-seconds", seconds, "-bytes", "1048576", "sha256"]);
        cmd.output()
            .ok()
            .and_then(|o| openssl_rate(&String::from_utf8_lossy(&o.stdout)))
            .map(|r| vec![r / 1e9])
            .unwrap_or_default()
    };
    rows.push((
        "`openssl speed sha256`, 1 MiB blocks, 1 core".into(),
        Unit::GigabytesPerSecond,
        openssl(None),
    ));
    rows.push((
        format!("`openssl speed -multi {cores} sha256`, 1 MiB blocks"),
        Unit::GigabytesPerSecond,
        openssl(Some(cores)),
    ));
    Ok(Plain {
        title: "Hashing throughput".into(),
        about: format!(
            "A {} MiB file of pseudo-random bytes in the page cache; the chalk hasher is what \
             seals snapshot files (each file's plain sha256, files in parallel).",
            o.hash_bytes >> 20
        ),
        rows,
    })
}

/// Bytes per second from `openssl speed`'s table (its last `sha256` line, in 1000s of bytes).
fn openssl_rate(out: &str) -> Option<f64> {
    let line = out.lines().rev().find(|l| l.starts_with("sha256"))?;
    let last = line.split_whitespace().last()?;
    last.trim_end_matches('k')
        .parse::<f64>()
        .ok()
        .map(|k| k * 1e3)
}

/// `bytes` of xorshift noise (incompressible, cheap to make) into `path`.
fn write_noise(path: &Path, bytes: u64) -> Result<(), String> {
    use std::io::Write;
    let mut f = std::io::BufWriter::new(
        std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?,
    );
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut block = vec![0u8; 1 << 20];
    for _ in 0..bytes.div_ceil(block.len() as u64) {
        for w in block.chunks_exact_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            w.copy_from_slice(&x.to_le_bytes());
        }
        f.write_all(&block).map_err(|e| e.to_string())?;
    }
    f.flush().map_err(|e| e.to_string())
}

/// Draws memory.png with gnuplot; None when there is nothing to plot, or gnuplot is missing
/// or fails.
fn plot(out: &Path, points: &[PlotPoint], runsc: &str) -> Option<String> {
    // A run without the memory group (`--only cow`) has nothing to plot.
    if points.is_empty() {
        return None;
    }
    let data = out.join("memory.dat");
    std::fs::write(&data, report::plot_data(points)).ok()?;
    let png = out.join("memory.png");
    let script = report::plot_script(
        &data.to_string_lossy(),
        &png.to_string_lossy(),
        &format!("chalk shim vs runsc alone ({})", runsc.replace('\'', "")),
    );
    let gp = out.join("memory.gp");
    std::fs::write(&gp, script).ok()?;
    let ok = Command::new("gnuplot")
        .arg(&gp)
        .status()
        .is_ok_and(|s| s.success());
    ok.then(|| "memory.png".to_string())
}
