//! chalk-agent on the two nodes as packaging/kubernetes/agent.yaml deploys it, run here as
//! processes: the CRD, the agents' accounts, roles and admission policies applied; each node
//! agent with a token bound to a pod of its own on its node (the node-name claim the policies
//! hold it to), and the cluster agent with its account's token.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
};

use chalk_integration::{containerd::PAUSE_IMAGE, k8s::Cluster, registry::Secured};
use serde_json::Value;

use crate::kube::applied;

/// The agents, stopped when dropped.
pub struct Agents(Vec<Child>);

impl Drop for Agents {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Where this run's binaries are (chalk-agent, kubectl-chalk).
pub fn built() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|e| Some(e.parent()?.to_path_buf()))
        .unwrap_or_default()
}

pub fn packaging(file: &str) -> Result<String, String> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../packaging/kubernetes")
        .join(file);
    std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))
}

/// The pod of node `node`'s agent: what its token is bound to (it runs pause, in gVisor).
fn placeholder(node: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: chalk-agent-{node}, namespace: chalk-system}}
spec:
  nodeName: {node}
  serviceAccountName: chalk-agent
  automountServiceAccountToken: false
  runtimeClassName: chalk
  tolerations: [{{operator: Exists}}]
  containers:
  - {{name: agent, image: {PAUSE_IMAGE}, imagePullPolicy: Never}}
"#
    )
}

/// Starts chalk-agent with `args` as the holder of `kubeconfig`, logging to `log`.
fn spawn_agent(
    args: &[std::ffi::OsString],
    kubeconfig: &Path,
    registry: &Secured,
    log: &Path,
) -> Result<Child, String> {
    let out = std::fs::File::create(log).map_err(|e| e.to_string())?;
    let err = out.try_clone().map_err(|e| e.to_string())?;
    Command::new(built().join("chalk-agent"))
        .args(args)
        .arg("--hosts-dir")
        .arg(&registry.hosts_dir)
        .env("KUBECONFIG", kubeconfig)
        .env("DOCKER_CONFIG", &registry.docker_config)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("chalk-agent {args:?}: {e}"))
}

/// The agents started: each node's kubeconfig (its bound token), by node name.
pub struct Started {
    pub agents: Agents,
    pub kubeconfigs: Vec<(String, PathBuf)>,
}

/// Applies the CRD and agent.yaml but what runs (its DaemonSet and Deployment), starts one
/// node agent per node (with `extra` arguments) and, with `cluster_agent`, the cluster agent
/// keeping `keep` snapshots per Sandbox.
pub fn start_agents(
    c: &Cluster,
    registry: &Secured,
    dir: &Path,
    extra: &[String],
    cluster_agent: Option<usize>,
) -> Result<Started, String> {
    applied(c, &packaging("crd.yaml")?)?;
    c.established("podsnapshots.chalk.io")?;
    let rules: Vec<String> = packaging("agent.yaml")?
        .split("\n---\n")
        .filter(|d| !d.contains("kind: DaemonSet") && !d.contains("kind: Deployment"))
        .map(String::from)
        .collect();
    applied(c, &rules.join("\n---\n"))?;
    let mut agents = Agents(Vec::new());
    let mut kubeconfigs = Vec::new();
    for n in &c.nodes {
        applied(c, &placeholder(n.name))?;
        let bound = format!("chalk-agent-{}", n.name);
        let kubeconfig = c.kubeconfig_with(
            &dir.join(format!("agent-{}.kubeconfig", n.name)),
            &c.token("chalk-agent", Some(&bound))?,
        )?;
        let mut args: Vec<std::ffi::OsString> = vec![
            "--node".into(),
            n.name.into(),
            "--address".into(),
            n.containerd.socket().into(),
            "--config".into(),
            n.containerd.options_path().into(),
        ];
        args.extend(extra.iter().map(Into::into));
        let log = dir.join(format!("chalk-agent-{}.log", n.name));
        agents
            .0
            .push(spawn_agent(&args, &kubeconfig, registry, &log)?);
        kubeconfigs.push((n.name.to_string(), kubeconfig));
    }
    if let Some(keep) = cluster_agent {
        let kubeconfig = c.kubeconfig_with(
            &dir.join("cluster-agent.kubeconfig"),
            &c.token("chalk-cluster-agent", None)?,
        )?;
        let args: Vec<std::ffi::OsString> = vec![
            "cluster".into(),
            "--keep-snapshots".into(),
            keep.to_string().into(),
        ];
        let log = dir.join("chalk-cluster-agent.log");
        agents
            .0
            .push(spawn_agent(&args, &kubeconfig, registry, &log)?);
    }
    Ok(Started {
        agents,
        kubeconfigs,
    })
}

/// PATH with this run's kubectl-chalk first.
fn plugin_path() -> String {
    let rest = std::env::var("PATH").unwrap_or_default();
    format!("{}:{rest}", built().display())
}

/// `kubectl chalk ARGS` (kubectl finds the plugin, kubectl-chalk, on PATH; it takes no flag
/// before the plugin's name, so the cluster is KUBECONFIG's) as JSON.
pub fn chalk(c: &Cluster, args: &[&str]) -> Result<Value, String> {
    let mut all = vec!["chalk"];
    all.extend_from_slice(args);
    all.extend(["-o", "json"]);
    let out: chalk_integration::CtrOutput = Command::new(&c.bins().kubectl)
        .args(&all)
        .env("KUBECONFIG", c.kubeconfig())
        .env("PATH", plugin_path())
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("kubectl: {e}"))?
        .into();
    if out.code != 0 {
        return Err(format!("kubectl {all:?}: {}", out.stderr.trim()));
    }
    serde_json::from_str(&out.stdout).map_err(|e| format!("{e}: {}", out.stdout))
}

/// kubectl as the holder of `kubeconfig` (an agent).
pub fn kubectl_as(c: &Cluster, kubeconfig: &Path, args: &[&str]) -> chalk_integration::CtrOutput {
    Command::new(&c.bins().kubectl)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map(Into::into)
        .unwrap_or_else(|e| chalk_integration::CtrOutput {
            code: -1,
            stdout: String::new(),
            stderr: e.to_string(),
        })
}
