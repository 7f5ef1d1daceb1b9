//! Snapshots that belong to someone, through the API only: a pod of namespace tenant-b never
//! starts from default's snapshot, whichever way it names it, and learns nothing of it; a
//! golden snapshot the administrator shares restores there; a PodSnapshot pushes only into
//! its namespace's area; and a node's agent cannot touch another node's pods.

use std::{path::PathBuf, time::Duration};

use chalk_integration::{containerd::IMAGE, k8s::until, registry::Secured};
use chalk_labels::{RESTORE_FROM, RESUME_FROM};

use crate::agents::{chalk, kubectl_as};
use crate::kube::*;
use crate::pods::{counter_pod_with, refused, Refusal};
use crate::{Run, TENANT_B};

/// The counter's snapshot (PodSnapshot counter-1): its id and its registry reference.
fn counter_snapshot(c: &chalk_integration::k8s::Cluster) -> Result<(String, String), String> {
    let s = json(c, &["get", "podsnapshot", "counter-1"])?;
    let id = s["status"]["snapshotId"].as_str().unwrap_or_default();
    let from = s["status"]["restoreFrom"].as_str().unwrap_or_default();
    if id.is_empty() || !from.contains('@') {
        return Err(format!("counter-1 has no pushed snapshot: {}", s["status"]));
    }
    Ok((id.to_string(), from.to_string()))
}

pub fn steps(run: &mut Run, registry: &Secured, agents: &[(String, PathBuf)]) {
    let reg = registry.addr.clone();
    let tenant = run.step(&format!("a namespace of another tenant, {TENANT_B}"), |c| {
        let _ = c.kubectl(&["create", "namespace", TENANT_B]);
        until(Duration::from_secs(30), || {
            (c.kubectl(&["get", "serviceaccount", "default", "-n", TENANT_B]).code == 0)
                .then_some(())
        })
        .ok_or("its default service account was not made")?;
        Ok(format!("{TENANT_B} (the nodes' [restore_from] lets default and {TENANT_B} in, each from its own area {reg}/pods/NAMESPACE; {reg}/golden is shared with {TENANT_B})"))
    });
    if !tenant {
        return;
    }
    run.step(
        &format!("pods of {TENANT_B} naming default's snapshot (its id, its registry reference, resume-from of default's Sandbox repository, a reference of {TENANT_B}'s own whose digest the nodes have) are refused, the event naming the rule only; the registry sees no request for default's"),
        |c| {
            let (id, from) = counter_snapshot(c)?;
            let cases = [
                ("b-by-id", RESTORE_FROM, id.clone(), "not a snapshot of this namespace"),
                ("b-by-reference", RESTORE_FROM, from.clone(), "outside the registry prefixes namespace tenant-b"),
                ("b-by-resume", RESUME_FROM, format!("{reg}/sandboxes/default/counter@{id}"), "the pod's own Sandbox's repository"),
                ("b-by-present-digest", RESTORE_FROM, format!("{reg}/pods/{TENANT_B}/counter@{id}"), "could not be pulled"),
            ];
            let mut said = Vec::new();
            for (name, key, value, why) in &cases {
                let before = registry.log_len();
                let event = refused(c, Refusal {
                    key,
                    name,
                    namespace: TENANT_B,
                    from: value,
                    image: IMAGE,
                    reason: "FailedCreatePodSandBox",
                    why,
                })?;
                // What tenant-b does not know of the snapshot: its init container, its
                // containers as the snapshot holds them.
                if event.contains("\"setup\"") || event.contains("holds") {
                    return Err(format!("{name}: the event tells of default's snapshot: {event}"));
                }
                let asked: Vec<String> = registry
                    .requests_since(before)
                    .into_iter()
                    .filter(|r| r.contains("/pods/default/") || r.contains("/sandboxes/default/"))
                    .collect();
                if !asked.is_empty() {
                    return Err(format!("{name}: the registry was asked for default's: {asked:?}"));
                }
                said.push(format!("{name}: {event}"));
            }
            Ok(said.join(" / "))
        },
    );
    run.step(
        &format!("a golden snapshot the administrator shares ({reg}/golden, pushed with chalkctl on the node) restores in {TENANT_B}: Ready, its memory carried on"),
        |c| {
            let (id, _) = counter_snapshot(c)?;
            let node = &c.nodes[0];
            let mut cmd = node.containerd.chalkctl_command().map_err(|e| e.to_string())?;
            registry.client(&mut cmd);
            let to = format!("{reg}/golden/counter:v1");
            let out: chalk_integration::CtrOutput = cmd
                .args(["snapshot", "push", "--snapshot-id", &id, &to])
                .output()
                .map_err(|e| e.to_string())?
                .into();
            if out.code != 0 {
                return Err(format!("push to golden: {out:?}"));
            }
            // The reference the push printed pins its packed form, not the snapshot's id.
            let golden = out.stdout.trim().replace(":v1@", "@");
            let meta = format!("  namespace: {TENANT_B}\n  annotations: {{{RESTORE_FROM}: \"{golden}\"}}\n");
            applied(c, &counter_pod_with("golden", c.nodes[1].name, 0, &meta))?;
            let ready = until(Duration::from_secs(120), || {
                let p = json(c, &["get", "pod", "golden", "-n", TENANT_B]).ok()?;
                let ready = p["status"]["conditions"].as_array().is_some_and(|cs| {
                    cs.iter().any(|c| c["type"] == "Ready" && c["status"] == "True")
                });
                ready.then_some(())
            });
            let n = c.kubectl(&["exec", "-n", TENANT_B, "golden", "-c", "main", "--", "cat", "/tmp/n"]);
            let _ = c.kubectl(&["delete", "pod", "golden", "-n", TENANT_B, "--wait=true"]);
            ready.ok_or("the golden pod is not Ready")?;
            let n: u64 = n.stdout.trim().parse().map_err(|_| format!("its counter: {n:?}"))?;
            Ok(format!("Ready on {} from {golden}, counting from {n} (the snapshot's memory)", c.nodes[1].name))
        },
    );
    run.step(
        "kubectl chalk snapshot --push-to outside the namespace's area, or into the Sandboxes' repositories, fails with the rule",
        |c| {
            let mut said = Vec::new();
            for (name, to, why) in [
                ("counter-elsewhere", format!("{reg}/pods/{TENANT_B}/stolen:v1"), "outside the registry prefixes namespace default"),
                ("counter-sandboxes", format!("{reg}/sandboxes/default/counter:s1"), "only the agents write"),
            ] {
                let got = chalk(c, &["snapshot", "counter", "--name", name, "--push-to", &to]);
                let status = json(c, &["get", "podsnapshot", name]).map(|p| p["status"].clone());
                let _ = c.kubectl(&["delete", "podsnapshot", name, "--wait=true"]);
                let error = status?["error"].as_str().unwrap_or_default().to_string();
                if got.is_ok() || !error.contains(why) {
                    return Err(format!("{name}: {got:?}; status error {error:?}"));
                }
                said.push(format!("{name}: {error}"));
            }
            Ok(said.join(" / "))
        },
    );
    run.step(
        "a node's agent (its token bound to its pod on that node) may annotate its own node's pods, never another node's",
        |c| {
            let (own, kubeconfig) = agents.first().ok_or("no agents")?;
            let other = agents.get(1).map(|(n, _)| n.clone()).ok_or("one node only")?;
            let mine = kubectl_as(c, kubeconfig, &["annotate", "--overwrite", "-n", "chalk-system", "pod", &format!("chalk-agent-{own}"), "chalk.io/checked=yes"]);
            if mine.code != 0 {
                return Err(format!("its own node's pod: {}", mine.stderr));
            }
            let theirs = kubectl_as(c, kubeconfig, &["annotate", "--overwrite", "-n", "chalk-system", "pod", &format!("chalk-agent-{other}"), "chalk.io/checked=yes"]);
            if theirs.code == 0 || !theirs.stderr.contains("only on its own node's pods") {
                return Err(format!("another node's pod: {theirs:?}"));
            }
            let del = kubectl_as(c, kubeconfig, &["delete", "-n", "chalk-system", "pod", &format!("chalk-agent-{other}"), "--wait=false"]);
            if del.code == 0 {
                return Err("it deleted another node's pod".into());
            }
            Ok(format!("{own}'s agent: its own pod annotated; {other}'s refused: {}", theirs.stderr.trim()))
        },
    );
}
