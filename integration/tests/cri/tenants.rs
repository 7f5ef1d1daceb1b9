//! Snapshots belong to their namespace: a pod of `tenant-b` that names `default`'s snapshot,
//! by any of the ways a pod can name one, is refused before anything of it is read, without
//! the registry seeing a request for it, and without learning anything of it; a golden
//! snapshot the administrator shares restores in `tenant-b`.

use super::*;

/// The second tenant's namespace (the first is `default`).
pub const TENANT_B: &str = "tenant-b";

/// The node's `[restore_from]` keys: two namespaces, each with its own area of the registry,
/// agent-sandbox's repositories apart, a short pull limit.
pub fn restore_from(addr: &str) -> String {
    format!(
        "namespaces = [\"default\", \"{TENANT_B}\"]\nregistries = [\"{addr}/pods/{{namespace}}\", \
         \"{addr}/signed/{{namespace}}\"]\nsuspend_to = \"{addr}/sandboxes\"\npull_secs = 60\n"
    )
}

/// `[trust]` rules for the areas the tests push unsigned snapshots to (a node that restores
/// pods refuses what no rule covers).
pub fn trust(addr: &str) -> String {
    format!(
        "[[trust.rules]]\nscope = \"{addr}/pods\"\nunsigned = \"allow\"\n\
         [[trust.rules]]\nscope = \"{addr}/golden\"\nunsigned = \"allow\"\n"
    )
}

/// Namespace `default`'s pod `secret` holds a secret in memory; a pod of `tenant-b` names its
/// snapshot by the node-store id, by `default`'s registry reference, by `resume-from` of
/// `default`'s Sandbox repository, and by a reference of its own area whose digest the node
/// already has. Each is refused, nothing of `default`'s is read (no request for `default`'s
/// repositories reaches the registry, no blob of the snapshot is fetched), the refusal names
/// no detail of the snapshot, and nothing is left. A golden snapshot shared with `tenant-b`
/// (`[[restore_from.shared]]`) restores there, memory and all.
pub fn a_namespace_never_restores_anothers_snapshot(e: &CriEnv) -> TestResult {
    let registry = e.registry.as_ref().ok_or("no registry")?;
    let addr = &registry.addr;
    let secret = "s3cret-of-default-7731";
    let pod = e.cri.run_pod("secret", CRI_HANDLER, false)?;
    let script = format!("echo {secret} > /tmp/secret; i=0; while true; do i=$((i+1)); echo $i > /tmp/n; sleep 1; done");
    let web = e
        .cri
        .run_container(&pod, "vault", IMAGE, &["/bin/sh", "-c", &script])?;
    std::thread::sleep(Duration::from_millis(1500));
    let snapshot = pod_snapshot(e, &pod)?;
    let pushed = chalkctl_to_registry(
        e,
        &[
            "snapshot",
            "push",
            "--snapshot-id",
            &snapshot,
            &format!("{addr}/pods/default/secret:v1"),
        ],
    );
    ensure!(pushed.code == 0, "push: {pushed:?}");
    let image = e.chalkctl(&["snapshot", "get", "--snapshot-id", &snapshot, "-o", "json"]);
    // What tenant-b does not know of it: its container, what it holds, its base image.
    let details = [
        "vault".to_string(),
        secret.to_string(),
        // Its base image's digest, and its memory blob's.
        serde_json::from_str::<serde_json::Value>(&image.stdout)
            .ok()
            .and_then(|v| v["base_image"].as_str().map(String::from))
            .and_then(|b| b.rsplit('@').next().map(String::from))
            .unwrap_or_else(|| "no-base-image-known".into()),
    ];
    let cases = [
        (
            "b-by-id",
            RESTORE_FROM,
            snapshot.clone(),
            "not a snapshot of this namespace",
        ),
        (
            "b-by-reference",
            RESTORE_FROM,
            format!("{addr}/pods/default/secret@{snapshot}"),
            "outside the registry prefixes namespace tenant-b",
        ),
        (
            "b-by-resume",
            chalk_labels::RESUME_FROM,
            format!("{addr}/sandboxes/default/secret@{snapshot}"),
            "the pod's own Sandbox's repository",
        ),
        (
            "b-by-present-digest",
            RESTORE_FROM,
            format!("{addr}/pods/{TENANT_B}/anything@{snapshot}"),
            "could not be pulled",
        ),
    ];
    for (name, key, value, why) in cases {
        let from = registry.log_len();
        let got = e
            .cri
            .run_pod_with(name, CRI_HANDLER, false, TENANT_B, &[(key, &value)]);
        let said = match &got {
            Err(m) => m.clone(),
            Ok(p) => return Err(format!("{name}: pod {p} started from {value}").into()),
        };
        ensure!(said.contains(why), "{name} ({key} {value}): {said}");
        for d in &details {
            ensure!(
                !said.contains(d.as_str()),
                "{name}: the refusal names {d:?} of default's snapshot: {said}"
            );
        }
        // Other cases run beside this one, on the same registry: only the repositories of
        // default's snapshot, and tenant-b's own area, say anything of this one.
        let requests = registry.requests_since(from);
        let of_default: Vec<&String> = requests
            .iter()
            .filter(|r| r.contains("/pods/default/secret/") || r.contains("/sandboxes/default/"))
            .collect();
        ensure!(
            of_default.is_empty(),
            "{name}: the registry was asked for default's snapshot: {of_default:?}"
        );
        let blobs: Vec<&String> = requests
            .iter()
            .filter(|r| r.contains(&format!("/pods/{TENANT_B}/")) && r.contains("/blobs/"))
            .collect();
        ensure!(blobs.is_empty(), "{name}: blobs were fetched: {blobs:?}");
        // The one case that asks the registry asks it in tenant-b's own area (and shows the
        // registry's log is read at all).
        if name == "b-by-present-digest" {
            ensure!(
                requests
                    .iter()
                    .any(|r| r.contains(&format!("/pods/{TENANT_B}/anything/manifests/"))),
                "{name}: no request for tenant-b's own area was logged: {requests:?}"
            );
        }
        remove_refused(e, name)?;
    }
    // The node's log has what the pods were not told.
    let log = e.c.log();
    ensure!(
        log.contains("refused") && log.contains(&snapshot),
        "the node's log does not say what was refused"
    );
    let list = e.chalkctl(&["snapshot", "list", "-o", "json"]);
    ensure!(
        list.stdout.matches(&snapshot).count() == 1,
        "a refused pull left a record: {list:?}"
    );

    // A golden snapshot: the administrator shares registry prefix golden/ with tenant-b.
    let golden = chalkctl_to_registry(
        e,
        &[
            "snapshot",
            "push",
            "--snapshot-id",
            &snapshot,
            &format!("{addr}/golden/base:v1"),
        ],
    );
    ensure!(golden.code == 0, "push to golden: {golden:?}");
    // What the push pins: its packed form's digest, not the snapshot's id.
    let golden_ref = golden.stdout.trim().replace(":v1@", "@");
    chalk_integration::sealing::add_options(
        &e.c.dir().join("chalk.toml"),
        &format!(
            "[[restore_from.shared]]\nprefixes = [\"{addr}/golden\"]\nnamespaces = [\"{TENANT_B}\"]\n"
        ),
    )?;
    let shared = e.cri.run_pod_with(
        "b-golden",
        CRI_HANDLER,
        false,
        TENANT_B,
        &[(RESTORE_FROM, &golden_ref)],
    )?;
    let vault = e
        .cri
        .run_container(&shared, "vault", IMAGE, &["/bin/sh", "-c", &script])?;
    let r = e
        .cri
        .exec_sync(&vault, &["cat", "/tmp/secret"], 10 * SECOND)?;
    ensure!(
        r.stdout.trim() == secret,
        "the shared golden snapshot's memory is not in tenant-b's pod: {r:?}"
    );
    e.stop_and_remove(&shared)?;
    ensure!(e.counter(&web)? > 0, "default's pod stopped counting");
    e.stop_and_remove(&pod)?;
    e.chalkctl(&["snapshot", "delete", "--snapshot-id", &snapshot]);
    Ok(())
}
