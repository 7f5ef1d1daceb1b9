//! Fork trees: every sandbox, a fork or a resumed one, can be snapshotted, forked, suspended
//! and resumed again, knows where it came from, may have a lifetime, and leaves nothing of
//! its snapshots behind in containerd's temporary directory.

use chalk_integration::Containerd;

use super::*;

/// The files a level of the tree wrote, as `cat` prints them.
fn levels(e: &Env, id: &str) -> String {
    e.sh(id, "levels", "cat /workspace/level-* 2>/dev/null")
        .stdout
}

/// containerd's unpacked checkpoints (from this test run) of sandboxes `of`.
fn unpacked_of(e: &Env, of: &[&str]) -> Vec<(PathBuf, u64)> {
    e.c.unpacked_checkpoints()
        .into_iter()
        .filter(|(dir, _)| {
            let m = std::fs::read(dir.join("chalk.manifest.json")).unwrap_or_default();
            let m: serde_json::Value = serde_json::from_slice(&m).unwrap_or_default();
            of.iter().any(|id| m["source"]["container_id"] == *id)
        })
        .collect()
}

/// source -> fork -> fork of the fork -> suspend and resume of that -> fork again: each goes on
/// from its parent's counter and files, and the tree, the lineage and the intermediate
/// snapshots read as they should.
pub fn fork_tree_four_levels_deep(e: &Env) -> TestResult {
    let ids = ["tree-0", "tree-1", "tree-2", "tree-3", "tree-k"];
    for id in ids {
        e.remove(id);
    }
    let mut taken = Vec::new();
    let result = (|| {
        let ran = e.chalkctl_json(&["run", IMAGE, ids[0], "--", "sh", "-c", COUNTER])?;
        ensure!(ran["status"] == "running", "run: {ran}");
        e.count_reaches(ids[0], 3)?;
        e.sh(ids[0], "l", "echo 0 > /workspace/level-0");
        let mut timings = Vec::new();
        let mut expected = "0\n".to_string();
        for level in 1..=3 {
            let (parent, child) = (ids[level - 1], ids[level]);
            let at = e.count(parent)?;
            if level == 3 {
                // The parent, a fork of a fork, is suspended and resumed first.
                let started = Instant::now();
                let suspended = e.suspend_and_resume(parent)?;
                timings.push(format!(
                    "suspend+resume {parent} {:.2}s",
                    started.elapsed().as_secs_f64()
                ));
                taken.push(suspended);
                ensure!(e.count(parent)? >= at, "resumed {parent} lost its counter");
                ensure!(
                    levels(e, parent) == expected,
                    "resumed {parent}'s files: {:?}",
                    levels(e, parent)
                );
            }
            let started = Instant::now();
            let out = e.chalkctl_json(&["fork", "--id", parent, "--fork-id", child])?;
            timings.push(format!(
                "fork {parent} -> {child} {:.2}s",
                started.elapsed().as_secs_f64()
            ));
            ensure!(out["snapshot"]["kept"] == false, "fork --id: {out}");
            ensure!(
                e.task_status(child).as_deref() == Some("RUNNING"),
                "{child} is {:?}",
                e.task_status(child)
            );
            let n = e.count(child)?;
            ensure!(n >= at, "{child} counts from {n}, its parent was at {at}");
            e.count_reaches(child, n + 2)?;
            ensure!(
                levels(e, child) == expected,
                "{child} has {:?} of its ancestors' files, not {expected:?}",
                levels(e, child)
            );
            e.sh(
                child,
                "l",
                &format!("echo {level} > /workspace/level-{level}"),
            );
            // A change in the child reaches neither its parent nor the tree above.
            ensure!(
                levels(e, parent) == expected,
                "{parent} sees {child}'s files"
            );
            expected.push_str(&format!("{level}\n"));
        }
        eprintln!("fork tree timings: {}", timings.join(", "));

        // Lineage: get, list -o json and the tree.
        // `fork --id` forks from runsc's files and keeps no snapshot: the parent sandbox is
        // the lineage.
        let got = e.chalkctl_json(&["get", "--id", ids[3]])?;
        ensure!(
            got["parent_sandbox_id"] == ids[2] && got["parent_snapshot_id"].is_null(),
            "lineage of {}: {got}",
            ids[3]
        );
        let listed = e.chalkctl_json(&["list"])?;
        let row = listed["sandboxes"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|s| s["id"] == ids[2])
            .cloned()
            .unwrap_or_default();
        ensure!(row["parent_sandbox_id"] == ids[1], "list: {row}");
        let root = e.chalkctl_json(&["get", "--id", ids[0]])?;
        ensure!(
            root["parent_sandbox_id"].is_null(),
            "the source has a parent: {root}"
        );
        let tree = e.chalkctl_json(&["tree", "--id", ids[0]])?;
        let mut node = &tree["tree"][0];
        for id in &ids[..4] {
            ensure!(
                node["id"] == *id && node["status"] == "running",
                "tree at {id}: {tree}"
            );
            node = &node["children"][0];
        }
        let drawn = e.chalkctl(&["tree", "--id", ids[1]]);
        ensure!(
            drawn.code == 0
                && drawn.stdout.lines().count() == 3
                && drawn.stdout.contains(&format!("`-- {}", ids[2])),
            "tree --id {}: {drawn:?}",
            ids[1]
        );
        let table = e.chalkctl(&["list"]);
        ensure!(
            table.code == 0 && table.stderr.is_empty() && table.stdout.contains(ids[3]),
            "list: {table:?}"
        );

        // The intermediate snapshots are gone; --keep-snapshot keeps one.
        for id in &ids[..3] {
            let left = e.chalkctl_json(&["snapshot", "list", "--sandbox-id", id])?;
            let n = left["items"].as_array().map_or(0, Vec::len);
            let want = usize::from(*id == ids[2]); // its suspend snapshot
            ensure!(n == want, "{id} has {n} snapshots left: {left}");
        }
        let kept = e.chalkctl_json(&[
            "fork",
            "--id",
            ids[3],
            "--fork-id",
            ids[4],
            "--keep-snapshot",
        ])?;
        let digest = kept["snapshot"]["id"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        taken.push(digest.clone());
        ensure!(kept["snapshot"]["kept"] == true, "{kept}");
        let got = e.chalkctl_json(&["snapshot", "get", "--snapshot-id", &digest])?;
        ensure!(got["status"] == "completed", "kept snapshot: {got}");
        let both = e.chalkctl(&["fork", "--snapshot-id", &digest, "--id", ids[4]]);
        ensure!(
            both.code != 0 && both.stderr.contains("--fork-id"),
            "--snapshot-id with --id: {both:?}"
        );
        Ok(())
    })();
    e.conclude(result, &ids, &taken)
}

/// A lifetime ends in the sandbox's destruction or its suspension; forks inherit it, and a
/// resume starts it again.
pub fn lifetime_destroys_or_suspends_and_forks_inherit_it(e: &Env) -> TestResult {
    let ids = ["life-d", "life-s", "life-sf"];
    for id in ids {
        e.remove(id);
    }
    let mut taken = Vec::new();
    let gone = |id: &str, within: Duration| -> Result<Duration, Failed> {
        let started = Instant::now();
        loop {
            let got = e.chalkctl(&["get", "--id", id]);
            if got.code != 0 && got.stderr.contains("not found") {
                return Ok(started.elapsed());
            }
            ensure!(
                started.elapsed() < within,
                "{id} outlived its lifetime: {got:?}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    let suspended = |id: &str, within: Duration| -> TestResult {
        let started = Instant::now();
        loop {
            let got = e.chalkctl_json(&["get", "--id", id])?;
            if got["status"] == "suspended" {
                return Ok(());
            }
            ensure!(started.elapsed() < within, "{id} was not suspended: {got}");
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    let result = (|| {
        let bad = e.chalkctl(&["run", "--lifetime", "soon", IMAGE, ids[0], "--", "true"]);
        ensure!(bad.code != 0 && bad.stderr.contains("soon"), "{bad:?}");
        let started = Instant::now();
        e.chalkctl_json(&[
            "run",
            "--lifetime",
            "3s",
            IMAGE,
            ids[0],
            "--",
            "sleep",
            "1000",
        ])?;
        let got = e.chalkctl_json(&["get", "--id", ids[0]])?;
        ensure!(
            got["lifetime"] == "3s"
                && got["on_timeout"] == "destroy"
                && got["time_left"].is_string(),
            "get: {got}"
        );
        gone(ids[0], Duration::from_secs(20))?;
        let lived = started.elapsed();
        ensure!(lived >= Duration::from_secs(3), "destroyed after {lived:?}");
        e.assert_clean(ids[0])?;
        eprintln!("lifetime 3s: destroyed after {:.1}s", lived.as_secs_f64());

        e.chalkctl_json(&[
            "run",
            "--lifetime",
            "12s",
            "--on-timeout",
            "suspend",
            IMAGE,
            ids[1],
            "--",
            "sh",
            "-c",
            COUNTER,
        ])?;
        e.count_reaches(ids[1], 3)?;
        e.chalkctl_json(&["fork", "--id", ids[1], "--fork-id", ids[2]])?;
        let got = e.chalkctl_json(&["get", "--id", ids[2]])?;
        ensure!(
            got["lifetime"] == "12s" && got["on_timeout"] == "suspend",
            "the fork did not inherit the lifetime: {got}"
        );
        for id in &ids[1..] {
            suspended(id, Duration::from_secs(30))?;
            let snaps = e.chalkctl_json(&["get", "--id", id])?;
            for s in snaps["snapshots"].as_array().into_iter().flatten() {
                taken.push(s["id"].as_str().unwrap_or_default().to_string());
            }
            ensure!(
                snaps["snapshots"][0]["labels"]["reason"] == "lifetime",
                "{id}'s suspend snapshot: {snaps}"
            );
        }
        let before = e.chalkctl_json(&["get", "--id", ids[1]])?["snapshots"][0]["id"]
            .as_str()
            .map(String::from);
        ensure!(before.is_some(), "no suspend snapshot");
        e.chalkctl_json(&["resume", "--id", ids[1]])?;
        let got = e.chalkctl_json(&["get", "--id", ids[1]])?;
        let left = got["time_left"].as_str().unwrap_or("0s");
        ensure!(
            got["status"] == "running" && left != "0s",
            "a resume starts the lifetime again: {got}"
        );
        ensure!(e.count(ids[1])? >= 3, "the counter did not survive");
        Ok(())
    })();
    e.conclude(result, &ids, &taken)
}

/// The lifetime's timer is the shim's: a containerd restarted meanwhile does not lose it.
pub fn lifetime_survives_a_containerd_restart(_e: &Env) -> TestResult {
    // A containerd of its own: the restart must not disturb the other tests.
    let mut c = Containerd::start().map_err(|e| e.to_string())?;
    c.import_busybox().map_err(|e| e.to_string())?;
    let id = "life-restart";
    let chalkctl = Containerd::chalkctl;
    let out = chalkctl(
        &c,
        &["run", "--lifetime", "6s", IMAGE, id, "--", "sleep", "1000"],
    );
    ensure!(out.code == 0, "run: {out:?}");
    let started = Instant::now();
    c.restart().map_err(|e| e.to_string())?;
    ensure!(
        c.ctr(["task", "ls"]).stdout.contains(id),
        "the restarted containerd lost the sandbox"
    );
    testkit::wait_gone(&c, id, started, Duration::from_secs(30))?;
    let lived = started.elapsed();
    ensure!(
        lived >= Duration::from_secs(5),
        "destroyed after {lived:?} of 6s"
    );
    eprintln!(
        "lifetime 6s across a containerd restart: destroyed after {:.1}s",
        lived.as_secs_f64()
    );
    Ok(())
}

/// `fork --count` makes its forks with a pool the host's size, refuses what the host's memory
/// cannot hold, and leaves nothing of the snapshot in containerd's temporary directory.
pub fn fork_count_is_pooled_and_leaves_nothing_behind(e: &Env) -> TestResult {
    let src = "pool-src";
    let forks: Vec<String> = (1..=16).map(|i| format!("pool-f-{i}")).collect();
    let all: Vec<&str> = std::iter::once(src)
        .chain(forks.iter().map(String::as_str))
        .collect();
    for id in &all {
        e.remove(id);
    }
    let mut taken = Vec::new();
    let result = (|| {
        e.start_counter(src)?;
        let digest = e.snapshot_of(src)?;
        taken.push(digest.clone());
        let refused = e.chalkctl(&["fork", "--snapshot-id", &digest, "--count", "100000"]);
        ensure!(
            refused.code != 0
                && refused.stderr.contains("MemAvailable")
                && refused.stderr.contains("--force"),
            "100000 forks: {refused:?}"
        );
        let started = Instant::now();
        let out = e.chalkctl_json(&[
            "fork",
            "--snapshot-id",
            &digest,
            "--fork-id",
            "pool-f",
            "--count",
            "16",
        ])?;
        let took = started.elapsed();
        // A pool sized to the host, not a thread per fork.
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
        let pool = out["pool"].as_u64().unwrap_or(0);
        ensure!(
            pool >= 1 && pool <= 2 * cores && pool <= 16,
            "16 forks by a pool of {pool} on {cores} cores: {out}"
        );
        for f in &forks {
            ensure!(
                e.task_status(f).as_deref() == Some("RUNNING"),
                "{f} is {:?}: {out}",
                e.task_status(f)
            );
        }
        eprintln!("fork --count 16: {:.2}s", took.as_secs_f64());
        // Every restore went through containerd's unpacking: nothing of it is left.
        let left = unpacked_of(e, &[src]);
        let bytes: u64 = left.iter().map(|(_, b)| b).sum();
        ensure!(
            left.is_empty(),
            "containerd's temp dir keeps {bytes} bytes: {left:?}"
        );
        eprintln!("after 16 forks, containerd's temp dir holds {bytes} bytes of their snapshot");
        // And so does `ctr container restore`.
        let image = e.chalkctl_json(&["snapshot", "get", "--snapshot-id", &digest])?["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        e.remove(&forks[15]);
        let out = e.restore_live(&forks[15], &image);
        ensure!(out.code == 0, "ctr restore: {out:?}");
        ensure!(
            unpacked_of(e, &[src]).is_empty(),
            "ctr restore left its unpacked checkpoint"
        );
        Ok(())
    })();
    e.conclude(result, &all, &taken)
}

/// Without a network in the options, sandboxes get the one this runsc can give on this host;
/// one it cannot give is refused with what to set.
pub fn defaults_work_without_an_options_file(e: &Env) -> TestResult {
    let dir = e.c.dir();
    let binary = std::env::var("CHALK_RUNSC")
        .ok()
        .filter(|v| !v.is_empty())
        .map(|r| format!("binary_name = \"{r}\"\n"))
        .unwrap_or_default();
    let defaults = e.options_file(
        "defaults.toml",
        &format!(
            "{binary}root = \"{}\"\n",
            dir.join("runsc-defaults").display()
        ),
    );
    let sandbox = e.options_file(
        "sandbox-net.toml",
        &format!(
            "{binary}root = \"{}\"\n[runsc_config]\nplatform = \"ptrace\"\nnetwork = \"sandbox\"\n",
            dir.join("runsc-defaults").display()
        ),
    );
    let id = "defaults";
    e.remove(id);
    let said = || {
        e.c.log()
            .matches("cannot give sandboxes a network of their own")
            .count()
    };
    let before = said();
    let config = format!("--runtime-config-path={}", defaults.display());
    let out = e.run_rm(id, &[&config], &["echo", "hi"]);
    ensure!(
        out.code == 0 && out.stdout == "hi\n",
        "no network in the options: {out:?}"
    );
    let chose_none = said() > before;
    // Debian's runsc (2022, the cell without CHALK_RUNSC) cannot have one on current kernels.
    let old = !testkit::current_runsc();
    ensure!(
        chose_none == old,
        "the shim chose loopback only: {chose_none}, with Debian's runsc: {old}"
    );
    let config = format!("--runtime-config-path={}", sandbox.display());
    let out = e.run_rm(id, &[&config], &["echo", "hi"]);
    if old {
        ensure!(
            out.code != 0
                && out.stderr.contains("network = ")
                && out.stderr.contains("[runsc_config]"),
            "network = sandbox on Debian's runsc: {out:?}"
        );
    } else {
        ensure!(
            out.code == 0 && out.stdout == "hi\n",
            "network = sandbox: {out:?}"
        );
    }
    e.remove(id);
    e.ctr(&["snapshots", "rm", id]);
    e.assert_clean(id)
}
