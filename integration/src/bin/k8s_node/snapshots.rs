//! The PodSnapshot steps on two nodes, through kubectl and the API only: chalk-agent on each
//! node, a pod snapshotted and forked into pods the scheduler places, a suspend and a resume
//! on the other node, refusals, and a pod holding 1 GB moved between nodes.

use std::{
    collections::BTreeSet,
    time::{Duration, Instant},
};

use chalk_integration::{
    containerd::IMAGE,
    k8s::{until, Cluster, NODES},
    registry::Secured,
};
use chalk_labels::RESTORE_FROM;

use crate::agents::{chalk, start_agents};
use crate::kube::*;
use crate::pods::*;
use crate::Run;

/// The forks `pods` of the counter (snapshotted at `at_snapshot`), made at `t`: all Running
/// and Ready on both nodes, each counting on with its own hostname, IP and limits inside, its
/// logs and exec working, and the Service listing them with the source.
fn check_forks(
    c: &Cluster,
    pods: &[String],
    t: Instant,
    at_snapshot: u64,
) -> Result<(f64, f64, String), String> {
    if pods.len() != 3 {
        return Err(format!("made {pods:?}"));
    }
    // The first on its own: a single fork's time, beside a fresh pod's.
    let first = all_ready(c, &pods[..1], t)?;
    let secs = all_ready(c, pods, t)?;
    let mut nodes = BTreeSet::new();
    let mut seen = Vec::new();
    for p in pods {
        let node = node_of(c, p)?;
        let n = count(c, p)?;
        if n + 1 < at_snapshot {
            return Err(format!("{p} counts from {n}; the source had {at_snapshot}"));
        }
        let logs = c.kubectl(&["logs", p, "-c", "main"]);
        if logs.code != 0 || !logs.stdout.contains("tick") {
            return Err(format!("logs of {p}: {logs:?}"));
        }
        skipped_init(c, p)?;
        seen.push(format!("on {node} at {n}: {}", inside(c, p, pod_mib(0))?));
        nodes.insert(node);
    }
    if nodes.len() < 2 {
        return Err(format!("all forks on one node: {seen:?}"));
    }
    let slices = json(
        c,
        &[
            "get",
            "endpointslices",
            "-l",
            "kubernetes.io/service-name=counter",
        ],
    )?;
    let ready_eps: usize = slices["items"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .flat_map(|s| s["endpoints"].as_array().cloned().unwrap_or_default())
                .filter(|e| e["conditions"]["ready"] == true)
                .count()
        })
        .unwrap_or(0);
    if ready_eps != 4 {
        return Err(format!(
            "the Service has {ready_eps} ready endpoints, not 4: {seen:?}"
        ));
    }
    Ok((
        first,
        secs,
        format!(
            "the first Ready {first:.2}s and all 3 {secs:.2}s after the command; {}; the \
             Service's EndpointSlices list 4 ready endpoints",
            seen.join("; ")
        ),
    ))
}

pub fn steps(run: &mut Run, registry: &Secured) {
    let c = run.node;
    let dir = match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => {
            run.step("chalk-agent on both nodes", |_| Err(e.to_string()));
            return;
        }
    };
    let mut agents = None;
    let up = run.step(
        "chalk-agent on each node (CRD, RBAC and admission policies from packaging/kubernetes, each node's token bound to a pod on it)",
        |c| {
            let started = start_agents(c, registry, dir.path(), &[], None)?;
            agents = Some(started);
            let role = json(c, &["get", "clusterrole", "chalk-agent"])?;
            let policies = json(c, &["get", "validatingadmissionpolicies"])?;
            Ok(format!(
                "{} agents running as system:serviceaccount:chalk-system:chalk-agent, {} rules, {} admission policies",
                c.nodes.len(),
                role["rules"].as_array().map_or(0, Vec::len),
                policies["items"].as_array().map_or(0, Vec::len)
            ))
        },
    );
    if !up {
        return;
    }
    let (a, b) = (NODES[0].0, NODES[1].0);
    let reg = registry.addr.clone();
    let source_up = run.step(&format!("a counter pod (an init container, then a counter) on node {a}, and a Service selecting it"), |c| {
        applied(c, &counter_pod("counter", a, 0))?;
        applied(c, "apiVersion: v1\nkind: Service\nmetadata: {name: counter}\nspec:\n  selector: {app: counter}\n  ports: [{port: 80}]\n",)?;
        ready(c, "counter", Duration::from_secs(120))?;
        let init = c.kubectl(&["logs", "counter", "-c", "setup"]);
        if !init.stdout.contains("setup-ran") {
            return Err(format!("the init container did not run: {init:?}"));
        }
        std::thread::sleep(Duration::from_secs(3));
        Ok(format!("counting: {}; {}", count(c, "counter")?, inside(c, "counter", pod_mib(0))?))
    });
    if !source_up {
        return;
    }
    let mut at_snapshot = 0;
    let snapped = run.step(
        "kubectl chalk snapshot counter --push-to REGISTRY: the PodSnapshot completes on its node; the pod stays Running and Ready",
        |c| {
            let watch = watch_ready(c.kubeconfig(), c.bins().kubectl.clone(), "counter");
            let before = restarts(&json(c, &["get", "pod", "counter"])?);
            let t = Instant::now();
            let to = format!("{reg}/pods/default/counter:v1");
            let got = chalk(c, &["snapshot", "counter", "--name", "counter-1", "--push-to", &to]);
            let secs = t.elapsed().as_secs_f64();
            at_snapshot = count(c, "counter").unwrap_or(0);
            std::thread::sleep(Duration::from_secs(2));
            let (polls, unready) = watch.end();
            let got = got?;
            let p = json(c, &["get", "pod", "counter"])?;
            let s = &got["status"];
            if s["node"] != a || !s["restoreFrom"].as_str().unwrap_or("").contains('@') {
                return Err(format!("status: {s}"));
            }
            if unready > 0 || restarts(&p) != before || p["status"]["phase"] != "Running" {
                return Err(format!(
                    "the pod was not Ready in {unready} of {polls} polls during its snapshot; restarts {before} -> {}",
                    restarts(&p)
                ));
            }
            Ok(format!(
                "{secs:.2}s through kubectl (agent: snapshot {} ms, push {} ms, {} bytes); Ready in all {polls} polls of the pod during it",
                s["timings"]["snapshotMs"], s["timings"]["pushMs"], s["sizeBytes"]
            ))
        },
    );
    let (mut fork_first, mut fork_secs) = (0.0, 0.0);
    if snapped {
        run.step(
            "kubectl chalk fork counter-1 --count 3: the scheduler places them on both nodes; init containers skipped; Running and Ready, counters carry on, each its own hostname, IP and limits inside, logs, exec, the Service",
            |c| {
                let t = Instant::now();
                let got = chalk(c, &["fork", "counter-1", "--count", "3"])?;
                let pods: Vec<String> = got["pods"]
                    .as_array()
                    .map(|a| a.iter().filter_map(|p| p.as_str().map(String::from)).collect())
                    .unwrap_or_default();
                // The forks go whatever happens: they would skew the next steps' placement.
                let checked = check_forks(c, &pods, t, at_snapshot);
                let mut del = vec!["delete", "pod", "--wait=true", "--ignore-not-found"];
                del.extend(pods.iter().map(String::as_str));
                let _ = c.kubectl(&del);
                let (first, secs, said) = checked?;
                (fork_first, fork_secs) = (first, secs);
                Ok(said)
            },
        );
    }
    let fresh_secs = run.timed_step(
        "a fresh pod of the same spec through the scheduler (for comparison)",
        |c| fresh_start(c, "counter-fresh", 0),
    );
    let mut at_suspend = 0;
    let suspended = run.step(
        &format!("kubectl chalk suspend counter --push-to REGISTRY on {a}: the pod is gone, and nothing of it stays on {a}"),
        |c| {
            let sandbox = sandbox_of(c, "counter")?;
            at_suspend = count(c, "counter")?;
            let t = Instant::now();
            let to = format!("{reg}/pods/default/counter:suspended");
            let got = chalk(c, &["suspend", "counter", "--name", "counter-2", "--push-to", &to])?;
            let secs = t.elapsed().as_secs_f64();
            let id = got["status"]["snapshotId"].as_str().unwrap_or_default().to_string();
            until(Duration::from_secs(60), || {
                (c.kubectl(&["get", "pod", "counter"]).code != 0).then_some(())
            })
            .ok_or("the pod is still there")?;
            let gone = until(Duration::from_secs(30), || processes_of(&sandbox).is_empty().then_some(()));
            if gone.is_none() {
                return Err(format!("left running: {:?}", processes_of(&sandbox)));
            }
            if snapshots_on(c, 0).contains(&id) {
                return Err(format!("{id} is still on {a}"));
            }
            // Its memory (pages.img of its own manifest, the packed form's first layer) is
            // not in the node's store either.
            let memory = registry
                .layer_digest(&id, "pages.img")
                .map(|d| d.trim_start_matches("sha256:").to_string())
                .ok_or("the registry holds no manifest of the snapshot")?;
            let left = c.nodes[0]
                .containerd
                .snapshot_store()
                .join("blobs/sha256")
                .join(&memory);
            if left.exists() {
                return Err(format!("its memory (sha256:{memory}) is still in {a}'s store"));
            }
            Ok(format!(
                "suspended in {secs:.2}s (snapshot {} ms, push {} ms); no process of its sandbox, no record of {} and none of its memory on {a}; {a}'s store holds {} bytes (the snapshot kept there earlier)",
                got["status"]["timings"]["snapshotMs"],
                got["status"]["timings"]["pushMs"],
                &id[..19.min(id.len())],
                store_bytes(c, 0)
            ))
        },
    );
    let mut resume_secs = 0.0;
    if suspended {
        run.step(&format!("kubectl cordon {a}; kubectl chalk resume counter-2: it runs on {b} with its memory"), |c| {
            let cordon = c.kubectl(&["cordon", a]);
            if cordon.code != 0 {
                return Err(cordon.stderr);
            }
            let t = Instant::now();
            chalk(c, &["resume", "counter-2"])?;
            resume_secs = all_ready(c, &["counter".to_string()], t)?;
            let node = node_of(c, "counter")?;
            skipped_init(c, "counter")?;
            let n = count(c, "counter")?;
            if node != b || n + 1 < at_suspend {
                return Err(format!("resumed on {node} counting from {n} (suspended at {at_suspend})"));
            }
            Ok(format!(
                "Ready on {node} {resume_secs:.2}s after the command ({}), counting on from {n} (suspended at {at_suspend}); {}",
                shim_breakdown(c, "counter"),
                inside(c, "counter", pod_mib(0))?
            ))
        });
    }
    run.step(
        "pods naming a tampered or missing snapshot, one on another image, or in a namespace not allowed, fail with an event naming why, and leave nothing",
        |c| {
            // Another snapshot, altered in the registry.
            let pushed = chalk(c, &["snapshot", "counter", "--name", "counter-3", "--push-to", &format!("{reg}/pods/default/counter:v3")])?;
            let from = pushed["status"]["restoreFrom"].as_str().unwrap_or_default().to_string();
            // Its kernel state, which every pull fetches whole (the memory comes as pieces).
            let packed = from.rsplit_once('@').map(|(_, d)| d).unwrap_or_default();
            let largest = registry
                .layer_titled(packed, "checkpoint.img")
                .ok_or("no blob to alter")?;
            let mut bytes = std::fs::read(&largest).map_err(|e| e.to_string())?;
            let mid = bytes.len() / 2;
            bytes[mid] ^= 0xff;
            std::fs::write(&largest, bytes).map_err(|e| e.to_string())?;
            // The node that has it locally (the counter's) is cordoned away: pods go to the other.
            let _ = c.kubectl(&["uncordon", a]);
            let _ = c.kubectl(&["cordon", b]);
            let mut said = Vec::new();
            let pulled = |name, from| Refusal {
                key: RESTORE_FROM,
                name,
                namespace: "default",
                from,
                image: IMAGE,
                reason: "FailedCreatePodSandBox",
                why: "could not be pulled",
            };
            said.push(refused(c, pulled("from-tampered", &from))?);
            let missing = format!("{reg}/pods/default/counter@sha256:{}", "0".repeat(64));
            said.push(refused(c, pulled("from-missing", &missing))?);
            // The snapshot's container on another image (not the snapshot's by digest).
            let good = json(c, &["get", "podsnapshot", "counter-1"])?["status"]["restoreFrom"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            said.push(refused(c, Refusal {
                key: RESTORE_FROM,
                name: "other-image",
                namespace: "default",
                from: &good,
                image: chalk_integration::containerd::PAUSE_IMAGE,
                reason: "Failed",
                why: "by digest",
            })?);
            let _ = c.kubectl(&["create", "namespace", "other"]);
            until(Duration::from_secs(30), || {
                (c.kubectl(&["get", "serviceaccount", "default", "-n", "other"]).code == 0).then_some(())
            });
            said.push(refused(c, Refusal {
                key: RESTORE_FROM,
                name: "from-elsewhere",
                namespace: "other",
                from: &from,
                image: IMAGE,
                reason: "FailedCreatePodSandBox",
                why: "may not start pods",
            })?);
            let _ = c.kubectl(&["uncordon", b]);
            let _ = c.kubectl(&["delete", "podsnapshot", "counter-3", "--wait=true"]);
            Ok(said.join(" / "))
        },
    );
    let _ = c.kubectl(&["uncordon", a]);
    let _ = c.kubectl(&["uncordon", b]);
    if let Some(started) = &agents {
        crate::tenants::steps(run, registry, &started.kubeconfigs);
    }
    big_pod(run, registry, &reg);
    run.step(
        "kubectl delete podsnapshot: its snapshot leaves its node (the finalizer)",
        |c| {
            let before = snapshots_on(c, 0);
            let got = json(c, &["get", "podsnapshot", "counter-1"])?;
            let id = got["status"]["snapshotId"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            if !before.contains(&id) {
                return Err(format!("{id} was not on {a} to begin with"));
            }
            let del = c.kubectl(&[
                "delete",
                "podsnapshot",
                "counter-1",
                "--wait=true",
                "--timeout=60s",
            ]);
            if del.code != 0 {
                return Err(del.stderr);
            }
            if snapshots_on(c, 0).contains(&id) {
                return Err(format!("{id} is still on {a}"));
            }
            Ok(format!(
                "{} deleted; not on {a} any more",
                &id[..19.min(id.len())]
            ))
        },
    );
    run.timings = Some(crate::Timings {
        fork_small: fork_secs,
        fork_small_first: fork_first,
        fresh_small: fresh_secs.unwrap_or(0.0),
        resume_small: resume_secs,
        ..run.timings.take().unwrap_or_default()
    });
    let _ = c.kubectl(&[
        "delete",
        "pod",
        "counter",
        "--ignore-not-found",
        "--wait=true",
    ]);
    drop(agents);
}

/// A pod holding 1 GB: suspended on one node, resumed on the other; forked through the
/// scheduler; suspended again there, sending only what changed, and resumed back; beside a
/// fresh pod of the same spec.
fn big_pod(run: &mut Run, registry: &Secured, reg: &str) {
    let (a, b) = (NODES[0].0, NODES[1].0);
    let mut t = crate::Timings::default();
    let up = run.step(&format!("a pod holding 1 GB in memory on {b}"), |c| {
        applied(c, &counter_pod("big", b, 1024))?;
        ready(c, "big", Duration::from_secs(300))?;
        Ok(format!(
            "Ready with 1 GB of /dev/urandom in its /tmp, counting {}",
            count(c, "big")?
        ))
    });
    if up {
        let moved = run.step(&format!("1 GB: suspended on {b} (pushed), {b} cordoned, resumed: Running on {a}"), |c| {
            let st = Instant::now();
            let got = chalk(c, &["suspend", "big", "--name", "big-1", "--push-to", &format!("{reg}/pods/default/big:v1")])?;
            t.suspend_big = st.elapsed().as_secs_f64();
            until(Duration::from_secs(60), || (c.kubectl(&["get", "pod", "big"]).code != 0).then_some(()))
                .ok_or("the pod is still there")?;
            let _ = c.kubectl(&["cordon", b]);
            let rt = Instant::now();
            chalk(c, &["resume", "big-1"])?;
            t.resume_big = all_ready(c, &["big".to_string()], rt)?;
            let _ = c.kubectl(&["uncordon", b]);
            let node = node_of(c, "big")?;
            if node != a {
                return Err(format!("resumed on {node}"));
            }
            let seen = inside(c, "big", pod_mib(1024))?;
            let shim = shim_breakdown(c, "big");
            Ok(format!(
                "suspend {:.2}s ({} bytes; snapshot {} ms, push {} ms); Ready on {a} {:.2}s after `resume` (pull included; {shim}); {seen}",
                t.suspend_big, got["status"]["sizeBytes"], got["status"]["timings"]["snapshotMs"],
                got["status"]["timings"]["pushMs"], t.resume_big
            ))
        });
        if moved {
            run.step(
                "1 GB: kubectl chalk fork big-1 through the scheduler",
                |c| {
                    // The resumed pod's memory loads in the background for a few seconds
                    // after it runs: not to be timed as the fork's.
                    std::thread::sleep(Duration::from_secs(15));
                    let ft = Instant::now();
                    let got = chalk(c, &["fork", "big-1", "--count", "1"])?;
                    let pod = got["pods"][0].as_str().unwrap_or_default().to_string();
                    t.fork_big = all_ready(c, std::slice::from_ref(&pod), ft)?;
                    let node = node_of(c, &pod)?;
                    let shim = shim_breakdown(c, &pod);
                    let _ = c.kubectl(&["delete", "pod", &pod, "--wait=true"]);
                    Ok(format!(
                        "{pod} Ready on {node} {:.2}s after the command ({shim})",
                        t.fork_big
                    ))
                },
            );
            run.step(
                &format!("1 GB: suspended again on {a}: the push sends what changed since big-1; resumed on {b}"),
                |c| {
                    let before = registry.stored_bytes();
                    let st = Instant::now();
                    let got = chalk(c, &["suspend", "big", "--name", "big-2", "--push-to", &format!("{reg}/pods/default/big:v2")])?;
                    t.suspend_big_again = st.elapsed().as_secs_f64();
                    let grew = registry.stored_bytes().saturating_sub(before);
                    until(Duration::from_secs(60), || (c.kubectl(&["get", "pod", "big"]).code != 0).then_some(()))
                        .ok_or("the pod is still there")?;
                    let _ = c.kubectl(&["cordon", a]);
                    let rt = Instant::now();
                    chalk(c, &["resume", "big-2"])?;
                    let resumed = all_ready(c, &["big".to_string()], rt)?;
                    let _ = c.kubectl(&["uncordon", a]);
                    let node = node_of(c, "big")?;
                    if node != b {
                        return Err(format!("resumed on {node}"));
                    }
                    let seen = inside(c, "big", pod_mib(1024))?;
                    // The counter and the kernel's own pages change; the 1 GB in /tmp does not.
                    if grew > 64 << 20 {
                        return Err(format!("the second push grew the registry by {grew} bytes"));
                    }
                    Ok(format!(
                        "suspend {:.2}s (snapshot {} ms, push {} ms; the registry grew {:.1} MB); Ready on {b} {resumed:.2}s after `resume`; {seen}",
                        t.suspend_big_again, got["status"]["timings"]["snapshotMs"],
                        got["status"]["timings"]["pushMs"], grew as f64 / 1e6
                    ))
                },
            );
        }
        let _ = run
            .node
            .kubectl(&["delete", "pod", "big", "--ignore-not-found", "--wait=true"]);
        for name in ["big-1", "big-2"] {
            let _ = run.node.kubectl(&[
                "delete",
                "podsnapshot",
                name,
                "--ignore-not-found",
                "--wait=true",
            ]);
        }
    }
    if let Some(secs) = run.timed_step(
        "1 GB: a fresh pod of the same spec, to Ready (its 1 GB written)",
        |c| fresh_start(c, "big-fresh", 1024),
    ) {
        t.fresh_big = secs;
    }
    run.timings = Some(t);
}
