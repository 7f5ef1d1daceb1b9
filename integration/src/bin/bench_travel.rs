//! `scripts/bench --travel`: snapshots that travel, measured. Two private containerds (hosts A
//! and B) and a Distribution registry over HTTPS with credentials, all on loopback. Per run: a
//! sandbox holding SIZE MB of random data in memory on A; a snapshot pushed (the first push
//! to an empty registry also sends the base image); a second snapshot of it pushed (what the
//! registry already has is not sent); `suspend --to --release`; on B, a full pull of the first
//! snapshot and `resume --from` of the suspended one (B fetches what it lacks, the base image
//! only once). Writes TRAVEL.md into the output directory.
//!
//!   chalk-bench-travel [--quick] [--out DIR] [--size MB]

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
    },
    containerd::program,
    procs::first_line,
    registry::{Secured, PASSWORD, USER},
    Containerd,
};
use serde_json::Value;

struct Opts {
    quick: bool,
    out: PathBuf,
    reps: usize,
    size: u64,
}

fn parse_opts() -> Result<Opts, String> {
    let mut o = Opts {
        quick: false,
        out: PathBuf::from("bench"),
        reps: 3,
        size: 1024,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--quick" => {
                o.quick = true;
                o.reps = 1;
                o.size = 16;
            }
            "--out" => o.out = args.next().ok_or("--out needs a directory")?.into(),
            "--size" => {
                o.size = args
                    .next()
                    .and_then(|s| s.parse().ok())
                    .ok_or("--size needs megabytes")?
            }
            other => {
                return Err(format!(
                    "unknown argument {other}; usage: chalk-bench-travel [--quick] [--out DIR] \
                     [--size MB]"
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
    curl_put: Vec<f64>,
    curl_get: Vec<f64>,
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
    let (on_a, on_b) = (ViaCtr::chalk(&a), ViaCtr::chalk(&b));
    let mut s = Samples::default();
    for i in 0..o.reps {
        println!("== run {i}: {} MB", o.size);
        let id = format!("tv-{i}");
        let repo = format!("{}/bench/{id}", reg.addr);
        on_a.run_detached(&id, &filled_counter(o.size))?;
        on_a.wait_file(&id, "/tmp/ready", Duration::from_secs(300))?;
        let (_, first, size) = on_a.snapshot(&id)?;
        s.snapshot_size.push(mb(size));
        let first_ref = format!("{repo}:first");
        let (took, out) =
            timed(|| on_a.chalkctl(&["snapshot", "push", "--snapshot-id", &first, &first_ref]))?;
        s.push_first.push(ms(took));
        s.push_first_rate
            .push(rate(bytes_moved(&out["transfer"]), took));
        let (_, second, _) = on_a.snapshot(&id)?;
        let (took, out) = timed(|| {
            on_a.chalkctl(&[
                "snapshot",
                "push",
                "--snapshot-id",
                &second,
                &format!("{repo}:second"),
            ])
        })?;
        s.push_second.push(ms(took));
        s.push_second_sent.push(mb(bytes_moved(&out["transfer"])));
        // The same bytes by curl, into a repository of their own.
        let (digest, file) = largest_file(&a, &second)?;
        let curl = Curl { reg: &reg };
        let raw = format!("bench/raw-{i}");
        s.curl_put.push(ms(curl.put(&raw, &file, &digest)?));
        s.curl_get
            .push(ms(curl.get(&raw, &digest, &a.dir().join("curl-get"))?));
        let susp_ref = format!("{repo}:suspended");
        let (took, _) =
            timed(|| on_a.chalkctl(&["suspend", "--id", &id, "--to", &susp_ref, "--release"]))?;
        s.suspend_to.push(ms(took));

        let (took, out) = timed(|| on_b.chalkctl(&["snapshot", "pull", &first_ref]))?;
        s.pull_full.push(ms(took));
        s.pull_full_rate
            .push(rate(bytes_moved(&out["transfer"]), took));
        let (took, out) = timed(|| on_b.chalkctl(&["resume", "--id", &id, "--from", &susp_ref]))?;
        s.resume_from.push(ms(took));
        s.resume_fetched.push(mb(bytes_moved(&out["pulled"])));

        on_b.remove(&id);
        on_a.remove(&id);
        on_a.delete_snapshot(&first);
        on_a.delete_snapshot(&second);
        let listed = on_b.chalkctl(&["snapshot", "list", "--limit", "100"])?;
        for item in listed["items"].as_array().into_iter().flatten() {
            if let Some(d) = item["id"].as_str() {
                on_b.delete_snapshot(d);
            }
        }
    }
    write_report(o, &s)
}

fn write_report(o: &Opts, s: &Samples) -> Result<(), String> {
    let rows = |r: Vec<(&str, Unit, &Vec<f64>)>| {
        r.into_iter()
            .map(|(n, u, v)| (n.to_string(), u, v.clone()))
            .collect()
    };
    let push = Plain {
        title: format!("Push, {} MB sandbox (host A)", o.size),
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
    };
    let pull = Plain {
        title: format!("Pull and resume, {} MB sandbox (host B)", o.size),
        about: "Host B never ran the sandbox: the first run's pull also fetches and unpacks \
                the base image. `resume --from` pulls the suspended snapshot (what B lacks) and \
                restores it under the same id; it returns once the sandbox runs."
            .into(),
        rows: rows(vec![
            ("full pull of a snapshot", Unit::Millis, &s.pull_full),
            (
                "full pull throughput",
                Unit::GigabytesPerSecond,
                &s.pull_full_rate,
            ),
            (
                "`resume --from`: time to running",
                Unit::Millis,
                &s.resume_from,
            ),
            (
                "`resume --from`: bytes fetched",
                Unit::Megabytes,
                &s.resume_fetched,
            ),
            (
                "curl: GET of the largest file to disk (the reference)",
                Unit::Millis,
                &s.curl_get,
            ),
        ]),
    };
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
            format!("{} runs", o.reps)
        },
    };
    let notes = vec![
        "Lazy pull is not done: runsc's `restore --background` reads pages.img with preadv at \
         any offset from the first fault, so a pages.img still arriving would need a FUSE \
         file or userfaultfd in runsc; gVisor streams from Google Cloud Storage only \
         (gcs_opts.json). A pull is whole before the restore starts."
            .into(),
        "A file is one blob: the second push re-sends every file that changed by one byte \
         (pages.img changes whenever any page does)."
            .into(),
    ];
    let text = report::render(&meta, &[], &[push, pull], None, &notes).replacen(
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
