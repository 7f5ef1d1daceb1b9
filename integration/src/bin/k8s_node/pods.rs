//! The pods of the two-node steps and what is read of them: the counter pod, its count and
//! node, what its sandbox sees, when pods are Ready, the store on each node, and a pod start
//! the node refuses.

use std::{
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
    k8s::{until, Cluster},
};

use crate::kube::*;

/// The counter pod: counts seconds into /tmp/n and its log, ready while it counts; spread
/// across nodes with its forks (they carry its spec), cordoned nodes left out of the spread.
/// Its memory limit is 256 MiB (1.5 GiB when it fills memory), so its pod cgroup's is that
/// plus the RuntimeClass's 64 MiB: what the sandbox sees as MemTotal ([`pod_mib`]).
pub fn counter_pod(name: &str, node: &str, fill_mb: u64) -> String {
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
pub fn pod_mib(fill_mb: u64) -> u64 {
    if fill_mb > 0 {
        1536 + 64
    } else {
        256 + 64
    }
}

/// What pod `pod` is inside its sandbox: its hostname, its IPv4 addresses (without
/// loopback's), and the memory it sees (MemTotal, MiB), checked against the pod object (its
/// name, its pod IP) and the limit of its pod cgroup (`mib`).
pub fn inside(c: &Cluster, pod: &str, mib: u64) -> Result<String, String> {
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
pub fn skipped_init(c: &Cluster, pod: &str) -> Result<(), String> {
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
pub fn shim_breakdown(c: &Cluster, pod: &str) -> String {
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
pub struct ReadyWatch {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<(u32, u32)>,
}

pub fn watch_ready(kubeconfig: PathBuf, kubectl: PathBuf, pod: &str) -> ReadyWatch {
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
    pub fn end(self) -> (u32, u32) {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().unwrap_or((0, 0))
    }
}

/// Snapshots on `node` (chalkctl's records in the node's CRI namespace).
pub fn snapshots_on(c: &Cluster, node: usize) -> String {
    c.nodes[node]
        .containerd
        .chalkctl(&["snapshot", "list", "-o", "json"])
        .stdout
}

/// Bytes of the snapshot store of `node`.
pub fn store_bytes(c: &Cluster, node: usize) -> u64 {
    let store = c.nodes[node].containerd.snapshot_store();
    chalk_runtime::snapshot::store::Store::open(&store).map_or(0, |s| s.usage())
}

/// Waits for `pods` to be Running and ready; the time it took from `since`.
pub fn all_ready(c: &Cluster, pods: &[String], since: Instant) -> Result<f64, String> {
    for p in pods {
        ready(c, p, Duration::from_secs(180))?;
    }
    Ok(since.elapsed().as_secs_f64())
}

/// A fresh pod of the same kind through the scheduler (no nodeName): seconds to Ready.
pub fn fresh_start(c: &Cluster, name: &str, fill_mb: u64) -> Result<f64, String> {
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
