//! The registry's and the disk's faults during a transfer: each on a registry of the case's
//! own (filesystem storage it can fill or stop), ending cleanly and working once it is back.

use super::*;

/// A registry of a fault case's own (filesystem storage under its directory), and chalkctl
/// on a host pointed at it.
pub(crate) struct Own {
    pub(crate) registry: chalk_integration::registry::Secured,
}

impl Own {
    pub(crate) fn start() -> Result<Own, Failed> {
        Self::start_with(&[])
    }

    /// With `env` in the registry's environment (its configuration's overrides).
    pub(crate) fn start_with(env: &[(&str, &str)]) -> Result<Own, Failed> {
        let bin = std::env::var_os("CHALK_REGISTRY")
            .filter(|v| !v.is_empty())
            .ok_or("CHALK_REGISTRY names no registry binary")?;
        let registry = chalk_integration::registry::Secured::start(Path::new(&bin), None, env)?;
        Ok(Own { registry })
    }

    pub(crate) fn reference(&self, repo: &str) -> String {
        format!("{}/{repo}", self.registry.addr)
    }

    pub(crate) fn command(&self, host: &Env, args: &[&str]) -> std::process::Command {
        let mut cmd = host.c.chalkctl_command().expect("chalkctl is built");
        self.registry.client(&mut cmd).args(args);
        cmd
    }

    pub(crate) fn chalkctl(&self, host: &Env, args: &[&str]) -> CtrOutput {
        self.command(host, args)
            .output()
            .expect("run chalkctl")
            .into()
    }

    pub(crate) fn json(&self, host: &Env, args: &[&str]) -> Result<Value, Failed> {
        let mut all = vec!["--output", "json"];
        all.extend_from_slice(args);
        let out = self.chalkctl(host, &all);
        ensure!(out.code == 0, "chalkctl {args:?}: {out:?}");
        serde_json::from_str(&out.stdout).map_err(|e| Failed::from(format!("{e}: {out:?}")))
    }
}

/// A sandbox holding `mb` MB of random bytes in memory (a transfer of its snapshot takes a
/// moment), counting.
pub(crate) fn filled(host: &Env, id: &str, mb: u32) -> TestResult {
    let fill = format!(
        "dd if=/dev/urandom of=/tmp/fill bs=1048576 count={mb} iflag=fullblock 2>/dev/null; \
         {COUNTER}"
    );
    host.run_detached(id, &["sh", "-c", &fill])?;
    let deadline = Instant::now() + std::time::Duration::from_secs(60);
    while host.count(id).unwrap_or(0) < 2 {
        ensure!(Instant::now() < deadline, "{id} does not count");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    Ok(())
}

/// What a failed pull may not leave on `host`: a record, a ref, an ingest, a chalkctl lease.
fn nothing_of_a_failed_pull(host: &Env, sandbox: &str) -> TestResult {
    let listed = host.chalkctl_json(&["snapshot", "list", "--sandbox-id", sandbox])?;
    ensure!(
        listed["items"].as_array().is_some_and(Vec::is_empty),
        "a failed pull left a record: {listed}"
    );
    let store = host.c.snapshot_store();
    for sub in ["refs", "ingest"] {
        let left = files_under(&store.join(sub));
        ensure!(
            left == 0,
            "a failed pull left {left} files in the store's {sub}"
        );
    }
    let leases = host.ctr(&["leases", "ls", "-q"]).stdout;
    ensure!(
        !leases.lines().any(|l| l.starts_with("chalkctl-")),
        "a failed pull left a lease: {leases}"
    );
    Ok(())
}

/// A fresh host (no image, no snapshot) for a case that fills or breaks its store.
/// What chalkctl said went wrong (its `chalkctl:` lines, not its progress).
fn error_of(stderr: &str) -> String {
    let said: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("chalkctl:"))
        .collect();
    said.join(" ")
}

pub(crate) fn fresh_host() -> Result<Env, Failed> {
    Ok(Env {
        c: Containerd::start().map_err(|e| format!("a fresh host: {e}"))?,
    })
}

/// The pull of `reference` on `host` that must work now (after a fault that failed one), and
/// a fork of it that counts on.
fn pull_and_fork(own: &Own, host: &Env, reference: &str, snap: &str, fork: &str) -> TestResult {
    let pulled = own.json(host, &["snapshot", "pull", reference])?;
    ensure!(
        pulled["id"] == snap,
        "the pull that must work now: {pulled}"
    );
    own.json(host, &["fork", "--snapshot-id", snap, "--fork-id", fork])?;
    let n = host.count(fork)?;
    host.count_reaches(fork, n + 2)?;
    Ok(())
}

/// The snapshot store of a fresh host on a 16 MiB filesystem: a pull of a 48 MB snapshot is
/// refused before anything is fetched (the declared sizes against the free space), saying
/// to make room, leaves nothing partial, and succeeds once there is room; the pulled
/// snapshot forks.
pub fn fault_disk_full_during_a_pull_fails_cleanly_and_pulls_after(h: &Hosts) -> TestResult {
    let (id, fork) = ("tr-full-pull", "tr-full-pull-fork");
    let own = Own::start()?;
    let host = fresh_host()?;
    let mut on_a = Vec::new();
    let result = (|| {
        filled(&h.a, id, 48)?;
        let snap = h.a.snapshot_of(id)?;
        on_a.push(snap.clone());
        let reference = own.reference("full/pull:1");
        own.json(
            &h.a,
            &["snapshot", "push", "--snapshot-id", &snap, &reference],
        )?;
        let small = testkit::SmallFs::mount(host.c.snapshot_store(), 16)?;
        let started = Instant::now();
        let out = own.chalkctl(&host, &["snapshot", "pull", &reference]);
        ensure!(
            out.code != 0
                && out.stderr.contains("make room there first")
                && out.stderr.contains("nothing was fetched"),
            "a pull onto a full disk: {out:?}"
        );
        let failed_in = started.elapsed();
        nothing_of_a_failed_pull(&host, id)?;
        small.grow(512)?;
        pull_and_fork(&own, &host, &reference, &snap, fork)?;
        testkit::note(format!(
            "the pull failed in {:.1} s saying: {}; nothing left; with room it pulled and forked",
            failed_in.as_secs_f64(),
            error_of(&out.stderr)
        ));
        let done = host.conclude(Ok(()), &[fork], std::slice::from_ref(&snap));
        drop(small);
        done
    })();
    h.a.conclude(result, &[id], &on_a)
}

/// The registry's disk fills during a push: it fails with the registry's error, the local
/// snapshot is whole (it forks), and once the registry has room the push completes and
/// pulls whole on a fresh host.
pub fn fault_registry_full_during_a_push_fails_cleanly_and_resumes(h: &Hosts) -> TestResult {
    let (id, fork) = ("tr-full-push", "tr-full-push-fork");
    let own = Own::start()?;
    let full = testkit::SmallFs::mount(own.registry.blobs(), 16)?;
    let host = fresh_host()?;
    let mut on_a = Vec::new();
    let result = (|| {
        filled(&h.a, id, 48)?;
        let snap = h.a.snapshot_of(id)?;
        on_a.push(snap.clone());
        let reference = own.reference("full/push:1");
        let out = own.chalkctl(
            &h.a,
            &["snapshot", "push", "--snapshot-id", &snap, &reference],
        );
        ensure!(
            out.code != 0 && !out.stderr.trim().is_empty(),
            "a push to a full registry: {out:?}"
        );
        let said = error_of(&out.stderr);
        let got =
            h.a.chalkctl_json(&["snapshot", "get", "--snapshot-id", &snap])?;
        ensure!(
            got["status"] == "completed",
            "the local snapshot after: {got}"
        );
        full.grow(512)?;
        let pushed = own.json(
            &h.a,
            &["snapshot", "push", "--snapshot-id", &snap, &reference],
        )?;
        let t = &pushed["transfer"];
        let pulled = own.json(
            &host,
            &["fork", "--snapshot", &reference, "--fork-id", fork],
        )?;
        ensure!(
            pulled["forks"][0]["id"] == fork,
            "fork of the pushed snapshot: {pulled}"
        );
        let n = host.count(fork)?;
        host.count_reaches(fork, n + 2)?;
        testkit::note(format!(
            "the push failed saying: {said}; the local snapshot was whole; with room the push \
             sent {} blobs ({} already there) and forked on a fresh host",
            t["blobs_moved"], t["blobs_present"]
        ));
        host.conclude(Ok(()), &[fork], std::slice::from_ref(&snap))
    })();
    drop(full);
    h.a.conclude(result, &[id], &on_a)
}

/// Waits up to 60 s for a file of more than a MB below `dir` (a transfer under way).
fn transfer_under_way(dir: &Path, done: &mut std::process::Child) -> Result<(), Failed> {
    fn big(dir: &Path) -> bool {
        std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| {
                let p = e.path();
                match e.metadata() {
                    Ok(m) if m.is_dir() => big(&p),
                    Ok(m) => m.len() > 1 << 20,
                    Err(_) => false,
                }
            })
    }
    let deadline = Instant::now() + std::time::Duration::from_secs(60);
    while !big(dir) {
        ensure!(
            !done.try_wait().is_ok_and(|s| s.is_some()),
            "the transfer ended before it could be cut"
        );
        ensure!(
            Instant::now() < deadline,
            "no transfer seen under {}",
            dir.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    Ok(())
}

/// The registry killed during a push and during a pull: each fails naming the registry,
/// leaves nothing half-made (the local snapshot whole; no record, ref or ingest on the
/// pulling host), and each completes once the registry is back.
pub fn fault_registry_gone_mid_push_and_mid_pull(h: &Hosts) -> TestResult {
    let (id, fork) = ("tr-gone", "tr-gone-fork");
    let mut own = Own::start()?;
    let host = fresh_host()?;
    let mut on_a = Vec::new();
    let result = (|| {
        filled(&h.a, id, 96)?;
        let snap = h.a.snapshot_of(id)?;
        on_a.push(snap.clone());
        let reference = own.reference("gone/push:1");
        let addr = own.registry.addr.clone();

        let mut push = own
            .command(
                &h.a,
                &["snapshot", "push", "--snapshot-id", &snap, &reference],
            )
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| e.to_string())?;
        transfer_under_way(&own.registry.blobs(), &mut push)?;
        own.registry.stop();
        let out = push.wait_with_output().map_err(|e| e.to_string())?;
        let said = String::from_utf8_lossy(&out.stderr).into_owned();
        ensure!(
            !out.status.success() && said.contains(&addr),
            "a push cut by the registry going away: {said:?}"
        );
        let got =
            h.a.chalkctl_json(&["snapshot", "get", "--snapshot-id", &snap])?;
        ensure!(
            got["status"] == "completed",
            "the local snapshot after: {got}"
        );
        own.registry.serve_again()?;
        let pushed = own.json(
            &h.a,
            &["snapshot", "push", "--snapshot-id", &snap, &reference],
        )?;
        let push_note = format!(
            "push cut: failed saying {:?}; pushed again once back ({} blobs sent, {} already \
             there)",
            error_of(&said),
            pushed["transfer"]["blobs_moved"],
            pushed["transfer"]["blobs_present"]
        );

        let mut pull = own
            .command(&host, &["snapshot", "pull", &reference])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| e.to_string())?;
        transfer_under_way(&host.c.snapshot_store().join("ingest"), &mut pull)?;
        own.registry.stop();
        let out = pull.wait_with_output().map_err(|e| e.to_string())?;
        let said = String::from_utf8_lossy(&out.stderr).into_owned();
        ensure!(
            !out.status.success() && said.contains(&addr),
            "a pull cut by the registry going away: {said:?}"
        );
        nothing_of_a_failed_pull(&host, id)?;
        own.registry.serve_again()?;
        pull_and_fork(&own, &host, &reference, &snap, fork)?;
        testkit::note(push_note);
        testkit::note(format!(
            "pull cut: failed saying {:?}, nothing left; pulled and forked once back",
            error_of(&said)
        ));
        host.conclude(Ok(()), &[fork], std::slice::from_ref(&snap))
    })();
    h.a.conclude(result, &[id], &on_a)
}
