//! `scripts/bench --travel`: snapshots that travel, measured. Two private containerds (hosts A
//! and B) and a Distribution registry over HTTPS with credentials, all on loopback. Per run: a
//! sandbox holding SIZE MB of random data in memory on A; a snapshot pushed (the first push
//! to an empty registry also sends the base image); a second snapshot of it pushed (what the
//! registry already has is not sent); `suspend --to --release`; on B, a full pull of the first
//! snapshot and `resume --from` of the suspended one: first with `--whole` (the pull, then the
//! restore), then, the sandbox and its snapshot removed from B, as it arrives (a lazy pull),
//! beside a local suspend and resume on A. Writes TRAVEL.md into the output directory, a
//! section per size.
//!
//!   chalk-bench-travel [--quick] [--out DIR] [--sizes MB[,MB…]] [--reps N] [--lean]
//!
//! Then the same moves encrypted and signed: the first snapshot pushed with `--encrypt-to`
//! and `--sign`, its signature checked by B's `[trust]` policy, pulled by B (verified and
//! decrypted), and the sandbox suspended from B encrypted and signed and resumed on A.
//!
//! `--lean` leaves out the second push and curl's transfers (a 4 GB run's registry holds
//! twice less).

use std::{
    path::{Path, PathBuf},
    process::{Command, ExitCode},
    time::Duration,
};

use chalk_integration::{
    bench::{
        filled_counter, machine, reap_orphans,
        report::{self, Meta, Plain},
        stats::Unit,
        timed,
        via_ctr::ViaCtr,
        wait_arrived,
    },
    containerd::program,
    procs::first_line,
    registry::{Secured, PASSWORD, USER},
    sealing, Containerd,
};
use serde_json::Value;

struct Opts {
    quick: bool,
    out: PathBuf,
    reps: usize,
    sizes: Vec<u64>,
    lean: bool,
}

fn parse_opts() -> Result<Opts, String> {
    let mut o = Opts {
        quick: false,
        out: PathBuf::from("bench"),
        reps: 3,
        sizes: vec![1024],
        lean: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--quick" => {
                o.quick = true;
                o.reps = 1;
                o.sizes = vec![16];
            }
            "--lean" => o.lean = true,
            "--out" => o.out = args.next().ok_or("--out needs a directory")?.into(),
            "--size" | "--sizes" => {
                o.sizes = args
                    .next()
                    .and_then(|s| s.split(',').map(|m| m.trim().parse().ok()).collect())
                    .ok_or("--sizes needs megabytes, comma-separated")?
            }
            "--reps" => {
                o.reps = args
                    .next()
                    .and_then(|s| s.parse().ok())
                    .filter(|n| *n > 0)
                    .ok_or("--reps needs a number of runs")?
            }
            other => {
                return Err(format!(
                    "unknown argument {other}; usage: chalk-bench-travel [--quick] [--out DIR] \
                     [--sizes MB[,MB…]] [--reps N] [--lean]"
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
            eprintln!("chalk-bench-travel: {e}");
            ExitCode::FAILURE
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1e6
}

/// `bytes` over `took`, in GB/s.
fn rate(bytes: u64, took: Duration) -> f64 {
    bytes as f64 / 1e9 / took.as_secs_f64().max(1e-9)
}

fn bytes_moved(v: &Value) -> u64 {
    v["bytes_moved"].as_u64().unwrap_or(0)
}

/// The measurements, one sample per run each.
#[derive(Default)]
struct Samples {
    snapshot_size: Vec<f64>,
    push_first: Vec<f64>,
    push_first_rate: Vec<f64>,
    push_second: Vec<f64>,
    push_second_sent: Vec<f64>,
    suspend_to: Vec<f64>,
    pull_full: Vec<f64>,
    pull_full_rate: Vec<f64>,
    resume_from: Vec<f64>,
    resume_fetched: Vec<f64>,
    resume_whole_loaded: Vec<f64>,
    resume_lazy: Vec<f64>,
    resume_lazy_loaded: Vec<f64>,
    resume_lazy_arriving: Vec<f64>,
    resume_local: Vec<f64>,
    resume_local_loaded: Vec<f64>,
    curl_put: Vec<f64>,
    curl_get: Vec<f64>,
    push_sealed: Vec<f64>,
    verify: Vec<f64>,
    pull_sealed: Vec<f64>,
    suspend_sealed: Vec<f64>,
    resume_sealed: Vec<f64>,
    resume_sealed_loaded: Vec<f64>,
}

/// The keys both hosts share: an age identity (in `[encryption]`) and a signing key their
/// `[trust]` policy names for the registry's `sealed/`.
struct Sealing {
    _dir: tempfile::TempDir,
    recipient: String,
    key: String,
}

impl Sealing {
    fn set_up(reg: &Secured, hosts: &[&Containerd]) -> Result<Sealing, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let identities = dir.path().join("hosts.age");
        let key = dir.path().join("signer.key");
        let recipient = sealing::keygen(&identities, false)?;
        let public = PathBuf::from(sealing::keygen(&key, true)?);
        let scope = format!("{}/sealed", reg.addr);
        for c in hosts {
            sealing::add_options(
                &c.options_path(),
                &sealing::options(Some(&identities), &scope, &public),
            )?;
        }
        Ok(Sealing {
            recipient,
            key: key.display().to_string(),
            _dir: dir,
        })
    }
}

/// From the start of a command that reached running in `took`, how long until the restore
/// had all its memory: the shim's `loaded_ms` counts from its own restore's start, which
/// `running_ms` before running began.
fn loaded_after(c: &ViaCtr, id: &str, nth: usize, took: Duration) -> Option<f64> {
    let t = c.timing("restore", id, nth)?;
    Some(ms(took) - t.get("running_ms")? + t.get("loaded_ms")?)
}

/// curl against the same registry, moving the snapshot's largest file as one blob: the
/// reference for what the registry and the loopback allow.
struct Curl<'r> {
    reg: &'r Secured,
}

impl Curl<'_> {
    fn base(&self) -> Command {
        let mut c = Command::new("curl");
        c.args(["-sf", "--cacert"])
            .arg(self.reg.dir.join("ca.crt"))
            .args(["-u", &format!("{USER}:{PASSWORD}")]);
        c
    }

    fn run(mut c: Command, what: &str) -> Result<String, String> {
        let out = c.output().map_err(|e| format!("curl: {e}"))?;
        if !out.status.success() {
            return Err(format!("curl {what}: {:?}", out.status));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// A monolithic upload (POST, then PUT of the file) of `file` as blob `digest`.
    fn put(&self, repo: &str, file: &Path, digest: &str) -> Result<Duration, String> {
        let mut post = self.base();
        post.args(["-X", "POST", "-D", "-", "-o", "/dev/null"])
            .arg(format!(
                "https://{}/v2/{repo}/blobs/uploads/",
                self.reg.addr
            ));
        let headers = Self::run(post, "POST")?;
        let location = headers
            .lines()
            .find_map(|l| {
                l.strip_prefix("Location: ")
                    .or(l.strip_prefix("location: "))
            })
            .map(|l| l.trim().to_string())
            .ok_or("no upload location")?;
        let url = if location.starts_with("http") {
            location
        } else {
            format!("https://{}{location}", self.reg.addr)
        };
        let sep = if url.contains('?') { '&' } else { '?' };
        let mut put = self.base();
        put.arg("-T")
            .arg(file)
            .args([
                "-H",
                "Content-Type: application/octet-stream",
                "-o",
                "/dev/null",
            ])
            .arg(format!("{url}{sep}digest={digest}"));
        Ok(timed(|| Self::run(put, "PUT"))?.0)
    }

    fn get(&self, repo: &str, digest: &str, to: &Path) -> Result<Duration, String> {
        let mut get = self.base();
        get.arg("-o").arg(to).arg(format!(
            "https://{}/v2/{repo}/blobs/{digest}",
            self.reg.addr
        ));
        let took = timed(|| Self::run(get, "GET"))?.0;
        let _ = std::fs::remove_file(to);
        Ok(took)
    }
}

/// The digest and file of the largest file of stored snapshot `id` on host `c`.
fn largest_file(c: &Containerd, id: &str) -> Result<(String, PathBuf), String> {
    let blobs = c.snapshot_store().join("blobs/sha256");
    let path = blobs.join(id.trim_start_matches("sha256:"));
    let m: Value = serde_json::from_slice(&std::fs::read(&path).map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?;
    let layer = m["layers"]
        .as_array()
        .into_iter()
        .flatten()
        .max_by_key(|l| l["size"].as_u64().unwrap_or(0))
        .ok_or("the snapshot has no layers")?;
    let digest = layer["digest"].as_str().unwrap_or_default().to_string();
    let file = blobs.join(digest.trim_start_matches("sha256:"));
    Ok((digest, file))
}

fn run(o: &Opts) -> Result<(), String> {
    reap_orphans();
    let registry_bin = program("CHALK_REGISTRY", "registry");
    let reg = Secured::start(&registry_bin, None, &[])?;
    // Every chalkctl this process starts reaches the registry as a user's would.
    std::env::set_var("CHALK_HOSTS_DIR", &reg.hosts_dir);
    std::env::set_var("DOCKER_CONFIG", &reg.docker_config);
    let a = Containerd::start().map_err(|e| format!("host A: {e}"))?;
    a.import_busybox()
        .map_err(|e| format!("import busybox: {e}"))?;
    let b = Containerd::start().map_err(|e| format!("host B: {e}"))?;
    let sealing = Sealing::set_up(&reg, &[&a, &b])?;
    let mut sections = Vec::new();
    for &size in &o.sizes {
        let s = run_size(o, size, &reg, &a, &b, &sealing)?;
        sections.push((size, s));
    }
    write_report(o, &sections)
}

/// The runs at one size.
fn run_size(
    o: &Opts,
    size: u64,
    reg: &Secured,
    a: &Containerd,
    b: &Containerd,
    sealing: &Sealing,
) -> Result<Samples, String> {
    let (on_a, on_b) = (ViaCtr::chalk(a), ViaCtr::chalk(b));
    let mut s = Samples::default();
    for i in 0..o.reps {
        println!("== run {i}: {size} MB");
        let id = format!("tv-{size}-{i}");
        let repo = format!("{}/bench/{id}", reg.addr);
        on_a.run_detached(&id, &filled_counter(size))?;
        on_a.wait_file(&id, "/tmp/ready", Duration::from_secs(600))?;
        let (_, first, snap_size) = on_a.snapshot(&id)?;
        s.snapshot_size.push(mb(snap_size));
        let first_ref = format!("{repo}:first");
        let (took, out) =
            timed(|| on_a.chalkctl(&["snapshot", "push", "--snapshot-id", &first, &first_ref]))?;
        s.push_first.push(ms(took));
        s.push_first_rate
            .push(rate(bytes_moved(&out["transfer"]), took));
        let mut second = None;
        if !o.lean {
            let (_, snap, _) = on_a.snapshot(&id)?;
            let (took, out) = timed(|| {
                on_a.chalkctl(&[
                    "snapshot",
                    "push",
                    "--snapshot-id",
                    &snap,
                    &format!("{repo}:second"),
                ])
            })?;
            s.push_second.push(ms(took));
            s.push_second_sent.push(mb(bytes_moved(&out["transfer"])));
            // The same bytes by curl, into a repository of their own.
            let (digest, file) = largest_file(a, &snap)?;
            let curl = Curl { reg };
            let raw = format!("bench/raw-{size}-{i}");
            s.curl_put.push(ms(curl.put(&raw, &file, &digest)?));
            s.curl_get
                .push(ms(curl.get(&raw, &digest, &a.dir().join("curl-get"))?));
            second = Some(snap);
        }
        // The reference: a suspend and resume on the host that keeps the snapshot.
        let (_, local) = on_a.suspend(&id)?;
        let took = on_a.resume(&id)?;
        s.resume_local.push(ms(took));
        s.resume_local_loaded
            .extend(loaded_after(&on_a, &id, 0, took));
        on_a.delete_snapshot(&local);
        let susp_ref = format!("{repo}:suspended");
        let (took, _) =
            timed(|| on_a.chalkctl(&["suspend", "--id", &id, "--to", &susp_ref, "--release"]))?;
        s.suspend_to.push(ms(took));

        let (took, out) = timed(|| on_b.chalkctl(&["snapshot", "pull", &first_ref]))?;
        s.pull_full.push(ms(took));
        s.pull_full_rate
            .push(rate(bytes_moved(&out["transfer"]), took));
        on_b.delete_snapshot(&first);
        // The pull, then the restore.
        let (took, out) =
            timed(|| on_b.chalkctl(&["resume", "--id", &id, "--from", &susp_ref, "--whole"]))?;
        s.resume_from.push(ms(took));
        s.resume_fetched.push(mb(bytes_moved(&out["pulled"])));
        s.resume_whole_loaded
            .extend(loaded_after(&on_b, &id, 0, took));
        let suspended = out["snapshot"].as_str().unwrap_or_default().to_string();
        on_b.remove(&id);
        on_b.delete_snapshot(&suspended);
        // The same, as the memory arrives.
        let (took, out) = timed(|| on_b.chalkctl(&["resume", "--id", &id, "--from", &susp_ref]))?;
        s.resume_lazy.push(ms(took));
        s.resume_lazy_arriving
            .push(mb(out["pulled"]["bytes_arriving"].as_u64().unwrap_or(0)));
        s.resume_lazy_loaded
            .extend(loaded_after(&on_b, &id, 1, took));
        wait_arrived(b, &suspended, Duration::from_secs(600))?;

        // Encrypted and signed: pushed from A, checked and pulled by B; suspended from B,
        // resumed on A (which first forgets the sandbox).
        let sealed = format!("{}/sealed/{id}", reg.addr);
        let seal = ["--encrypt-to", &sealing.recipient, "--sign", &sealing.key];
        let sealed_first = format!("{sealed}:first");
        let (took, _) = timed(|| {
            let mut args = vec!["snapshot", "push", "--snapshot-id", &first, &sealed_first];
            args.extend(seal);
            on_a.chalkctl(&args)
        })?;
        s.push_sealed.push(ms(took));
        let (took, _) = timed(|| on_b.chalkctl(&["snapshot", "verify", &sealed_first]))?;
        s.verify.push(ms(took));
        let (took, _) = timed(|| on_b.chalkctl(&["snapshot", "pull", &sealed_first]))?;
        s.pull_sealed.push(ms(took));
        on_b.delete_snapshot(&first);
        let sealed_susp = format!("{sealed}:suspended");
        let (took, _) = timed(|| {
            let mut args = vec!["suspend", "--id", &id, "--to", &sealed_susp, "--release"];
            args.extend(seal);
            on_b.chalkctl(&args)
        })?;
        s.suspend_sealed.push(ms(took));
        on_a.remove(&id);
        let (took, out) =
            timed(|| on_a.chalkctl(&["resume", "--id", &id, "--from", &sealed_susp]))?;
        s.resume_sealed.push(ms(took));
        s.resume_sealed_loaded
            .extend(loaded_after(&on_a, &id, 0, took));
        if let Some(d) = out["snapshot"].as_str() {
            on_a.remove(&id);
            on_a.delete_snapshot(d);
        }

        on_b.remove(&id);
        on_a.remove(&id);
        on_a.delete_snapshot(&first);
        if let Some(second) = second {
            on_a.delete_snapshot(&second);
        }
        let listed = on_b.chalkctl(&["snapshot", "list", "--limit", "100"])?;
        for item in listed["items"].as_array().into_iter().flatten() {
            if let Some(d) = item["id"].as_str() {
                on_b.delete_snapshot(d);
            }
        }
        // This run's memory files go from the registry too (each run's are its own): a
        // 4 GB run would fill the disk otherwise.
        drop_big_files(&reg.blobs());
    }
    Ok(s)
}

/// Removes files over 64 MB below `dir`.
fn drop_big_files(dir: &Path) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        match e.metadata() {
            Ok(m) if m.is_dir() => drop_big_files(&e.path()),
            Ok(m) if m.len() > 64 << 20 => {
                let _ = std::fs::remove_file(e.path());
            }
            _ => {}
        }
    }
}

fn write_report(o: &Opts, sections: &[(u64, Samples)]) -> Result<(), String> {
    let rows = |r: Vec<(&str, Unit, &Vec<f64>)>| {
        r.into_iter()
            .filter(|(_, _, v)| !v.is_empty())
            .map(|(n, u, v)| (n.to_string(), u, v.clone()))
            .collect()
    };
    let mut tables = Vec::new();
    for (size, s) in sections {
        tables.push(Plain {
            title: format!("Push, {size} MB sandbox (host A)"),
            about: "`chalkctl snapshot push` over HTTPS with credentials to a Distribution \
                    registry on loopback (filesystem storage); the first push also sends the \
                    base image. The second snapshot is taken a moment after the first."
                .into(),
            rows: rows(vec![
                ("snapshot size", Unit::Megabytes, &s.snapshot_size),
                (
                    "first push (to an empty registry)",
                    Unit::Millis,
                    &s.push_first,
                ),
                (
                    "first push throughput",
                    Unit::GigabytesPerSecond,
                    &s.push_first_rate,
                ),
                ("second push", Unit::Millis, &s.push_second),
                (
                    "second push: bytes sent",
                    Unit::Megabytes,
                    &s.push_second_sent,
                ),
                (
                    "`suspend --to --release` (checkpoint, push, release)",
                    Unit::Millis,
                    &s.suspend_to,
                ),
                (
                    "curl: PUT of the largest file (the reference)",
                    Unit::Millis,
                    &s.curl_put,
                ),
            ]),
        });
        tables.push(Plain {
            title: format!("Pull and resume, {size} MB sandbox (host B)"),
            about: "Host B never ran the sandbox: the first run's pull also fetches and \
                    unpacks the base image. `resume --from` pulls the suspended snapshot (what \
                    B lacks) and restores it under the same id; it returns once the sandbox \
                    runs. With `--whole` the pull ends before the restore starts; without, \
                    pages.img arrives while the sandbox runs (served through FUSE, each 1 MiB \
                    piece checked). Between the two, B's sandbox and snapshot are removed. \
                    \"Loaded\": from the command's start until runsc has read all of pages.img \
                    (the shim's `wait --restore`). The local resume is a suspend and resume on \
                    host A, which keeps the snapshot."
                .into(),
            rows: rows(vec![
                ("full pull of a snapshot", Unit::Millis, &s.pull_full),
                (
                    "full pull throughput",
                    Unit::GigabytesPerSecond,
                    &s.pull_full_rate,
                ),
                (
                    "`resume --from --whole` (pull, then restore): time to running",
                    Unit::Millis,
                    &s.resume_from,
                ),
                (
                    "`resume --from --whole`: loaded",
                    Unit::Millis,
                    &s.resume_whole_loaded,
                ),
                (
                    "`resume --from --whole`: bytes fetched",
                    Unit::Megabytes,
                    &s.resume_fetched,
                ),
                (
                    "`resume --from` (as it arrives): time to running",
                    Unit::Millis,
                    &s.resume_lazy,
                ),
                (
                    "`resume --from` (as it arrives): loaded",
                    Unit::Millis,
                    &s.resume_lazy_loaded,
                ),
                (
                    "`resume --from` (as it arrives): bytes left to arrive",
                    Unit::Megabytes,
                    &s.resume_lazy_arriving,
                ),
                (
                    "local resume (host A): time to running",
                    Unit::Millis,
                    &s.resume_local,
                ),
                (
                    "local resume (host A): loaded",
                    Unit::Millis,
                    &s.resume_local_loaded,
                ),
                (
                    "curl: GET of the largest file to disk (the reference)",
                    Unit::Millis,
                    &s.curl_get,
                ),
            ]),
        });
    }
    for (size, s) in sections {
        tables.push(Plain {
            title: format!("Encrypted and signed, {size} MB sandbox"),
            about: "The same moves with `--encrypt-to` (age, X25519: every blob encrypted on the \
                    host before it leaves) and `--sign` (a cosign signature of the pushed \
                    manifest): host A pushes the first snapshot to a repository of its own; \
                    host B checks its signature under its `[trust]` policy (`snapshot verify`), \
                    then pulls it (policy, fetch, decrypt, digests); B suspends the sandbox \
                    encrypted and signed, and A, which forgot it, resumes it (an encrypted \
                    snapshot's memory is decrypted whole before the restore: no lazy pull). \
                    Compare with the plain rows above."
                .into(),
            rows: rows(vec![
                ("encrypted, signed push (A)", Unit::Millis, &s.push_sealed),
                (
                    "`snapshot verify` by the policy (B)",
                    Unit::Millis,
                    &s.verify,
                ),
                (
                    "full pull, verified and decrypted (B)",
                    Unit::Millis,
                    &s.pull_sealed,
                ),
                (
                    "`suspend --to --release`, encrypted and signed (B)",
                    Unit::Millis,
                    &s.suspend_sealed,
                ),
                (
                    "`resume --from` an encrypted snapshot (A): time to running",
                    Unit::Millis,
                    &s.resume_sealed,
                ),
                (
                    "`resume --from` an encrypted snapshot (A): loaded",
                    Unit::Millis,
                    &s.resume_sealed_loaded,
                ),
            ]),
        });
    }
    let meta = Meta {
        date: chalk_runtime::snapshot::manifest::rfc3339_now(),
        machine: machine(),
        containerd: first_line(&program("CHALK_CONTAINERD", "containerd"), &["--version"]),
        runsc: format!(
            "{} at {}",
            first_line(&program("CHALK_RUNSC", "runsc"), &["--version"]),
            program("CHALK_RUNSC", "runsc").display()
        ),
        mode: if o.quick {
            "--quick: smoke mode".into()
        } else {
            format!("{} runs{}", o.reps, if o.lean { ", --lean" } else { "" })
        },
    };
    let notes = vec![
        "A runsc without `restore --background` (Debian's 2022 build) cannot start before \
         pages.img is all there: its pulls fetch everything, with or without `--whole`."
            .into(),
        "Memory travels as pieces (`[snapshot] push_pieces`, the default): a push sends the \
         pages the registry lacks, zstd-compressed in a pack, and a pull fetches the pieces by \
         range. The memfill data is random, so it does not compress; the second push sends \
         what changed between the two snapshots. The state files are still one blob each."
            .into(),
    ];
    let text = report::render(&meta, &[], &tables, None, &notes).replacen(
        "# chalk-shim benchmarks",
        "# chalk-shim benchmarks: snapshots that travel",
        1,
    );
    std::fs::create_dir_all(&o.out).map_err(|e| format!("{}: {e}", o.out.display()))?;
    let path = o.out.join("TRAVEL.md");
    std::fs::write(&path, &text).map_err(|e| format!("{}: {e}", path.display()))?;
    println!("{text}\nwritten: {}", path.display());
    Ok(())
}
