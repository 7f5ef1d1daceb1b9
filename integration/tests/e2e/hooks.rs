//! Checkpoint and restore hooks (chalk-hooks) through real containerd and runsc: in-sandbox
//! hooks from the `chalk.io/hooks` annotation (the test containerd's options allow them),
//! host hooks from an options file.

use super::*;

/// `ctr run -d` of the snapshot tests' counter with `hooks` as its annotation.
fn run_with_hooks(e: &Env, id: &str, hooks: &serde_json::Value, extra: &[&str]) -> CtrOutput {
    let annotation = format!("chalk.io/hooks={hooks}");
    let mut args = vec![
        "run",
        "-d",
        "--runtime",
        RUNTIME,
        "--annotation",
        &annotation,
    ];
    args.extend_from_slice(extra);
    args.extend_from_slice(&[IMAGE, id, "sh", "-c", COUNTER]);
    e.ctr(&args)
}

fn hook_log(e: &Env, id: &str) -> String {
    e.sh(id, "hooklog", "cat /tmp/hooks.log").stdout
}

/// A hook appending `word $CHALK_CONTAINER_ID` to /tmp/hooks.log inside the sandbox.
fn log_hook(stage: &str, word: &str) -> serde_json::Value {
    serde_json::json!({
        "stage": stage,
        "command": ["/bin/sh", "-c", format!("echo {word} $CHALK_CONTAINER_ID >> /tmp/hooks.log")],
    })
}

pub fn hooks_run_around_a_snapshot_and_in_each_fork(e: &Env) -> TestResult {
    let (src, fork) = ("hk-src", "hk-fork");
    for id in [src, fork] {
        e.remove(id);
    }
    let mut taken = Vec::new();
    let result = (|| {
        let hooks = serde_json::json!([
            log_hook("pre-checkpoint", "pre"),
            log_hook("post-checkpoint", "post"),
            log_hook("post-restore", "restored"),
        ]);
        let out = run_with_hooks(e, src, &hooks, &[]);
        ensure!(out.code == 0, "{out:?}");
        std::thread::sleep(Duration::from_millis(300));
        let digest = e.snapshot_of(src)?;
        taken.push(digest.clone());
        ensure!(
            hook_log(e, src) == "pre hk-src\npost hk-src\n",
            "source's log after the snapshot: {:?}",
            hook_log(e, src)
        );
        // The fork starts from the snapshot (taken after `pre`, before `post`) and runs its
        // post-restore hook as itself.
        e.chalkctl_json(&["fork", "--snapshot-id", &digest, "--fork-id", fork])?;
        ensure!(
            hook_log(e, fork) == "pre hk-src\nrestored hk-fork\n",
            "fork's log: {:?}",
            hook_log(e, fork)
        );
        // Suspend and resume: the resumed sandbox runs post-restore too.
        taken.push(e.suspend_and_resume(src)?);
        ensure!(
            hook_log(e, src) == "pre hk-src\npost hk-src\npre hk-src\nrestored hk-src\n",
            "resumed source's log: {:?}",
            hook_log(e, src)
        );
        Ok(())
    })();
    e.conclude(result, &[src, fork], &taken)
}

pub fn failing_hooks_abort_the_checkpoint_or_fail_the_restore(e: &Env) -> TestResult {
    let ids = [
        "hk-fail",
        "hk-slow",
        "hk-pr",
        "hk-pr-fork",
        "hk-host",
        "hk-denied",
    ];
    for id in ids {
        e.remove(id);
    }
    let mut taken = Vec::new();
    let result = (|| {
        // A pre-checkpoint hook that fails: no snapshot, the error carries its output, the
        // source runs on.
        let failing = serde_json::json!([{"stage": "pre-checkpoint",
            "command": ["/bin/sh", "-c", "echo disk full >&2; exit 3"]}]);
        let out = run_with_hooks(e, ids[0], &failing, &[]);
        ensure!(out.code == 0, "{out:?}");
        let out = e.chalkctl(&["snapshot", "create", "--id", ids[0]]);
        ensure!(
            out.code != 0
                && out.stderr.contains("pre-checkpoint hook")
                && out.stderr.contains("exit 3")
                && out.stderr.contains("disk full"),
            "failing pre-checkpoint hook: {out:?}"
        );
        ensure!(
            e.task_status(ids[0]).as_deref() == Some("RUNNING"),
            "the source stopped"
        );
        let failed = e.chalkctl_json(&["snapshot", "list", "--sandbox-id", ids[0]])?;
        ensure!(failed["items"][0]["status"] == "failed", "{failed}");
        taken.push(
            failed["items"][0]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        );

        // One that hangs: killed at its timeout.
        let slow = serde_json::json!([{"stage": "pre-checkpoint", "command": ["/bin/sleep", "60"],
            "timeout_secs": 1}]);
        let out = run_with_hooks(e, ids[1], &slow, &[]);
        ensure!(out.code == 0, "{out:?}");
        let started = Instant::now();
        let out = e.chalkctl(&["snapshot", "create", "--id", ids[1]]);
        ensure!(
            out.code != 0 && out.stderr.contains("timed out after 1 s"),
            "hanging pre-checkpoint hook: {out:?}"
        );
        ensure!(
            started.elapsed() < Duration::from_secs(20),
            "the timeout did not hold"
        );
        ensure!(
            e.task_status(ids[1]).as_deref() == Some("RUNNING"),
            "the source stopped"
        );
        let list = e.chalkctl_json(&["snapshot", "list", "--sandbox-id", ids[1]])?;
        taken.push(
            list["items"][0]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        );

        // A post-restore hook that fails: the fork fails with its output and is gone.
        let bad_restore = serde_json::json!([{"stage": "post-restore",
            "command": ["/bin/sh", "-c", "echo no identity >&2; exit 4"]}]);
        let out = run_with_hooks(e, ids[2], &bad_restore, &[]);
        ensure!(out.code == 0, "{out:?}");
        let digest = e.snapshot_of(ids[2])?;
        taken.push(digest.clone());
        let out = e.chalkctl(&["fork", "--snapshot-id", &digest, "--fork-id", ids[3]]);
        let all = format!("{}{}", out.stdout, out.stderr);
        ensure!(
            out.code != 0 && all.contains("post-restore hook") && all.contains("no identity"),
            "failing post-restore hook: {out:?}"
        );
        ensure!(
            e.task_status(ids[3]).is_none(),
            "the failed fork is still there"
        );
        let left = e.leftovers(ids[3]);
        ensure!(left.is_empty(), "the failed fork left {left:?}");

        // Host hooks come from the options only; they get the stage, ids and directory.
        let marker = e.c.dir().join("host-hook.out");
        let hook = format!(
            "[[hooks]]\nstage = \"pre-checkpoint\"\nplace = \"host\"\n\
             command = [\"/bin/sh\", \"-c\", \"echo $CHALK_STAGE $CHALK_CONTAINER_ID ${{CHALK_SNAPSHOT_DIR:+dir}} > {}\"]\n",
            marker.display()
        );
        let opts = e.options_with("hooks.toml", &hook)?;
        e.run_detached_with(ids[4], &opts, &["sh", "-c", COUNTER])?;
        taken.push(e.snapshot_of(ids[4])?);
        let got = std::fs::read_to_string(&marker).unwrap_or_default();
        ensure!(
            got == "pre-checkpoint hk-host dir\n",
            "host hook wrote {got:?}"
        );

        // An annotation may not ask for the host.
        let host = serde_json::json!([{"stage": "pre-checkpoint", "place": "host",
            "command": ["/bin/true"]}]);
        let out = run_with_hooks(e, ids[5], &host, &[]);
        ensure!(
            out.code != 0 && out.stderr.contains("only in the sandbox"),
            "host hook by annotation: {out:?}"
        );
        Ok(())
    })();
    e.conclude(result, &ids, &taken)
}

/// The shipped fork-identity example (hooks/examples/fork-identity.json): each fork gets its
/// own machine id and hostname; the source keeps its own.
pub fn fork_identity_example_gives_each_fork_its_own(e: &Env) -> TestResult {
    let (src, forks) = ("hk-ident", ["hk-ident-f-1", "hk-ident-f-2"]);
    e.remove(src);
    for f in forks {
        e.remove(f);
    }
    let mut taken = Vec::new();
    let result = (|| {
        let example: serde_json::Value =
            serde_json::from_str(include_str!("../../../hooks/examples/fork-identity.json"))
                .map_err(|e| e.to_string())?;
        let out = run_with_hooks(e, src, &example, &[]);
        ensure!(out.code == 0, "{out:?}");
        e.sh(src, "mid", "echo source-id > /etc/machine-id");
        let digest = e.snapshot_of(src)?;
        taken.push(digest.clone());
        e.chalkctl_json(&[
            "fork",
            "--snapshot-id",
            &digest,
            "--fork-id",
            "hk-ident-f",
            "--count",
            "2",
        ])?;
        let identity = |id: &str| {
            e.sh(id, "ident", "cat /etc/machine-id /etc/hostname")
                .stdout
        };
        let (a, b, own) = (identity(forks[0]), identity(forks[1]), identity(src));
        ensure!(
            own.starts_with("source-id\n"),
            "the source changed: {own:?}"
        );
        ensure!(
            a != b && !a.contains("source-id") && !b.contains("source-id"),
            "{a:?} {b:?}"
        );
        ensure!(
            a.trim_end().ends_with("chalk-hkidentf1"),
            "fork 1's hostname: {a:?}"
        );
        ensure!(
            b.trim_end().ends_with("chalk-hkidentf2"),
            "fork 2's hostname: {b:?}"
        );
        Ok(())
    })();
    e.conclude(result, &[src, forks[0], forks[1]], &taken)
}
