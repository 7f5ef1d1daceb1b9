//! The RuntimeClass steps on node A: a pod in gVisor, its overhead, logs, exec, limits, two
//! containers, a probe, a snapshot and fork beside Kubernetes, and delete.

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use chalk_integration::{containerd::IMAGE, k8s::until};

use crate::kube::*;
use crate::Run;

pub fn steps(run: &mut Run) {
    let image = IMAGE;
    run.step(
        "kubectl apply -f packaging/kubernetes/runtimeclass.yaml",
        |n| {
            let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../packaging/kubernetes/runtimeclass.yaml");
            let text = std::fs::read_to_string(&path).map_err(|e| e.to_string())?;
            let out = n.apply(&text);
            if out.code != 0 {
                return Err(out.stderr);
            }
            let rc = json(n, &["get", "runtimeclass", "chalk"])?;
            Ok(format!(
                "{} (handler {}, overhead {})",
                out.stdout.trim(),
                rc["handler"],
                rc["overhead"]["podFixed"]
            ))
        },
    );
    let basic = pod(
        "chalk-basic",
        &format!(
            r#"  containers:
  - name: main
    image: {image}
    imagePullPolicy: Never
    command: ["sh", "-c", "echo hello from chalk; dmesg | head -n 1; exec sleep 100000"]
    resources:
      limits: {{memory: "256Mi", cpu: "500m"}}
"#
        ),
    );
    let up = run.step(
        "a Pod with runtimeClassName: chalk reaches Running, in gVisor",
        |n| {
            applied(n, &basic)?;
            ready(n, "chalk-basic", Duration::from_secs(120))?;
            let k = exec(n, "chalk-basic", None, &["dmesg"]);
            let first = k.stdout.lines().next().unwrap_or_default().to_string();
            if !k.stdout.contains("gVisor") {
                return Err(format!("dmesg does not say gVisor: {k:?}"));
            }
            let uname = exec(n, "chalk-basic", None, &["uname", "-r"]);
            Ok(format!(
                "dmesg: {first:?}; uname -r: {}",
                uname.stdout.trim()
            ))
        },
    );
    if up {
        run.step("pod overhead from the RuntimeClass is on the pod", |n| {
            let p = json(n, &["get", "pod", "chalk-basic"])?;
            let o = &p["spec"]["overhead"];
            if o["memory"] != "64Mi" || o["cpu"] != "100m" {
                return Err(format!("spec.overhead: {o}"));
            }
            Ok(format!("spec.overhead {o}"))
        });
        run.step("kubectl logs", |n| {
            let out = n.kubectl(&["logs", "chalk-basic"]);
            if out.code != 0 || !out.stdout.contains("hello from chalk") {
                return Err(format!("{out:?}"));
            }
            Ok(format!("{:?}", out.stdout.trim()))
        });
        run.step("kubectl exec (output and exit status)", |n| {
            let out = exec(n, "chalk-basic", None, &["sh", "-c", "echo $((6*7))"]);
            if out.code != 0 || out.stdout.trim() != "42" {
                return Err(format!("{out:?}"));
            }
            let failed = exec(n, "chalk-basic", None, &["sh", "-c", "exit 3"]);
            if failed.code != 3 {
                return Err(format!("exit 3 came back as {failed:?}"));
            }
            Ok("echo $((6*7)) printed 42; exit 3 made kubectl exit 3".into())
        });
        run.step("resource limits are visible inside", |n| {
            let out = exec(
                n,
                "chalk-basic",
                None,
                &[
                    "sh",
                    "-c",
                    "grep MemTotal /proc/meminfo; nproc; cat /sys/fs/cgroup/memory.max \
                     /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/cpu.max \
                     /sys/fs/cgroup/cpu/cpu.cfs_quota_us 2>/dev/null; true",
                ],
            );
            let inside = out.stdout.trim().replace('\n', "; ");
            // The pod's cgroup on the host, as the kubelet sized it (limits plus overhead).
            let p = json(n, &["get", "pod", "chalk-basic"])?;
            let uid = p["metadata"]["uid"].as_str().unwrap_or_default();
            let qos = match p["status"]["qosClass"].as_str() {
                Some("Burstable") => "burstable/",
                Some("BestEffort") => "besteffort/",
                _ => "",
            };
            let read = |ctl: &str, file: &str| {
                std::fs::read_to_string(format!(
                    "/sys/fs/cgroup/{ctl}{node}/kubepods/{qos}pod{uid}/{file}",
                    node = chalk_integration::k8s::NODES[0].0
                ))
                .unwrap_or_default()
                .trim()
                .to_string()
            };
            let host = format!(
                "memory {} cpu quota {}",
                [
                    read("memory/", "memory.limit_in_bytes"),
                    read("", "memory.max")
                ]
                .concat(),
                [read("cpu/", "cpu.cfs_quota_us"), read("", "cpu.max")].concat()
            );
            // The pod's cgroup holds 256 MiB of limits plus the RuntimeClass's 64 MiB.
            let pod_kb = format!("{} kB", 320u64 << 10);
            if out.stdout.contains(&pod_kb) {
                return Ok(format!("inside: {inside}; the pod's cgroup: {host}"));
            }
            Err(format!(
                "inside the sandbox: {inside}, not MemTotal {pod_kb}; the pod's cgroup on the \
                 host: {host}"
            ))
        });
    }
    let two = pod(
        "chalk-two",
        &format!(
            r#"  containers:
  - name: web
    image: {image}
    imagePullPolicy: Never
    command: ["sh", "-c", "mkdir -p /www && echo served-by-web > /www/index.html && exec httpd -f -p 8080 -h /www"]
  - name: client
    image: {image}
    imagePullPolicy: Never
    command: ["sleep", "100000"]
"#
        ),
    );
    run.step(
        "a two-container pod: both run, and share the pod's network",
        |n| {
            applied(n, &two)?;
            ready(n, "chalk-two", Duration::from_secs(120))?;
            let got = until(Duration::from_secs(20), || {
                let o = exec(
                    n,
                    "chalk-two",
                    Some("client"),
                    &["wget", "-qO-", "http://127.0.0.1:8080/"],
                );
                o.stdout.contains("served-by-web").then_some(o)
            })
            .ok_or("the client container cannot reach the web container on localhost")?;
            let ip = json(n, &["get", "pod", "chalk-two"])?["status"]["podIP"].clone();
            Ok(format!(
                "client got {:?} from web over localhost; pod IP {ip}",
                got.stdout.trim()
            ))
        },
    );
    let probed = pod(
        "chalk-probe",
        &format!(
            r#"  containers:
  - name: main
    image: {image}
    imagePullPolicy: Never
    command: ["sh", "-c", "touch /tmp/healthy; i=0; while :; do i=$((i+1)); echo $i > /tmp/count; sleep 1; done"]
    livenessProbe:
      exec: {{command: ["cat", "/tmp/healthy"]}}
      periodSeconds: 2
      failureThreshold: 2
"#
        ),
    );
    let probe_up = run.step("a liveness probe that fails restarts the container", |n| {
        applied(n, &probed)?;
        ready(n, "chalk-probe", Duration::from_secs(120))?;
        let rm = exec(n, "chalk-probe", None, &["rm", "/tmp/healthy"]);
        if rm.code != 0 {
            return Err(format!("rm /tmp/healthy: {rm:?}"));
        }
        let t = Instant::now();
        until(Duration::from_secs(60), || {
            let p = json(n, &["get", "pod", "chalk-probe"]).ok()?;
            (restarts(&p) >= 1).then_some(())
        })
        .ok_or("the container was not restarted within 60 s of its probe failing")?;
        ready(n, "chalk-probe", Duration::from_secs(60))?;
        Ok(format!(
            "restarted {:.1}s after its probe's file was removed, Ready again",
            t.elapsed().as_secs_f64()
        ))
    });
    if probe_up {
        run.step(
            "chalkctl -n k8s.io snapshot create and fork of the running pod; its probes keep passing",
            |n| {
                let sandbox = sandbox_of(n, "chalk-probe")?;
                let before = restarts(&json(n, &["get", "pod", "chalk-probe"])?);
                let t = Instant::now();
                let snap = n.nodes[0].containerd.chalkctl(&["snapshot", "create", "--id", &sandbox]);
                if snap.code != 0 {
                    return Err(format!("snapshot create: {snap:?}"));
                }
                let snap_secs = t.elapsed().as_secs_f64();
                let id = snap.stdout.trim().to_string();
                let t = Instant::now();
                let fork = n.nodes[0].containerd.chalkctl(&["fork", "--snapshot-id", &id, "--fork-id", "probefork"]);
                if fork.code != 0 {
                    return Err(format!("fork: {fork:?}"));
                }
                let fork_secs = t.elapsed().as_secs_f64();
                // Watch the probes through several periods after the snapshot.
                std::thread::sleep(Duration::from_secs(12));
                let counted = exec(n, "chalk-probe", None, &["cat", "/tmp/count"]);
                let p = json(n, &["get", "pod", "chalk-probe"])?;
                let after = restarts(&p);
                let still_ready = p["status"]["containerStatuses"][0]["ready"] == true;
                let unhealthy = n.kubectl(&[
                    "get",
                    "events",
                    "--field-selector",
                    "involvedObject.name=chalk-probe,reason=Unhealthy",
                    "-o",
                    "jsonpath={range .items[*]}{.lastTimestamp} {end}",
                ]);
                // The fork is a pod of its own: its copy of `main` is `main-probefork`.
                let fork_count =
                    n.nodes[0].containerd.chalkctl(&["exec", "--id", "main-probefork", "--", "cat", "/tmp/count"]);
                let removed = n.nodes[0].containerd.chalkctl(&["rm", "--force", "--grace", "1s", "--id", "probefork"]);
                let deleted = n.nodes[0].containerd.chalkctl(&["snapshot", "delete", "--snapshot-id", &id]);
                if after != before || !still_ready {
                    return Err(format!(
                        "the pod's probes failed after the snapshot: restarts {before} -> {after}, \
                         ready {still_ready}; Unhealthy events at {}",
                        unhealthy.stdout
                    ));
                }
                if fork_count.code != 0 || removed.code != 0 || deleted.code != 0 {
                    return Err(format!(
                        "the fork: exec {fork_count:?}, rm {removed:?}, snapshot delete {deleted:?}"
                    ));
                }
                Ok(format!(
                    "snapshot {} in {snap_secs:.2}s, fork in {fork_secs:.2}s; 12 s later the pod's \
                     counter read {} and the fork's {} (both counting on); restarts {before} -> \
                     {after}, Ready throughout",
                    &id[..19.min(id.len())],
                    counted.stdout.trim(),
                    fork_count.stdout.trim()
                ))
            },
        );
    }
    run.step("kubectl delete leaves no shim or sandbox", |n| {
        let mut sandboxes = Vec::new();
        for p in ["chalk-basic", "chalk-two", "chalk-probe"] {
            if let Ok(s) = sandbox_of(n, p) {
                sandboxes.push(s);
            }
        }
        let t = Instant::now();
        let out = n.kubectl(&[
            "delete",
            "pod",
            "chalk-basic",
            "chalk-two",
            "chalk-probe",
            "--ignore-not-found",
            "--wait=true",
            "--timeout=120s",
        ]);
        if out.code != 0 {
            return Err(out.stderr);
        }
        let secs = t.elapsed().as_secs_f64();
        let left = until(Duration::from_secs(30), || {
            let all: Vec<String> = sandboxes.iter().flat_map(|s| processes_of(s)).collect();
            all.is_empty().then_some(())
        });
        if left.is_none() {
            let all: Vec<String> = sandboxes.iter().flat_map(|s| processes_of(s)).collect();
            return Err(format!("left running: {all:?}"));
        }
        let gone_secs = t.elapsed().as_secs_f64();
        // The stopped sandboxes' records go with the kubelet's garbage collection (each
        // minute).
        let kept = || {
            let containers = n.nodes[0].containerd.ctr(["containers", "list", "-q"]);
            containers
                .stdout
                .lines()
                .filter(|c| sandboxes.iter().any(|s| c == s))
                .map(str::to_string)
                .collect::<Vec<_>>()
        };
        if until(Duration::from_secs(150), || kept().is_empty().then_some(())).is_none() {
            return Err(format!(
                "sandbox containers left in containerd after 150 s: {:?}",
                kept()
            ));
        }
        Ok(format!(
            "3 pods deleted in {secs:.1}s; no shim or runsc process of their {} sandboxes at \
             {gone_secs:.1}s; their records removed by the kubelet's garbage collection at {:.1}s",
            sandboxes.len(),
            t.elapsed().as_secs_f64()
        ))
    });
}
