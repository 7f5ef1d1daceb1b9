//! A Kubernetes cluster on this machine for the RuntimeClass and PodSnapshot tests: etcd,
//! kube-apiserver, kube-scheduler and kube-controller-manager (certificates and a service
//! account key made here, for this run only), and one or two nodes, each a kubelet on an
//! address of its own on `lo` against a private containerd whose CRI has the `chalk` handler
//! as packaging/install.sh registers it (the harness's CRI setup, pods networked by a CNI
//! bridge of the node's own and runsc's `network = "sandbox"`). Every process stops, and the
//! kubelets' cgroups go, when the cluster is dropped.

use std::{
    fs,
    io::Write,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

mod pki;

use crate::{containerd::CriOptions, registry::Secured, Containerd, CtrOutput};
use pki::{kubeconfig, make_pki};

/// The nodes' names and addresses, on the loopback interface: reachable from this machine
/// only (a kubelet refuses a loopback node IP, and the API server reaches a kubelet by it).
pub const NODES: [(&str, &str); 2] = [("chalk-a", "10.88.78.1"), ("chalk-b", "10.88.78.2")];
const ETCD_CLIENT: u16 = 12379;
const ETCD_PEER: u16 = 12380;
const API_PORT: u16 = 16443;
const KUBELET_PORT: u16 = 11250;
const KUBELET_HEALTHZ: u16 = 11260;

/// Where the node's programs are (scripts/peers --k8s).
pub struct Binaries {
    pub apiserver: PathBuf,
    pub scheduler: PathBuf,
    pub controller_manager: PathBuf,
    pub kubelet: PathBuf,
    pub kubectl: PathBuf,
    pub etcd: PathBuf,
}

impl Binaries {
    /// From CHALK_K8S_BIN (kube-apiserver, kube-scheduler, kube-controller-manager, kubelet,
    /// kubectl) and CHALK_ETCD.
    pub fn from_env() -> Result<Self, String> {
        let var = |k: &str| {
            std::env::var_os(k)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
                .ok_or_else(|| format!("{k} is not set: run scripts/peers --k8s"))
        };
        let bin = var("CHALK_K8S_BIN")?;
        Ok(Binaries {
            apiserver: bin.join("kube-apiserver"),
            scheduler: bin.join("kube-scheduler"),
            controller_manager: bin.join("kube-controller-manager"),
            kubelet: bin.join("kubelet"),
            kubectl: bin.join("kubectl"),
            etcd: var("CHALK_ETCD")?,
        })
    }

    /// The API server's alone (kube-apiserver and kubectl in CHALK_K8S_BIN, CHALK_ETCD):
    /// what [`Cluster::start_api`] needs (scripts/peers --apiserver builds them).
    pub fn api_from_env() -> Result<Self, String> {
        let var = |k: &str| {
            std::env::var_os(k)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
                .ok_or_else(|| format!("{k} is not set: run scripts/peers --apiserver"))
        };
        let bin = var("CHALK_K8S_BIN")?;
        let none = PathBuf::from("/nonexistent");
        Ok(Binaries {
            apiserver: bin.join("kube-apiserver"),
            scheduler: none.clone(),
            controller_manager: none.clone(),
            kubelet: none,
            kubectl: bin.join("kubectl"),
            etcd: var("CHALK_ETCD")?,
        })
    }
}

/// One node: its name, address and containerd (its kubelet is among the cluster's children).
pub struct Node {
    pub name: &'static str,
    pub ip: &'static str,
    pub containerd: Containerd,
}

pub struct Cluster {
    /// Made before the containerds, so that a stop on a signal runs it after their teardown
    /// (the kubelets' cgroups empty only once the pods are gone).
    _on_stop: crate::stop::Registration,
    pub nodes: Vec<Node>,
    dir: PathBuf,
    _dir: tempfile::TempDir,
    bins: Binaries,
    children: Vec<(String, Child)>,
}

fn kubelet_config(dir: &Path, pki: &Path, runtime: &Path, index: usize) -> String {
    let p = |f: &str| pki.join(f).display().to_string();
    let (node, ip) = NODES[index];
    let port = KUBELET_PORT + index as u16;
    let healthz = KUBELET_HEALTHZ + index as u16;
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: {ip}
port: {port}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {healthz}
# Each node's pods under a cgroup of its own: two kubelets share this machine.
cgroupRoot: /{node}
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: false}}
  x509: {{clientCAFile: {ca}}}
authorization: {{mode: AlwaysAllow}}
tlsCertFile: {crt}
tlsPrivateKeyFile: {key}
cgroupDriver: cgroupfs
# This kind of machine boots with cgroup v1, which kubelets since 1.35 refuse unless told.
failCgroupV1: false
containerRuntimeEndpoint: unix://{runtime}
failSwapOn: false
podLogsDir: {logs}
resolvConf: ""
# The images are imported, never pulled: never collect them; and a small disk is no reason
# to evict.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {{memory.available: "1Mi", nodefs.available: "1%", imagefs.available: "1%"}}
serializeImagePulls: false
"#,
        ca = p("ca.crt"),
        crt = p(&format!("kubelet-{node}.crt")),
        key = p(&format!("kubelet-{node}.key")),
        runtime = runtime.display(),
        logs = dir.join(format!("pod-logs-{node}")).display(),
    )
}

fn spawn(dir: &Path, name: &str, bin: &Path, args: &[String]) -> Result<Child, String> {
    let log = fs::File::create(dir.join(format!("{name}.log"))).map_err(|e| e.to_string())?;
    let err = log.try_clone().map_err(|e| e.to_string())?;
    Command::new(bin)
        .args(args)
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("start {name} ({}): {e}", bin.display()))
}

/// What a cluster is started with.
pub struct Start<'a> {
    pub bins: Binaries,
    pub cni_bin: PathBuf,
    /// How many of [`NODES`].
    pub nodes: usize,
    /// A registry the nodes pull pods' snapshots from (`[restore_from]`).
    pub registry: Option<&'a Secured>,
    /// More of the nodes' runtime options (`[trust]`), and of their `[restore_from]`.
    pub options: String,
    pub restore_from: String,
}

impl Cluster {
    /// Starts the control plane (etcd, the API server, the scheduler, the controller
    /// manager), then each node (containerd with its CRI, a kubelet), and waits until every
    /// node is Ready and the `default` service account exists.
    pub fn start(how: Start) -> Result<Cluster, String> {
        let nodes = &NODES[..how.nodes.clamp(1, NODES.len())];
        // Its processes are children in this process's group: a stop on a signal ends those
        // first (crate::stop).
        let on_stop = crate::stop::on_stop("the nodes' addresses and cgroups", || {
            remove_kubelet_cgroups();
            for (_, ip) in NODES {
                let _ = node_link(ip, false);
            }
        });
        let tmp = tempfile::Builder::new()
            .prefix("chalk-k8s-")
            .tempdir_in("/tmp")
            .map_err(|e| e.to_string())?;
        let dir = tmp.path().to_path_buf();
        let pki = dir.join("pki");
        make_pki(&pki, nodes)?;
        let mut cluster = Cluster {
            _on_stop: on_stop,
            nodes: Vec::new(),
            dir: dir.clone(),
            _dir: tmp,
            bins: how.bins,
            children: Vec::new(),
        };
        cluster.start_control_plane(&pki, true)?;
        for (i, (name, ip)) in nodes.iter().enumerate() {
            node_link(ip, true)?;
            let containerd = Containerd::start_cri(CriOptions {
                cni_bin: Some(how.cni_bin.clone()),
                registry_hosts: how.registry.map(|r| r.hosts_dir.clone()),
                registry_auth: how.registry.map(|r| r.docker_config.clone()),
                network: i as u8,
                options: how.options.clone(),
                restore_from: how.restore_from.clone(),
            })
            .map_err(|e| format!("containerd of {name}: {e}"))?;
            cluster.start_kubelet(&pki, i, &containerd)?;
            cluster.nodes.push(Node {
                name,
                ip,
                containerd,
            });
        }
        for (name, _) in nodes {
            cluster.wait(
                &format!("node {name} to be Ready"),
                Duration::from_secs(120),
                |c| {
                    let out = c.kubectl(&[
                        "get",
                        "node",
                        name,
                        "-o",
                        "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
                    ]);
                    out.stdout.trim() == "True"
                },
            )?;
            // Where chalk-shim runs: the RuntimeClass and the node agent go there only.
            let labelled = cluster.kubectl(&[
                "label",
                "node",
                name,
                "chalk.io/runtime=true",
                "--overwrite",
            ]);
            if labelled.code != 0 {
                return Err(format!("label node {name}: {}", labelled.stderr));
            }
        }
        // The controller manager makes each namespace's default service account, which pods
        // are admitted with.
        cluster.wait(
            "the default service account",
            Duration::from_secs(60),
            |c| c.kubectl(&["get", "serviceaccount", "default"]).code == 0,
        )?;
        Ok(cluster)
    }

    /// Starts etcd and the API server alone (no scheduler, controller manager or node):
    /// what a test of the API's own rules (RBAC, admission policies) needs.
    pub fn start_api(bins: Binaries) -> Result<Cluster, String> {
        let on_stop = crate::stop::on_stop("the API server", || {});
        let tmp = tempfile::Builder::new()
            .prefix("chalk-k8s-api-")
            .tempdir_in("/tmp")
            .map_err(|e| e.to_string())?;
        let dir = tmp.path().to_path_buf();
        let pki = dir.join("pki");
        make_pki(&pki, &[])?;
        let mut cluster = Cluster {
            _on_stop: on_stop,
            nodes: Vec::new(),
            dir,
            _dir: tmp,
            bins,
            children: Vec::new(),
        };
        cluster.start_control_plane(&pki, false)?;
        Ok(cluster)
    }

    fn start_control_plane(&mut self, pki: &Path, full: bool) -> Result<(), String> {
        let dir = self.dir.clone();
        let s = |v: &str| v.to_string();
        let etcd = spawn(
            &dir,
            "etcd",
            &self.bins.etcd,
            &[
                s("--name=chalk"),
                format!("--data-dir={}", dir.join("etcd").display()),
                format!("--listen-client-urls=http://127.0.0.1:{ETCD_CLIENT}"),
                format!("--advertise-client-urls=http://127.0.0.1:{ETCD_CLIENT}"),
                format!("--listen-peer-urls=http://127.0.0.1:{ETCD_PEER}"),
                format!("--initial-advertise-peer-urls=http://127.0.0.1:{ETCD_PEER}"),
                format!("--initial-cluster=chalk=http://127.0.0.1:{ETCD_PEER}"),
            ],
        )?;
        self.children.push(("etcd".into(), etcd));
        let p = |f: &str| pki.join(f).display().to_string();
        let apiserver = spawn(
            &dir,
            "kube-apiserver",
            &self.bins.apiserver,
            &[
                format!("--etcd-servers=http://127.0.0.1:{ETCD_CLIENT}"),
                s("--bind-address=127.0.0.1"),
                s("--advertise-address=127.0.0.1"),
                format!("--secure-port={API_PORT}"),
                format!("--cert-dir={}", dir.join("apiserver").display()),
                format!("--tls-cert-file={}", p("apiserver.crt")),
                format!("--tls-private-key-file={}", p("apiserver.key")),
                format!("--client-ca-file={}", p("ca.crt")),
                format!("--service-account-key-file={}", p("sa.pub")),
                format!("--service-account-signing-key-file={}", p("sa.key")),
                format!("--service-account-issuer=https://127.0.0.1:{API_PORT}"),
                s("--service-cluster-ip-range=10.0.0.0/24"),
                s("--authorization-mode=Node,RBAC"),
                s("--enable-admission-plugins=NodeRestriction"),
                format!(
                    "--kubelet-client-certificate={}",
                    p("apiserver-kubelet-client.crt")
                ),
                format!("--kubelet-client-key={}", p("apiserver-kubelet-client.key")),
                format!("--kubelet-certificate-authority={}", p("ca.crt")),
                s("--kubelet-preferred-address-types=InternalIP"),
                s("--anonymous-auth=false"),
            ],
        )?;
        self.children.push(("kube-apiserver".into(), apiserver));
        fs::write(dir.join("admin.kubeconfig"), kubeconfig(pki, "admin"))
            .map_err(|e| e.to_string())?;
        self.wait("the API server to answer", Duration::from_secs(120), |c| {
            c.kubectl(&["get", "--raw", "/readyz"]).code == 0
        })?;
        if !full {
            return Ok(());
        }
        let admin = dir.join("admin.kubeconfig").display().to_string();
        // As the admin; neither serves: nothing here reads their metrics or health.
        let common = [
            format!("--kubeconfig={admin}"),
            format!("--authentication-kubeconfig={admin}"),
            format!("--authorization-kubeconfig={admin}"),
            s("--leader-elect=false"),
            s("--bind-address=127.0.0.1"),
            s("--secure-port=0"),
        ];
        let scheduler = spawn(&dir, "kube-scheduler", &self.bins.scheduler, &common)?;
        self.children.push(("kube-scheduler".into(), scheduler));
        let manager_args: Vec<String> = common
            .iter()
            .cloned()
            .chain([
                format!("--service-account-private-key-file={}", p("sa.key")),
                format!("--root-ca-file={}", p("ca.crt")),
                format!("--cluster-signing-cert-file={}", p("ca.crt")),
                format!("--cluster-signing-key-file={}", p("ca.key")),
                s("--service-cluster-ip-range=10.0.0.0/24"),
            ])
            .collect();
        let manager = spawn(
            &dir,
            "kube-controller-manager",
            &self.bins.controller_manager,
            &manager_args,
        )?;
        self.children
            .push(("kube-controller-manager".into(), manager));
        Ok(())
    }

    fn start_kubelet(&mut self, pki: &Path, i: usize, c: &Containerd) -> Result<(), String> {
        let (node, ip) = NODES[i];
        make_cgroup_root(node)?;
        let dir = self.dir.clone();
        let config = dir.join(format!("kubelet-{node}.yaml"));
        let kubeconfig_path = dir.join(format!("kubelet-{node}.kubeconfig"));
        fs::write(
            &kubeconfig_path,
            kubeconfig(pki, &format!("kubelet-client-{node}")),
        )
        .map_err(|e| e.to_string())?;
        fs::write(&config, kubelet_config(&dir, pki, &c.socket(), i)).map_err(|e| e.to_string())?;
        let name = format!("kubelet-{node}");
        let kubelet = spawn(
            &dir,
            &name,
            &self.bins.kubelet,
            &[
                format!("--config={}", config.display()),
                format!("--kubeconfig={}", kubeconfig_path.display()),
                format!("--root-dir={}", dir.join(&name).display()),
                format!("--hostname-override={node}"),
                format!("--node-ip={ip}"),
            ],
        )?;
        self.children.push((name, kubelet));
        Ok(())
    }

    /// The node called `name`.
    pub fn node(&self, name: &str) -> Option<&Node> {
        self.nodes.iter().find(|n| n.name == name)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.join("admin.kubeconfig")
    }

    /// The tail of the log of `name` (etcd, kube-apiserver, kube-scheduler,
    /// kube-controller-manager, kubelet-NODE).
    pub fn log_tail(&self, name: &str, lines: usize) -> String {
        let text = fs::read_to_string(self.dir.join(format!("{name}.log"))).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    fn wait(
        &mut self,
        what: &str,
        timeout: Duration,
        ready: impl Fn(&Cluster) -> bool,
    ) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        loop {
            if ready(self) {
                return Ok(());
            }
            let exited = self
                .children
                .iter_mut()
                .find_map(|(name, child)| Some((name.clone(), child.try_wait().ok()??)));
            if let Some((name, status)) = exited {
                return Err(format!(
                    "{name} exited ({status}) while waiting for {what}:\n{}",
                    self.log_tail(&name, 30)
                ));
            }
            if Instant::now() >= deadline {
                return Err(format!("timed out waiting for {what}"));
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Waits (up to a minute) until the API server serves CRD `name`.
    pub fn established(&self, name: &str) -> Result<(), String> {
        let out = self.kubectl(&[
            "wait",
            "--for=condition=established",
            "--timeout=60s",
            &format!("crd/{name}"),
        ]);
        if out.code != 0 {
            return Err(format!("CRD {name} is not established: {}", out.stderr));
        }
        Ok(())
    }

    /// Runs kubectl as the cluster's admin.
    pub fn kubectl(&self, args: &[&str]) -> CtrOutput {
        self.kubectl_with_stdin(args, None)
    }

    pub fn kubectl_with_stdin(&self, args: &[&str], stdin: Option<&str>) -> CtrOutput {
        let child = Command::new(&self.bins.kubectl)
            .arg("--kubeconfig")
            .arg(self.kubeconfig())
            .args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn();
        let mut child = match child {
            Ok(c) => c,
            Err(e) => {
                return CtrOutput {
                    code: -1,
                    stdout: String::new(),
                    stderr: e.to_string(),
                }
            }
        };
        if let (Some(text), Some(mut w)) = (stdin, child.stdin.take()) {
            let _ = w.write_all(text.as_bytes());
        }
        match child.wait_with_output() {
            Ok(o) => o.into(),
            Err(e) => CtrOutput {
                code: -1,
                stdout: String::new(),
                stderr: e.to_string(),
            },
        }
    }

    /// A token of service account `account` of `chalk-system`, bound to pod `bound_to` of
    /// that namespace when given (the token then carries its node's name).
    pub fn token(&self, account: &str, bound_to: Option<&str>) -> Result<String, String> {
        let mut args = vec![
            "create",
            "token",
            account,
            "-n",
            "chalk-system",
            "--duration=2h",
        ];
        if let Some(pod) = bound_to {
            args.extend(["--bound-object-kind", "Pod", "--bound-object-name", pod]);
        }
        let out = self.kubectl(&args);
        if out.code != 0 {
            return Err(format!("a token for {account}: {}", out.stderr));
        }
        Ok(out.stdout.trim().to_string())
    }

    /// The admin's kubeconfig with `token` in place of its credentials, written to `path`.
    pub fn kubeconfig_with(&self, path: &Path, token: &str) -> Result<PathBuf, String> {
        let admin = fs::read_to_string(self.kubeconfig()).map_err(|e| e.to_string())?;
        let users = admin.find("users:").ok_or("no users in the kubeconfig")?;
        let contexts = admin
            .find("contexts:")
            .ok_or("no contexts in the kubeconfig")?;
        let user = admin[users..contexts]
            .lines()
            .nth(1)
            .and_then(|l| l.strip_prefix("- name: "))
            .ok_or("no user name in the kubeconfig")?;
        let text = format!(
            "{}users:\n- name: {user}\n  user:\n    token: {token}\n{}",
            &admin[..users],
            &admin[contexts..]
        );
        fs::write(path, text).map_err(|e| e.to_string())?;
        Ok(path.to_path_buf())
    }

    /// `kubectl apply -f -` of `yaml`.
    pub fn apply(&self, yaml: &str) -> CtrOutput {
        self.kubectl_with_stdin(&["apply", "-f", "-"], Some(yaml))
    }

    fn stop(&mut self) {
        // The kubelets first (they would restart what goes), then the control plane.
        for (_, child) in self.children.iter_mut().rev() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.children.clear();
        // The pods' sandboxes go with their containerds.
        self.nodes.clear();
        // Each kubelet bind-mounts its root directory onto itself; left, the run's directory
        // cannot be removed.
        crate::containerd::unmount_under(&self.dir);
        remove_kubelet_cgroups();
        for (_, ip) in NODES {
            let _ = node_link(ip, false);
        }
    }

    /// Starts `bin` with `args` and `env` as a child of the cluster (stopped with it), its
    /// output in `<name>.log`.
    pub fn spawn_child(
        &mut self,
        name: &str,
        bin: &Path,
        args: &[String],
        env: &[(&str, &std::ffi::OsStr)],
    ) -> Result<(), String> {
        let log =
            fs::File::create(self.dir.join(format!("{name}.log"))).map_err(|e| e.to_string())?;
        let err = log.try_clone().map_err(|e| e.to_string())?;
        let child = Command::new(bin)
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("start {name} ({}): {e}", bin.display()))?;
        // After the kubelets in `stop`'s reverse order: placed first.
        self.children.insert(0, (name.to_string(), child));
        Ok(())
    }

    pub fn bins(&self) -> &Binaries {
        &self.bins
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Adds (or removes) `addr` on the loopback interface: an address of this machine's only,
/// not in the loopback range.
fn node_link(addr: &str, make: bool) -> Result<(), String> {
    let ip = |verb: &str| {
        Command::new("ip")
            .args(["addr", verb, &format!("{addr}/32"), "dev", "lo"])
            .output()
            .map_err(|e| format!("ip: {e}"))
            .and_then(|o| {
                if o.status.success() {
                    Ok(())
                } else {
                    Err(format!(
                        "ip addr {verb} {addr}: {}",
                        String::from_utf8_lossy(&o.stderr)
                    ))
                }
            })
    };
    // One left by a run that was killed goes first.
    let _ = ip("del");
    if make {
        ip("add")?;
    }
    Ok(())
}

/// The cgroup a node's kubelet puts its pods under (`cgroupRoot`), made in every hierarchy:
/// the kubelet refuses one that is missing anywhere.
fn make_cgroup_root(node: &str) -> Result<(), String> {
    for h in crate::crictl::cgroup_hierarchies() {
        let d = h.join(node);
        fs::create_dir_all(&d).map_err(|e| format!("{}: {e}", d.display()))?;
        // A v1 cpuset takes no task until it has CPUs and memory nodes.
        for f in ["cpuset.cpus", "cpuset.mems"] {
            if let Ok(v) = fs::read_to_string(h.join(f)) {
                let _ = fs::write(d.join(f), v.trim());
            }
        }
    }
    Ok(())
}

/// The kubelets' cgroups (`/<node>/kubepods`, cgroupfs driver), removed deepest first once
/// empty.
fn remove_kubelet_cgroups() {
    fn rm(dir: &Path) {
        for e in fs::read_dir(dir).into_iter().flatten().flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                rm(&e.path());
            }
        }
        let _ = fs::remove_dir(dir);
    }
    for root in crate::crictl::cgroup_hierarchies() {
        for (node, _) in NODES {
            let d = root.join(node);
            if d.is_dir() {
                rm(&d);
            }
        }
    }
}

/// Waits for `f` to give Some, up to `timeout`.
pub fn until<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}
