//! The agents' limits, on a real API server (etcd and kube-apiserver of scripts/peers
//! --apiserver) with packaging/kubernetes/agent.yaml applied as it ships (its RBAC and its
//! ValidatingAdmissionPolicies): a node agent whose token is bound to its pod on node A may
//! annotate (chalk.io/) and delete A's pods, and nothing else; B's pods, other annotations,
//! labels and specs are refused, as is a token bound to no node; a node agent takes up only
//! its own node's PodSnapshots; the cluster agent touches no pod. With agent-sandbox's CRDs
//! (CHALK_AGENT_SANDBOX_CRDS) and a registry (CHALK_REGISTRY), the cluster agent itself runs
//! (`chalk-agent cluster`): a tenant's finalizer and annotations on its own Sandbox remove
//! nothing of another's snapshots, a Sandbox deleted takes its recorded snapshots with it,
//! retention keeps the newest, and a node agent may not touch a Sandbox's finalizers. Nodes
//! and pods are API objects only (no kubelet runs them): the API's rules are what is tested.

use std::path::PathBuf;

use chalk_integration::{
    cases, ensure,
    k8s::{Binaries, Cluster},
    registry::Secured,
    testkit::{self, TestResult},
    CtrOutput,
};

struct Api {
    cluster: Cluster,
    /// Tokens: the node agent bound to its pod on node-a, the same unbound, the cluster agent.
    agent_a: PathBuf,
    unbound: PathBuf,
    cluster_agent: PathBuf,
    /// The node agent's bound token itself (for a PATCH of a status, as the agent sends it).
    agent_a_token: String,
    /// The cluster agent's kubeconfig, and a registry (CHALK_REGISTRY) for it to keep.
    cluster_agent_config: PathBuf,
    registry: Option<Secured>,
}

const NODES: [&str; 2] = ["node-a", "node-b"];
const TEAM: &str = "team";

fn packaging(file: &str) -> String {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../packaging/kubernetes")
        .join(file);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// agent.yaml without what runs (its DaemonSet and Deployment): its accounts, roles and
/// policies, as a cluster gets them.
fn rules() -> String {
    packaging("agent.yaml")
        .split("\n---\n")
        .filter(|d| !d.contains("kind: DaemonSet") && !d.contains("kind: Deployment"))
        .collect::<Vec<_>>()
        .join("\n---\n")
}

fn applied(c: &Cluster, yaml: &str) -> Result<(), String> {
    let out = c.apply(yaml);
    if out.code != 0 {
        return Err(format!("kubectl apply: {}", out.stderr));
    }
    Ok(())
}

/// A pod object bound to `node` (no kubelet runs it).
fn pod(ns: &str, name: &str, node: &str, account: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {ns}, labels: {{app: x}}, \
         annotations: {{other.io/kept: v}}}}\nspec:\n  nodeName: {node}\n  serviceAccountName: \
         {account}\n  automountServiceAccountToken: false\n  containers: [{{name: c, image: pause}}]\n"
    )
}

impl Api {
    fn start() -> Result<Api, String> {
        let cluster = Cluster::start_api(Binaries::api_from_env()?)?;
        applied(&cluster, &packaging("crd.yaml"))?;
        cluster.established("podsnapshots.chalk.io")?;
        applied(&cluster, &rules())?;
        let mut objects = format!(
            "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {TEAM}}}\n---\n\
             apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: tenant, namespace: {TEAM}}}\n"
        );
        for node in NODES {
            objects.push_str(&format!(
                "---\napiVersion: v1\nkind: Node\nmetadata: {{name: {node}}}\n---\n{}---\n{}",
                pod(
                    "chalk-system",
                    &format!("agent-{node}"),
                    node,
                    "chalk-agent"
                ),
                pod(TEAM, &format!("work-{node}"), node, "tenant")
            ));
        }
        applied(&cluster, &objects)?;
        let agent_a_token = cluster.token("chalk-agent", Some("agent-node-a"))?;
        let path = |name: &str| cluster.dir().join(format!("{name}.kubeconfig"));
        let agent_a = cluster.kubeconfig_with(&path("agent-a"), &agent_a_token)?;
        let unbound =
            cluster.kubeconfig_with(&path("unbound"), &cluster.token("chalk-agent", None)?)?;
        let cluster_agent = cluster.kubeconfig_with(
            &path("cluster-agent"),
            &cluster.token("chalk-cluster-agent", None)?,
        )?;
        let registry = match std::env::var_os("CHALK_REGISTRY").filter(|v| !v.is_empty()) {
            // Deletes allowed: the cluster agent removes snapshots.
            Some(bin) => Some(Secured::start(
                std::path::Path::new(&bin),
                None,
                &[("REGISTRY_STORAGE_DELETE_ENABLED", "true")],
            )?),
            None => None,
        };
        Ok(Api {
            cluster,
            agent_a,
            unbound,
            cluster_agent_config: cluster_agent.clone(),
            cluster_agent,
            agent_a_token,
            registry,
        })
    }

    /// `chalk-agent cluster` with its own account's token, keeping two snapshots a Sandbox.
    fn start_cluster_agent(&self, r: &Secured) -> Result<std::process::Child, String> {
        let bin = chalk_integration::containerd::built_binary("CHALK_AGENT", "chalk-agent")
            .map_err(|e| e.to_string())?;
        let log = std::fs::File::create(self.cluster.dir().join("cluster-agent.log"))
            .map_err(|e| e.to_string())?;
        let err = log.try_clone().map_err(|e| e.to_string())?;
        std::process::Command::new(bin)
            .args(["cluster", "--keep-snapshots", "2"])
            .arg("--hosts-dir")
            .arg(&r.hosts_dir)
            .env("KUBECONFIG", &self.cluster_agent_config)
            .env("DOCKER_CONFIG", &r.docker_config)
            .stdout(log)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("chalk-agent cluster: {e}"))
    }

    /// A merge PATCH of `path` with `body` as the node agent sends one (no GET first, which
    /// its role does not grant): what the API answered.
    fn agent_patch(&self, path: &str, body: &str) -> CtrOutput {
        let config = std::fs::read_to_string(self.cluster.kubeconfig()).unwrap_or_default();
        let server = config
            .lines()
            .find_map(|l| l.trim().strip_prefix("server: "))
            .unwrap_or_default()
            .to_string();
        let ca = config
            .lines()
            .find_map(|l| l.trim().strip_prefix("certificate-authority: "))
            .unwrap_or_default()
            .to_string();
        let out = std::process::Command::new("curl")
            .args(["-s", "-w", "\n%{http_code}", "--cacert", &ca])
            .args([
                "-H",
                &format!("Authorization: Bearer {}", self.agent_a_token),
            ])
            .args(["-H", "Content-Type: application/merge-patch+json"])
            .args(["-X", "PATCH", "--data", body])
            .arg(format!("{server}{path}"))
            .output();
        match out {
            Ok(o) => {
                let text = String::from_utf8_lossy(&o.stdout).to_string();
                let code = text.lines().last().unwrap_or("0").trim().to_string();
                CtrOutput {
                    code: if code.starts_with('2') { 0 } else { 1 },
                    stdout: String::new(),
                    stderr: text,
                }
            }
            Err(e) => CtrOutput {
                code: -1,
                stdout: String::new(),
                stderr: e.to_string(),
            },
        }
    }

    /// kubectl as the holder of `kubeconfig`.
    fn as_(&self, kubeconfig: &std::path::Path, args: &[&str]) -> CtrOutput {
        std::process::Command::new(&self.cluster.bins().kubectl)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(args)
            .output()
            .map(Into::into)
            .unwrap_or_else(|e| CtrOutput {
                code: -1,
                stdout: String::new(),
                stderr: e.to_string(),
            })
    }
}

fn allowed(out: &CtrOutput, what: &str) -> TestResult {
    ensure!(out.code == 0, "{what} was refused: {}", out.stderr);
    Ok(())
}

fn refused(out: &CtrOutput, what: &str, why: &str) -> TestResult {
    ensure!(
        out.code != 0 && out.stderr.contains(why),
        "{what}: expected a refusal saying {why:?}: {out:?}"
    );
    Ok(())
}

fn annotate(ns: &str, pod: &str, kv: &str) -> Vec<String> {
    ["annotate", "--overwrite", "-n", ns, "pod", pod, kv]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

fn a_node_agent_acts_only_on_its_own_nodes_pods(a: &Api) -> TestResult {
    let own = annotate(TEAM, "work-node-a", "chalk.io/resumed-from=x");
    let own: Vec<&str> = own.iter().map(String::as_str).collect();
    allowed(
        &a.as_(&a.agent_a, &own),
        "a chalk.io annotation of its own node's pod",
    )?;
    let other = annotate(TEAM, "work-node-b", "chalk.io/resumed-from=x");
    let other: Vec<&str> = other.iter().map(String::as_str).collect();
    refused(
        &a.as_(&a.agent_a, &other),
        "an annotation of another node's pod",
        "a node agent acts only on its own node's pods",
    )?;
    refused(
        &a.as_(
            &a.agent_a,
            &["delete", "-n", TEAM, "pod", "work-node-b", "--wait=false"],
        ),
        "a delete of another node's pod",
        "a node agent acts only on its own node's pods",
    )?;
    let foreign = annotate(TEAM, "work-node-a", "other.io/kept=changed");
    let foreign: Vec<&str> = foreign.iter().map(String::as_str).collect();
    refused(
        &a.as_(&a.agent_a, &foreign),
        "another annotation of its own node's pod",
        "no annotation of a pod but chalk.io/",
    )?;
    refused(
        &a.as_(
            &a.agent_a,
            &[
                "label",
                "--overwrite",
                "-n",
                TEAM,
                "pod",
                "work-node-a",
                "app=y",
            ],
        ),
        "a label of its own node's pod",
        "nothing of a pod but its chalk.io/ annotations",
    )?;
    refused(
        &a.as_(&a.unbound, &own),
        "a token bound to no node",
        "names no node",
    )?;
    refused(
        &a.as_(&a.cluster_agent, &own),
        "the cluster agent on a pod",
        "forbidden",
    )?;
    allowed(
        &a.as_(
            &a.agent_a,
            &["delete", "-n", TEAM, "pod", "work-node-a", "--wait=false"],
        ),
        "a delete of its own node's pod",
    )
}

fn a_node_agent_takes_up_only_its_own_nodes_podsnapshots(a: &Api) -> TestResult {
    applied(
        &a.cluster,
        &format!(
            "apiVersion: chalk.io/v1alpha1\nkind: PodSnapshot\nmetadata: {{name: ps, namespace: \
             {TEAM}}}\nspec: {{podName: work-node-b}}\n"
        ),
    )?;
    let path = format!("/apis/chalk.io/v1alpha1/namespaces/{TEAM}/podsnapshots/ps/status");
    let status =
        |node: &str| format!(r#"{{"status": {{"phase": "InProgress", "node": "{node}"}}}}"#);
    refused(
        &a.agent_patch(&path, &status("node-b")),
        "taking up another node's PodSnapshot",
        "only on its own node's PodSnapshots",
    )?;
    allowed(
        &a.agent_patch(&path, &status("node-a")),
        "taking up a PodSnapshot for its node",
    )?;
    let spec = r#"{"spec": {"pushTo": "reg.example/elsewhere/x"}}"#;
    refused(
        &a.agent_patch(
            &format!("/apis/chalk.io/v1alpha1/namespaces/{TEAM}/podsnapshots/ps"),
            spec,
        ),
        "a change to a PodSnapshot's spec",
        "no PodSnapshot's spec",
    )
}

/// agent-sandbox's CRDs, if given.
fn sandbox_crds() -> Option<PathBuf> {
    std::env::var_os("CHALK_AGENT_SANDBOX_CRDS")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

fn install_sandbox_crds(c: &Cluster) -> TestResult {
    let dir = sandbox_crds().ok_or("no CHALK_AGENT_SANDBOX_CRDS")?;
    for entry in std::fs::read_dir(&dir).map_err(|e| e.to_string())? {
        let path = entry.map_err(|e| e.to_string())?.path();
        applied(
            c,
            &std::fs::read_to_string(&path).map_err(|e| e.to_string())?,
        )?;
    }
    Ok(c.established("sandboxes.agents.x-k8s.io")?)
}

fn sandbox(ns: &str, name: &str, annotations: &str, finalizers: &str) -> String {
    format!(
        "apiVersion: agents.x-k8s.io/v1beta1\nkind: Sandbox\nmetadata:\n  name: {name}\n  \
         namespace: {ns}\n  annotations: {{{annotations}}}\n  finalizers: [{finalizers}]\n\
         spec:\n  podTemplate:\n    spec:\n      containers: [{{name: c, image: pause}}]\n"
    )
}

fn uid_of(c: &Cluster, ns: &str, what: &str) -> Result<String, String> {
    let out = c.kubectl(&["get", "-n", ns, what, "-o", "jsonpath={.metadata.uid}"]);
    if out.code != 0 || out.stdout.is_empty() {
        return Err(format!("{what}: {}", out.stderr));
    }
    Ok(out.stdout)
}

/// A small manifest pushed to `repo` of `r` (a snapshot stand-in the registry holds): its
/// reference `REPO:TAG@DIGEST`.
fn pushed(r: &Secured, repo: &str, tag: &str) -> Result<String, String> {
    let config = r.put_blob(repo, b"{}")?;
    let layer = r.put_blob(repo, format!("{repo}:{tag}").as_bytes())?;
    let m = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "artifactType": "application/vnd.chalk.snapshot.v1",
        "config": {"mediaType": "application/vnd.oci.empty.v1+json", "digest": config, "size": 2},
        "layers": [{"mediaType": "application/octet-stream", "digest": layer,
                    "size": format!("{repo}:{tag}").len()}]
    });
    r.put_manifest(&format!("{repo}/manifests/{tag}"), &m)?;
    let bytes = serde_json::to_vec(&m).map_err(|e| e.to_string())?;
    let digest = format!(
        "sha256:{}",
        chalk_runtime::snapshot::hash::sha256_hex(&bytes)
    );
    Ok(format!("{}/{repo}:{tag}@{digest}", r.addr))
}

fn in_registry(r: &Secured, reference: &str) -> bool {
    let Some((repo_tag, digest)) = reference.rsplit_once('@') else {
        return false;
    };
    let repo = repo_tag
        .split_once('/')
        .map(|(_, p)| p)
        .unwrap_or_default()
        .rsplit_once(':')
        .map_or(repo_tag, |(p, _)| p);
    r.get_manifest(&format!("{repo}/manifests/{digest}"))
        .is_ok()
}

/// chalk's finalizer on Sandboxes (chalk-agent's `sandbox::FINALIZER`).
const FINALIZER: &str = "chalk.io/sandbox-snapshots";

/// The name of the agents' record of Sandbox `ns/name` (chalk-agent's `records::name_of`).
fn record_name(ns: &str, name: &str) -> String {
    let hex = chalk_runtime::snapshot::hash::sha256_hex(format!("{ns}/{name}").as_bytes());
    format!("chalk-sandbox-{}", &hex[..20])
}

/// The record a node agent writes after a push (agent-owned, in chalk-system), in the shape
/// chalk-agent's `records` module gives it.
fn record(ns: &str, name: &str, uid: &str, repository: &str, pushed: &[String]) -> String {
    let data = serde_json::json!({
        "namespace": ns, "name": name, "uid": uid, "repository": repository,
        "pushed": pushed.join("\n"),
    });
    serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": record_name(ns, name), "namespace": "chalk-system",
                     "labels": {"chalk.io/sandbox-snapshots": ns}},
        "data": data
    })
    .to_string()
}

fn until(what: &str, mut f: impl FnMut() -> bool) -> TestResult {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !f() {
        ensure!(
            std::time::Instant::now() < deadline,
            "{what} did not happen in 60 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
    Ok(())
}

/// A tenant adds chalk's finalizer and lists another tenant's snapshots on its own Sandbox,
/// then deletes it: the cluster agent removes its finalizer and nothing else. The other's
/// Sandbox keeps its newest snapshots (retention), and once deleted takes its recorded ones
/// with it, and its record. A node agent may not touch a Sandbox's finalizers.
fn the_cluster_agent_removes_only_what_is_recorded_for_that_sandbox(a: &Api) -> TestResult {
    let registry = a.registry.as_ref().ok_or("no registry")?;
    let c = &a.cluster;
    install_sandbox_crds(c)?;
    applied(
        c,
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: other}\n",
    )?;
    applied(c, &sandbox(TEAM, "sa", "", ""))?;
    let uid = uid_of(c, TEAM, "sandbox/sa")?;
    let repo = format!("{}/sandboxes/{TEAM}/sa", registry.addr);
    let refs: Vec<String> = (1..=3)
        .map(|i| pushed(registry, &format!("sandboxes/{TEAM}/sa"), &format!("s{i}")))
        .collect::<Result<_, _>>()?;
    let mut agent = a.start_cluster_agent(registry)?;
    let result = (|| -> TestResult {
        applied(c, &record(TEAM, "sa", &uid, &repo, &refs))?;
        // Retention: the newest two stay; the cluster agent keeps the finalizer on it.
        until("the oldest snapshot's removal", || {
            !in_registry(registry, &refs[0])
        })?;
        ensure!(
            in_registry(registry, &refs[1]) && in_registry(registry, &refs[2]),
            "retention removed more than the oldest"
        );
        until("the finalizer on the recorded Sandbox", || {
            c.kubectl(&[
                "get",
                "-n",
                TEAM,
                "sandbox/sa",
                "-o",
                "jsonpath={.metadata.finalizers}",
            ])
            .stdout
            .contains(FINALIZER)
        })?;
        // A node agent may not take it off.
        let unfinalize = a.agent_patch(
            &format!("/apis/agents.x-k8s.io/v1beta1/namespaces/{TEAM}/sandboxes/sa"),
            r#"{"metadata": {"finalizers": null}}"#,
        );
        refused(
            &unfinalize,
            "a node agent's change of finalizers",
            "finalizers",
        )?;
        // Tenant "other": its own Sandbox with chalk's finalizer and team's snapshots listed.
        let listed = format!("chalk.io/snapshots: \"{}\"", refs[1..].join(","));
        applied(
            c,
            &sandbox("other", "sa", &listed, &format!("\"{}\"", FINALIZER)),
        )?;
        let del = c.kubectl(&["delete", "-n", "other", "sandbox/sa", "--wait=false"]);
        ensure!(del.code == 0, "delete: {}", del.stderr);
        until("the tenant's Sandbox to go", || {
            c.kubectl(&["get", "-n", "other", "sandbox/sa"]).code != 0
        })?;
        ensure!(
            in_registry(registry, &refs[1]) && in_registry(registry, &refs[2]),
            "another tenant's finalizer and annotation removed team's snapshots"
        );
        // Team's own deletion takes its recorded snapshots, and the record.
        let del = c.kubectl(&["delete", "-n", TEAM, "sandbox/sa", "--wait=false"]);
        ensure!(del.code == 0, "delete: {}", del.stderr);
        until("team's Sandbox to go with its snapshots", || {
            c.kubectl(&["get", "-n", TEAM, "sandbox/sa"]).code != 0
                && !in_registry(registry, &refs[1])
                && !in_registry(registry, &refs[2])
        })?;
        let name = record_name(TEAM, "sa");
        until("the record to go", || {
            c.kubectl(&["get", "-n", "chalk-system", "configmap", &name])
                .code
                != 0
        })
    })();
    let _ = agent.kill();
    let _ = agent.wait();
    result.map_err(|e| {
        format!(
            "{e:?}\nthe cluster agent said:\n{}",
            c.log_tail("cluster-agent", 20)
        )
        .into()
    })
}

fn main() {
    testkit::check_args();
    let api = match Api::start() {
        Ok(a) => a,
        Err(e) if e.contains("is not set") => {
            eprintln!("agent_policy: {e}");
            return;
        }
        Err(e) => panic!("the API server: {e}"),
    };
    let sandboxes = sandbox_crds().is_some() && api.registry.is_some();
    let all = cases![
        a_node_agent_acts_only_on_its_own_nodes_pods,
        a_node_agent_takes_up_only_its_own_nodes_podsnapshots,
    ]
    .into_iter()
    .chain(
        cases![the_cluster_agent_removes_only_what_is_recorded_for_that_sandbox]
            .into_iter()
            .map(|c| c.ignored_if(!sandboxes)),
    )
    .collect();
    testkit::run(api, all, |_| Ok::<(), String>(()))
}
