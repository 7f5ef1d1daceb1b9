//! Pods that start from a snapshot in the node's store (`chalk.io/restore-from`), and those
//! refused before anything is made.

use super::*;

/// `chalk.io/restore-from` on a new pod: its sandbox and each of its containers come up as
/// the snapshot's restore (memory and processes carry on), as a real pod of CRI's; a container
/// the snapshot lacks is refused by name; the source runs on throughout.
pub fn a_pod_starts_from_a_snapshot(e: &CriEnv) -> TestResult {
    let fresh = Instant::now();
    let (source, web, _) = web_and_side(e, "origin")?;
    let fresh_in = fresh.elapsed();
    std::thread::sleep(Duration::from_millis(2500));
    let snapshot = pod_snapshot(e, &source)?;
    let at_snapshot = e.counter(&web)?;

    let started = Instant::now();
    let pod = e.cri.run_pod_with(
        "restored",
        CRI_HANDLER,
        false,
        "default",
        &[(RESTORE_FROM, &snapshot)],
    )?;
    let web2 = e.cri.run_container(&pod, "web", IMAGE, COUNTER)?;
    let side2 = e.cri.run_container(&pod, "side", IMAGE, SIDE)?;
    let running_in = started.elapsed();
    ensure!(
        e.processes_for(&pod) == (1, 1),
        "the restored pod should be one sandbox under one shim: {:?}",
        e.processes_for(&pod)
    );
    // Memory carried on: web's counter from the snapshot's value, side's file.
    let n = e.counter(&web2)?;
    ensure!(
        n + 1 >= at_snapshot,
        "the restored web counts from {n}, the source had {at_snapshot} at the snapshot"
    );
    let r = e
        .cri
        .exec_sync(&side2, &["cat", "/tmp/side"], 10 * SECOND)?;
    ensure!(
        r.stdout == "side-state\n",
        "the restored side lost its memory: {r:?}"
    );
    for id in [&web2, &side2] {
        let s = e.cri.container_status(id)?;
        ensure!(
            s.state == ContainerState::ContainerRunning as i32,
            "{id} is {:?} in the restored pod",
            s.state
        );
    }
    // A container the snapshot does not hold is refused, by name.
    let other = e.cri.create_container(&pod, "intruder", IMAGE, COUNTER)?;
    let refused = e.cri.start_container(&other);
    ensure!(
        refused
            .as_ref()
            .is_err_and(|m| m.contains("\"intruder\"") && m.contains("\"web\"")),
        "a container the snapshot lacks: {refused:?}"
    );
    e.cri.remove_container(&other)?;
    // One of the snapshot's names on another image is refused too: the image must match by
    // digest.
    let wrong = e.cri.run_pod_with(
        "restored-on-another-image",
        CRI_HANDLER,
        false,
        "default",
        &[(RESTORE_FROM, &snapshot)],
    )?;
    let web3 = e
        .cri
        .create_container(&wrong, "web", PAUSE_IMAGE, COUNTER)?;
    let refused = e.cri.start_container(&web3);
    ensure!(
        refused
            .as_ref()
            .is_err_and(|m| m.contains("by digest") && m.contains("\"web\"")),
        "the snapshot's container on another image: {refused:?}"
    );
    // So its containers never join it: its sandbox ends once the wait (8 s here) is over,
    // naming them.
    let waited = Instant::now();
    while e.processes_for(&wrong).1 > 0 {
        ensure!(
            waited.elapsed() < 30 * SECOND,
            "a restored pod whose containers never joined still runs after {:?}",
            waited.elapsed()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let log = e.c.log();
    ensure!(
        log.contains("did not join") && log.contains("\"side\""),
        "the sandbox ended without naming the containers missing"
    );
    e.stop_and_remove(&wrong)?;
    // The source ran on, and both go their own ways.
    ensure!(
        e.counter(&web)? >= at_snapshot,
        "the source stopped counting"
    );
    eprintln!(
        "pod from a snapshot (2 containers) running in {running_in:?}; the same pod fresh in \
         {fresh_in:?}"
    );
    e.stop_and_remove(&pod)?;
    e.stop_and_remove(&source)?;
    e.chalkctl(&["snapshot", "delete", "--snapshot-id", &snapshot]);
    Ok(())
}

/// Checks that the pods named `name` (a refused RunPodSandbox may leave a NotReady record)
/// hold no process, and removes them.
pub(crate) fn remove_refused(e: &CriEnv, name: &str) -> TestResult {
    for left in e.cri.pods_named(name)? {
        ensure!(
            e.processes_for(&left) == (0, 0),
            "the refused pod {name} left processes"
        );
        e.cri.remove_pod(&left)?;
    }
    Ok(())
}

/// A pod whose `chalk.io/restore-from` names a missing snapshot, says no digest, or is in a
/// namespace the node does not allow fails at RunPodSandbox with the reason, and leaves no
/// pod, shim or sandbox (any runsc: this is refused before runsc is asked).
pub fn a_pod_from_a_missing_or_disallowed_snapshot_fails_with_why(e: &CriEnv) -> TestResult {
    let missing = format!("sha256:{}", "0".repeat(64));
    for (name, namespace, value, why) in [
        (
            "from-missing",
            "default",
            missing.as_str(),
            "not a snapshot of this namespace",
        ),
        ("from-a-tag", "default", "latest", "not pinned by digest"),
        (
            "from-elsewhere",
            "other",
            missing.as_str(),
            "may not start pods from snapshots",
        ),
    ] {
        let got = e.cri.run_pod_with(
            name,
            CRI_HANDLER,
            false,
            namespace,
            &[(RESTORE_FROM, value)],
        );
        ensure!(
            got.as_ref().is_err_and(|m| m.contains(why)),
            "pod {name} ({value} in {namespace}): {got:?}"
        );
        remove_refused(e, name)?;
    }
    Ok(())
}
