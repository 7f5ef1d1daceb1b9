//! What agents run, on a Debian 12 image built from Debian's packages (scripts/debian-image):
//! a Python process holding threads, a large heap, an open SQLite transaction, a child over a
//! unix socket and a pipe, inotify watches, sleepers, unlinked files and /dev/shm; and a git
//! checkout of a Python project whose forks each run its tests with their own change.

use std::sync::OnceLock;

use chalk_integration::debian::{self, carries_on, exec, status, wait_started, DEBIAN_IMAGE};

use super::*;

fn import(e: &Env) -> TestResult {
    static IMPORTED: OnceLock<Result<(), String>> = OnceLock::new();
    IMPORTED
        .get_or_init(|| e.c.import_debian().map_err(|e| e.to_string()))
        .clone()
        .map_err(Failed::from)
}

fn run_debian(e: &Env, id: &str, env: &[&str], cmd: &[&str]) -> TestResult {
    let mut args = vec!["run", "-d", "--runtime", RUNTIME];
    for kv in env {
        args.extend_from_slice(&["--env", kv]);
    }
    args.extend_from_slice(&[DEBIAN_IMAGE, id]);
    args.extend_from_slice(cmd);
    let out = e.ctr(&args);
    ensure!(out.code == 0, "ctr run {id}: {out:?}");
    Ok(())
}

/// Snapshot and two restores of it, then a long suspend and resume: every part of the
/// workload carries on in each, the same process with the same memory.
pub fn debian_workload_carries_on_across_snapshot_fork_and_suspend(e: &Env) -> TestResult {
    let src = "deb-work";
    let forks = ["deb-work-f-1", "deb-work-f-2"];
    let ids = [src, forks[0], forks[1]];
    for id in ids {
        e.remove(id);
    }
    let mut snapshots = Vec::new();
    let result = (|| {
        import(e)?;
        run_debian(e, src, &["HEAP_MB=128"], debian::WORKLOAD)?;
        wait_started(&e.c, src)?;

        let at_snapshot = status(&e.c, src)?;
        let t = Instant::now();
        let digest = e.snapshot_of(src)?;
        let snapshot_took = t.elapsed();
        snapshots.push(digest.clone());
        carries_on(&e.c, src, &at_snapshot, "after-snapshot")?;

        // One snapshot restored twice: two sandboxes carrying on from the same state.
        let t = Instant::now();
        let out = e.chalkctl_json(&[
            "fork",
            "--snapshot-id",
            &digest,
            "--count",
            "2",
            "--fork-id",
            "deb-work-f",
        ])?;
        ensure!(out.to_string().contains(forks[1]), "fork: {out}");
        let fork_took = t.elapsed();
        for fork in forks {
            let now = carries_on(&e.c, fork, &at_snapshot, fork)?;
            // The file the source saw created after the snapshot is not the fork's.
            ensure!(
                !now.inotify_seen().iter().any(|n| n == "after-snapshot"),
                "{fork} saw the source's later file: {:?}",
                now.inotify_seen()
            );
        }
        // And they diverge: a file of one is seen by neither the other nor the source.
        let mark = exec(&e.c, forks[0], &["touch", "/workspace/only-f-1"]);
        ensure!(mark.code == 0, "{mark:?}");
        for other in [forks[1], src] {
            let seen = exec(&e.c, other, &["ls", "/workspace/only-f-1"]);
            ensure!(seen.code != 0, "{other} sees {}'s file", forks[0]);
        }

        // A long suspend: the sleepers wake once resumed, and the wall clock shows the gap.
        let before = status(&e.c, src)?;
        let t = Instant::now();
        let out = e.chalkctl_json(&["suspend", "--id", src])?;
        ensure!(out["status"] == "suspended", "suspend: {out}");
        let suspend_took = t.elapsed();
        snapshots.push(out["snapshot"]["id"].as_str().unwrap_or_default().into());
        std::thread::sleep(Duration::from_secs(6));
        let t = Instant::now();
        let out = e.chalkctl_json(&["resume", "--id", src])?;
        ensure!(out["status"] == "running", "resume: {out}");
        let resume_took = t.elapsed();
        let after = carries_on(&e.c, src, &before, "after-resume")?;
        let wall_gap = after.float("sleep_max_wall_gap");
        ensure!(
            wall_gap >= 6.0,
            "the wall clock did not see a 6 s suspend: the longest gap between ticks was {wall_gap:.2}s"
        );
        // The sleep under way when the sandbox was suspended ends once it runs again.
        let asleep = before.float("long_sleep_started");
        let long = debian::poll(
            Duration::from_secs(20),
            || status(&e.c, src),
            |s| s.float("long_sleep_ended") >= asleep,
        );
        ensure!(
            long.is_ok(),
            "the sleep begun at {asleep} before the suspend never ended: {long:?}"
        );
        testkit::note(format!(
            "128 MB heap: snapshot {snapshot_took:.1?}, two forks {fork_took:.1?}, suspend \
             {suspend_took:.1?}, resume {resume_took:.1?}; across the 6 s suspend the \
             workload's wall clock jumped {wall_gap:.1}s and its monotonic clock {:.1}s",
            after.float("sleep_max_mono_gap")
        ));
        Ok(())
    })();
    snapshots.retain(|s| !s.is_empty());
    e.conclude(result, &ids, &snapshots)
}

/// The seeds' flow: clone a Python project, test it, leave a note, suspend and resume, then
/// three forks each change it and run its tests side by side with three different results.
pub fn debian_git_project_forks_three_ways(e: &Env) -> TestResult {
    let src = "deb-git";
    let forks = ["deb-git-f-1", "deb-git-f-2", "deb-git-f-3"];
    let ids = [src, forks[0], forks[1], forks[2]];
    for id in ids {
        e.remove(id);
    }
    let mut snapshots = Vec::new();
    let result = (|| {
        import(e)?;
        run_debian(e, src, &[], debian::COUNT_PY)?;
        clone(e, src)?;
        let tests = sh(
            e,
            src,
            "cd /workspace/app && python3 -m pytest -q -p no:cacheprovider",
        );
        ensure!(
            tests.code == 0 && tests.stdout.contains("4 passed"),
            "pytest in the clone: {tests:?}"
        );
        let notes = sh(e, src, "echo 'try tabs' > /workspace/app/NOTES.md");
        ensure!(notes.code == 0, "{notes:?}");

        let count = || -> Result<u64, Failed> {
            let out = exec(&e.c, src, &["cat", "/workspace/count.txt"]);
            out.stdout
                .trim()
                .parse()
                .map_err(|_| Failed::from(format!("count.txt: {out:?}")))
        };
        let before = count()?;
        snapshots.push(e.suspend_and_resume(src)?);
        let git = sh(e, src, "cd /workspace/app && git status --porcelain");
        ensure!(
            git.stdout == "?? NOTES.md\n",
            "git status after the resume: {git:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
        let after = count()?;
        ensure!(
            after > before,
            "count.py went from {before} to {after} across suspend and resume"
        );

        let out = e.chalkctl_json(&[
            "fork",
            "--id",
            src,
            "--count",
            "3",
            "--fork-id",
            "deb-git-f",
        ])?;
        ensure!(out.to_string().contains(forks[2]), "fork: {out}");
        // Three changes: none, tabs no longer separate words, and lines and the most common
        // word both counted wrong.
        let changes = [
            "true",
            r#"sed -i 's/^SEPARATORS = .*/SEPARATORS = " \\n"/' tally/__init__.py"#,
            r#"sed -i 's/return text.count("\\n") + .*/return text.count("\\n")/; s/return max(sorted(seen).*/return min(seen)/' tally/__init__.py"#,
        ];
        for (fork, change) in forks.iter().zip(changes) {
            let out = sh(e, fork, &format!("cd /workspace/app && {change}"));
            ensure!(out.code == 0, "change in {fork}: {out:?}");
        }
        let runs: Vec<_> = std::thread::scope(|s| {
            let handles: Vec<_> = forks
                .iter()
                .map(|fork| {
                    s.spawn(move || {
                        sh(
                            e,
                            fork,
                            "cd /workspace/app && python3 -m pytest -q -p no:cacheprovider",
                        )
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("pytest thread"))
                .collect()
        });
        for ((fork, run), want) in
            forks
                .iter()
                .zip(&runs)
                .zip(["4 passed", "1 failed, 3 passed", "2 failed, 2 passed"])
        {
            ensure!(
                run.stdout.contains(want),
                "pytest in {fork}: wanted {want:?}, got {run:?}"
            );
        }
        let git = sh(e, src, "cd /workspace/app && git status --porcelain");
        ensure!(
            git.stdout == "?? NOTES.md\n",
            "the forks' changes reached the source: {git:?}"
        );
        Ok(())
    })();
    snapshots.retain(|s| !s.is_empty());
    e.conclude(result, &ids, &snapshots)
}

fn sh(e: &Env, id: &str, script: &str) -> CtrOutput {
    exec(&e.c, id, &["sh", "-c", script])
}

/// `git clone /srv/app.git /workspace/app`. The repository is in the image, so git's hard
/// links copy its objects up into the sandbox's overlay. Our patched runsc keeps a copied-up
/// file's inode and the plain clone works; on another runsc it fails, as it does with runsc
/// alone, and `--no-hardlinks` is the way around it (docs/troubleshooting.md).
fn clone(e: &Env, id: &str) -> TestResult {
    let plain = sh(e, id, "git clone -q /srv/app.git /workspace/app");
    if testkit::hardlinks_keep_inodes() {
        ensure!(plain.code == 0, "git clone on the patched runsc: {plain:?}");
        return Ok(());
    }
    ensure!(
        plain.code != 0 && plain.stderr.contains("hardlink different from source"),
        "git clone on a runsc without the patch: {plain:?}"
    );
    let out = sh(
        e,
        id,
        "rm -rf /workspace/app && git clone -q --no-hardlinks /srv/app.git /workspace/app",
    );
    ensure!(out.code == 0, "git clone --no-hardlinks: {out:?}");
    Ok(())
}
