//! The PodSnapshot steps on two nodes, through kubectl and the API only: chalk-agent on each
//! node, a pod snapshotted and forked into pods the scheduler places, a suspend and a resume
//! on the other node, refusals, and a pod holding 1 GB moved between nodes.

use std::{
    collections::BTreeSet,
    path::PathBuf,
    process::Command,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
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
use crate::Run;

/// The counter pod: counts seconds into /tmp/n and its log, ready while it counts; spread
/// across nodes with its forks (they carry its spec), cordoned nodes left out of the spread.
/// Its memory limit is 256 MiB (1.5 GiB when it fills memory), so its pod cgroup's is that
/// plus the RuntimeClass's 64 MiB: what the sandbox sees as MemTotal ([`pod_mib`]).
fn counter_pod(name: &str, node: &str, fill_mb: u64) -> String {
    counter_pod_with(name, node, fill_mb, "")
}

/// [`counter_pod`] with `meta` (YAML lines under `metadata:`: a namespace, annotations).
pub fn counter_pod_with(name: &str, node: &str, fill_mb: u64, meta: &str) -> String {
    let limit = pod_mib(fill_mb) - 64;
    let fill = if fill_mb > 0 {
        format!(
            "dd if=/dev/urandom of=/tmp/fill bs=1048576 count={fill_mb} iflag=fullblock 2>/dev/null; "
        )
    } else {
        String::new()
    };
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
  labels: {{app: {name}}}
{meta}spec:
  runtimeClassName: chalk
  nodeName: {node}
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 2
  topologySpreadConstraints:
  - maxSkew: 1
    topologyKey: kubernetes.io/hostname
    whenUnsatisfiable: DoNotSchedule
    labelSelector: {{matchLabels: {{app: {name}}}}}
    nodeTaintsPolicy: Honor
  initContainers:
  - name: setup
    image: {IMAGE}
    imagePullPolicy: Never
    command: ["sh", "-c", "echo setup-ran"]
    # Limits on every container, or the kubelet gives the pod's cgroup none.
    resources:
      limits: {{memory: "64Mi", cpu: "100m"}}
  containers:
  - name: main
    image: {IMAGE}
    imagePullPolicy: Never
    command: ["sh", "-c", "{fill}i=0; while :; do i=$((i+1)); echo $i > /tmp/n; echo tick $i; sleep 1; done"]
    resources:
      limits: {{memory: "{limit}Mi", cpu: "500m"}}
    readinessProbe:
      exec: {{command: ["cat", "/tmp/n"]}}
      periodSeconds: 1
"#
    )
}

/// The pod cgroup's memory limit of a counter pod, in MiB: its container's limit and the
/// RuntimeClass overhead (64 MiB).
fn pod_mib(fill_mb: u64) -> u64 {
    if fill_mb > 0 {
        1536 + 64
    } else {
        256 + 64
    }
}

/// What pod `pod` is inside its sandbox: its hostname, its IPv4 addresses (without
/// loopback's), and the memory it sees (MemTotal, MiB), checked against the pod object (its
/// name, its pod IP) and the limit of its pod cgroup (`mib`).
fn inside(c: &Cluster, pod: &str, mib: u64) -> Result<String, String> {
    let out = exec(
        c,
        pod,
        None,
        &[
            "sh",
            "-c",
            "hostname; ip -4 -o addr; grep MemTotal /proc/meminfo",
        ],
    );
    if out.code != 0 {
        return Err(format!("exec in {pod}: {out:?}"));
    }
    let mut lines = out.stdout.lines();
    let host = lines.next().unwrap_or_default().trim().to_string();
    let text = out.stdout.clone();
    let addrs: Vec<&str> = text
        .lines()
        .filter(|l| l.contains(" inet "))
        .filter_map(|l| l.split_whitespace().nth(3))
        .filter(|a| !a.starts_with("127."))
        .collect();
    let kb: u64 = text
        .lines()
        .find(|l| l.starts_with("MemTotal"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0);
    let ip = json(c, &["get", "pod", pod])?["status"]["podIP"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let seen = format!("hostname {host}, inet {addrs:?}, MemTotal {} MiB", kb >> 10);
    if host != pod {
        return Err(format!("{pod} calls itself {host:?} inside: {seen}"));
    }
    if !addrs
        .iter()
        .any(|a| a.split('/').next() == Some(ip.as_str()))
    {
        return Err(format!(
            "{pod}'s pod IP is {ip}, not an address inside it: {seen}"
        ));
    }
    if kb != mib << 10 {
        return Err(format!(
            "{pod} sees {kb} kB of memory, its pod cgroup allows {mib} MiB: {seen}"
        ));
    }
    Ok(format!("{pod} (pod IP {ip}): {seen}"))
}

/// Pod `pod`, made from a snapshot of a pod whose init container `setup` had run, skipped it:
/// the kubelet saw it complete (exit 0), and it printed nothing.
fn skipped_init(c: &Cluster, pod: &str) -> Result<(), String> {
    let p = json(c, &["get", "pod", pod])?;
    let done = &p["status"]["initContainerStatuses"][0]["state"]["terminated"];
    if done["exitCode"] != 0 || done["reason"] != "Completed" {
        return Err(format!(
            "{pod}'s init container: {}",
            p["status"]["initContainerStatuses"]
        ));
    }
    let logs = c.kubectl(&["logs", pod, "-c", "setup"]);
    if logs.stdout.contains("setup-ran") {
        return Err(format!("{pod} ran its init container again: {logs:?}"));
    }
    Ok(())
}

/// Where the time of pod `pod`'s start from a snapshot went on its node, as the shim logged
/// it: the pull (when its node lacked the snapshot), the verification, and runsc's restore.
fn shim_breakdown(c: &Cluster, pod: &str) -> String {
    let Ok(node) = node_of(c, pod) else {
        return String::new();
    };
    let Some(n) = c.node(&node) else {
        return String::new();
    };
    let Ok(id) = sandbox_on(&n.containerd, pod) else {
        return String::new();
    };
    let log = n.containerd.log();
    let mut parts = Vec::new();
    for line in log.lines().filter(|l| l.contains(&id)) {
        let msg = line
            .split("msg=\"")
            .nth(1)
            .unwrap_or(line)
            .trim_end_matches('"');
        if let Some(at) = msg.find(" in ").filter(|_| msg.contains(": pulled ")) {
            parts.push(format!("pull{}", &msg[at..]));
        } else if let Some(at) = msg.find("verified in ") {
            let t = msg[at + "verified in ".len()..]
                .split(',')
                .next()
                .unwrap_or("");
            parts.push(format!("verify {t}"));
        } else if let Some(at) = msg.find("running_ms=") {
            let t = msg[at..].split_whitespace().next().unwrap_or("");
            parts.push(format!("runsc restore {t}"));
        }
    }
    format!("on {node}, the shim: {}", parts.join(", "))
}

pub fn count(c: &Cluster, pod: &str) -> Result<u64, String> {
    let out = exec(c, pod, None, &["cat", "/tmp/n"]);
    out.stdout
        .trim()
        .parse()
        .map_err(|_| format!("the counter of {pod}: {out:?}"))
}

pub fn node_of(c: &Cluster, pod: &str) -> Result<String, String> {
    Ok(json(c, &["get", "pod", pod])?["spec"]["nodeName"]
        .as_str()
        .unwrap_or_default()
        .to_string())
}

/// Polls pod `pod`'s Ready condition until stopped; how many polls saw it not Ready.
struct ReadyWatch {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<(u32, u32)>,
}

fn watch_ready(kubeconfig: PathBuf, kubectl: PathBuf, pod: &str) -> ReadyWatch {
    let stop = Arc::new(AtomicBool::new(false));
    let (flag, pod) = (stop.clone(), pod.to_string());
    let thread = std::thread::spawn(move || {
        let (mut polls, mut unready) = (0, 0);
        while !flag.load(Ordering::SeqCst) {
            let out = Command::new(&kubectl)
                .arg("--kubeconfig")
                .arg(&kubeconfig)
                .args(["get", "pod", &pod, "-o"])
                .arg("jsonpath={.status.conditions[?(@.type==\"Ready\")].status}")
                .output();
            polls += 1;
            if !out.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "True") {
                unready += 1;
            }
            std::thread::sleep(Duration::from_millis(150));
        }
        (polls, unready)
    });
    ReadyWatch { stop, thread }
}

impl ReadyWatch {
    fn end(self) -> (u32, u32) {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().unwrap_or((0, 0))
    }
}

/// Snapshots on `node` (chalkctl's records in the node's CRI namespace).
fn snapshots_on(c: &Cluster, node: usize) -> String {
    c.nodes[node]
        .containerd
        .chalkctl(&["snapshot", "list", "-o", "json"])
        .stdout
}

/// Bytes of the snapshot store of `node`.
fn store_bytes(c: &Cluster, node: usize) -> u64 {
    let store = c.nodes[node].containerd.snapshot_store();
    chalk_runtime::snapshot::store::Store::open(&store).map_or(0, |s| s.usage())
}

/// Waits for `pods` to be Running and ready; the time it took from `since`.
fn all_ready(c: &Cluster, pods: &[String], since: Instant) -> Result<f64, String> {
    for p in pods {
        ready(c, p, Duration::from_secs(180))?;
    }
    Ok(since.elapsed().as_secs_f64())
}

/// A fresh pod of the same kind through the scheduler (no nodeName): seconds to Ready.
fn fresh_start(c: &Cluster, name: &str, fill_mb: u64) -> Result<f64, String> {
    let spec = counter_pod(name, "", fill_mb).replace("  nodeName: \n", "");
    let t = Instant::now();
    applied(c, &spec)?;
    ready(c, name, Duration::from_secs(180))?;
    let secs = t.elapsed().as_secs_f64();
    c.kubectl(&["delete", "pod", name, "--wait=true", "--timeout=60s"]);
    Ok(secs)
}

/// A pod that must be refused: named `name`, in `namespace`, starting from `from` with its
/// container on `image`; refused with a `reason` event whose message says `why`.
pub struct Refusal<'a> {
    /// The annotation that names the snapshot (`chalk.io/restore-from`, or resume-from).
    pub key: &'a str,
    pub name: &'a str,
    pub namespace: &'a str,
    pub from: &'a str,
    pub image: &'a str,
    pub reason: &'a str,
    pub why: &'a str,
}

/// A pod (no node named) that starts from a snapshot and is refused: an event names why, and
/// nothing of it is left on any node once it is deleted.
pub fn refused(c: &Cluster, r: Refusal) -> Result<String, String> {
    let Refusal {
        key,
        name,
        namespace,
        from,
        image,
        reason,
        why,
    } = r;
    let spec = format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: {namespace}
  annotations: {{{key}: "{from}"}}
spec:
  runtimeClassName: chalk
  automountServiceAccountToken: false
  containers:
  - name: main
    image: {image}
    imagePullPolicy: Never
    command: ["sleep", "100000"]
"#
    );
    applied(c, &spec)?;
    let field = format!("involvedObject.name={name},reason={reason}");
    let said = until(Duration::from_secs(60), || {
        let e = c.kubectl(&[
            "get",
            "events",
            "-n",
            namespace,
            "--field-selector",
            &field,
            "-o",
            "jsonpath={.items[0].message}",
        ]);
        (!e.stdout.trim().is_empty()).then(|| e.stdout.trim().to_string())
    })
    .ok_or_else(|| format!("no {reason} event for {name}"))?;
    let deleted = c.kubectl(&["delete", "pod", name, "-n", namespace, "--wait=true"]);
    if !said.contains(why) {
        return Err(format!("the event does not say {why:?}: {said}"));
    }
    let filter = format!("labels.\"io.kubernetes.pod.name\"=={name}");
    let left: Vec<String> = c
        .nodes
        .iter()
        .flat_map(|n| {
            let ids = n
                .containerd
                .ctr(["containers", "list", "-q", filter.as_str()]);
            ids.stdout
                .lines()
                .flat_map(processes_of)
                .collect::<Vec<_>>()
        })
        .collect();
    if deleted.code != 0 || !left.is_empty() {
        return Err(format!("delete {deleted:?}; left running: {left:?}"));
    }
    // From the shim's own words on.
    let at = said.find(&format!("{namespace}/{name}")).unwrap_or(0);
    Ok(said[at..].to_string())
}

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
            // Its memory (its largest layer, as pushed) is not in the node's store either.
            let memory = registry
                .largest_layer(&id)
                .and_then(|f| Some(f.parent()?.file_name()?.to_string_lossy().to_string()))
                .ok_or("the registry holds no memory of the snapshot")?;
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
            // Another snapshot, its memory altered in the registry.
            let pushed = chalk(c, &["snapshot", "counter", "--name", "counter-3", "--push-to", &format!("{reg}/pods/default/counter:v3")])?;
            let id = pushed["status"]["snapshotId"].as_str().unwrap_or_default().to_string();
            let from = pushed["status"]["restoreFrom"].as_str().unwrap_or_default().to_string();
            let largest = registry.largest_layer(&id).ok_or("no blob to alter")?;
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
    big_pod(run, &reg);
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
/// scheduler; beside a fresh pod of the same spec.
fn big_pod(run: &mut Run, reg: &str) {
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
        }
        let _ = run
            .node
            .kubectl(&["delete", "pod", "big", "--ignore-not-found", "--wait=true"]);
        let _ = run
            .node
            .kubectl(&["delete", "podsnapshot", "big-1", "--wait=true"]);
    }
    if let Some(secs) = run.timed_step(
        "1 GB: a fresh pod of the same spec, to Ready (its 1 GB written)",
        |c| fresh_start(c, "big-fresh", 1024),
    ) {
        t.fresh_big = secs;
    }
    run.timings = Some(t);
}
