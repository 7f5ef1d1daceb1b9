//! Snapshots that travel: two "hosts" on this machine (two private containerds, each with its
//! own root, state, runsc root, snapshot store and socket; host B never has the base image
//! imported) and a real registry on loopback (Distribution, `CHALK_REGISTRY`, built by
//! scripts/peers) over HTTPS with a CA of the test's own and htpasswd credentials. With
//! `CHALK_OTHER_RUNSC`, a third host whose shim runs another runsc. With `CHALK_TRAVEL_S3`
//! (`endpoint bucket access-key secret-key`, see scripts/registry-s3), the registry keeps its
//! blobs in that S3 store.

use std::{
    path::{Path, PathBuf},
    time::Instant,
};

use chalk_integration::{
    cases,
    containerd::IMAGE,
    ensure,
    registry::{Secured, USER},
    testkit::{self, Env, Failed, TestResult, COUNTER},
    Containerd, CtrOutput, RUNTIME,
};
use serde_json::Value;

#[path = "travel/cycles.rs"]
mod cycles;
#[path = "travel/debian.rs"]
mod debian;
#[path = "travel/faults.rs"]
mod faults;
use faults::{filled, fresh_host, Own};
#[path = "travel/lazy.rs"]
mod lazy;
#[path = "travel/network.rs"]
mod network;
#[path = "travel/refusals.rs"]
mod refusals;
#[path = "travel/trust.rs"]
mod trust;

use lazy::{
    a_lazy_resume_and_fork_on_another_host_carry_on,
    a_tampered_piece_ends_a_lazy_restore_with_the_reason, fault_registry_gone_mid_lazy_restore,
};
use network::B_NETWORK;

struct Hosts {
    a: Env,
    b: Env,
    /// A host whose runsc is another build.
    c: Option<Env>,
    /// Where the registry keeps its blobs.
    blobs: Blobs,
    registry: Secured,
    /// B's decryption key, and the signing keys its `[trust]` policy knows.
    keys: Option<trust::Keys>,
}

impl Hosts {
    /// `repo` in this run's namespace of the registry (a bucket may outlive a run).
    fn reference(&self, repo: &str) -> String {
        let run = self.registry.addr.rsplit(':').next().unwrap_or("0");
        format!("{}/run-{run}/{repo}", self.registry.addr)
    }

    /// chalkctl on `host`, with the test's hosts directory and a docker config holding the
    /// registry's credentials (which `--user` in `args` overrides).
    fn chalkctl(&self, host: &Env, args: &[&str]) -> CtrOutput {
        let mut cmd = host.c.chalkctl_command().expect("chalkctl is built");
        self.registry.client(&mut cmd).args(args);
        cmd.output().expect("run chalkctl").into()
    }

    /// Like [`Hosts::chalkctl`], with the docker config in `docker_config` instead.
    fn chalkctl_with(&self, host: &Env, args: &[&str], docker_config: &Path) -> CtrOutput {
        let mut cmd = host.c.chalkctl_command().expect("chalkctl is built");
        self.registry
            .client(&mut cmd)
            .env("DOCKER_CONFIG", docker_config)
            .args(args);
        cmd.output().expect("run chalkctl").into()
    }

    fn json(&self, host: &Env, args: &[&str]) -> Result<Value, Failed> {
        let mut all = vec!["--output", "json"];
        all.extend_from_slice(args);
        let out = self.chalkctl(host, &all);
        ensure!(out.code == 0, "chalkctl {args:?}: {out:?}");
        serde_json::from_str(&out.stdout).map_err(|e| Failed::from(format!("{e}: {out:?}")))
    }

    /// Suspends `id` on `host` to `reference`, releasing the local copy: what chalkctl said,
    /// and the suspend snapshot's id.
    fn suspend_to(&self, host: &Env, id: &str, reference: &str) -> Result<(Value, String), Failed> {
        let out = self.json(
            host,
            &["suspend", "--id", id, "--to", reference, "--release"],
        )?;
        let snapshot = out["snapshot"]["id"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        Ok((out, snapshot))
    }

    /// GET `/v2/<this run's namespace>/<path>` from the registry, as JSON.
    fn registry_get(&self, path: &str) -> Result<Value, Failed> {
        let run = self.registry.addr.rsplit(':').next().unwrap_or("0");
        let url = format!("https://{}/v2/run-{run}/{path}", self.registry.addr);
        let out = std::process::Command::new("curl")
            .args([
                "-sf",
                "-H",
                "Accept: application/vnd.oci.image.index.v1+json",
            ])
            .arg("--cacert")
            .arg(self.registry.dir.join("ca.crt"))
            .args([
                "-u",
                &format!("{USER}:{}", chalk_integration::registry::PASSWORD),
            ])
            .arg(&url)
            .output()
            .map_err(|e| format!("curl: {e}"))?;
        ensure!(out.status.success(), "GET {url}: {:?}", out.status);
        serde_json::from_slice(&out.stdout).map_err(|e| Failed::from(format!("{url}: {e}")))
    }

    /// Manifest `path` (`<repo>/manifests/<ref>`, in this run's namespace) as JSON.
    fn registry_manifest(&self, path: &str) -> Result<Value, Failed> {
        let run = self.registry.addr.rsplit(':').next().unwrap_or("0");
        Ok(self.registry.get_manifest(&format!("run-{run}/{path}"))?)
    }

    /// PUTs manifest `m` at `path` (behind chalkctl's back).
    fn registry_put_manifest(&self, path: &str, m: &Value) -> TestResult {
        let run = self.registry.addr.rsplit(':').next().unwrap_or("0");
        Ok(self
            .registry
            .put_manifest(&format!("run-{run}/{path}"), m)?)
    }

    /// Blob `digest` as the registry stores it (Distribution's layout).
    fn registry_blob(&self, digest: &str) -> Result<Vec<u8>, Failed> {
        match &self.blobs {
            Blobs::Dir(dir) => {
                let p = dir.join(blob_key(digest));
                std::fs::read(&p).map_err(|e| Failed::from(format!("{}: {e}", p.display())))
            }
            Blobs::S3(s3) => s3.request("GET", &blob_key(digest), None),
        }
    }

    /// Replaces what the registry stores for blob `digest` (behind its back).
    fn set_registry_blob(&self, digest: &str, bytes: &[u8]) -> TestResult {
        match &self.blobs {
            Blobs::Dir(dir) => std::fs::write(dir.join(blob_key(digest)), bytes)
                .map_err(|e| Failed::from(e.to_string())),
            Blobs::S3(s3) => s3.request("PUT", &blob_key(digest), Some(bytes)).map(drop),
        }
    }
}

enum Blobs {
    /// Distribution's filesystem storage root.
    Dir(PathBuf),
    S3(S3),
}

/// The S3 bucket the registry stores into, reached with curl's SigV4 signing.
struct S3 {
    endpoint: String,
    bucket: String,
    key: String,
    secret: String,
}

impl S3 {
    /// GET `key`, or PUT `body` there.
    fn request(&self, method: &str, key: &str, body: Option<&[u8]>) -> Result<Vec<u8>, Failed> {
        let url = format!("{}/{}/{key}", self.endpoint, self.bucket);
        let mut cmd = std::process::Command::new("curl");
        cmd.args(["-sf", "--aws-sigv4", "aws:amz:us-east-1:s3", "--user"])
            .arg(format!("{}:{}", self.key, self.secret))
            .arg(&url);
        let tmp = tempfile::NamedTempFile::new().map_err(|e| e.to_string())?;
        if let Some(body) = body {
            std::fs::write(tmp.path(), body).map_err(|e| e.to_string())?;
            // An upload is a PUT of the file.
            cmd.arg("-T").arg(tmp.path());
        }
        let out = cmd.output().map_err(|e| format!("curl: {e}"))?;
        ensure!(
            out.status.success(),
            "curl {method} {url}: {:?}",
            out.status
        );
        Ok(out.stdout)
    }
}

const PACKED: &str = "application/vnd.chalk.snapshot.packed.v1";
const PLAIN: &str = "application/vnd.chalk.snapshot.v1";

/// The digest a push's reference pins.
fn pinned(pushed: &Value) -> Result<String, Failed> {
    pushed["reference"]
        .as_str()
        .and_then(|r| r.rsplit_once('@'))
        .map(|(_, d)| d.to_string())
        .ok_or_else(|| Failed::from(format!("no digest in the pushed reference: {pushed}")))
}

fn blob_key(digest: &str) -> String {
    let hex = digest.trim_start_matches("sha256:");
    format!("docker/registry/v2/blobs/sha256/{}/{hex}/data", &hex[..2])
}

/// The layer of `manifest` (the snapshot's OCI manifest) titled `title`.
fn layer<'a>(manifest: &'a Value, title: &str) -> Option<&'a Value> {
    manifest["layers"]
        .as_array()?
        .iter()
        .find(|l| l["annotations"]["org.opencontainers.image.title"] == title)
}

fn files_under(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |d| d.count())
}

/// A counter on host `a`, counting.
fn counter(h: &Hosts, id: &str) -> TestResult {
    h.a.start_counter(id)
}

/// A sandbox suspended on A to the registry and released there resumes on B, which never had
/// its image, and counts on; a snapshot of it forks on B; each host fetches only what it
/// lacks; the second push sends only what changed.
fn a_sandbox_travels_between_hosts(h: &Hosts) -> TestResult {
    let (id, fork) = ("tr-src", "tr-fork");
    let mut on_a = Vec::new();
    let mut on_b = Vec::new();
    let result = (|| {
        counter(h, id)?;
        let first = h.a.snapshot_of(id)?;
        on_a.push(first.clone());
        let first_ref = h.reference("travel/tr-src:first");
        let pushed = h.json(
            &h.a,
            &["snapshot", "push", "--snapshot-id", &first, &first_ref],
        )?;
        // Its memory goes as pieces: the pushed manifest is the packed form, whose first
        // layer is the snapshot's own manifest (the id). Debian's runsc keeps memory inside
        // checkpoint.img: its snapshots are pushed whole, as they are.
        let packed = pinned(&pushed)?;
        let packed_manifest = h.registry_manifest(&format!("travel/tr-src/manifests/{packed}"))?;
        let form = if testkit::current_runsc() {
            PACKED
        } else {
            PLAIN
        };
        let first_layer = &packed_manifest["layers"][0]["digest"];
        ensure!(
            pushed["id"] == first.as_str()
                && packed_manifest["artifactType"] == form
                && (if form == PACKED {
                    first_layer == first.as_str()
                } else {
                    packed == first
                })
                && pushed["transfer"]["bytes_moved"].as_u64() > Some(0)
                && pushed["transfer"]["base_image_blobs_moved"].as_u64() > Some(0),
            "first push: {pushed}"
        );
        eprintln!("travel: first push {}", pushed["transfer"]);
        // Distribution has no referrers API: the image's `sha256-<hex>` tag lists the snapshot.
        let (_, m) = h.a.stored_snapshot(&first)?;
        let subject = m["subject"]["digest"].as_str().unwrap_or_default();
        let referrers = h.registry_get(&format!(
            "travel/tr-src/manifests/{}",
            subject.replace(':', "-")
        ))?;
        ensure!(
            referrers["manifests"].as_array().is_some_and(|l| l
                .iter()
                .any(|d| d["digest"] == packed.as_str() && d["artifactType"] == form)),
            "the referrers tag of {subject}: {referrers}, not {packed} ({form})"
        );

        // Suspended to the registry and released: no sandbox and no snapshot left on A.
        let count_before = h.a.count(id)?;
        let suspended_ref = h.reference("travel/tr-src:suspended");
        let (out, suspended) = h.suspend_to(&h.a, id, &suspended_ref)?;
        let second = &out["pushed"]["transfer"];
        eprintln!("travel: second push (suspend) {second}");
        ensure!(
            second["base_image_blobs_moved"] == 0
                && second["bytes_present"].as_u64() > Some(0)
                && out["released"]["freed_bytes"].as_u64() > Some(0),
            "the second push sends only what changed, the base image not again: {out}"
        );
        ensure!(h.a.task_status(id).is_none(), "{id} still has a task on A");
        ensure!(
            h.a.stored_snapshot(&suspended).is_err(),
            "A kept the released snapshot {suspended}"
        );
        let listed = h.json(&h.a, &["get", "--id", id])?;
        ensure!(
            listed["status"] == "suspended" && listed["released_to"] == out["pushed"]["reference"],
            "A's record: {listed}"
        );

        // B has no record of the sandbox, nor its image: resume pulls both.
        let started = Instant::now();
        let out = h.json(&h.b, &["resume", "--id", id, "--from", &suspended_ref])?;
        eprintln!(
            "travel: resume on B in {} ms ({:?} wall): {}",
            out["elapsed_ms"],
            started.elapsed(),
            out["pulled"]
        );
        on_b.push(suspended.clone());
        // (The base image came with it, unless a case running beside this one pulled it.)
        ensure!(
            out["snapshot"] == suspended.as_str()
                && out["pulled"]["bytes_moved"].as_u64() > Some(0),
            "resume on B: {out}"
        );
        let on_b_record = h.json(&h.b, &["get", "--id", id])?;
        ensure!(
            on_b_record["status"] == "running" && on_b_record["resumed_from"] == suspended.as_str(),
            "B's record: {on_b_record}"
        );
        let now = h.b.count(id)?;
        ensure!(
            now >= count_before,
            "B's count {now} < {count_before} at suspend"
        );
        h.b.count_reaches(id, now + 3)?;
        let files = h.b.sh(id, "files", "cat /workspace/notes.txt /tmp/t");
        ensure!(
            files.stdout == "hello\ntmp\n",
            "files after the move: {files:?}"
        );

        // The first snapshot forks on B: only what B lacks is fetched (the image is there).
        let pulled = h.json(&h.b, &["snapshot", "pull", &first_ref])?;
        on_b.push(first.clone());
        ensure!(
            pulled["id"] == first.as_str() && pulled["transfer"]["base_image_blobs_moved"] == 0,
            "pull of the first snapshot on B: {pulled}"
        );
        eprintln!(
            "travel: pull of the first snapshot on B {}",
            pulled["transfer"]
        );
        let again = h.json(&h.b, &["snapshot", "pull", &first_ref])?;
        ensure!(
            again["transfer"]["bytes_moved"] == 0,
            "a second pull fetches nothing: {again}"
        );
        let out = h.json(&h.b, &["fork", "--snapshot", &first_ref, "--fork-id", fork])?;
        ensure!(out["forks"][0]["id"] == fork, "fork on B: {out}");
        let n = h.b.count(fork)?;
        h.b.count_reaches(fork, n + 2)?;
        // Every chalkctl above has ended: none left a lease behind on either host.
        for (host, env) in [("A", &h.a), ("B", &h.b)] {
            let leases = env.ctr(&["leases", "ls", "-q"]);
            let left: Vec<&str> = leases
                .stdout
                .lines()
                .filter(|l| l.starts_with("chalkctl-"))
                .collect();
            ensure!(left.is_empty(), "leases left on {host}: {left:?}");
        }
        Ok(())
    })();
    // B first: the same ids run there, and A's check looks for any process of them.
    let on_b = h.b.conclude(result, &[id, fork], &on_b);
    h.a.conclude(on_b, &[id], &on_a)
}

/// A blob changed in the registry is refused when pulled: no record, no ref and no partial
/// file is left; put back, it pulls.
fn a_tampered_blob_in_the_registry_is_refused(h: &Hosts) -> TestResult {
    let id = "tr-tamper";
    let mut on_a = Vec::new();
    let result = (|| {
        counter(h, id)?;
        let snap = h.a.snapshot_of(id)?;
        on_a.push(snap.clone());
        let reference = h.reference("travel/tamper:1");
        h.json(
            &h.a,
            &["snapshot", "push", "--snapshot-id", &snap, &reference],
        )?;
        let (_, m) = h.a.stored_snapshot(&snap)?;
        let digest = layer(&m, "checkpoint.img")
            .and_then(|l| l["digest"].as_str())
            .ok_or("no checkpoint.img layer")?
            .to_string();
        let bytes = h.registry_blob(&digest)?;
        let mut bent = bytes.clone();
        bent[bytes.len() / 2] ^= 1;
        h.set_registry_blob(&digest, &bent)?;
        let out = h.chalkctl(&h.b, &["snapshot", "pull", &reference]);
        h.set_registry_blob(&digest, &bytes)?;
        ensure!(
            out.code != 0 && out.stderr.contains("changed or damaged"),
            "pull of a tampered blob: {out:?}"
        );
        let store = h.b.c.snapshot_store();
        let left = h.json(&h.b, &["snapshot", "list", "--sandbox-id", id])?;
        let parts: Vec<_> = std::fs::read_dir(store.join("ingest"))
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| std::fs::read_dir(e.path()).is_ok_and(|mut d| d.next().is_some()))
            .collect();
        ensure!(
            left["items"].as_array().is_some_and(Vec::is_empty)
                && parts.is_empty()
                && !h.b.store_blob(&digest).exists(),
            "the refused pull left {left} / partial files in {parts:?}"
        );
        let pulled = h.json(&h.b, &["snapshot", "pull", &reference])?;
        ensure!(
            pulled["id"] == snap.as_str(),
            "pull once put back: {pulled}"
        );
        h.json(&h.b, &["snapshot", "delete", "--snapshot-id", &snap])?;
        Ok(())
    })();
    h.a.conclude(result, &[id], &on_a)
}

fn start() -> Result<Hosts, String> {
    let registry_bin = std::env::var_os("CHALK_REGISTRY")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .ok_or("CHALK_REGISTRY names no registry binary (scripts/peers builds one)")?;
    let s3 = match std::env::var("CHALK_TRAVEL_S3") {
        Ok(s3) if !s3.is_empty() => {
            let f: Vec<&str> = s3.split_whitespace().collect();
            let [endpoint, bucket, key, secret] = f[..] else {
                return Err(format!(
                    "CHALK_TRAVEL_S3={s3:?}: expected `endpoint bucket access-key secret-key`"
                ));
            };
            Some(S3 {
                endpoint: endpoint.into(),
                bucket: bucket.into(),
                key: key.into(),
                secret: secret.into(),
            })
        }
        _ => None,
    };
    let registry = match &s3 {
        Some(s3) => {
            let storage = format!(
                "storage:\n  s3:\n    region: us-east-1\n    regionendpoint: {}\n    \
                 bucket: {}\n    forcepathstyle: true\n    secure: false\n    \
                 v4auth: true\n  redirect:\n    disable: true\n",
                s3.endpoint, s3.bucket
            );
            let env = [
                ("REGISTRY_STORAGE_S3_ACCESSKEY", s3.key.as_str()),
                ("REGISTRY_STORAGE_S3_SECRETKEY", s3.secret.as_str()),
            ];
            Secured::start(&registry_bin, Some(&storage), &env)?
        }
        None => Secured::start(&registry_bin, None, &[])?,
    };
    let blobs = match s3 {
        Some(s3) => Blobs::S3(s3),
        None => Blobs::Dir(registry.blobs()),
    };
    let a = Containerd::start().map_err(|e| format!("host A: {e}"))?;
    a.import_busybox().map_err(|e| e.to_string())?;
    let b = Containerd::start().map_err(|e| format!("host B: {e}"))?;
    // B's default network is its own: another bridge and subnet than A's.
    network::write_network(&b, B_NETWORK)?;
    let run = registry.addr.rsplit(':').next().unwrap_or("0");
    let keys = trust::set_up(
        &b.dir().join("keys"),
        &b.options_path(),
        &format!("{}/run-{run}/trust", registry.addr),
    )?;
    let c = match std::env::var_os("CHALK_OTHER_RUNSC").filter(|v| !v.is_empty()) {
        Some(runsc) => Some(
            Containerd::start_with_runsc(Path::new(&runsc)).map_err(|e| format!("host C: {e}"))?,
        ),
        None => None,
    };
    Ok(Hosts {
        a: Env { c: a },
        b: Env { c: b },
        c: c.map(|c| Env { c }),
        blobs,
        registry,
        keys: Some(keys),
    })
}

fn main() {
    testkit::check_args();
    let hosts = start().unwrap_or_else(|e| panic!("cannot set up the two hosts: {e}"));
    let no_other = hosts.c.is_none();
    let mut all = cases![
        a_sandbox_travels_between_hosts,
        a_tampered_blob_in_the_registry_is_refused,
        refusals::wrong_credentials_are_refused_clearly,
        refusals::a_mirror_in_hosts_toml_serves_the_pull,
        refusals::a_pulled_snapshot_may_not_bind_host_paths,
        faults::fault_disk_full_during_a_pull_fails_cleanly_and_pulls_after,
        faults::fault_registry_full_during_a_push_fails_cleanly_and_resumes,
        faults::fault_registry_gone_mid_push_and_mid_pull,
        trust::an_encrypted_snapshot_is_unreadable_and_opens_only_with_its_key,
        trust::a_trust_policy_lets_in_only_what_its_key_signed,
        debian::a_debian_workload_resumes_and_forks_on_another_host,
        cycles::a_snapshot_pushed_whole_still_restores,
    ];
    all.extend(cases![a_lazy_resume_and_fork_on_another_host_carry_on]);
    // Debian's runsc cannot give a sandbox a network of its own (tests/network.rs).
    let networks = testkit::current_runsc() && std::env::var_os("CHALK_CNI_BIN").is_some();
    all.extend(
        cases![network::a_resume_on_another_host_gets_an_address_there]
            .into_iter()
            .map(|c| c.ignored_if(!networks)),
    );
    // Debian's runsc cannot restore while pages.img arrives (its pulls fetch all), and keeps
    // memory inside checkpoint.img, which is pushed whole: no pieces to count.
    all.extend(
        cases![
            a_tampered_piece_ends_a_lazy_restore_with_the_reason,
            fault_registry_gone_mid_lazy_restore,
            cycles::twenty_suspends_send_what_changed_and_gc_keeps_what_is_needed
        ]
        .into_iter()
        .map(|c| c.ignored_if(!testkit::current_runsc())),
    );
    all.extend(
        cases![refusals::a_host_with_another_runsc_refuses_before_pulling]
            .into_iter()
            .map(|c| c.ignored_if(no_other)),
    );
    testkit::run(hosts, all, |_| Ok(()))
}
