//! A real Kubernetes node selecting chalk-shim by RuntimeClass (see `chalk_integration::k8s`).
//!
//!   chalk-k8s-node serve           start the node, print KUBECONFIG, stop on SIGINT/SIGTERM
//!                                  or when stdin closes
//!   chalk-k8s-node test REPORT.md  start it, run every step, write the report (each step's
//!                                  result, time and what it saw)
//!   chalk-k8s-node agent-sandbox REPORT.md
//!                                  the same with kubernetes-sigs/agent-sandbox's controller
//!                                  (CHALK_AGENT_SANDBOX)
//!
//! Needs root, CHALK_K8S_BIN, CHALK_ETCD, CHALK_CNI_BIN (scripts/peers --k8s), CHALK_CHALKCTL
//! or a built chalkctl, and the containerd/runsc to run (CHALK_CONTAINERD, CHALK_CTR,
//! CHALK_RUNSC).

use std::{io::Read, path::PathBuf, time::Instant};

use chalk_integration::{
    k8s::{Binaries, Cluster, Start, NODES},
    registry::Secured,
};

mod agent_sandbox;
mod agents;
mod kube;
mod pods;
mod report;
mod runtimeclass;
mod snapshots;
mod tenants;

fn main() {
    // SIGINT, SIGTERM and SIGHUP all end it as Ctrl-C would, with nothing left running.
    chalk_integration::stop::install();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("serve") => serve(),
        Some("agent-sandbox") => agent_sandbox_test(PathBuf::from(
            args.get(1)
                .map_or("packaging/kubernetes/AGENT-SANDBOX.md", String::as_str),
        )),
        Some("test") => test(PathBuf::from(
            args.get(1)
                .map_or("packaging/kubernetes/KUBERNETES.md", String::as_str),
        )),
        _ => {
            Err("usage: chalk-k8s-node serve | test [REPORT.md] | agent-sandbox [REPORT.md]".into())
        }
    };
    if let Err(e) = result {
        eprintln!("chalk-k8s-node: {e}");
        std::process::exit(1);
    }
}

fn start(registry: Option<&Secured>) -> Result<Cluster, String> {
    let bins = Binaries::from_env()?;
    let cni = std::env::var_os("CHALK_CNI_BIN")
        .map(PathBuf::from)
        .ok_or("CHALK_CNI_BIN is not set: run scripts/peers --k8s")?;
    // Two tenants, each with its area of the registry; Sandboxes suspend apart; a golden
    // prefix shared with the second; what the registry serves trusted unsigned (the CRI and
    // travel tests check signatures).
    let (options, restore_from) = match registry {
        Some(r) => (
            format!("[trust]\n[[trust.rules]]\nscope = \"{}\"\nunsigned = \"allow\"\n", r.addr),
            format!(
                "namespaces = [\"default\", \"{TENANT_B}\"]\nregistries = [\"{0}/pods/{{namespace}}\"]\n\
                 suspend_to = \"{0}/sandboxes\"\n[[restore_from.shared]]\nprefixes = \
                 [\"{0}/golden\"]\nnamespaces = [\"{TENANT_B}\"]\n",
                r.addr
            ),
        ),
        None => (String::new(), String::new()),
    };
    Cluster::start(Start {
        bins,
        cni_bin: cni,
        nodes: NODES.len(),
        registry,
        options,
        restore_from,
    })
}

/// The second tenant's namespace (the first is `default`).
pub const TENANT_B: &str = "tenant-b";

/// The registry pods' snapshots travel through (CHALK_REGISTRY, scripts/peers).
/// The registry between the nodes, with `env` for its configuration.
fn registry(env: &[(&str, &str)]) -> Result<Secured, String> {
    let bin = std::env::var_os("CHALK_REGISTRY")
        .filter(|v| !v.is_empty())
        .ok_or("CHALK_REGISTRY is not set: run scripts/peers")?;
    Secured::start(std::path::Path::new(&bin), None, env)
}

fn serve() -> Result<(), String> {
    let registry = registry(&[]).ok();
    let cluster = start(registry.as_ref())?;
    println!("export KUBECONFIG={}", cluster.kubeconfig().display());
    for n in &cluster.nodes {
        println!(
            "# node {} ({}): CONTAINERD_ADDRESS={} CONTAINERD_NAMESPACE=k8s.io",
            n.name,
            n.ip,
            n.containerd.socket().display()
        );
    }
    if let Some(r) = &registry {
        println!(
            "# registry {} (hosts dir {})",
            r.addr,
            r.hosts_dir.display()
        );
    }
    eprintln!("the cluster is Ready; close stdin (Ctrl-D) or interrupt to stop it");
    // A signal stops the cluster from chalk_integration::stop's watcher; Ctrl-D here.
    let mut buf = [0u8; 64];
    while matches!(std::io::stdin().read(&mut buf), Ok(n) if n > 0) {}
    eprintln!("stopping the cluster");
    drop(cluster);
    Ok(())
}

pub struct Step {
    name: String,
    ok: bool,
    secs: f64,
    detail: String,
}

/// The comparisons the report ends with (seconds to Ready).
#[derive(Default, Clone)]
pub struct Timings {
    pub fork_small: f64,
    pub fork_small_first: f64,
    pub fresh_small: f64,
    pub resume_small: f64,
    pub suspend_big: f64,
    /// The second suspend of the 1 GB pod, after its resume on the other node.
    pub suspend_big_again: f64,
    pub resume_big: f64,
    pub fork_big: f64,
    pub fresh_big: f64,
}

pub struct Run<'a> {
    node: &'a Cluster,
    steps: Vec<Step>,
    timings: Option<Timings>,
}

impl Run<'_> {
    fn step(&mut self, name: &str, f: impl FnOnce(&Cluster) -> Result<String, String>) -> bool {
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

    /// A step whose result is a time in seconds (None when it failed).
    fn timed_step(
        &mut self,
        name: &str,
        f: impl FnOnce(&Cluster) -> Result<f64, String>,
    ) -> Option<f64> {
        let mut got = None;
        self.step(name, |c| {
            let secs = f(c)?;
            got = Some(secs);
            Ok(format!("Ready {secs:.2}s after kubectl apply"))
        });
        got
    }
}

fn agent_sandbox_test(report: PathBuf) -> Result<(), String> {
    let started = Instant::now();
    agent_sandbox::controller_dir()?;
    // The agent removes a deleted Sandbox's snapshots: the registry must allow deletes.
    let mut registry = registry(&[("REGISTRY_STORAGE_DELETE_ENABLED", "true")])?;
    let mut cluster = start(Some(&registry))?;
    let controller = agent_sandbox::start_controller(&mut cluster)?;
    let boot = started.elapsed().as_secs_f64();
    let mut run = Run {
        node: &cluster,
        steps: Vec::new(),
        timings: None,
    };
    let timings = agent_sandbox::steps(&mut run, &mut registry, &controller);
    let steps = std::mem::take(&mut run.steps);
    let text = report::render_agent_sandbox(&steps, boot, &controller, &timings);
    drop(cluster);
    write_report(&report, &text, &steps)
}

fn test(report: PathBuf) -> Result<(), String> {
    let started = Instant::now();
    let registry = registry(&[])?;
    let cluster = start(Some(&registry))?;
    let boot = started.elapsed().as_secs_f64();
    let mut run = Run {
        node: &cluster,
        steps: Vec::new(),
        timings: None,
    };
    runtimeclass::steps(&mut run);
    snapshots::steps(&mut run, &registry);
    let steps = std::mem::take(&mut run.steps);
    let text = report::render(&steps, boot, run.timings.as_ref());
    drop(cluster);
    write_report(&report, &text, &steps)
}

/// Writes the report, says how many steps passed, and fails where any did not.
fn write_report(report: &std::path::Path, text: &str, steps: &[Step]) -> Result<(), String> {
    std::fs::write(report, text).map_err(|e| format!("{}: {e}", report.display()))?;
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
