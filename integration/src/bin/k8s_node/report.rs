//! KUBERNETES.md: the components, then every step with its result, time and what it saw.

use std::{fmt::Write as _, process::Command};

use chalk_integration::{k8s::Binaries, procs};

use crate::{Step, Timings};

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

pub fn render(steps: &[Step], boot: f64, timings: Option<&Timings>) -> String {
    let bins = Binaries::from_env().ok();
    let mut t = String::new();
    let _ = writeln!(
        t,
        "# Kubernetes with chalk-shim: RuntimeClass, PodSnapshots, two nodes\n"
    );
    let _ = writeln!(
        t,
        "Written by `scripts/k8s-node --test` on {} from a real run on this machine: etcd, \
         kube-apiserver, kube-scheduler and kube-controller-manager (loopback, certificates made \
         for the run), and two nodes, `chalk-a` (10.88.78.1) and `chalk-b` (10.88.78.2), each \
         a kubelet against a private containerd whose CRI has the `chalk` handler as \
         `packaging/install.sh` registers it, runsc with `network = \"sandbox\"` over a CNI \
         bridge of the node's own, and `[restore_from]` on for the `default` and `tenant-b` \
         namespaces, each restoring from its own area of the registry (`pods/NAMESPACE`), \
         `golden/` shared with `tenant-b`. A Distribution registry (TLS and a password, on \
         loopback) carries snapshots between the nodes; chalk-agent runs on each node under \
         the RBAC and admission policies of `packaging/kubernetes/agent.yaml`, with a token \
         bound to a pod on its node, and `kubectl chalk` is the kubectl plugin. Everything is \
         driven through kubectl and the API.\n",
        today()
    );
    if let Some(b) = &bins {
        let _ = writeln!(t, "| component | version |\n|---|---|");
        let _ = writeln!(
            t,
            "| kube-apiserver | {} |",
            version(&b.apiserver, &["--version"])
        );
        let _ = writeln!(
            t,
            "| kube-scheduler | {} |",
            version(&b.scheduler, &["--version"])
        );
        let _ = writeln!(
            t,
            "| kube-controller-manager | {} |",
            version(&b.controller_manager, &["--version"])
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
    steps_table(&mut t, steps, boot);
    if let Some(x) = timings {
        let ratio = |a: f64, b: f64| {
            if b > 0.0 {
                format!("{:.2}x", a / b)
            } else {
                "-".into()
            }
        };
        let _ = writeln!(
            t,
            "\n## Against a fresh pod\n\nSeconds from the command to the pod Running and \
             Ready, each beside a fresh pod of the same spec made through the scheduler (for 1 \
             GB, the fresh pod is Ready once its 1 GB is written).\n\n| | from the snapshot | \
             fresh pod | ratio |\n|---|---|---|---|"
        );
        for (what, got, fresh) in [
            (
                "fork, small pod (the first of 3 Ready)",
                x.fork_small_first,
                x.fresh_small,
            ),
            ("fork, small pod (all 3 Ready)", x.fork_small, x.fresh_small),
            (
                "resume on the other node, small pod",
                x.resume_small,
                x.fresh_small,
            ),
            (
                "fork, 1 GB (through the scheduler)",
                x.fork_big,
                x.fresh_big,
            ),
            (
                "resume on the other node, 1 GB (pull included)",
                x.resume_big,
                x.fresh_big,
            ),
        ] {
            let _ = writeln!(
                t,
                "| {what} | {got:.2} | {fresh:.2} | {} |",
                ratio(got, fresh)
            );
        }
        let _ = writeln!(
            t,
            "\nThe 1 GB suspend (snapshot, push, the pod deleted) took {:.2}s; its second \
             suspend, on the node it was resumed on (only what changed pushed), {:.2}s.",
            x.suspend_big, x.suspend_big_again
        );
    }
    t.push_str(NOTES);
    t
}

const NOTES: &str = r#"
## Notes

- **Resource limits inside the sandbox.** runsc sizes a sandbox (`/proc/meminfo`, its CPUs)
  from the cgroup it runs in. The shim runs a pod's sandbox in the pod's own cgroup, which the
  kubelet sizes (the containers' limits plus the RuntimeClass overhead), rather than in the
  pause container's, which has no limits. It does so by the sandbox's cgroup path, which runsc
  does not compare across a restore, so a pod restored from a snapshot is sized by its own new
  pod's cgroup (gVisor's own shim uses an annotation, which runsc does compare, and which
  would refuse such a restore).
- **Release builds.** The run uses release builds of the shim, chalkctl and the agent: a debug
  build hashes a 1 GB snapshot in about 18 s instead of about 1 s.
- **The 1 GB fork** starts 15 s after the 1 GB resume, so that the resumed pod's memory has
  finished loading in the background. Its time to Ready varies widely from run to run (from
  3.6 to 16.6 s in the runs so far) while the shim's part (its row: the pull, which leaves the
  memory to arrive, the verify and runsc's restore) stays under a second: the rest goes
  between the restore and Ready (the kubelet's container starts and first probe while the
  restored memory loads), not yet explained.
- **Init containers.** The counter pod has one (`setup`, which prints `setup-ran`): the source
  runs it; every pod made from its snapshot skips it (reported Completed, exit 0, no output).
- The kubelet runs with `failCgroupV1: false`: this machine boots with cgroup v1, which
  kubelets since 1.35 refuse unless told.
- The kubelet's address is 10.88.78.1 on `lo` (a kubelet refuses a loopback node IP); the API
  server, etcd and the kubelet listen on loopback or that address only.
- A deleted pod's shim and runsc processes are gone as soon as `kubectl delete` returns; its
  stopped sandbox's record in containerd goes with the kubelet's next garbage collection.
"#;

/// AGENT-SANDBOX.md: agent-sandbox's controller on the two nodes, every step, and the
/// suspend, resume and claim times beside a cold Sandbox start.
pub fn render_agent_sandbox(
    steps: &[Step],
    boot: f64,
    controller: &str,
    x: &crate::agent_sandbox::Timings,
) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "# agent-sandbox on chalk: suspend with memory, resume on any node, warm pools from a golden snapshot\n"
    );
    let _ = writeln!(
        t,
        "Written by `scripts/k8s-node --agent-sandbox` on {} from a real run on this machine: the \
         two-node cluster of `KUBERNETES.md` (kube-apiserver, kube-scheduler, \
         kube-controller-manager, two kubelets against containerd with the `chalk` handler) with \
         kubernetes-sigs/agent-sandbox's own controller, `agent-sandbox-controller` built by \
         `scripts/peers --agent-sandbox` from `sigs.k8s.io/agent-sandbox` v1.0.1 (says: \
         {controller:?}), run out of cluster with `--extensions` and its four CRDs from the \
         module. chalk-agent runs on each node (suspending to the nodes' `[restore_from] \
         suspend_to`, REGISTRY/sandboxes), and the cluster agent (`chalk-agent cluster \
         --keep-snapshots 2`) beside them; a Distribution registry (TLS, a password, deletes \
         enabled) on loopback. Everything is driven through kubectl.\n",
        today()
    );
    steps_table(&mut t, steps, boot);
    let ratio = |a: f64| {
        if x.cold > 0.0 {
            format!("{:.2}x", a / x.cold)
        } else {
            "-".into()
        }
    };
    let _ = writeln!(
        t,
        "\n## Against a cold Sandbox\n\nSeconds, each beside a cold Sandbox of the same pod spec \
         (`kubectl apply` to its Ready condition) on the same cluster.\n\n| | seconds | cold \
         Sandbox | ratio |\n|---|---|---|---|"
    );
    for (what, got) in [
        (
            "suspend: the patch to the Suspended condition (snapshot and push included)",
            x.suspend,
        ),
        (
            "resume on the other node: the patch to Ready (pull included)",
            x.resume,
        ),
        ("claim to Ready from the warm pool", x.claim),
        (
            "a warm pool of 3 restores of the golden snapshot, apply to 3 ready",
            x.pool,
        ),
        (
            "a suspend whose registry is down (the pod released, the Sandbox marked)",
            x.suspend_failed,
        ),
    ] {
        let _ = writeln!(t, "| {what} | {got:.2} | {:.2} | {} |", x.cold, ratio(got));
    }
    t
}

/// The boot line and one row per step.
fn steps_table(t: &mut String, steps: &[Step], boot: f64) {
    let passed = steps.iter().filter(|s| s.ok).count();
    let _ = writeln!(
        t,
        "Both nodes were Ready {boot:.1}s after the start. {passed} of {} steps passed.\n",
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
}
