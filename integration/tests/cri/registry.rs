//! Pods that start from a snapshot in a registry: pulled through the node's registry
//! configuration into its store, and only under the node's trust policy.

use super::*;

/// Two signing keys; the node's policy names the first.
pub struct SigningKeys {
    dir: tempfile::TempDir,
}

impl SigningKeys {
    /// Makes them, and the runtime options that trust the first for `scope`.
    pub fn make(scope: &str) -> Result<(SigningKeys, String), String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        for name in ["trusted.key", "other.key"] {
            sealing::keygen(&dir.path().join(name), true)?;
        }
        let options = sealing::options(None, scope, &dir.path().join("trusted.key.pub"));
        Ok((SigningKeys { dir }, options))
    }

    pub fn key(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }
}

/// `chalk.io/restore-from` naming `REF@sha256:…` on a node whose store lacks the snapshot:
/// the shim pulls it through the node's registry configuration (hosts.toml, credentials)
/// and the pod carries on from it. A snapshot tampered with in the registry, or one the
/// registry does not have, is refused with why, and leaves no record, no pod process.
pub fn a_pod_starts_from_a_registry_snapshot_this_node_lacks(e: &CriEnv) -> TestResult {
    let registry = e.registry.as_ref().ok_or("no registry")?;
    let (source, web, _) = web_and_side(e, "pushed")?;
    std::thread::sleep(Duration::from_millis(2500));
    let snapshot = pod_snapshot(e, &source)?;
    let at_snapshot = e.counter(&web)?;
    let reference = format!("{}/pods/default/pushed:v1", registry.addr);
    let pushed = chalkctl_to_registry(
        e,
        &["snapshot", "push", "--snapshot-id", &snapshot, &reference],
    );
    ensure!(pushed.code == 0, "push: {pushed:?}");
    e.stop_and_remove(&source)?;
    // The digest the push pins (its memory went as pieces: the packed form's, not the id).
    let digest = pushed
        .stdout
        .trim()
        .rsplit_once('@')
        .map(|(_, d)| d.to_string())
        .ok_or_else(|| format!("no digest in what the push printed: {pushed:?}"))?;
    // The sandbox's kernel state, as the registry holds it (fetched whole by any pull).
    let state = registry
        .layer_titled(&digest, "checkpoint.img")
        .ok_or("the registry holds no checkpoint.img of the snapshot")?;
    let deleted = e.chalkctl(&["snapshot", "delete", "--snapshot-id", &snapshot]);
    ensure!(deleted.code == 0, "delete: {deleted:?}");
    let pinned = format!("{}/pods/default/pushed@{digest}", registry.addr);

    let started = Instant::now();
    let pod = e.cri.run_pod_with(
        "pulled",
        CRI_HANDLER,
        false,
        "default",
        &[(RESTORE_FROM, &pinned)],
    )?;
    let pulled_in = started.elapsed();
    let web2 = e.cri.run_container(&pod, "web", IMAGE, COUNTER)?;
    e.cri.run_container(&pod, "side", IMAGE, SIDE)?;
    let running_in = started.elapsed();
    // The pull ran in the pulls' cgroup: the server of the memory it left to arrive (alive
    // a while after its file is whole) is still there to say so.
    let servers = serving_processes();
    ensure!(
        !servers.is_empty(),
        "no server of the pod's memory was found"
    );
    for (pid, cgroup) in &servers {
        ensure!(
            cgroup.contains("/chalk-pulls"),
            "the server of the pod's memory (pid {pid}) runs outside chalk-pulls: {cgroup}"
        );
    }
    let n = e.counter(&web2)?;
    ensure!(
        n + 1 >= at_snapshot,
        "the pulled pod counts from {n}, the source had {at_snapshot}"
    );
    let list = e.chalkctl(&["snapshot", "list", "-o", "json"]);
    ensure!(
        list.stdout.contains(&snapshot),
        "the pulled snapshot has no record on this node: {list:?}"
    );
    println!(
        "pod from {pinned}: sandbox (pull included) in {pulled_in:?}, both containers running \
         in {running_in:?}"
    );
    e.stop_and_remove(&pod)?;
    let deleted = e.chalkctl(&["snapshot", "delete", "--snapshot-id", &snapshot]);
    ensure!(
        deleted.code == 0,
        "delete of the pulled snapshot: {deleted:?}"
    );

    // A digest the registry does not hold, then the snapshot's state altered in the
    // registry's storage.
    let absent = format!(
        "{}/pods/default/pushed@sha256:{}",
        registry.addr,
        "1".repeat(64)
    );
    let mut bytes = std::fs::read(&state).map_err(|err| err.to_string())?;
    let at = bytes.len() / 2;
    bytes[at] ^= 0xff;
    std::fs::write(&state, bytes).map_err(|err| err.to_string())?;
    for (name, value) in [("from-absent", &absent), ("from-tampered", &pinned)] {
        let got = e.cri.run_pod_with(
            name,
            CRI_HANDLER,
            false,
            "default",
            &[(RESTORE_FROM, value)],
        );
        ensure!(
            got.as_ref()
                .is_err_and(|m| m.contains("could not be pulled")),
            "pod {name} ({value}): {got:?}"
        );
        remove_refused(e, name)?;
        let list = e.chalkctl(&["snapshot", "list", "-o", "json"]);
        ensure!(
            !list.stdout.contains(&snapshot),
            "the refused pull of {value} left a record: {list:?}"
        );
    }
    Ok(())
}

/// The `chalkctl serve-lazy` processes running, with their cgroups.
fn serving_processes() -> Vec<(String, String)> {
    procs::processes()
        .into_iter()
        .filter(|(_, args)| args.iter().any(|a| a == "serve-lazy"))
        .map(|(pid, _)| {
            let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
            (pid.to_string(), cgroup)
        })
        .collect()
}

/// The node's `[trust]` rule names one key for the registry's `signed/`: a restore-from pod
/// of a snapshot there unsigned, or signed by another key, fails with the policy's refusal
/// (what the kubelet shows in the pod's events), as do a signature changed in the registry,
/// one moved onto another snapshot, and an encrypted snapshot on a node with no key; signed
/// by the named key, the pod starts from it.
pub fn a_pod_starts_only_from_a_snapshot_its_node_trusts(e: &CriEnv) -> TestResult {
    let registry = e.registry.as_ref().ok_or("no registry")?;
    let keys = e.keys.as_ref().ok_or("no keys")?;
    let (source, web, _) = web_and_side(e, "trusted")?;
    let snapshot = pod_snapshot(e, &source)?;
    let later = pod_snapshot(e, &source)?;
    // `snap` pushed to `repo:tag`: `repo@digest`, as a pod names it.
    let push_as = |snap: &str, repo: &str, extra: &[&str]| -> Result<String, Failed> {
        let reference = format!("{}/{repo}", registry.addr);
        let mut args = vec!["snapshot", "push", "--snapshot-id", snap, &reference];
        args.extend_from_slice(extra);
        let out = chalkctl_to_registry(e, &args);
        ensure!(out.code == 0, "push to {reference}: {out:?}");
        let digest = out
            .stdout
            .trim()
            .rsplit('@')
            .next()
            .unwrap_or_default()
            .to_string();
        let name = repo.split(':').next().unwrap_or_default();
        Ok(format!("{}/{name}@{digest}", registry.addr))
    };
    let pinned = |repo: &str, extra: &[&str]| push_as(&snapshot, repo, extra);
    // A signature's path in the registry (cosign's tag).
    let sig = |repo: &str, pinned: &str| {
        let hex = pinned
            .rsplit("sha256:")
            .next()
            .unwrap_or_default()
            .to_string();
        format!("{repo}/manifests/sha256-{hex}.sig")
    };
    let (other, trusted) = (keys.key("other.key"), keys.key("trusted.key"));
    let recipient = chalkctl_to_registry(e, &["snapshot", "keygen", "--out", &keys.key("age.key")]);
    ensure!(recipient.code == 0, "keygen: {recipient:?}");
    let cases = [
        (
            pinned("signed/default/unsigned:v1", &[])?,
            "it has no signature",
        ),
        (
            pinned("signed/default/other:v1", &["--sign", &other])?,
            "does not verify with any of the keys",
        ),
        (
            pinned(
                "pods/default/sealed:v1",
                &["--encrypt-to", recipient.stdout.trim()],
            )?,
            "is encrypted and this host has no key",
        ),
    ];
    // A signature changed in the registry; one moved onto another snapshot's manifest.
    let changed = pinned("signed/default/changed:v1", &["--sign", &trusted])?;
    let mut m = registry.get_manifest(&sig("signed/default/changed", &changed))?;
    sealing::tamper_signature(&mut m);
    registry.put_manifest(&sig("signed/default/changed", &changed), &m)?;
    let signed_first = pinned("signed/default/swapped:v1", &["--sign", &trusted])?;
    let swapped = push_as(&later, "signed/default/swapped:v2", &[])?;
    let moved = registry.get_manifest(&sig("signed/default/swapped", &signed_first))?;
    registry.put_manifest(&sig("signed/default/swapped", &swapped), &moved)?;
    let cases = cases.into_iter().chain([
        (changed, "does not verify with any of the keys"),
        (swapped, "the manifest was changed or swapped after signing"),
    ]);
    let signed = pinned("signed/default/good:v1", &["--sign", &trusted])?;
    e.stop_and_remove(&source)?;
    for snap in [&snapshot, &later] {
        let deleted = e.chalkctl(&["snapshot", "delete", "--snapshot-id", snap]);
        ensure!(deleted.code == 0, "delete: {deleted:?}");
    }
    for (i, (value, why)) in cases.enumerate() {
        let name = format!("untrusted-{i}");
        let got = e.cri.run_pod_with(
            &name,
            CRI_HANDLER,
            false,
            "default",
            &[(RESTORE_FROM, &value)],
        );
        ensure!(
            got.as_ref().is_err_and(|m| m.contains(why)),
            "pod {name} ({value}): {got:?}"
        );
        remove_refused(e, &name)?;
    }
    let list = e.chalkctl(&["snapshot", "list", "-o", "json"]);
    ensure!(
        !list.stdout.contains(&snapshot) && !list.stdout.contains(&later),
        "a refused pull left a record: {list:?}"
    );

    let pod = e.cri.run_pod_with(
        "trusted-2",
        CRI_HANDLER,
        false,
        "default",
        &[(RESTORE_FROM, &signed)],
    )?;
    let web2 = e.cri.run_container(&pod, "web", IMAGE, COUNTER)?;
    e.cri.run_container(&pod, "side", IMAGE, SIDE)?;
    let n = e.counter(&web2)?;
    ensure!(
        n > 0,
        "the trusted pod counts from {n} ({web} was the source)"
    );
    e.stop_and_remove(&pod)?;
    e.chalkctl(&["snapshot", "delete", "--snapshot-id", &snapshot]);
    Ok(())
}
