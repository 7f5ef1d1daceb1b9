//! chalkctl's snapshot registry against a real containerd and runsc.

use chalk_integration::containerd::chalkctl_binary;

use super::*;

pub fn chalkctl_snapshot_registry(e: &Env) -> TestResult {
    let (src, fork) = ("ctl-src", "ctl-fork");
    let forks = ["ctl-f-1", "ctl-f-2", "ctl-f-3", "ctl-g-1", "ctl-g-2"];
    for id in [src, fork].iter().chain(&forks) {
        e.remove(id);
    }
    let result = (|| {
        e.run_detached(src, &["sh", "-c", COUNTER])?;
        // Three snapshots of one sandbox (containerd 1.6 stores a spec once: chalkctl marks
        // each checkpoint's spec so that it can).
        let mut ids = Vec::new();
        for i in 0..3 {
            let label = format!("n={i}");
            let out = e.chalkctl_json(&["snapshot", "create", "--id", src, "--label", &label])?;
            ensure!(out["status"] == "completed", "create: {out}");
            ids.push(out["id"].as_str().unwrap_or_default().to_string());
        }
        ensure!(
            e.task_status(src).as_deref() == Some("RUNNING"),
            "the source stopped"
        );

        // Pages of two, newest first, until the cursor runs out.
        let first = e.chalkctl_json(&["snapshot", "list", "--sandbox-id", src, "--limit", "2"])?;
        let items = first["items"].as_array().cloned().unwrap_or_default();
        ensure!(
            items.len() == 2 && items[0]["id"] == ids[2].as_str(),
            "page 1: {first}"
        );
        let cursor = first["next_cursor"]
            .as_str()
            .ok_or("no cursor after page 1")?;
        let second = e.chalkctl_json(&[
            "snapshot",
            "list",
            "--sandbox-id",
            src,
            "--limit",
            "2",
            "--cursor",
            cursor,
        ])?;
        let items = second["items"].as_array().cloned().unwrap_or_default();
        ensure!(
            items.len() == 1
                && items[0]["id"] == ids[0].as_str()
                && second["next_cursor"].is_null(),
            "page 2: {second}"
        );
        let failed = e.chalkctl_json(&[
            "snapshot",
            "list",
            "--status",
            "failed",
            "--sandbox-id",
            src,
        ])?;
        ensure!(
            failed["items"].as_array().is_some_and(|i| i.is_empty()),
            "{failed}"
        );

        // get, by a prefix of the digest: labels and the manifest's fields.
        let prefix = &ids[1][..19];
        let got = e.chalkctl_json(&["snapshot", "get", "--snapshot-id", prefix])?;
        ensure!(got["labels"]["n"] == "1", "labels: {got}");
        ensure!(got["manifest"]["kind"] == "snapshot", "manifest: {got}");
        ensure!(got["sandbox_id"] == src, "source: {got}");

        // The snapshot is an image `ctr container restore` can fork from.
        let name = got["name"].as_str().unwrap_or_default();
        let out = e.restore_live(fork, name);
        ensure!(out.code == 0, "ctr restore of a chalkctl snapshot: {out:?}");
        let files = e.sh(fork, "files", "cat /workspace/notes.txt");
        ensure!(files.stdout == "hello\n", "fork's files: {files:?}");

        // fork --count 3: three running sandboxes carrying on from the snapshot.
        let out = e.chalkctl_json(&[
            "fork",
            "--snapshot-id",
            &ids[1],
            "--fork-id",
            "ctl-f",
            "--count",
            "3",
        ])?;
        for f in &forks[..3] {
            ensure!(out.to_string().contains(f), "fork output lacks {f}: {out}");
            ensure!(
                e.task_status(f).as_deref() == Some("RUNNING"),
                "{f} is {:?}",
                e.task_status(f)
            );
            let files = e.sh(f, "files", "cat /workspace/notes.txt");
            ensure!(files.stdout == "hello\n", "{f}'s files: {files:?}");
        }
        // Each fork on its own: one that cannot be made does not undo the other.
        let taken = e.ctr(&["containers", "create", IMAGE, "ctl-g-1", "true"]);
        ensure!(taken.code == 0, "{taken:?}");
        let out = e.chalkctl(&[
            "-o",
            "json",
            "fork",
            "--snapshot-id",
            &ids[1],
            "--fork-id",
            "ctl-g",
            "--count",
            "2",
        ]);
        ensure!(
            out.code != 0 && out.stderr.contains("1 of 2 forks failed"),
            "{out:?}"
        );
        ensure!(
            e.task_status("ctl-g-2").as_deref() == Some("RUNNING"),
            "the second fork did not survive the first's failure: {out:?}"
        );
        let bad = e.chalkctl(&["fork", "--snapshot-id", "sha256:000000000000"]);
        ensure!(bad.code != 0 && bad.stderr.contains("not found"), "{bad:?}");

        // delete removes the record only.
        let del = e.chalkctl(&["snapshot", "delete", "--snapshot-id", &ids[0]]);
        ensure!(del.code == 0, "delete: {del:?}");
        let left = e.chalkctl_json(&["snapshot", "list", "--sandbox-id", src])?;
        ensure!(left["items"].as_array().map(Vec::len) == Some(2), "{left}");
        ensure!(
            e.task_status(src).as_deref() == Some("RUNNING"),
            "delete touched the source"
        );

        // --no-wait: the record is there at once, pending; a background chalkctl completes it.
        let out = e.chalkctl_json(&["snapshot", "create", "--id", src, "--no-wait"])?;
        ensure!(out["status"] == "pending", "--no-wait: {out}");
        let name = out["name"].as_str().unwrap_or_default().to_string();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let got = e.chalkctl_json(&["snapshot", "get", "--snapshot-id", &name])?;
            if got["status"] == "completed" {
                ensure!(got["manifest"]["kind"] == "snapshot", "{got}");
                break;
            }
            ensure!(
                got["status"] != "failed" && Instant::now() < deadline,
                "the background snapshot did not complete: {got}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        e.chalkctl(&["snapshot", "delete", "--snapshot-id", &name]);

        // Failures are clear and non-zero.
        let missing = e.chalkctl(&["snapshot", "create", "--id", "no-such-sandbox"]);
        ensure!(
            missing.code != 0 && missing.stderr.contains("no-such-sandbox: not found"),
            "unknown sandbox: {missing:?}"
        );
        let missing = e.chalkctl(&["snapshot", "get", "--snapshot-id", &ids[0]]);
        ensure!(
            missing.code != 0 && missing.stderr.contains("not found"),
            "{missing:?}"
        );
        let bin = chalkctl_binary().map_err(|e| e.to_string())?;
        let away = Command::new(bin)
            .args([
                "--address",
                "/nonexistent/containerd.sock",
                "snapshot",
                "list",
            ])
            .output()
            .map_err(|e| e.to_string())?;
        let stderr = String::from_utf8_lossy(&away.stderr);
        ensure!(
            !away.status.success() && stderr.contains("/nonexistent/containerd.sock"),
            "unreachable containerd: {stderr}"
        );
        for id in &ids[1..] {
            e.chalkctl(&["snapshot", "delete", "--snapshot-id", id]);
        }
        Ok(())
    })();
    for id in [src, fork].iter().chain(&forks) {
        e.remove(id);
    }
    result?;
    for id in [src, fork].iter().chain(&forks) {
        e.assert_clean(id)?;
    }
    Ok(())
}

pub fn chalkctl_suspend_and_resume(e: &Env) -> TestResult {
    let id = "ctl-susp";
    e.remove(id);
    let result = (|| {
        // Made by chalkctl itself this time.
        let ran = e.chalkctl_json(&["run", IMAGE, id, "--", "sh", "-c", COUNTER])?;
        ensure!(ran["status"] == "running", "run: {ran}");
        std::thread::sleep(Duration::from_millis(500));
        let before: u64 = e
            .sh(id, "count", "cat /tmp/count")
            .stdout
            .trim()
            .parse()
            .unwrap_or(0);
        let out = e.chalkctl_json(&["suspend", "--id", id])?;
        ensure!(out["status"] == "suspended", "suspend: {out}");
        let snapshot = out["snapshot"]["id"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        // Compute released: no task, no runsc process.
        ensure!(
            e.task_status(id).is_none(),
            "suspended {id} still has a task"
        );
        let procs: Vec<String> = e
            .leftovers(id)
            .into_iter()
            .filter(|l| l.starts_with("process"))
            .collect();
        ensure!(procs.is_empty(), "suspended {id} still runs: {procs:?}");
        // It reads suspended, and only `list --all` shows it.
        let got = e.chalkctl_json(&["get", "--id", id])?;
        ensure!(got["status"] == "suspended", "get: {got}");
        ensure!(
            got["snapshots"].as_array().map(Vec::len) == Some(1),
            "get: {got}"
        );
        let listed = e.chalkctl_json(&["list"])?.to_string();
        ensure!(
            !listed.contains(id),
            "list shows the suspended sandbox: {listed}"
        );
        let listed = e.chalkctl_json(&["list", "--all"])?.to_string();
        ensure!(listed.contains(id), "list --all misses it: {listed}");
        // Its snapshot cannot go while it is needed.
        let del = e.chalkctl(&["snapshot", "delete", "--snapshot-id", &snapshot]);
        ensure!(
            del.code != 0 && del.stderr.contains(id) && del.stderr.contains("resume"),
            "delete of a needed snapshot: {del:?}"
        );
        let out = e.chalkctl_json(&["resume", "--id", id])?;
        ensure!(out["status"] == "running", "resume: {out}");
        ensure!(
            e.task_status(id).as_deref() == Some("RUNNING"),
            "resumed {id} is not running"
        );
        let got = e.chalkctl_json(&["get", "--id", id])?;
        ensure!(got["status"] == "running", "get after resume: {got}");
        let missing = e.chalkctl(&["get", "--id", "no-such-sandbox"]);
        ensure!(
            missing.code != 0 && missing.stderr.contains("not found"),
            "{missing:?}"
        );
        let after: u64 = e
            .sh(id, "count2", "cat /tmp/count")
            .stdout
            .trim()
            .parse()
            .unwrap_or(0);
        ensure!(
            after >= before && before > 0,
            "counter went from {before} to {after}"
        );
        let again = e.chalkctl(&["resume", "--id", id]);
        ensure!(
            again.code != 0 && again.stderr.contains("not suspended"),
            "{again:?}"
        );
        let del = e.chalkctl(&["snapshot", "delete", "--snapshot-id", &snapshot]);
        ensure!(del.code == 0, "delete once resumed: {del:?}");
        Ok(())
    })();
    e.remove(id);
    result?;
    e.assert_clean(id)
}

/// The pid of the background `chalkctl snapshot finish` for record `name`.
fn finisher(name: &str) -> Option<i32> {
    chalk_integration::procs::processes()
        .into_iter()
        .find(|(_, args)| args.iter().any(|a| a == "finish") && args.iter().any(|a| a == name))
        .and_then(|(pid, _)| i32::try_from(pid).ok())
}

/// What chalkctl refuses to fork, each with the reason: a failed snapshot, one still in
/// progress, and stored content that no longer matches its digest or its manifest.
pub fn chalkctl_refuses_what_it_cannot_fork(e: &Env) -> TestResult {
    let (src, idle) = ("ctl-ref-src", "ctl-ref-idle");
    let ids = ["ctl-ref-1", "ctl-ref-2", "ctl-ref-3", "ctl-ref-4"];
    for id in [src, idle].iter().chain(&ids) {
        e.remove(id);
    }
    let mut taken = Vec::new();
    let result = (|| {
        // A sandbox with no task: its snapshot fails, and the registry keeps why.
        let made = e.ctr(&[
            "containers",
            "create",
            "--runtime",
            RUNTIME,
            IMAGE,
            idle,
            "true",
        ]);
        ensure!(made.code == 0, "{made:?}");
        let out = e.chalkctl(&["snapshot", "create", "--id", idle]);
        ensure!(out.code != 0 && out.stderr.contains(idle), "{out:?}");
        let failed = e.chalkctl_json(&[
            "snapshot",
            "list",
            "--status",
            "failed",
            "--sandbox-id",
            idle,
        ])?;
        let items = failed["items"].as_array().cloned().unwrap_or_default();
        ensure!(
            items.len() == 1
                && items[0]["sandbox_id"] == idle
                && items[0]["error"].as_str().is_some_and(|e| !e.is_empty()),
            "failed snapshots: {failed}"
        );
        let name = items[0]["name"].as_str().unwrap_or_default().to_string();
        taken.push(name.clone());
        let completed = e.chalkctl_json(&["snapshot", "list", "--status", "completed"])?;
        ensure!(
            !completed.to_string().contains(idle),
            "the status filter let a failed snapshot through: {completed}"
        );
        let out = e.chalkctl(&["fork", "--snapshot-id", &name, "--fork-id", ids[0]]);
        ensure!(
            out.code != 0 && out.stderr.contains("failed") && e.task_status(ids[0]).is_none(),
            "fork of a failed snapshot: {out:?}"
        );

        // Still in progress: the background checkpoint is held stopped while we fork.
        e.run_detached(src, &["sh", "-c", COUNTER])?;
        let out = e.chalkctl_json(&["snapshot", "create", "--id", src, "--no-wait"])?;
        let name = out["name"].as_str().unwrap_or_default().to_string();
        taken.push(name.clone());
        let pid = finisher(&name).ok_or("no background checkpoint process")?;
        // SAFETY: a plain signal to a process we found by its command line.
        unsafe { libc::kill(pid, libc::SIGSTOP) };
        let status = e.chalkctl_json(&["snapshot", "get", "--snapshot-id", &name])?;
        let out = e.chalkctl(&["fork", "--snapshot-id", &name, "--fork-id", ids[1]]);
        unsafe { libc::kill(pid, libc::SIGCONT) };
        ensure!(
            status["status"] != "completed",
            "the checkpoint completed before it could be held: {status}"
        );
        ensure!(
            out.code != 0 && out.stderr.contains("still in progress"),
            "fork of a snapshot in progress: {out:?}"
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        let snap = loop {
            let got = e.chalkctl_json(&["snapshot", "get", "--snapshot-id", &name])?;
            if got["status"] == "completed" {
                break got;
            }
            ensure!(Instant::now() < deadline, "never completed: {got}");
            std::thread::sleep(Duration::from_millis(200));
        };
        let digest = snap["id"].as_str().unwrap_or_default().to_string();

        // Stored content changed in place: the snapshot's OCI manifest (which the record's
        // index names) no longer matches its digest.
        let (stored, _) = e.stored_snapshot(&digest)?;
        let manifest_file = e.store_blob(&stored);
        let manifest = std::fs::read(&manifest_file).map_err(|e| e.to_string())?;
        let mut bent = manifest.clone();
        let last = bent.len() - 2;
        bent[last] = b' ';
        std::fs::write(&manifest_file, &bent).map_err(|e| e.to_string())?;
        let out = e.chalkctl(&["fork", "--snapshot-id", &digest, "--fork-id", ids[2]]);
        std::fs::write(&manifest_file, &manifest).map_err(|e| e.to_string())?;
        ensure!(
            out.code != 0
                && out.stderr.contains("changed or damaged")
                && e.task_status(ids[2]).is_none(),
            "fork of a snapshot whose manifest changed: {out:?}"
        );

        // A flipped byte in the checkpoint's memory image, in place in the store: the blob's
        // identity changed, so the shim hashes it again and refuses it.
        let parsed: serde_json::Value =
            serde_json::from_slice(&manifest).map_err(|e| e.to_string())?;
        let layer = parsed["layers"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|l| l["annotations"]["org.opencontainers.image.title"] == "checkpoint.img")
            .and_then(|l| l["digest"].as_str())
            .ok_or("no checkpoint.img layer in the snapshot's manifest")?
            .to_string();
        let blob = e.store_blob(&layer);
        let bytes = std::fs::read(&blob).map_err(|e| e.to_string())?;
        let mut bent = bytes.clone();
        bent[bytes.len() / 2] ^= 1;
        std::fs::write(&blob, &bent).map_err(|e| e.to_string())?;
        let out = e.chalkctl(&["fork", "--snapshot-id", &digest, "--fork-id", ids[3]]);
        std::fs::write(&blob, &bytes).map_err(|e| e.to_string())?;
        ensure!(
            out.code != 0
                && format!("{}{}", out.stdout, out.stderr).contains("changed or damaged")
                && e.task_status(ids[3]).is_none(),
            "fork of a snapshot whose memory changed: {out:?}"
        );
        let leftovers = e.leftovers(ids[3]);
        ensure!(leftovers.is_empty(), "the refused fork left {leftovers:?}");

        // Put back, it forks.
        let out = e.chalkctl_json(&["fork", "--snapshot-id", &digest, "--fork-id", ids[3]])?;
        ensure!(
            e.task_status(ids[3]).as_deref() == Some("RUNNING"),
            "the intact snapshot did not fork: {out}"
        );
        Ok(())
    })();
    let all: Vec<&str> = [src, idle].into_iter().chain(ids).collect();
    e.conclude(result, &all, &taken)
}
