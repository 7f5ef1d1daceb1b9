//! `scripts/bench --cycles`: what a sandbox costs when it is suspended to a registry and resumed
//! all day. Two private containerds (hosts A and B) and a Distribution registry over HTTPS, all
//! on loopback. A memfill sandbox of SIZE MB (every page distinct and random, so nothing
//! compresses) rewrites CHANGE MB between suspends; it is suspended to the registry with
//! `--release` and resumed from it CYCLES times on A, its memory checked page by page at the
//! end. Beside it: the same cycle of a 16 MB sandbox, a local suspend and resume, the last
//! snapshot resumed on B (never ran it) whole and as it arrives, each until memfill has
//! checked every page (all memory read), a sandbox that allocated SIZE
//! MB and touched a tenth, and a Python process with its libraries loaded (the Debian image,
//! when `CHALK_DEBIAN_ROOTFS` is set). Writes CYCLES.md into the output directory.
//!
//!   chalk-bench-cycles [--quick] [--out DIR] [--size MB] [--change MB] [--cycles N]

use std::{
    path::PathBuf,
    process::ExitCode,
    time::{Duration, Instant},
};

use chalk_integration::{
    bench::{machine, reap_orphans, wait_arrived},
    containerd::program,
    memfill,
    registry::Secured,
    Containerd,
};
use serde_json::Value;

struct Opts {
    out: PathBuf,
    size: u64,
    change: u64,
    cycles: usize,
}

fn parse_opts() -> Result<Opts, String> {
    let mut o = Opts {
        out: PathBuf::from("bench"),
        size: 1024,
        change: 16,
        cycles: 20,
    };
    let mut args = std::env::args().skip(1);
    let number = |v: Option<String>, what: &str| -> Result<u64, String> {
        v.and_then(|s| s.parse().ok())
            .filter(|n| *n > 0)
            .ok_or(format!("{what} needs a positive number"))
    };
    while let Some(a) = args.next() {
        match a.as_str() {
            "--quick" => {
                o.size = 64;
                o.change = 4;
                o.cycles = 3;
            }
            "--out" => o.out = args.next().ok_or("--out needs a directory")?.into(),
            "--size" => o.size = number(args.next(), "--size")?,
            "--change" => o.change = number(args.next(), "--change")?,
            "--cycles" => o.cycles = number(args.next(), "--cycles")? as usize,
            other => {
                return Err(format!(
                    "unknown argument {other}; usage: chalk-bench-cycles [--quick] [--out DIR] \
                     [--size MB] [--change MB] [--cycles N]"
                ))
            }
        }
    }
    Ok(o)
}

fn main() -> ExitCode {
    match parse_opts().and_then(|o| run(&o)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("chalk-bench-cycles: {e}");
            ExitCode::FAILURE
        }
    }
}

/// chalkctl on `c` with JSON output: what it printed, and how long it took.
fn chalkctl(c: &Containerd, args: &[&str]) -> Result<(Value, Duration), String> {
    let mut cmd = c.chalkctl_command().map_err(|e| e.to_string())?;
    cmd.args(["--output", "json"]).args(args);
    if std::env::var_os("CHALK_BENCH_SAY").is_some() {
        cmd.env("CHALK_PROGRESS", "1");
    }
    let started = Instant::now();
    let out = cmd.output().map_err(|e| e.to_string())?;
    let took = started.elapsed();
    // CHALK_BENCH_SAY: chalkctl's timed steps, to see where a command's time goes.
    if std::env::var_os("CHALK_BENCH_SAY").is_some() {
        eprint!("{}", String::from_utf8_lossy(&out.stderr));
    }
    if !out.status.success() {
        return Err(format!(
            "chalkctl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let v = serde_json::from_slice(&out.stdout).map_err(|e| format!("chalkctl {args:?}: {e}"))?;
    Ok((v, took))
}

fn exec(c: &Containerd, id: &str, script: &str) -> Result<String, String> {
    let mut cmd = c.chalkctl_command().map_err(|e| e.to_string())?;
    cmd.args(["exec", "--id", id, "--", "sh", "-c", script]);
    let out = cmd.output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "exec in {id}: {script}: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// What `path` in `id` holds once written (removed first when `signal` is sent).
fn ask(c: &Containerd, id: &str, signal: Option<&str>, path: &str) -> Result<String, String> {
    let read = |script: &str| exec(c, id, script);
    let within = Duration::from_secs(600);
    match signal {
        Some(s) => memfill::ask(read, s, path, within),
        None => memfill::wait_written(read, path, within),
    }
}

fn memfill_on(c: &Containerd, id: &str, args: &[&str]) -> Result<(), String> {
    let run = memfill::run_args(id, args);
    chalkctl(c, &run)?;
    ask(c, id, None, "/tmp/ready").map(drop)
}

fn pinned(v: &Value) -> String {
    v["reference"].as_str().unwrap_or_default().to_string()
}

/// One cycle: the memory rewritten (but the first), suspended to `reference` and released,
/// resumed from it on the same host: (suspend, resume, bytes pushed).
fn cycle(
    c: &Containerd,
    id: &str,
    first: bool,
    reference: &str,
) -> Result<(f64, f64, u64, String), String> {
    if !first {
        ask(c, id, Some("USR2"), "/tmp/rewritten")?;
    }
    let (out, suspend) = chalkctl(c, &["suspend", "--id", id, "--to", reference, "--release"])?;
    let moved = out["pushed"]["transfer"]["bytes_moved"]
        .as_u64()
        .unwrap_or(0);
    let (_, resume) = chalkctl(c, &["resume", "--id", id, "--from", reference])?;
    Ok((ms(suspend), ms(resume), moved, pinned(&out["pushed"])))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1e6
}

struct Line {
    what: String,
    value: String,
    against: String,
    ratio: String,
    target: String,
}

fn line(what: &str, value: String, against: String, ratio: String, target: &str) -> Line {
    Line {
        what: what.into(),
        value,
        against,
        ratio,
        target: target.into(),
    }
}

fn run(o: &Opts) -> Result<(), String> {
    reap_orphans();
    let reg = Secured::start(&program("CHALK_REGISTRY", "registry"), None, &[])?;
    std::env::set_var("CHALK_HOSTS_DIR", &reg.hosts_dir);
    std::env::set_var("DOCKER_CONFIG", &reg.docker_config);
    let a = Containerd::start().map_err(|e| format!("host A: {e}"))?;
    let b = Containerd::start().map_err(|e| format!("host B: {e}"))?;
    for c in [&a, &b] {
        memfill::import(c).map_err(|e| e.to_string())?;
    }
    let at = |repo: &str| format!("{}/{repo}", reg.addr);
    let mut lines = Vec::new();

    // The same cycle of a small sandbox: what a suspend costs when memory is not the matter.
    let mut small = Vec::new();
    memfill_on(&a, "small", &["16"])?;
    for n in 1..=4 {
        let (s, _, _, _) = cycle(&a, "small", n == 1, &at(&format!("cycles/small:c{n}")))?;
        if n > 1 {
            small.push(s);
        }
    }
    chalkctl(&a, &["rm", "--force", "--id", "small"])?;

    let (size, change) = (o.size.to_string(), o.change.to_string());
    memfill_on(&a, "big", &[&size, &change])?;
    let before = reg.stored_bytes();
    let (mut suspends, mut resumes, mut moved) = (Vec::new(), Vec::new(), Vec::new());
    let mut last = String::new();
    for n in 1..=o.cycles {
        let (s, r, m, reference) = cycle(&a, "big", n == 1, &at(&format!("cycles/big:c{n}")))?;
        eprintln!(
            "cycle {n}: suspend --to {s:.0} ms ({:.1} MB sent), resume --from {r:.0} ms",
            mb(m)
        );
        suspends.push(s);
        resumes.push(r);
        moved.push(m);
        last = reference;
    }
    let grew = reg.stored_bytes() - before;
    let verified = ask(&a, "big", Some("USR1"), "/tmp/verified")?;
    if verified != format!("ok {}", o.cycles - 1) {
        return Err(format!("the memory after {} cycles: {verified}", o.cycles));
    }
    // A local suspend and resume (the snapshot stays on A).
    let mut local = Vec::new();
    for _ in 0..3 {
        chalkctl(&a, &["suspend", "--id", "big"])?;
        let (_, took) = chalkctl(&a, &["resume", "--id", "big"])?;
        local.push(ms(took));
    }
    // The last snapshot on B, which never ran the sandbox: whole, then as it arrives.
    // "All read": until memfill has checked every page (runsc has loaded all of it).
    let started = Instant::now();
    let (resumed, _) = chalkctl(&b, &["resume", "--id", "big", "--from", &last, "--whole"])?;
    let verified_whole = ask(&b, "big", Some("USR1"), "/tmp/verified")?;
    let whole = ms(started.elapsed());
    if !verified_whole.starts_with("ok ") {
        return Err(format!("the memory resumed whole on B: {verified_whole}"));
    }
    chalkctl(&b, &["rm", "--force", "--id", "big"])?;
    // Nothing of it left on B: the next resume fetches it all again.
    let id = resumed["snapshot"].as_str().unwrap_or_default();
    chalkctl(&b, &["snapshot", "delete", "--snapshot-id", id])?;
    chalkctl(&b, &["snapshot", "gc"])?;
    let started = Instant::now();
    let (_, running) = chalkctl(&b, &["resume", "--id", "big", "--from", &last])?;
    let verified_b = ask(&b, "big", Some("USR1"), "/tmp/verified")?;
    let loaded = ms(started.elapsed());
    if !verified_b.starts_with("ok ") {
        return Err(format!("the memory resumed on B: {verified_b}"));
    }
    wait_arrived(&b, &last, Duration::from_secs(900))?;
    chalkctl(&b, &["rm", "--force", "--id", "big"])?;
    chalkctl(&a, &["rm", "--force", "--id", "big"])?;

    let later = &suspends[1..];
    let later_moved: Vec<f64> = moved[1..].iter().map(|m| mb(*m)).collect();
    let sum_changes =
        o.size as f64 * 1.048_576 + (o.cycles - 1) as f64 * o.change as f64 * 1.048_576;
    lines.push(line(
        "bytes pushed by the 2nd and later `suspend --to`",
        format!("{:.1} MB", median(&later_moved)),
        format!("{} MB changed", o.change),
        format!(
            "{:.2}×",
            median(&later_moved) / (o.change as f64 * 1.048_576)
        ),
        "≤ 40 MB",
    ));
    lines.push(line(
        "`suspend --to --release`, 2nd and later",
        format!("{:.0} ms", median(later)),
        format!("{:.0} ms (16 MB sandbox)", median(&small)),
        format!("{:.2}×", median(later) / median(&small)),
        "≤ 1.5×",
    ));
    lines.push(line(
        &format!("registry growth over {} cycles", o.cycles),
        format!("{:.0} MB", mb(grew)),
        format!("{sum_changes:.0} MB (first + changes)"),
        format!("{:.2}×", mb(grew) / sum_changes),
        "≤ 1.2×",
    ));
    lines.push(line(
        "`resume --from` on the same host, median of the cycles",
        format!("{:.0} ms", median(&resumes)),
        format!("{:.0} ms (local resume)", median(&local)),
        format!("{:.2}×", median(&resumes) / median(&local)),
        "",
    ));
    lines.push(line(
        &format!("resume elsewhere of cycle {}: time to running", o.cycles),
        format!("{:.0} ms", ms(running)),
        format!("{:.0} ms (local resume)", median(&local)),
        format!("{:.2}×", ms(running) / median(&local)),
        "≤ 1.5×",
    ));
    lines.push(line(
        &format!(
            "resume elsewhere of cycle {}: all memory read (a page check)",
            o.cycles
        ),
        format!("{loaded:.0} ms"),
        format!("{whole:.0} ms (whole pull, restore, check)"),
        format!("{:.2}×", loaded / whole),
        "≤ 1.2×",
    ));

    // Allocated SIZE MB, touched a tenth.
    let touched = (o.size / 10).max(1).to_string();
    memfill_on(&a, "sparse", &[&size, "1", &touched])?;
    let before = reg.stored_bytes();
    let (out, _) = chalkctl(
        &a,
        &[
            "suspend",
            "--id",
            "sparse",
            "--to",
            &at("cycles/sparse:1"),
            "--release",
        ],
    )?;
    let sparse_moved = out["pushed"]["transfer"]["bytes_moved"]
        .as_u64()
        .unwrap_or(0);
    let sparse_grew = reg.stored_bytes() - before;
    chalkctl(&a, &["rm", "--force", "--id", "sparse"])?;
    lines.push(line(
        &format!("a sandbox that allocated {size} MB and touched {touched} MB: pushed"),
        format!("{:.0} MB", mb(sparse_moved)),
        format!("{touched} MB touched"),
        format!(
            "{:.2}×",
            mb(sparse_moved) / (o.size as f64 / 10.0 * 1.048_576)
        ),
        "≤ 1.2× (120 MB of 100)",
    ));
    lines.push(line(
        "the same: registry growth",
        format!("{:.0} MB", mb(sparse_grew)),
        String::new(),
        String::new(),
        "",
    ));
    if let Some(l) = python(&a, &at("cycles/python:1"))? {
        lines.push(l);
    }
    write_report(o, &lines)
}

/// A Python process with its standard libraries loaded (the Debian image): its memory file
/// against what its push stored, when the image is built.
fn python(a: &Containerd, reference: &str) -> Result<Option<Line>, String> {
    if std::env::var_os("CHALK_DEBIAN_ROOTFS").is_none_or(|v| v.is_empty()) {
        return Ok(None);
    }
    a.import_debian().map_err(|e| e.to_string())?;
    let script = "import json, sqlite3, email, http.server, xml.dom.minidom, unittest, \
                  asyncio, decimal, ssl; open('/tmp/ready','w').write('ready'); \
                  import time; time.sleep(1e9)";
    chalkctl(
        a,
        &[
            "run",
            "--net",
            "none",
            chalk_integration::debian::DEBIAN_IMAGE,
            "py",
            "--",
            "python3",
            "-c",
            script,
        ],
    )?;
    ask(a, "py", None, "/tmp/ready")?;
    let (snap, _) = chalkctl(a, &["snapshot", "create", "--id", "py"])?;
    let id = snap["id"].as_str().unwrap_or_default().to_string();
    let (pushed, _) = chalkctl(a, &["snapshot", "push", "--snapshot-id", &id, reference])?;
    let (_, m) = stored(a, &id)?;
    let memory = m["layers"]
        .as_array()
        .and_then(|l| {
            l.iter()
                .find(|l| l["annotations"]["org.opencontainers.image.title"] == "pages.img")
        })
        .and_then(|l| l["size"].as_u64())
        .unwrap_or(0);
    let sent = pushed["transfer"]["bytes_moved"].as_u64().unwrap_or(0);
    chalkctl(a, &["rm", "--force", "--id", "py"])?;
    Ok(Some(line(
        "a Python process (its libraries loaded): its memory file against all it pushed",
        format!("{:.1} MB pushed", mb(sent)),
        format!("{:.1} MB pages.img", mb(memory)),
        format!("{:.1}× smaller", memory as f64 / sent.max(1) as f64),
        "report (E2B: 4-5×)",
    )))
}

/// Snapshot `id`'s OCI manifest in `c`'s store.
fn stored(c: &Containerd, id: &str) -> Result<(String, Value), String> {
    let hex = id.trim_start_matches("sha256:");
    let bytes = std::fs::read(c.snapshot_store().join("blobs/sha256").join(hex))
        .map_err(|e| e.to_string())?;
    Ok((
        id.to_string(),
        serde_json::from_slice(&bytes).map_err(|e| e.to_string())?,
    ))
}

fn write_report(o: &Opts, lines: &[Line]) -> Result<(), String> {
    use std::fmt::Write;
    let runsc = program("CHALK_RUNSC", "runsc");
    let mut md = String::new();
    let _ = writeln!(md, "# chalk-shim benchmarks: suspend cycles\n");
    let _ = writeln!(
        md,
        "Written by `scripts/bench --cycles` (one run). A memfill sandbox of {} MB (every page \
         distinct and random: nothing compresses) rewrites {} MB between suspends; `suspend --to \
         --release` and `resume --from` on host A, {} times, its memory checked page by page \
         at the end. Pushes send memory as pieces (`[snapshot] push_pieces`, the default): only \
         the pages the registry lacks, zstd-compressed. Ratios are against the column beside.\n",
        o.size, o.change, o.cycles
    );
    let _ = writeln!(
        md,
        "- date: {}",
        chalk_runtime::snapshot::manifest::rfc3339_now()
    );
    let _ = writeln!(md, "- machine: {}", machine());
    let _ = writeln!(md, "- runsc: {}\n", runsc.display());
    let _ = writeln!(
        md,
        "| | this | against | ratio | target |\n|---|---|---|---|---|"
    );
    for l in lines {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} |",
            l.what, l.value, l.against, l.ratio, l.target
        );
    }
    std::fs::create_dir_all(&o.out).map_err(|e| e.to_string())?;
    let path = o.out.join("CYCLES.md");
    std::fs::write(&path, md).map_err(|e| e.to_string())?;
    eprintln!("wrote {}", path.display());
    Ok(())
}
