//! Restores that start while the snapshot's memory still arrives (a lazy pull: pages.img
//! served through FUSE by `chalkctl serve-lazy`, checked piece by piece): on host B, a
//! resume and a fork that count on; a tampered piece and a registry gone mid-stream, each
//! ending the sandbox with the reason and leaving nothing half-made; a second restore that
//! fetches nothing. Under Debian's runsc (no background restore) the pull falls back to
//! fetching everything, and says so.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use chalk_integration::{
    ensure,
    testkit::{self, Env, Failed, TestResult},
};
use serde_json::Value;

use super::{filled, layer, Hosts, Own};

/// The pages.img layer's digest of stored snapshot `snap` on `host`.
fn pages_digest(host: &Env, snap: &str) -> Result<String, Failed> {
    let (_, m) = host.stored_snapshot(snap)?;
    Ok(layer(&m, "pages.img")
        .and_then(|l| l["digest"].as_str())
        .ok_or("no pages.img layer")?
        .to_string())
}

fn lazy_dir(host: &Env, digest: &str) -> PathBuf {
    host.c
        .snapshot_store()
        .join("lazy")
        .join(digest.trim_start_matches("sha256:"))
}

/// Mounts left below `dir`.
fn mounts_under(dir: &Path) -> Vec<String> {
    let prefix = dir.display().to_string();
    std::fs::read_to_string("/proc/self/mounts")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter(|t| t.starts_with(&prefix))
        .map(String::from)
        .collect()
}

/// Waits until blob `digest` arrived whole on `host`: a store blob, its server gone, nothing
/// mounted.
fn arrived(host: &Env, digest: &str) -> TestResult {
    let deadline = Instant::now() + Duration::from_secs(120);
    let dir = lazy_dir(host, digest);
    while !host.store_blob(digest).exists() || dir.exists() {
        ensure!(
            Instant::now() < deadline,
            "{digest} did not arrive whole: blob {}, {} still there",
            host.store_blob(digest).exists(),
            dir.display()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Only this blob's: other lazy restores on the same host run beside this test.
    let left = mounts_under(&dir);
    ensure!(left.is_empty(), "mounts of {digest} left: {left:?}");
    Ok(())
}

/// The container record's labels.
fn labels(host: &Env, id: &str) -> Value {
    let out = host.ctr(&["containers", "info", id]);
    serde_json::from_str::<Value>(&out.stdout).map_or(Value::Null, |v| v["Labels"].clone())
}

/// A resume on B while the suspended sandbox's memory arrives counts on; so does a fork of
/// another snapshot pulled lazily; each blob becomes a store blob; a second restore of it
/// fetches nothing.
pub fn a_lazy_resume_and_fork_on_another_host_carry_on(h: &Hosts) -> TestResult {
    let (id, fork, again) = ("tl-src", "tl-fork", "tl-again");
    let lazy = testkit::current_runsc();
    let mut on_a = Vec::new();
    let mut on_b = Vec::new();
    let result = (|| {
        filled(&h.a, id, 64)?;
        let first = h.a.snapshot_of(id)?;
        on_a.push(first.clone());
        let first_ref = h.reference("lazy/tl-src:first");
        h.json(
            &h.a,
            &["snapshot", "push", "--snapshot-id", &first, &first_ref],
        )?;
        // Debian's runsc keeps memory inside checkpoint.img: no pages.img to arrive.
        let first_pages = lazy.then(|| pages_digest(&h.a, &first)).transpose()?;
        let count_before = h.a.count(id)?;
        let suspended_ref = h.reference("lazy/tl-src:suspended");
        let (_, suspended) = h.suspend_to(&h.a, id, &suspended_ref)?;
        let (_, m) = h.a.stored_snapshot(&first)?;
        let pages_size = layer(&m, "pages.img").and_then(|l| l["size"].as_u64());

        let started = Instant::now();
        let out = h.chalkctl(&h.b, &["resume", "--id", id, "--from", &suspended_ref]);
        let took = started.elapsed();
        ensure!(out.code == 0, "resume on B: {out:?}");
        on_b.push(suspended.clone());
        if lazy {
            ensure!(
                out.stderr.contains("arrives while the sandbox runs"),
                "the resume on B did not leave pages.img to arrive: {out:?}"
            );
        } else {
            ensure!(
                out.stderr
                    .matches("fetching the snapshot's memory whole")
                    .count()
                    == 1,
                "without a background restore the pull says once that it fetches all: {out:?}"
            );
        }
        let now = h.b.count(id)?;
        ensure!(now >= count_before, "B's count {now} < {count_before}");
        h.b.count_reaches(id, now + 3)?;
        let files = h.b.sh(id, "files", "wc -c < /tmp/fill");
        ensure!(
            files.stdout.trim() == (64u64 << 20).to_string(),
            "the 64 MB in memory after the move: {files:?}"
        );
        let pages = lazy.then(|| pages_digest(&h.b, &suspended)).transpose()?;
        if let Some(pages) = &pages {
            arrived(&h.b, pages)?;
        }

        // Another snapshot, forked on B as it arrives.
        let out = h.chalkctl(&h.b, &["fork", "--snapshot", &first_ref, "--fork-id", fork]);
        ensure!(out.code == 0, "fork on B: {out:?}");
        on_b.push(first.clone());
        ensure!(
            !lazy || out.stderr.contains("arrives while the sandbox runs"),
            "the fork on B did not leave pages.img to arrive: {out:?}"
        );
        let n = h.b.count(fork)?;
        h.b.count_reaches(fork, n + 2)?;
        if let Some(first_pages) = &first_pages {
            arrived(&h.b, first_pages)?;
        }

        // A second restore of the arrived blob fetches nothing and serves nothing.
        let pulled = h.json(&h.b, &["snapshot", "pull", &suspended_ref])?;
        ensure!(
            pulled["transfer"]["bytes_moved"] == 0 && pulled["transfer"]["bytes_arriving"] == 0,
            "a second pull on B: {pulled}"
        );
        h.json(
            &h.b,
            &["fork", "--snapshot-id", &suspended, "--fork-id", again],
        )?;
        let n = h.b.count(again)?;
        h.b.count_reaches(again, n + 2)?;
        ensure!(
            !pages.is_some_and(|p| lazy_dir(&h.b, &p).exists()),
            "a restore of an arrived blob started a server"
        );
        testkit::note(format!(
            "lazy={lazy}: resume on B (pages.img {pages_size:?} bytes) running in {took:?}"
        ));
        Ok(())
    })();
    let on_b = h.b.conclude(result, &[id, fork, again], &on_b);
    h.a.conclude(on_b, &[id], &on_a)
}

/// What a restore whose memory could not arrive leaves: its sandbox stopped with the reason
/// on its record (the error of the command when the restore itself failed, or when serving
/// had failed before the shim linked the snapshot: the background fetch may reach a bad piece
/// first), and of the pull nothing: no record, no blob, no bytes, no mount.
fn ended_with_reason(
    host: &Env,
    fork: &str,
    out: &chalk_integration::CtrOutput,
    reason: &str,
    digest: &str,
    sandbox: &str,
) -> Result<String, Failed> {
    let said = if out.code == 0 {
        host.wait_status(fork, "STOPPED", Duration::from_secs(120))?;
        let why = labels(host, fork)[chalk_labels::ENDED_BECAUSE]
            .as_str()
            .unwrap_or_default()
            .to_string();
        ensure!(
            why.contains(reason),
            "{fork} ended, but its record says {why:?}, not {reason:?}"
        );
        let waited = host.chalkctl_json(&["wait", "--id", fork, "--timeout", "30s"])?;
        ensure!(
            waited["exit_status"] == 137 && waited["ended_because"] == why.as_str(),
            "what chalkctl wait says of {fork}: {waited}"
        );
        why
    } else {
        ensure!(
            out.stderr.contains(reason),
            "the restore failed without the reason {reason:?}: {out:?}"
        );
        out.stderr.clone()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let dir = lazy_dir(host, digest);
    while dir.join("data").exists() || !mounts_under(&dir).is_empty() {
        ensure!(
            Instant::now() < deadline,
            "the failed blob's bytes or mount are still there"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    ensure!(
        !host.store_blob(digest).exists(),
        "the blob that never arrived is in the store"
    );
    let listed = host.chalkctl_json(&["snapshot", "list", "--sandbox-id", sandbox])?;
    ensure!(
        listed["items"].as_array().is_some_and(Vec::is_empty),
        "the pull's record stayed: {listed}"
    );
    Ok(said)
}

const PACK: &str = "application/vnd.chalk.memory.pack.v1";

/// A piece of pages.img changed in the registry: the fork reading it as it arrives ends,
/// with the reason, and nothing of the pull stays.
pub fn a_tampered_piece_ends_a_lazy_restore_with_the_reason(h: &Hosts) -> TestResult {
    let (id, fork) = ("tl-tamper", "tl-tamper-fork");
    let mut on_a = Vec::new();
    let result = (|| {
        filled(&h.a, id, 48)?;
        let snap = h.a.snapshot_of(id)?;
        on_a.push(snap.clone());
        let reference = h.reference("lazy/tamper:1");
        let pushed = h.json(
            &h.a,
            &["snapshot", "push", "--snapshot-id", &snap, &reference],
        )?;
        let digest = pages_digest(&h.a, &snap)?;
        // The memory went as pieces: a byte of its pack changed.
        let packed = pushed["reference"]
            .as_str()
            .and_then(|r| r.rsplit_once('@'));
        let packed = packed.ok_or("no digest in the pushed reference")?.1;
        let m = h.registry_manifest(&format!("lazy/tamper/manifests/{packed}"))?;
        let pack = m["layers"]
            .as_array()
            .and_then(|l| l.iter().find(|l| l["mediaType"] == PACK))
            .and_then(|l| l["digest"].as_str())
            .ok_or_else(|| format!("no pack in {m}"))?
            .to_string();
        let bytes = h.registry_blob(&pack)?;
        let mut bent = bytes.clone();
        bent[bytes.len() * 3 / 4] ^= 1;
        h.set_registry_blob(&pack, &bent)?;
        let out = h.chalkctl(&h.b, &["fork", "--snapshot", &reference, "--fork-id", fork]);
        let ended = ended_with_reason(&h.b, fork, &out, "changed or damaged", &digest, id);
        h.set_registry_blob(&pack, &bytes)?;
        let said = ended?;
        testkit::note(format!("a tampered piece: {}", said.trim()));
        Ok(())
    })();
    let on_b = h.b.conclude(result, &[fork], &[]);
    h.a.conclude(on_b, &[id], &on_a)
}

/// The registry killed while a fork's memory arrives: the fork ends with the reason, nothing
/// of the pull stays; once the registry is back the same fork works.
pub fn fault_registry_gone_mid_lazy_restore(h: &Hosts) -> TestResult {
    let (id, fork, again) = ("tl-gone", "tl-gone-fork", "tl-gone-again");
    let mut own = Own::start()?;
    let mut on_a = Vec::new();
    let mut on_b = Vec::new();
    let result = (|| {
        filled(&h.a, id, 256)?;
        let snap = h.a.snapshot_of(id)?;
        on_a.push(snap.clone());
        let reference = own.reference("lazy/gone:1");
        own.json(
            &h.a,
            &["snapshot", "push", "--snapshot-id", &snap, &reference],
        )?;
        let digest = pages_digest(&h.a, &snap)?;
        let serving = lazy_dir(&h.b, &digest).join("serving");
        let fork_cmd = own
            .command(&h.b, &["fork", "--snapshot", &reference, "--fork-id", fork])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| e.to_string())?;
        let deadline = Instant::now() + Duration::from_secs(60);
        while !serving.exists() {
            ensure!(Instant::now() < deadline, "no server of {digest} on B");
            std::thread::sleep(Duration::from_millis(2));
        }
        own.registry.stop();
        let out: chalk_integration::CtrOutput = fork_cmd
            .wait_with_output()
            .map_err(|e| e.to_string())?
            .into();
        let said = ended_with_reason(&h.b, fork, &out, &own.registry.addr, &digest, id)?;
        own.registry.serve_again()?;
        own.json(
            &h.b,
            &["fork", "--snapshot", &reference, "--fork-id", again],
        )?;
        on_b.push(snap.clone());
        let n = h.b.count(again)?;
        h.b.count_reaches(again, n + 2)?;
        arrived(&h.b, &digest)?;
        testkit::note(format!(
            "registry gone mid-stream: {}; forked once it was back",
            said.trim()
        ));
        Ok(())
    })();
    let on_b = h.b.conclude(result, &[fork, again], &on_b);
    h.a.conclude(on_b, &[id], &on_a)
}
