//! What the steps ask the cluster, through kubectl as its admin.

use std::time::Duration;

use chalk_integration::{
    k8s::{until, Cluster, NODES},
    procs, Containerd,
};
use serde_json::Value;

pub fn pod(name: &str, body: &str) -> String {
    let node = NODES[0].0;
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  runtimeClassName: chalk
  nodeName: {node}
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 2
{body}"#
    )
}

/// `kubectl apply` of `yaml`; its stderr where it fails.
pub fn applied(node: &Cluster, yaml: &str) -> Result<(), String> {
    let out = node.apply(yaml);
    if out.code != 0 {
        return Err(out.stderr);
    }
    Ok(())
}

pub fn json(node: &Cluster, args: &[&str]) -> Result<Value, String> {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    let out = node.kubectl(&all);
    if out.code != 0 {
        return Err(format!("kubectl {args:?}: {}", out.stderr.trim()));
    }
    serde_json::from_str(&out.stdout).map_err(|e| e.to_string())
}

/// Waits for pod `name` to be Running with every container ready.
pub fn ready(node: &Cluster, name: &str, timeout: Duration) -> Result<Value, String> {
    let mut last = Value::Null;
    until(timeout, || {
        let p = json(node, &["get", "pod", name]).ok()?;
        last = p.clone();
        let running = p["status"]["phase"] == "Running";
        let all_ready = p["status"]["containerStatuses"]
            .as_array()
            .is_some_and(|cs| !cs.is_empty() && cs.iter().all(|c| c["ready"] == true));
        (running && all_ready).then_some(p)
    })
    .ok_or_else(|| {
        format!(
            "pod {name} not Running and ready in {timeout:?}: {}",
            summary(&last, node, name)
        )
    })
}

pub fn summary(p: &Value, node: &Cluster, name: &str) -> String {
    let events = node.kubectl(&[
        "get",
        "events",
        "--field-selector",
        &format!("involvedObject.name={name}"),
        "-o",
        "custom-columns=REASON:.reason,MESSAGE:.message",
        "--no-headers",
    ]);
    format!(
        "phase {}, containers {}; events: {}",
        p["status"]["phase"],
        p["status"]["containerStatuses"],
        events.stdout.trim().replace('\n', " | ")
    )
}

pub fn restarts(p: &Value) -> u64 {
    p["status"]["containerStatuses"][0]["restartCount"]
        .as_u64()
        .unwrap_or(0)
}

pub fn exec(
    node: &Cluster,
    pod: &str,
    container: Option<&str>,
    cmd: &[&str],
) -> chalk_integration::CtrOutput {
    let mut args = vec!["exec", pod];
    if let Some(c) = container {
        args.extend(["-c", c]);
    }
    args.push("--");
    args.extend_from_slice(cmd);
    node.kubectl(&args)
}

/// The id of pod `name`'s sandbox container on the first node.
pub fn sandbox_of(node: &Cluster, name: &str) -> Result<String, String> {
    sandbox_on(&node.nodes[0].containerd, name)
}

/// The id of pod `name`'s sandbox container in `containerd` (CRI labels it).
pub fn sandbox_on(containerd: &Containerd, name: &str) -> Result<String, String> {
    let filter = format!(
        "labels.\"io.kubernetes.pod.name\"=={name},labels.\"io.cri-containerd.kind\"==sandbox"
    );
    let out = containerd.ctr(["containers", "list", "-q", filter.as_str()]);
    out.stdout
        .lines()
        .next()
        .map(str::to_string)
        .ok_or_else(|| format!("no sandbox container for pod {name}: {out:?}"))
}

/// Shim and runsc processes that name `id`.
pub fn processes_of(id: &str) -> Vec<String> {
    procs::processes()
        .into_iter()
        .filter(|(_, a)| a.iter().any(|x| x.contains(id)))
        .filter(|(_, a)| {
            a.iter()
                .any(|x| x.contains("runsc") || x.contains("containerd-shim"))
        })
        .map(|(pid, a)| format!("{pid} {}", a.join(" ")))
        .collect()
}
