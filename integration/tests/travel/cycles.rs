//! Snapshots that cost what changed: a sandbox holding a known pattern (memfill) suspended to
//! a registry of its own and resumed twenty times, its memory checked page by page after every
//! resume, first on one host, then moving between two. Every push after the first sends little
//! more than what the sandbox rewrote; the chain is cut at its depth; the registry grows by
//! what changed; and once the older snapshots' manifests are deleted and the registry collects
//! its garbage, the newest still restores: nothing it needs was freed. Halfway through the
//! cycles on one host, the packs that host kept are damaged on disk: the resume reads its
//! pieces checked, not as its own writing, and its memory is still right.

use std::time::Duration;

use chalk_integration::memfill;

use super::*;

const MB: u64 = 64;
/// What the sandbox rewrites between suspends.
const CHANGE_MB: u64 = 4;
const CYCLES: usize = 20;
/// Cycles on one host before the sandbox moves between the two at every cycle.
const LOCAL: usize = 10;
/// The chain's cut for this case (the default is longer than the cycles).
const DEPTH: u32 = 8;
const REPO: &str = "cycles/mf";
/// The cycle before whose resume the packs host A kept are damaged on disk.
const DAMAGED: usize = 5;

fn exec(host: &Env, id: &str, script: &str) -> Result<String, String> {
    let out = host.chalkctl(&["exec", "--id", id, "--", "sh", "-c", script]);
    if out.code != 0 {
        return Err(format!("exec in {id}: {script}: {out:?}"));
    }
    Ok(out.stdout.trim().to_string())
}

/// Sends memfill in `id` `signal` and waits for it to write `path`.
fn ask(host: &Env, id: &str, signal: &str, path: &str) -> Result<String, Failed> {
    let read = |script: &str| exec(host, id, script);
    Ok(memfill::ask(read, signal, path, Duration::from_secs(120))?)
}

/// What `path` in `id` holds once it is written (within 120 s).
fn wait_file(host: &Env, id: &str, path: &str) -> Result<String, Failed> {
    let read = |script: &str| exec(host, id, script);
    Ok(memfill::wait_written(read, path, Duration::from_secs(120))?)
}

/// chalkctl on `host` against `registry`, with the options at `options`.
fn json(registry: &Secured, host: &Env, options: &Path, args: &[&str]) -> Result<Value, Failed> {
    let mut argv = host.c.chalkctl_argv()?;
    let at = argv
        .iter()
        .position(|a| a == "--config")
        .ok_or("no --config")?
        + 1;
    argv[at] = options.display().to_string();
    let mut cmd = std::process::Command::new(&argv[0]);
    cmd.args(&argv[1..]).args(["--output", "json"]).args(args);
    let out: CtrOutput = registry
        .client(&mut cmd)
        .output()
        .map_err(|e| e.to_string())?
        .into();
    ensure!(out.code == 0, "chalkctl {args:?}: {out:?}");
    serde_json::from_str(&out.stdout).map_err(|e| Failed::from(format!("{e}: {out:?}")))
}

/// `host`'s options with the chain cut at [`DEPTH`].
fn options_of(host: &Env) -> Result<PathBuf, Failed> {
    options_with(host, "cycles", |o| o.max_chain_depth = DEPTH)
}

/// `host`'s options with `change` made to `[snapshot]`, in a file named for `name`.
fn options_with(
    host: &Env,
    name: &str,
    change: impl FnOnce(&mut chalk_runtime::options::SnapshotOptions),
) -> Result<PathBuf, Failed> {
    let mut opts = chalk_runtime::options::RuntimeOptions::load(&host.c.options_path())
        .map_err(|e| e.to_string())?;
    change(&mut opts.snapshot);
    let path = host.c.dir().join(format!("{name}-options.toml"));
    let text = toml::to_string(&opts).map_err(|e| e.to_string())?;
    std::fs::write(&path, text).map_err(|e| e.to_string())?;
    Ok(path)
}

/// Changes a byte in the middle of every pack `host` kept, as a disk or another program might:
/// the next resume there reads its pieces checked, finds them wrong, and fetches the
/// registry's. Host A vouches for its own snapshots' indexes, which lets it read its kept
/// packs unhashed only while they are as it kept them.
fn damage_kept_packs(host: &Env) -> Result<(), Failed> {
    use std::os::unix::fs::{FileExt, PermissionsExt};
    let dir = host.c.snapshot_store().join("packs");
    let mut damaged = 0;
    for entry in std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))? {
        let path = entry.map_err(|e| e.to_string())?.path();
        if path.extension().is_some() {
            continue;
        }
        let mode = std::fs::metadata(&path)
            .map_err(|e| e.to_string())?
            .permissions();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| e.to_string())?;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| e.to_string())?;
        let at = file.metadata().map_err(|e| e.to_string())?.len() / 2;
        let mut byte = [0u8];
        file.read_exact_at(&mut byte, at)
            .map_err(|e| e.to_string())?;
        file.write_all_at(&[byte[0] ^ 0xff], at)
            .map_err(|e| e.to_string())?;
        std::fs::set_permissions(&path, mode).map_err(|e| e.to_string())?;
        damaged += 1;
    }
    ensure!(damaged > 0, "no kept packs in {}", dir.display());
    Ok(())
}

struct Pushed {
    moved: u64,
    depth: u32,
    reference: String,
}

pub fn twenty_suspends_send_what_changed_and_gc_keeps_what_is_needed(h: &Hosts) -> TestResult {
    let id = "tr-cycles";
    let mut own = Own::start_with(&[("REGISTRY_STORAGE_DELETE_ENABLED", "true")])?;
    let mut pushes: Vec<Pushed> = Vec::new();
    let result = (|| {
        for host in [&h.a, &h.b] {
            memfill::import(&host.c).map_err(|e| e.to_string())?;
        }
        let options = [options_of(&h.a)?, options_of(&h.b)?];
        let (mb, change) = (MB.to_string(), CHANGE_MB.to_string());
        let run = memfill::run_args(id, &[&mb, &change]);
        let out = h.a.chalkctl(&run);
        ensure!(out.code == 0, "run {id}: {out:?}");
        let ready = wait_file(&h.a, id, "/tmp/ready")?;
        ensure!(ready == "ready", "{id}: {ready}");
        let mut on = 0; // host index: 0 A, 1 B
        let hosts = [&h.a, &h.b];
        let mut generation = 0;
        for n in 1..=CYCLES {
            let host = hosts[on];
            if n > 1 {
                let said = ask(host, id, "USR2", "/tmp/rewritten")?;
                generation += 1;
                ensure!(
                    said.starts_with(&format!("{generation} ")),
                    "rewrite: {said}"
                );
            }
            let reference = own.reference(&format!("{REPO}:c{n}"));
            let out = json(
                &own.registry,
                host,
                &options[on],
                &["suspend", "--id", id, "--to", &reference, "--release"],
            )?;
            let pushed = out["pushed"]["reference"].as_str().unwrap_or_default();
            let digest = pushed.rsplit_once('@').map(|(_, d)| d).unwrap_or_default();
            let m = own
                .registry
                .get_manifest(&format!("{REPO}/manifests/{digest}"))?;
            let depth = m["annotations"][chalk_labels::DEPTH_ANNOTATION]
                .as_str()
                .and_then(|d| d.parse().ok())
                .ok_or_else(|| format!("no depth in {m}"))?;
            pushes.push(Pushed {
                moved: out["pushed"]["transfer"]["bytes_moved"]
                    .as_u64()
                    .unwrap_or(0),
                depth,
                reference: pushed.to_string(),
            });
            if n == DAMAGED {
                damage_kept_packs(host)?;
            }
            let next = if n < LOCAL { on } else { 1 - on };
            let resumed = json(
                &own.registry,
                hosts[next],
                &options[next],
                &["resume", "--id", id, "--from", &reference],
            )?;
            ensure!(
                resumed["snapshot"] == out["snapshot"]["id"],
                "cycle {n}: resumed {resumed}"
            );
            if next != on {
                // The record of the sandbox it left: it lives on the other host now.
                let gone = host.chalkctl(&["rm", "--id", id]);
                ensure!(gone.code == 0, "remove {id} where it left: {gone:?}");
            }
            on = next;
            let verified = ask(hosts[on], id, "USR1", "/tmp/verified")?;
            ensure!(
                verified == format!("ok {generation}"),
                "cycle {n}: memory after the resume: {verified}"
            );
        }
        let report: Vec<String> = pushes
            .iter()
            .map(|p| format!("{:.1}MB/d{}", p.moved as f64 / 1e6, p.depth))
            .collect();
        testkit::note(format!(
            "20 suspends of {MB} MB, {CHANGE_MB} MB changed: {report:?}"
        ));
        // The chain is cut at DEPTH: a full push, then one deeper each time.
        let depths: Vec<u32> = pushes.iter().map(|p| p.depth).collect();
        for (n, d) in depths.iter().enumerate() {
            ensure!(*d <= DEPTH, "push {} is {d} deep: {depths:?}", n + 1);
            if n > 0 && *d > 0 {
                ensure!(*d == depths[n - 1] + 1, "depths {depths:?}");
            }
        }
        ensure!(
            depths.iter().filter(|d| **d == 0).count() >= (CYCLES as u32 / (DEPTH + 1)) as usize,
            "the chain was never cut: {depths:?}"
        );
        // A push taking from its parent sends what changed and the small files.
        for (n, p) in pushes.iter().enumerate().skip(1) {
            if p.depth > 0 {
                ensure!(
                    p.moved < (CHANGE_MB + 8) << 20,
                    "push {} sent {} bytes for {CHANGE_MB} MB changed: {report:?}",
                    n + 1,
                    p.moved
                );
            }
        }
        let full: u64 = pushes
            .iter()
            .filter(|p| p.depth == 0)
            .map(|p| p.moved)
            .sum();
        let sent: u64 = pushes.iter().map(|p| p.moved).sum();
        let stored = own.registry.stored_bytes();
        let whole = CYCLES as u64 * (MB << 20);
        ensure!(
            // What was sent, with the base image and the manifests.
            stored <= sent + (8 << 20) && stored < whole / 3,
            "the registry holds {stored} bytes after 20 suspends ({sent} sent, {full} in full \
             pushes; {whole} whole)"
        );

        // The older snapshots' manifests go, the registry collects its garbage: the last one
        // still restores on the other host, and the packs only the deleted ones needed went.
        for p in &pushes[..CYCLES - 1] {
            let digest = p
                .reference
                .rsplit_once('@')
                .map(|(_, d)| d)
                .unwrap_or_default();
            own.registry.delete_manifest(REPO, digest)?;
        }
        own.registry.collect_garbage()?;
        let after = own.registry.stored_bytes();
        ensure!(after < stored, "gc freed nothing: {stored} -> {after}");
        let last = &pushes[CYCLES - 1].reference;
        let host = hosts[on];
        let out = json(&own.registry, host, &options[on], &["suspend", "--id", id])?;
        ensure!(out["snapshot"]["id"].is_string(), "suspend here: {out}");
        let gone = host.chalkctl(&["rm", "--id", id]);
        ensure!(gone.code == 0, "remove {id}: {gone:?}");
        let other = 1 - on;
        let resumed = json(
            &own.registry,
            hosts[other],
            &options[other],
            &["resume", "--id", id, "--from", last],
        )?;
        ensure!(
            resumed["snapshot"].is_string(),
            "resume of the last: {resumed}"
        );
        let verified = ask(hosts[other], id, "USR1", "/tmp/verified")?;
        ensure!(
            verified == format!("ok {generation}"),
            "after gc: {verified}"
        );
        testkit::note(format!(
            "registry {:.1} MB after 20 suspends ({:.1} MB sent), {:.1} MB after gc",
            stored as f64 / 1e6,
            sent as f64 / 1e6,
            after as f64 / 1e6
        ));
        Ok(())
    })();
    own.registry.stop();
    // It ends on either host: gone from both before either looks for what is left.
    h.a.remove(id);
    h.b.remove(id);
    let on_b = h.b.conclude(result, &[id], &[]);
    h.a.conclude(on_b, &[id], &[])
}

/// A snapshot pushed whole, as chalk-shim pushed before memory went as pieces (and as
/// `push_pieces = false` still does), is pulled and forked as it always was.
pub fn a_snapshot_pushed_whole_still_restores(h: &Hosts) -> TestResult {
    let (id, fork) = ("tr-whole", "tr-whole-fork");
    let mut on_a = Vec::new();
    let mut on_b = Vec::new();
    let result = (|| {
        counter(h, id)?;
        let snap = h.a.snapshot_of(id)?;
        on_a.push(snap.clone());
        let whole = options_with(&h.a, "whole", |o| o.push_pieces = false)?;
        let reference = h.reference("travel/whole:1");
        let pushed = json(
            &h.registry,
            &h.a,
            &whole,
            &["snapshot", "push", "--snapshot-id", &snap, &reference],
        )?;
        ensure!(
            pushed["reference"]
                .as_str()
                .is_some_and(|r| r.ends_with(&format!("@{snap}"))),
            "a whole push pins the snapshot's own manifest: {pushed}"
        );
        let m = h.registry_manifest(&format!("travel/whole/manifests/{snap}"))?;
        ensure!(
            m["artifactType"] == PLAIN
                && layer(&m, "pages.img").is_some() == testkit::current_runsc(),
            "the whole form: {m}"
        );
        let out = h.json(&h.b, &["fork", "--snapshot", &reference, "--fork-id", fork])?;
        on_b.push(snap.clone());
        ensure!(out["forks"][0]["id"] == fork, "fork on B: {out}");
        let n = h.b.count(fork)?;
        h.b.count_reaches(fork, n + 2)?;
        Ok(())
    })();
    let on_b = h.b.conclude(result, &[fork], &on_b);
    h.a.conclude(on_b, &[id], &on_a)
}
