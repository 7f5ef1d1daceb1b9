//! Forks that share memory: on a runsc with `restore --share-pages` (the patch in
//! packaging/gvisor, built by scripts/peers as runsc-cow), a snapshot's forks map its memory
//! copy-on-write: process memory, and files in the sandbox's memory. Each fork's memory is
//! checked page by page and each file by its sum, the forks together hold no copy of either
//! until one writes, and a snapshot of a fork restores. A snapshot of a fork has runsc write
//! only the memory the fork changed (`checkpoint --base-pages`, patch 0003), and restores
//! page for page. On a runsc without the flag the cases are ignored: the rest of the suites
//! cover it.

use std::time::{Duration, Instant};

use chalk_integration::{
    bench::meminfo_kb,
    cases, ensure,
    memfill::{self, MEMFILL_IMAGE},
    testkit::{self, Env, Failed, TestResult},
    Containerd,
};

/// What each sandbox holds in its heap, MB.
const MB: u64 = 256;

fn main() {
    testkit::check_args();
    let c = Containerd::start().unwrap_or_else(|e| panic!("cannot start containerd: {e}"));
    let patched = testkit::shares_pages();
    if patched {
        memfill::import(&c).unwrap_or_else(|e| panic!("cannot import the memfill image: {e}"));
        c.import_debian()
            .unwrap_or_else(|e| panic!("cannot import the Debian image: {e}"));
    }
    let env = Env { c };
    let all = cases![
        forks_share_memory_until_they_write,
        a_snapshot_of_a_fork_restores_and_shares,
        a_snapshot_of_a_fork_writes_only_what_it_changed,
        files_in_memory_share_until_written,
        a_local_git_clone_works_and_survives_a_fork,
    ]
    .into_iter()
    .map(|c| c.ignored_if(!patched))
    .collect();
    testkit::run(env, all, |_| Ok(()));
}

/// The host's shared memory (memfds: each sandbox's private copy of its memory), MB.
fn shmem_mb() -> Result<u64, Failed> {
    let text = std::fs::read_to_string("/proc/meminfo").map_err(|e| e.to_string())?;
    meminfo_kb(&text, "Shmem:")
        .map(|kb| kb / 1024)
        .ok_or_else(|| Failed::from("no Shmem in /proc/meminfo"))
}

fn sh(e: &Env, id: &str, script: &str) -> Result<String, Failed> {
    let out = e.chalkctl(&["exec", "--id", id, "--", "sh", "-c", script]);
    ensure!(out.code == 0, "exec in {id}: {script}: {out:?}");
    Ok(out.stdout.trim().to_string())
}

/// Waits up to `within` for `path` in `id` to read as something for which `done` holds.
fn wait_for(
    e: &Env,
    id: &str,
    path: &str,
    within: Duration,
    done: impl Fn(&str) -> bool,
) -> Result<String, Failed> {
    let start = Instant::now();
    loop {
        let got = sh(e, id, &format!("cat {path} 2>/dev/null || true"))?;
        if done(&got) {
            return Ok(got);
        }
        ensure!(
            start.elapsed() < within,
            "{id}: {path} is {got:?} after {within:?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Asks memfill in `id` to check its memory: "ok GEN" or "bad PAGE GEN".
fn verify(e: &Env, id: &str) -> Result<String, Failed> {
    sh(e, id, "rm -f /tmp/verified; kill -USR1 1")?;
    wait_for(e, id, "/tmp/verified", Duration::from_secs(120), |s| {
        !s.is_empty()
    })
}

fn run_memfill(e: &Env, id: &str) -> TestResult {
    let mb = MB.to_string();
    let mut args = vec!["--output", "json"];
    args.extend(memfill::run_args(id, &[&mb]));
    let out = e.chalkctl(&args);
    ensure!(out.code == 0, "run {id}: {out:?}");
    wait_for(e, id, "/tmp/ready", Duration::from_secs(120), |s| {
        s == "ready"
    })?;
    Ok(())
}

fn forks_share_memory_until_they_write(e: &Env) -> TestResult {
    let src = "cow-src";
    let forks = ["cw-1", "cw-2", "cw-3"];
    let mut ids = vec![src];
    ids.extend(forks);
    for id in &ids {
        e.remove(id);
    }
    let result = (|| {
        run_memfill(e, src)?;
        let before = shmem_mb()?;
        let out = e.chalkctl_json(&["fork", "--id", src, "--fork-id", "cw", "--count", "3"])?;
        ensure!(out.to_string().contains("cw-3"), "fork: {out}");
        for f in forks {
            let v = verify(e, f)?;
            ensure!(v == "ok 0", "{f}'s memory after the fork: {v}");
        }
        let forked = shmem_mb()?;
        // Three private copies would be 3 x 256 MB; shared, the forks add their page tables'
        // worth and what the checks touched of their own.
        ensure!(
            forked.saturating_sub(before) < MB / 2,
            "3 forks of a {MB} MB sandbox grew the host's shared memory by {} MB \
             ({before} -> {forked}): they hold copies",
            forked.saturating_sub(before)
        );
        // A fork that rewrites its memory gets its own copy; the others keep the snapshot's.
        sh(e, forks[0], "rm -f /tmp/rewritten; kill -USR2 1")?;
        let took = wait_for(
            e,
            forks[0],
            "/tmp/rewritten",
            Duration::from_secs(120),
            |s| s.starts_with("1 "),
        )?;
        let rewritten = shmem_mb()?;
        ensure!(
            rewritten.saturating_sub(forked) >= MB * 3 / 4,
            "the rewrite added {} MB of shared memory, not a copy of {MB} MB",
            rewritten.saturating_sub(forked)
        );
        let v = verify(e, forks[0])?;
        ensure!(v == "ok 1", "{}: after its rewrite: {v}", forks[0]);
        let v = verify(e, forks[1])?;
        ensure!(
            v == "ok 0",
            "{}: after its sibling's rewrite: {v}",
            forks[1]
        );
        let v = verify(e, src)?;
        ensure!(v == "ok 0", "{src}: after its fork's rewrite: {v}");
        testkit::note(format!(
            "shmem {before} MB -> 3 forks {forked} MB -> one rewrote ({took}) {rewritten} MB"
        ));
        Ok(())
    })();
    e.conclude(result, &ids, &[])
}

fn a_snapshot_of_a_fork_restores_and_shares(e: &Env) -> TestResult {
    let src = "cow-snap-src";
    let (fork, grandchild) = ("cws", "cwg");
    let ids = [src, fork, grandchild];
    for id in ids {
        e.remove(id);
    }
    let mut snapshots = Vec::new();
    let result = (|| {
        run_memfill(e, src)?;
        e.chalkctl_json(&["fork", "--id", src, "--fork-id", "cws"])?;
        // Its snapshot copies what it maps of its own snapshot into its memory first.
        let snap = e.snapshot_of(fork)?;
        snapshots.push(snap.clone());
        e.chalkctl_json(&["fork", "--snapshot-id", &snap, "--fork-id", "cwg"])?;
        for id in [fork, grandchild] {
            let v = verify(e, id)?;
            ensure!(v == "ok 0", "{id}: {v}");
        }
        Ok(())
    })();
    e.conclude(result, &ids, &snapshots)
}

/// The bytes of memory the `nth` checkpoint of `id` took from the pages file the sandbox
/// maps, rather than have runsc write them (the shim's `chalk-timing op=checkpoint`).
fn from_base_bytes(e: &Env, id: &str, nth: usize) -> Result<u64, Failed> {
    let t = e
        .c
        .chalk_timing("checkpoint", id, nth, Duration::from_secs(10))
        .ok_or_else(|| Failed::from(format!("no checkpoint {nth} of {id} in the shim's log")))?;
    t.get("from_base_bytes")
        .map(|&b| b as u64)
        .ok_or_else(|| Failed::from(format!("no from_base_bytes in checkpoint {nth} of {id}")))
}

fn a_snapshot_of_a_fork_writes_only_what_it_changed(e: &Env) -> TestResult {
    const CHANGE: u64 = 16;
    let src = "cowd-src";
    let (fork, child, grandchild) = ("cwd", "cwd-c", "cwd-g");
    let ids = [src, fork, child, grandchild];
    for id in ids {
        e.remove(id);
    }
    let mut snapshots = Vec::new();
    let result = (|| {
        let (mb, change) = (MB.to_string(), CHANGE.to_string());
        let mut args = vec!["--output", "json"];
        args.extend(memfill::run_args(src, &[&mb, &change]));
        let out = e.chalkctl(&args);
        ensure!(out.code == 0, "run {src}: {out:?}");
        wait_for(e, src, "/tmp/ready", Duration::from_secs(120), |s| {
            s == "ready"
        })?;
        e.chalkctl_json(&["fork", "--id", src, "--fork-id", fork])?;
        // Two rounds: the fork changes 16 MB, is snapshotted running, and each snapshot is
        // forked again. Both are deltas against the pages the fork maps (its parent's).
        for (round, restored) in [(1, child), (2, grandchild)] {
            sh(e, fork, "rm -f /tmp/rewritten; kill -USR2 1")?;
            wait_for(e, fork, "/tmp/rewritten", Duration::from_secs(120), |s| {
                s.starts_with(&format!("{round} "))
            })?;
            let snap = e.snapshot_of(fork)?;
            snapshots.push(snap.clone());
            let from_base = from_base_bytes(e, fork, round - 1)?;
            ensure!(
                from_base >= (MB - CHANGE - 8) << 20,
                "snapshot {round} of a fork that changed {CHANGE} of {MB} MB took only \
                 {from_base} bytes from the pages it maps: runsc wrote the rest"
            );
            // The fork runs on, its memory as it was, still shared.
            let v = verify(e, fork)?;
            ensure!(
                v == format!("ok {round}"),
                "{fork} after snapshot {round}: {v}"
            );
            e.chalkctl_json(&["fork", "--snapshot-id", &snap, "--fork-id", restored])?;
            let v = verify(e, restored)?;
            ensure!(
                v == format!("ok {round}"),
                "{restored}, from snapshot {round}: {v}"
            );
        }
        let v = verify(e, src)?;
        ensure!(v == "ok 0", "{src}: {v}");
        Ok(())
    })();
    e.conclude(result, &ids, &snapshots)
}

/// Sums /tmp/fill in `id`.
fn sum_of_fill(e: &Env, id: &str) -> Result<String, Failed> {
    let out = sh(e, id, "sha256sum /tmp/fill")?;
    Ok(out
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string())
}

fn files_in_memory_share_until_written(e: &Env) -> TestResult {
    let src = "cowf-src";
    let forks = ["cf-1", "cf-2", "cf-3"];
    let grandchild = "cfg";
    let mut ids = vec![src, grandchild];
    ids.extend(forks);
    for id in &ids {
        e.remove(id);
    }
    let mut snapshots = Vec::new();
    let result = (|| {
        // Random data, so nothing but the snapshot can hold it; /tmp is in the sandbox's
        // memory.
        let fill = format!(
            "dd if=/dev/urandom of=/tmp/fill bs=1048576 count={MB} iflag=fullblock 2>/dev/null \
             && echo ready > /tmp/ready; exec sleep 100000"
        );
        let out = e.chalkctl(&[
            "run",
            "--net",
            "none",
            MEMFILL_IMAGE,
            src,
            "--",
            "sh",
            "-c",
            &fill,
        ]);
        ensure!(out.code == 0, "run {src}: {out:?}");
        wait_for(e, src, "/tmp/ready", Duration::from_secs(120), |s| {
            s == "ready"
        })?;
        let sum = sum_of_fill(e, src)?;
        let before = shmem_mb()?;
        let out = e.chalkctl_json(&["fork", "--id", src, "--fork-id", "cf", "--count", "3"])?;
        ensure!(out.to_string().contains("cf-3"), "fork: {out}");
        for f in forks {
            let got = sum_of_fill(e, f)?;
            ensure!(
                got == sum,
                "{f}'s /tmp/fill after the fork sums to {got}, not {sum}"
            );
        }
        let forked = shmem_mb()?;
        ensure!(
            forked.saturating_sub(before) < MB / 2,
            "3 forks of a sandbox with {MB} MB of files grew the host's shared memory by {} MB \
             ({before} -> {forked}): they hold copies",
            forked.saturating_sub(before)
        );
        // A fork that rewrites part of the file gets its own copy of that part only; the
        // others keep the snapshot's.
        sh(
            e,
            forks[0],
            "dd if=/dev/zero of=/tmp/fill bs=1048576 count=64 seek=16 conv=notrunc 2>/dev/null",
        )?;
        let rewritten = shmem_mb()?;
        let grew = rewritten.saturating_sub(forked);
        ensure!(
            (48..MB / 2).contains(&grew),
            "rewriting 64 MB of the file added {grew} MB of shared memory, not a copy of 64 MB"
        );
        let got = sum_of_fill(e, forks[0])?;
        ensure!(
            got != sum,
            "{}: its rewrite left the sum unchanged",
            forks[0]
        );
        let zeros = sh(
            e,
            forks[0],
            "dd if=/tmp/fill bs=1048576 skip=16 count=64 2>/dev/null | tr -d '\\0' | wc -c",
        )?;
        ensure!(
            zeros == "0",
            "{}: the rewritten part is not zeros ({zeros} other bytes)",
            forks[0]
        );
        // Truncation drops a fork's file without touching its siblings'.
        sh(e, forks[2], ": > /tmp/fill")?;
        let size = sh(e, forks[2], "wc -c < /tmp/fill")?;
        ensure!(
            size == "0",
            "{}: /tmp/fill is {size} bytes after truncation",
            forks[2]
        );
        for id in [forks[1], src] {
            let got = sum_of_fill(e, id)?;
            ensure!(
                got == sum,
                "{id}: after its siblings' writes, /tmp/fill sums to {got}"
            );
        }
        // A snapshot of a fork copies the file into its memory first, and restores.
        let snap = e.snapshot_of(forks[1])?;
        snapshots.push(snap.clone());
        e.chalkctl_json(&["fork", "--snapshot-id", &snap, "--fork-id", grandchild])?;
        let got = sum_of_fill(e, grandchild)?;
        ensure!(
            got == sum,
            "{grandchild}: a fork of a fork's snapshot sums to {got}"
        );
        testkit::note(format!(
            "shmem {before} MB -> 3 forks {forked} MB -> one rewrote 64 MB {rewritten} MB"
        ));
        Ok(())
    })();
    e.conclude(result, &ids, &snapshots)
}

/// packaging/gvisor's overlay patch: a file copied up keeps its inode number, so git's hard
/// links of a local repository in the image are the files they link, and the plain clone
/// works; its checkout and index are whole in a fork.
fn a_local_git_clone_works_and_survives_a_fork(e: &Env) -> TestResult {
    use chalk_integration::debian::{COUNT_PY, DEBIAN_IMAGE};
    let (id, fork) = ("cow-git", "cow-git-f");
    e.remove(id);
    e.remove(fork);
    let result = (|| {
        let mut run = vec!["run", DEBIAN_IMAGE, id, "--"];
        run.extend_from_slice(COUNT_PY);
        let out = e.chalkctl(&run);
        ensure!(out.code == 0, "run: {out:?}");
        sh(e, id, "git clone -q /srv/app.git /workspace/app")?;
        // The objects are hard links of the image's: one inode, as on Linux's overlayfs.
        let links = sh(
            e,
            id,
            "cd /workspace/app/.git/objects && find . -type f -links +1 | wc -l",
        )?;
        ensure!(
            links.parse::<u32>().unwrap_or(0) > 0,
            "no object of the clone is a hard link: {links}"
        );
        let tests = sh(
            e,
            id,
            "cd /workspace/app && python3 -m pytest -q -p no:cacheprovider",
        )?;
        ensure!(tests.contains("4 passed"), "pytest: {tests}");
        let out = e.chalkctl(&["fork", "--id", id, "--fork-id", fork]);
        ensure!(out.code == 0, "fork: {out:?}");
        let fsck = sh(
            e,
            fork,
            "cd /workspace/app && git fsck --no-dangling && git status --porcelain",
        )?;
        ensure!(fsck.is_empty(), "the fork's clone: {fsck}");
        // A second clone in the fork links the same image files again.
        sh(e, fork, "git clone -q /srv/app.git /workspace/again")?;
        Ok(())
    })();
    e.conclude(result, &[id, fork], &[])
}
