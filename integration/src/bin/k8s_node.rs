//! A real Kubernetes node selecting chalk-shim by RuntimeClass (see `chalk_integration::k8s`).
//!
//!   chalk-k8s-node serve           start the node, print KUBECONFIG, stop on SIGINT/SIGTERM
//!                                  or when stdin closes
//!   chalk-k8s-node test REPORT.md  start it, run every step, write the report (each step's
//!                                  result, time and what it saw)
//!
//! Needs root, CHALK_K8S_BIN, CHALK_ETCD, CHALK_CNI_BIN (scripts/peers --k8s), CHALK_CHALKCTL
//! or a built chalkctl, and the containerd/runsc to run (CHALK_CONTAINERD, CHALK_CTR,
//! CHALK_RUNSC).

use std::{
    fmt::Write as _,
    io::Read,
    path::PathBuf,
    process::Command,
    time::{Duration, Instant},
};

use chalk_integration::{
    containerd::IMAGE,
    k8s::{until, Binaries, Node, NODE},
    procs,
};
use serde_json::Value;

fn main() {
    // SIGINT, SIGTERM and SIGHUP all end it as Ctrl-C would, with nothing left running.
    chalk_integration::stop::install();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("serve") => serve(),
        Some("test") => test(PathBuf::from(
            args.get(1)
                .map_or("packaging/kubernetes/KUBERNETES.md", String::as_str),
        )),
        _ => Err("usage: chalk-k8s-node serve | test [REPORT.md]".into()),
    };
    if let Err(e) = result {
        eprintln!("chalk-k8s-node: {e}");
        std::process::exit(1);
    }
}

fn start() -> Result<Node, String> {
    let bins = Binaries::from_env()?;
    let cni = std::env::var_os("CHALK_CNI_BIN")
        .map(PathBuf::from)
        .ok_or("CHALK_CNI_BIN is not set: run scripts/peers --k8s")?;
    Node::start(bins, cni)
}

fn serve() -> Result<(), String> {
    let node = start()?;
    println!("export KUBECONFIG={}", node.kubeconfig().display());
    println!(
        "export CONTAINERD_ADDRESS={} CONTAINERD_NAMESPACE=k8s.io",
        node.containerd.socket().display()
    );
    eprintln!("node {NODE} is Ready; close stdin (Ctrl-D) or interrupt to stop it");
    // A signal stops the node from chalk_integration::stop's watcher; Ctrl-D here.
    let mut buf = [0u8; 64];
    while matches!(std::io::stdin().read(&mut buf), Ok(n) if n > 0) {}
    eprintln!("stopping the node");
    drop(node);
    Ok(())
}

struct Step {
    name: String,
    ok: bool,
    secs: f64,
    detail: String,
}

struct Run<'a> {
    node: &'a Node,
    steps: Vec<Step>,
}

impl Run<'_> {
    fn step(&mut self, name: &str, f: impl FnOnce(&Node) -> Result<String, String>) -> bool {
        eprintln!("== {name}");
        let started = Instant::now();
        let got = f(self.node);
        let secs = started.elapsed().as_secs_f64();
        let (ok, detail) = match got {
            Ok(d) => (true, d),
            Err(e) => (false, e),
        };
        eprintln!(
            "   {} in {secs:.1}s: {detail}",
            if ok { "ok" } else { "FAILED" }
        );
        self.steps.push(Step {
            name: name.into(),
            ok,
            secs,
            detail,
        });
        ok
    }
}

fn pod(name: &str, body: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  runtimeClassName: chalk
  nodeName: {NODE}
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 2
{body}"#
    )
}

fn json(node: &Node, args: &[&str]) -> Result<Value, String> {
    let mut all = args.to_vec();
    all.extend(["-o", "json"]);
    let out = node.kubectl(&all);
    if out.code != 0 {
        return Err(format!("kubectl {args:?}: {}", out.stderr.trim()));
    }
    serde_json::from_str(&out.stdout).map_err(|e| e.to_string())
}

/// Waits for pod `name` to be Running with every container ready.
fn ready(node: &Node, name: &str, timeout: Duration) -> Result<Value, String> {
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

fn summary(p: &Value, node: &Node, name: &str) -> String {
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

fn restarts(p: &Value) -> u64 {
    p["status"]["containerStatuses"][0]["restartCount"]
        .as_u64()
        .unwrap_or(0)
}

fn exec(
    node: &Node,
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

/// The id of pod `name`'s sandbox container in containerd (CRI labels it).
fn sandbox_of(node: &Node, name: &str) -> Result<String, String> {
    let filter = format!(
        "labels.\"io.kubernetes.pod.name\"=={name},labels.\"io.cri-containerd.kind\"==sandbox"
    );
    let out = node
        .containerd
        .ctr(["containers", "list", "-q", filter.as_str()]);
    out.stdout
        .lines()
        .next()
        .map(str::to_string)
        .ok_or_else(|| format!("no sandbox container for pod {name}: {out:?}"))
}

/// Shim and runsc processes that name `id`.
fn processes_of(id: &str) -> Vec<String> {
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

fn test(report: PathBuf) -> Result<(), String> {
    let started = Instant::now();
    let node = start()?;
    let boot = started.elapsed().as_secs_f64();
    let mut run = Run {
        node: &node,
        steps: Vec::new(),
    };
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
            let out = n.apply(&basic);
            if out.code != 0 {
                return Err(out.stderr);
            }
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
                    "/sys/fs/cgroup/{ctl}kubepods/{qos}pod{uid}/{file}"
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
            let limit = (256u64 << 20).to_string();
            let pod_limit = (320u64 << 20).to_string();
            if out.stdout.contains(&limit) || out.stdout.contains(&pod_limit) {
                return Ok(format!("inside: {inside}; the pod's cgroup: {host}"));
            }
            Err(format!(
                "inside the sandbox: {inside} (the host's memory and CPUs); the pod's cgroup on \
                 the host: {host}: the limits are enforced there, but runsc sizes the sandbox \
                 from the cgroup it is given, the pause container's, which has none"
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
            let out = n.apply(&two);
            if out.code != 0 {
                return Err(out.stderr);
            }
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
        let out = n.apply(&probed);
        if out.code != 0 {
            return Err(out.stderr);
        }
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
                let snap = n.containerd.chalkctl(&["snapshot", "create", "--id", &sandbox]);
                if snap.code != 0 {
                    return Err(format!("snapshot create: {snap:?}"));
                }
                let snap_secs = t.elapsed().as_secs_f64();
                let id = snap.stdout.trim().to_string();
                let t = Instant::now();
                let fork = n.containerd.chalkctl(&["fork", "--snapshot-id", &id, "--fork-id", "probefork"]);
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
                    n.containerd.chalkctl(&["exec", "--id", "main-probefork", "--", "cat", "/tmp/count"]);
                let removed = n.containerd.chalkctl(&["rm", "--force", "--grace", "1s", "--id", "probefork"]);
                let deleted = n.containerd.chalkctl(&["snapshot", "delete", "--snapshot-id", &id]);
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
            let containers = n.containerd.ctr(["containers", "list", "-q"]);
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
    let steps = std::mem::take(&mut run.steps);
    let text = render(&steps, boot);
    drop(node);
    std::fs::write(&report, &text).map_err(|e| format!("{}: {e}", report.display()))?;
    let failed = steps.iter().filter(|s| !s.ok).count();
    eprintln!(
        "{} of {} steps passed; report in {}",
        steps.len() - failed,
        steps.len(),
        report.display()
    );
    if failed > 0 {
        return Err(format!("{failed} steps failed"));
    }
    Ok(())
}

fn today() -> String {
    Command::new("date")
        .args(["-u", "+%F"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// What a peer is: the pinned version its directory in the peers' cache names (binaries built
/// from the module proxy say no version of their own), and what it says.
fn version(bin: &std::path::Path, args: &[&str]) -> String {
    let pinned = bin
        .parent()
        .and_then(|d| d.file_name())
        .map(|d| d.to_string_lossy().into_owned())
        .unwrap_or_default();
    format!("`{pinned}` (says: {})", procs::first_line(bin, args))
}

fn render(steps: &[Step], boot: f64) -> String {
    let bins = Binaries::from_env().ok();
    let mut t = String::new();
    let _ = writeln!(
        t,
        "# A Kubernetes node selecting chalk-shim by RuntimeClass\n"
    );
    let _ = writeln!(
        t,
        "Written by `scripts/k8s-node --test` on {} from a real run: etcd, kube-apiserver and a \
         kubelet on this machine (loopback, certificates made for the run), a private \
         containerd whose CRI has the `chalk` handler as `packaging/install.sh` registers it, \
         runsc with `network = \"sandbox\"` over the CNI bridge plugin. No scheduler or \
         controller manager runs: pods name their node (`nodeName`), and the `default` \
         service account is created by hand.\n",
        today()
    );
    if let Some(b) = &bins {
        let _ = writeln!(t, "| component | version |\n|---|---|");
        let _ = writeln!(
            t,
            "| kube-apiserver | {} |",
            version(&b.apiserver, &["--version"])
        );
        let _ = writeln!(t, "| kubelet | {} |", version(&b.kubelet, &["--version"]));
        let _ = writeln!(
            t,
            "| kubectl | {} |",
            version(&b.kubectl, &["version", "--client"])
        );
        let _ = writeln!(t, "| etcd | {} |", version(&b.etcd, &["--version"]));
        let containerd = chalk_integration::containerd::program("CHALK_CONTAINERD", "containerd");
        let _ = writeln!(
            t,
            "| containerd | {} |",
            version(&containerd, &["--version"])
        );
        let runsc = std::env::var("CHALK_RUNSC").unwrap_or_else(|_| "runsc".into());
        let _ = writeln!(
            t,
            "| runsc | {} |\n",
            version(std::path::Path::new(&runsc), &["--version"])
        );
    }
    let passed = steps.iter().filter(|s| s.ok).count();
    let _ = writeln!(
        t,
        "The node was Ready {boot:.1}s after the start. {passed} of {} steps passed.\n",
        steps.len()
    );
    let _ = writeln!(
        t,
        "| step | result | time | what it saw |\n|---|---|---|---|"
    );
    for s in steps {
        let _ = writeln!(
            t,
            "| {} | {} | {:.1}s | {} |",
            s.name,
            if s.ok { "pass" } else { "**fail**" },
            s.secs,
            s.detail.replace('|', "\\|").replace('\n', " ")
        );
    }
    t.push_str(NOTES);
    t
}

const NOTES: &str = r#"
## Notes

- **Resource limits inside the sandbox.** The kubelet sizes the pod's cgroup (the containers'
  limits plus the RuntimeClass overhead) and the sandbox is held to it on the host, but inside
  gVisor `/proc/meminfo`, `nproc` and the cgroup files show the host's figures: runsc sizes a
  sandbox from the cgroup it is started in, the pause container's, which the kubelet gives no
  limits. gVisor's own shim names the pod's cgroup instead (the annotation
  `dev.gvisor.spec.cgroup-parent`); chalk-shim does not, because the runsc tested here checks
  that annotation across a checkpoint and refuses to restore a fork of the pod anywhere but in
  the source pod's cgroup (tried: the fork failed with `"Annotations" does not match across
  checkpoint restore`). A later gVisor accepts a new pod's cgroup at restore (its restore
  validation tests a restore into a new pod); with such a runsc the shim
  can name the pod's cgroup and this step can pass.
- The kubelet runs with `failCgroupV1: false`: this machine boots with cgroup v1, which
  kubelets since 1.35 refuse unless told.
- The kubelet's address is 10.88.78.1 on `lo` (a kubelet refuses a loopback node IP); the API
  server, etcd and the kubelet listen on loopback or that address only.
- A deleted pod's shim and runsc processes are gone as soon as `kubectl delete` returns; its
  stopped sandbox's record in containerd goes with the kubelet's next garbage collection.
"#;
