//! kubernetes-sigs/agent-sandbox's real controller (v1.0.1, its CRDs, run out of cluster) on
//! the two nodes, with chalk-agent `--suspend-to` on each. Everything is driven through
//! kubectl: a Sandbox suspended and resumed on the other node with its memory and its PVC, a
//! warm pool of restores of a golden snapshot and a claim on it, a suspend whose registry is
//! down, and deleted Sandboxes taking their snapshots with them.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use chalk_integration::{
    containerd::IMAGE,
    k8s::{until, Cluster, NODES},
    registry::Secured,
};
use serde_json::Value;

use crate::agents::{chalk, start_agents};
use crate::kube::*;
use crate::pods::{count, node_of};
use crate::Run;

/// The registry repository prefix the agents suspend to.
const PREFIX: &str = "sandboxes";
const WAIT: Duration = Duration::from_secs(180);

/// The comparisons the report ends with (seconds).
#[derive(Default, Clone)]
pub struct Timings {
    pub cold: f64,
    pub suspend: f64,
    pub resume: f64,
    pub claim: f64,
    pub pool: f64,
    pub suspend_failed: f64,
}

/// The controller's CRDs and its binary: CHALK_AGENT_SANDBOX (scripts/peers --agent-sandbox).
pub fn controller_dir() -> Result<PathBuf, String> {
    std::env::var_os("CHALK_AGENT_SANDBOX")
        .map(PathBuf::from)
        .ok_or_else(|| "CHALK_AGENT_SANDBOX is not set: run scripts/peers --agent-sandbox".into())
}

/// Installs the CRDs and starts agent-sandbox-controller with the admin's kubeconfig.
pub fn start_controller(c: &mut Cluster) -> Result<String, String> {
    let dir = controller_dir()?;
    for entry in std::fs::read_dir(dir.join("crds")).map_err(|e| e.to_string())? {
        let path = entry.map_err(|e| e.to_string())?.path();
        let text = std::fs::read_to_string(&path).map_err(|e| e.to_string())?;
        let out = c.apply(&text);
        if out.code != 0 {
            return Err(format!("{}: {}", path.display(), out.stderr));
        }
    }
    for crd in [
        "sandboxes.agents.x-k8s.io",
        "sandboxclaims.extensions.agents.x-k8s.io",
        "sandboxtemplates.extensions.agents.x-k8s.io",
        "sandboxwarmpools.extensions.agents.x-k8s.io",
    ] {
        c.established(crd)?;
    }
    let kubeconfig = c.kubeconfig().display().to_string();
    let args: Vec<String> = [
        "--leader-elect=false",
        "--extensions",
        "--metrics-bind-address=0",
        "--health-probe-bind-address=0",
        "--kubeconfig",
        &kubeconfig,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    c.spawn_child(
        "agent-sandbox-controller",
        &dir.join("agent-sandbox-controller"),
        &args,
        &[],
    )?;
    // Built by `go install` without its release ldflags, it prints no version of its own:
    // scripts/peers names its directory after the module version.
    let version = dir
        .file_name()
        .map(|n| {
            n.to_string_lossy()
                .replace("agent-sandbox-", "sigs.k8s.io/agent-sandbox ")
        })
        .unwrap_or_default();
    Ok(version)
}

/// A counter held only in memory (a shell variable, shown in /tmp/n, which gVisor keeps in
/// memory), and the time of its first start on a PVC (`/data/created`; every start appends
/// to `/data/starts`).
fn pod_spec(indent: &str, with_pvc: bool) -> String {
    let mounts = if with_pvc {
        "\n  volumeMounts: [{name: data, mountPath: /data}]"
    } else {
        ""
    };
    let script = if with_pvc {
        "[ -f /data/created ] || date +%s > /data/created; echo start >> /data/starts; "
    } else {
        ""
    };
    let body = format!(
        r#"runtimeClassName: chalk
automountServiceAccountToken: false
terminationGracePeriodSeconds: 30
containers:
- name: main
  image: {IMAGE}
  imagePullPolicy: Never
  command: ["sh", "-c", "{script}i=0; while :; do i=$((i+1)); echo $i > /tmp/n; sleep 1; done"]
  resources:
    limits: {{memory: "256Mi", cpu: "200m"}}
  readinessProbe:
    exec: {{command: ["cat", "/tmp/n"]}}
    periodSeconds: 1{mounts}"#
    );
    body.lines()
        .map(|l| format!("{indent}{l}\n"))
        .collect::<String>()
}

fn sandbox_yaml(name: &str) -> String {
    format!(
        r#"apiVersion: agents.x-k8s.io/v1beta1
kind: Sandbox
metadata: {{name: {name}}}
spec:
  podTemplate:
    spec:
{spec}  volumeClaimTemplates:
  - metadata: {{name: data}}
    spec:
      accessModes: [ReadWriteOnce]
      storageClassName: ""
      resources: {{requests: {{storage: 16Mi}}}}
"#,
        spec = pod_spec("      ", true)
    )
}

/// A hostPath volume bound ahead to the claim the Sandbox's volumeClaimTemplate makes
/// (`data-NAME`): both kubelets run on this machine, so it is the same on either node.
fn volume_yaml(name: &str, dir: &Path) -> String {
    format!(
        r#"apiVersion: v1
kind: PersistentVolume
metadata: {{name: data-{name}}}
spec:
  capacity: {{storage: 16Mi}}
  accessModes: [ReadWriteOnce]
  storageClassName: ""
  persistentVolumeReclaimPolicy: Retain
  claimRef: {{namespace: default, name: data-{name}}}
  hostPath: {{path: {}, type: DirectoryOrCreate}}
"#,
        dir.display()
    )
}

fn condition(obj: &Value, kind: &str) -> (String, String) {
    obj["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == kind))
        .map(|c| {
            (
                c["status"].as_str().unwrap_or("").to_string(),
                c["reason"].as_str().unwrap_or("").to_string(),
            )
        })
        .unwrap_or_default()
}

/// Waits for condition `kind` of `what` (`sandbox/NAME`...) to be True; the object then.
fn until_true(c: &Cluster, what: &str, kind: &str) -> Result<Value, String> {
    let mut last = Value::Null;
    until(WAIT, || {
        let o = json(c, &["get", what]).ok()?;
        last = o.clone();
        (condition(&o, kind).0 == "True").then_some(o)
    })
    .ok_or_else(|| {
        format!(
            "{what}: {kind} not True in {WAIT:?}: conditions {}",
            last["status"]["conditions"]
        )
    })
}

fn patch(c: &Cluster, what: &str, body: &str) -> Result<(), String> {
    let out = c.kubectl(&["patch", what, "--type=merge", "-p", body]);
    if out.code != 0 {
        return Err(format!("patch {what}: {}", out.stderr));
    }
    Ok(())
}

fn mode(c: &Cluster, name: &str, mode: &str) -> Result<Instant, String> {
    let t = Instant::now();
    patch(
        c,
        &format!("sandbox/{name}"),
        &format!(r#"{{"spec":{{"operatingMode":"{mode}"}}}}"#),
    )?;
    Ok(t)
}

/// Events about `what` with reason `reason`: their messages.
fn events(c: &Cluster, name: &str, reason: &str) -> Vec<String> {
    let Ok(list) = json(
        c,
        &[
            "get",
            "events",
            "--field-selector",
            &format!("involvedObject.name={name},reason={reason}"),
        ],
    ) else {
        return Vec::new();
    };
    list["items"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .map(|e| e["message"].as_str().unwrap_or("").to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// The timed tags the registry holds for Sandbox `name`.
fn tags_in(registry: &Secured, name: &str) -> Vec<String> {
    let dir = registry
        .blobs()
        .join("docker/registry/v2/repositories")
        .join(PREFIX)
        .join("default")
        .join(name)
        .join("_manifests/tags");
    let mut tags: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|t| t.starts_with('s') && t.len() == 14)
                .collect()
        })
        .unwrap_or_default();
    tags.sort();
    tags
}

/// Whether the registry still holds manifest `reference`'s digest in its repository.
fn has_manifest(registry: &Secured, reference: &str) -> bool {
    let Some((repo, digest)) = reference.rsplit_once('@') else {
        return false;
    };
    let repo = repo
        .split_once('/')
        .map(|(_, r)| r.rsplit_once(':').map_or(r, |(r, _)| r))
        .unwrap_or_default();
    let hex = digest.trim_start_matches("sha256:");
    registry
        .blobs()
        .join("docker/registry/v2/repositories")
        .join(repo)
        .join("_manifests/revisions/sha256")
        .join(hex)
        .join("link")
        .exists()
}

fn annotation(obj: &Value, key: &str) -> Option<String> {
    obj["metadata"]["annotations"][key]
        .as_str()
        .map(String::from)
}

pub fn steps(run: &mut Run, registry: &mut Secured, controller: &str) -> Timings {
    let mut t = Timings::default();
    let dir = match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => {
            run.step("chalk-agent on both nodes", |_| Err(e.to_string()));
            return t;
        }
    };
    let suspend_to = format!("{}/{PREFIX}", registry.addr);
    let mut agents = None;
    let up = run.step(
        &format!("agent-sandbox-controller ({controller}) with its CRDs; chalk-agent on each node (suspending where the nodes' [restore_from] suspend_to says) and the cluster agent"),
        |c| {
            applied(c, &crate::agents::packaging("runtimeclass.yaml")?)?;
            let started = start_agents(c, registry, dir.path(), &[], Some(2))?;
            agents = Some(started.agents);
            Ok(format!("{} node agents suspending to {suspend_to}; the cluster agent keeping 2 snapshots per Sandbox", c.nodes.len()))
        },
    );
    if !up {
        return t;
    }
    let volumes = dir.path().join("volumes");

    // A Sandbox from cold, for the comparisons.
    let cold = run.step(
        "a Sandbox with runtimeClassName: chalk (a counter in memory, a PVC) is Ready from cold",
        |c| {
            applied(c, &volume_yaml("counter", &volumes.join("counter")))?;
            let started = Instant::now();
            applied(c, &sandbox_yaml("counter"))?;
            until_true(c, "sandbox/counter", "Ready")?;
            t.cold = started.elapsed().as_secs_f64();
            let node = node_of(c, "counter")?;
            let created = exec(c, "counter", None, &["cat", "/data/created"]);
            Ok(format!(
                "Ready {:.2}s after kubectl apply, on {node}; the PVC holds {:?}",
                t.cold,
                created.stdout.trim()
            ))
        },
    );
    if !cold {
        return t;
    }

    // Suspend: the pod goes, the snapshot is in the registry.
    let mut at_suspend = 0;
    let mut from_node = String::new();
    let suspended = run.step("kubectl patch sandbox counter operatingMode=Suspended: the pod goes, nothing of it runs on either node, its snapshot is in the registry", |c| {
        std::thread::sleep(Duration::from_secs(3));
        from_node = node_of(c, "counter")?;
        let id = sandbox_of_on(c, &from_node, "counter")?;
        at_suspend = count(c, "counter")?;
        let started = mode(c, "counter", "Suspended")?;
        let sb = until_true(c, "sandbox/counter", "Suspended")?;
        t.suspend = started.elapsed().as_secs_f64();
        let left = processes_of(&id);
        if !left.is_empty() {
            return Err(format!("processes of {id} left: {left:?}"));
        }
        let pending = sb["spec"]["podTemplate"]["metadata"]["annotations"]["chalk.io/resume-from"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if !has_manifest(registry, &pending) {
            let failed = annotation(&sb, "chalk.io/suspend-failed").unwrap_or_default();
            return Err(format!(
                "resume-from {pending:?} is not in the registry (suspend-failed: {failed:?})"
            ));
        }
        let note = events(c, "counter", "Suspended");
        Ok(format!(
            "Suspended {:.2}s after the patch (counter at {at_suspend}); no process of {id} on {from_node}; \
             resume-from {pending}; the agent: {}",
            t.suspend,
            note.first().cloned().unwrap_or_default()
        ))
    });

    if suspended {
        run.step(&format!("kubectl cordon {from_node}; patch operatingMode=Running: Ready on the other node, the counter carries on, the PVC's data is there, resume-from cleared"), |c| {
            c.kubectl(&["cordon", &from_node]);
            let started = mode(c, "counter", "Running")?;
            let got = until_true(c, "sandbox/counter", "Ready");
            t.resume = started.elapsed().as_secs_f64();
            c.kubectl(&["uncordon", &from_node]);
            got?;
            let node = node_of(c, "counter")?;
            if node == from_node {
                return Err(format!("resumed on {node}, the cordoned node"));
            }
            let now = count(c, "counter")?;
            if now < at_suspend {
                return Err(format!("the counter reads {now}, it was {at_suspend} at the suspend: it started over"));
            }
            let starts = exec(c, "counter", None, &["cat", "/data/starts"]).stdout;
            if starts.lines().count() != 1 {
                return Err(format!("/data/starts: {starts:?}: the program started again"));
            }
            let pod = until(Duration::from_secs(30), || {
                let p = json(c, &["get", "pod", "counter"]).ok()?;
                annotation(&p, "chalk.io/resumed-from").map(|_| p)
            })
            .ok_or("the pod has no chalk.io/resumed-from")?;
            until(Duration::from_secs(30), || {
                let s = json(c, &["get", "sandbox", "counter"]).ok()?;
                s["spec"]["podTemplate"]["metadata"]["annotations"]["chalk.io/resume-from"]
                    .is_null()
                    .then_some(())
            })
            .ok_or("resume-from is still on the Sandbox's pod template")?;
            Ok(format!(
                "Ready on {node} {:.2}s after the patch; counter {now} (suspended at {at_suspend}); the PVC: {} start; pod annotated resumed-from {}",
                t.resume,
                starts.lines().count(),
                annotation(&pod, "chalk.io/resumed-from").unwrap_or_default()
            ))
        });
        run.step(
            "a second suspend and resume, then a third: the registry keeps the newest 2",
            |c| {
                for _ in 0..2 {
                    mode(c, "counter", "Suspended")?;
                    until_true(c, "sandbox/counter", "Suspended")?;
                    mode(c, "counter", "Running")?;
                    until_true(c, "sandbox/counter", "Ready")?;
                }
                let tags = tags_in(registry, "counter");
                if tags.len() != 2 {
                    return Err(format!("the registry holds {tags:?} for counter"));
                }
                Ok(format!(
                    "tags {tags:?}; counter at {}",
                    count(c, "counter")?
                ))
            },
        );
    }

    // The golden snapshot and the pool.
    let mut golden = String::new();
    let mut golden_count = 0;
    let pool_up = run.step("a golden snapshot (kubectl chalk snapshot of a warmed Sandbox), a SandboxTemplate naming it, a SandboxWarmPool of 3: every member Ready and restored", |c| {
        applied(c, &format!(
            "apiVersion: agents.x-k8s.io/v1beta1\nkind: Sandbox\nmetadata: {{name: warmer}}\nspec:\n  podTemplate:\n    spec:\n{}",
            pod_spec("      ", false)
        ))?;
        until_true(c, "sandbox/warmer", "Ready")?;
        std::thread::sleep(Duration::from_secs(3));
        // In the namespace's own area of the registry (its pods restore from there).
        let reg = format!("{}/pods/default/golden", registry.addr);
        let ps = chalk(c, &["snapshot", "warmer", "--push-to", &reg])?;
        golden = ps["status"]["restoreFrom"].as_str().unwrap_or_default().to_string();
        golden_count = count(c, "warmer")?;
        if golden.is_empty() {
            return Err(format!("no restoreFrom: {ps}"));
        }
        let template = format!(
            r#"apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxTemplate
metadata: {{name: counter}}
spec:
  networkPolicyManagement: Unmanaged
  podTemplate:
    metadata:
      annotations: {{chalk.io/restore-from: "{golden}"}}
    spec:
{spec}---
apiVersion: extensions.agents.x-k8s.io/v1beta1
kind: SandboxWarmPool
metadata: {{name: counter}}
spec:
  replicas: 3
  sandboxTemplateRef: {{name: counter}}
"#,
            spec = pod_spec("      ", false)
        );
        let started = Instant::now();
        applied(c, &template)?;
        until(WAIT, || {
            let p = json(c, &["get", "sandboxwarmpool", "counter"]).ok()?;
            (p["status"]["readyReplicas"] == 3).then_some(())
        })
        .ok_or("the pool did not reach 3 ready")?;
        t.pool = started.elapsed().as_secs_f64();
        let pods = json(c, &["get", "pods", "-l", "agents.x-k8s.io/warm-pool-sandbox"])?;
        let mut seen = Vec::new();
        for p in pods["items"].as_array().cloned().unwrap_or_default() {
            let name = p["metadata"]["name"].as_str().unwrap_or_default().to_string();
            if annotation(&p, "chalk.io/restore-from").as_deref() != Some(golden.as_str()) {
                return Err(format!("{name} does not name the golden snapshot"));
            }
            let n = count(c, &name)?;
            if n < golden_count {
                return Err(format!("{name} counts {n}: it started over (golden at {golden_count})"));
            }
            seen.push(format!("{name} on {} at {n}", p["spec"]["nodeName"].as_str().unwrap_or("")));
        }
        if seen.len() != 3 {
            return Err(format!("{} pool pods: {seen:?}", seen.len()));
        }
        Ok(format!("golden {golden} (counter {golden_count}); 3 ready {:.2}s after kubectl apply: {}", t.pool, seen.join(", ")))
    });
    if pool_up {
        let mut claimed = String::new();
        run.step("a SandboxClaim on the pool gets a warm member, Ready", |c| {
            let started = Instant::now();
            applied(c, "apiVersion: extensions.agents.x-k8s.io/v1beta1\nkind: SandboxClaim\nmetadata: {name: mine}\nspec:\n  warmPoolRef: {name: counter}\n")?;
            let claim = until_true(c, "sandboxclaim/mine", "Ready")?;
            t.claim = started.elapsed().as_secs_f64();
            claimed = claim["status"]["sandbox"]["name"].as_str().unwrap_or_default().to_string();
            let n = count(c, &claimed)?;
            Ok(format!("claim Ready {:.2}s after kubectl apply: {claimed}, counter {n}", t.claim))
        });
        if !claimed.is_empty() {
            run.step("the claimed Sandbox suspended and resumed: its own snapshot (through the claim's additionalPodMetadata), not the golden one", |c| {
                std::thread::sleep(Duration::from_secs(2));
                let before = count(c, &claimed)?;
                mode(c, &claimed, "Suspended")?;
                until_true(c, &format!("sandbox/{claimed}"), "Suspended")?;
                let claim = json(c, &["get", "sandboxclaim", "mine"])?;
                let own = claim["spec"]["additionalPodMetadata"]["annotations"]["chalk.io/resume-from"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                if own.is_empty() {
                    return Err(format!("the claim has no resume-from: {}", claim["spec"]));
                }
                mode(c, &claimed, "Running")?;
                until_true(c, &format!("sandbox/{claimed}"), "Ready")?;
                let n = count(c, &claimed)?;
                if n < before {
                    return Err(format!("counter {n} < {before}: not its own memory"));
                }
                Ok(format!("resumed from {own}; counter {n} (was {before}, golden {golden_count})"))
            });
        }
    }

    // A suspend that cannot push.
    run.step("a suspend while the registry is down: the pod still goes; the Sandbox is marked, and its next pod says it started fresh", |c| {
        applied(c, &volume_yaml("unlucky", &volumes.join("unlucky")))?;
        applied(c, &sandbox_yaml("unlucky"))?;
        until_true(c, "sandbox/unlucky", "Ready")?;
        std::thread::sleep(Duration::from_secs(4));
        let before = count(c, "unlucky")?;
        registry.stop();
        let started = mode(c, "unlucky", "Suspended")?;
        let got = until_true(c, "sandbox/unlucky", "Suspended");
        t.suspend_failed = started.elapsed().as_secs_f64();
        let served = registry.serve_again();
        let sb = got?;
        served?;
        let marked = annotation(&sb, "chalk.io/suspend-failed").unwrap_or_default();
        if marked.is_empty() {
            return Err("the Sandbox is not marked chalk.io/suspend-failed".into());
        }
        let warned = events(c, "unlucky", "SuspendFailed");
        mode(c, "unlucky", "Running")?;
        until_true(c, "sandbox/unlucky", "Ready")?;
        let pod = until(Duration::from_secs(30), || {
            let p = json(c, &["get", "pod", "unlucky"]).ok()?;
            annotation(&p, "chalk.io/started-fresh").map(|_| p)
        })
        .ok_or("the new pod has no chalk.io/started-fresh")?;
        let n = count(c, "unlucky")?;
        if n >= before {
            return Err(format!("counter {n}: the new pod did not start fresh (was {before})"));
        }
        Ok(format!(
            "Suspended {:.2}s after the patch; event SuspendFailed: {}; the new pod: chalk.io/started-fresh {:?}, counter {n} (was {before})",
            t.suspend_failed,
            warned.first().cloned().unwrap_or_default(),
            annotation(&pod, "chalk.io/started-fresh").unwrap_or_default()
        ))
    });

    run.step(
        "kubectl delete the Sandboxes: their snapshots leave the registry, and the Sandboxes go",
        |c| {
            let listed = json(c, &["get", "sandbox", "counter"])
                .ok()
                .and_then(|s| annotation(&s, "chalk.io/snapshots"))
                .unwrap_or_default();
            let out = c.kubectl(&[
                "delete",
                "sandbox",
                "counter",
                "unlucky",
                "warmer",
                "--wait=true",
                "--timeout=120s",
            ]);
            if out.code != 0 {
                return Err(out.stderr);
            }
            let tags = tags_in(registry, "counter");
            let kept: Vec<&str> = listed
                .split(',')
                .filter(|r| !r.is_empty() && has_manifest(registry, r))
                .collect();
            if !tags.is_empty() || !kept.is_empty() {
                return Err(format!(
                    "left in the registry: tags {tags:?}, manifests {kept:?}"
                ));
            }
            Ok(format!(
                "deleted; {} snapshots removed from the registry, no tag left",
                listed.split(',').filter(|r| !r.is_empty()).count()
            ))
        },
    );
    drop(agents);
    if run.steps.iter().any(|s| !s.ok) {
        show_agent_logs(dir.path());
    }
    t
}

/// The agents' logs end with the tempdir: show their last lines where a step failed.
fn show_agent_logs(dir: &std::path::Path) {
    for (node, _) in NODES {
        let log = dir.join(format!("chalk-agent-{node}.log"));
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        eprintln!("-- the last lines of chalk-agent on {node}:");
        for l in &lines[lines.len().saturating_sub(40)..] {
            eprintln!("   {l}");
        }
    }
}

/// The sandbox container id of pod `pod` on node `node`.
fn sandbox_of_on(c: &Cluster, node: &str, pod: &str) -> Result<String, String> {
    let n = c.node(node).ok_or_else(|| format!("no node {node}"))?;
    sandbox_on(&n.containerd, pod)
}
