//! A single-node Kubernetes on this machine for the RuntimeClass tests: etcd, kube-apiserver
//! (certificates and a service account key made here, for this run only) and a kubelet, all on
//! loopback (the kubelet on an address of its own on `lo`), against a private containerd whose CRI has the `chalk` handler as
//! packaging/install.sh registers it (the harness's CRI setup, pods networked by the CNI
//! bridge plugin and runsc's `network = "sandbox"`). There is no scheduler or controller
//! manager: pods name their node, and the `default` service account is made by hand. Every
//! process stops, and the kubelet's cgroups go, when the node is dropped.

use std::{
    fs,
    io::Write,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use crate::{Containerd, CtrOutput};

pub const NODE: &str = "chalk-node";
/// The node's address, on the loopback interface: reachable from this machine only (a kubelet
/// refuses a loopback node IP, and the API server reaches the kubelet by it).
pub const NODE_IP: &str = "10.88.78.1";
const ETCD_CLIENT: u16 = 12379;
const ETCD_PEER: u16 = 12380;
const API_PORT: u16 = 16443;
const KUBELET_PORT: u16 = 11250;
const KUBELET_HEALTHZ: u16 = 11248;

/// Where the node's programs are (scripts/peers --k8s).
pub struct Binaries {
    pub apiserver: PathBuf,
    pub kubelet: PathBuf,
    pub kubectl: PathBuf,
    pub etcd: PathBuf,
}

impl Binaries {
    /// From CHALK_K8S_BIN (kube-apiserver, kubelet, kubectl) and CHALK_ETCD.
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
            kubelet: bin.join("kubelet"),
            kubectl: bin.join("kubectl"),
            etcd: var("CHALK_ETCD")?,
        })
    }
}

pub struct Node {
    /// Made before the containerd's, so that a stop on a signal runs it after that teardown
    /// (the kubelet's cgroups empty only once the pods are gone).
    _on_stop: crate::stop::Registration,
    pub containerd: Containerd,
    dir: PathBuf,
    bins: Binaries,
    children: Vec<(&'static str, Child)>,
}

fn openssl(dir: &Path, args: &[&str]) -> Result<(), String> {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .map_err(|e| format!("openssl: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}

/// Makes the run's CA and the certificates signed by it: `name.crt`/`name.key` in `pki`.
fn make_pki(pki: &Path) -> Result<(), String> {
    fs::create_dir_all(pki).map_err(|e| e.to_string())?;
    openssl(
        pki,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "2",
            "-subj",
            "/CN=chalk-k8s-ca",
        ],
    )?;
    let certs: [(&str, &str, &str, &str); 5] = [
        (
            "apiserver",
            "/CN=kube-apiserver",
            "serverAuth",
            "IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default",
        ),
        (
            "admin",
            "/O=system:masters/CN=chalk-admin",
            "clientAuth",
            "",
        ),
        (
            "apiserver-kubelet-client",
            "/O=system:masters/CN=kube-apiserver-kubelet-client",
            "clientAuth",
            "",
        ),
        (
            "kubelet-client",
            "/O=system:nodes/CN=system:node:chalk-node",
            "clientAuth",
            "",
        ),
        (
            "kubelet",
            "/CN=chalk-node",
            "serverAuth",
            "IP:127.0.0.1,IP:10.88.78.1,DNS:chalk-node,DNS:localhost",
        ),
    ];
    for (name, subj, usage, sans) in certs {
        let (key, csr, crt, ext) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.crt"),
            format!("{name}.ext"),
        );
        let mut e = format!(
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage={usage}\n"
        );
        if !sans.is_empty() {
            e.push_str(&format!("subjectAltName={sans}\n"));
        }
        fs::write(pki.join(&ext), e).map_err(|e| e.to_string())?;
        openssl(
            pki,
            &[
                "req", "-newkey", "rsa:2048", "-nodes", "-keyout", &key, "-out", &csr, "-subj",
                subj,
            ],
        )?;
        openssl(
            pki,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &crt,
                "-days",
                "2",
                "-extfile",
                &ext,
            ],
        )?;
    }
    openssl(pki, &["genrsa", "-out", "sa.key", "2048"])?;
    openssl(pki, &["rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub"])?;
    Ok(())
}

fn kubeconfig(pki: &Path, user: &str) -> String {
    let p = |f: &str| pki.join(f).display().to_string();
    format!(
        r#"apiVersion: v1
kind: Config
clusters:
- name: chalk
  cluster:
    server: https://127.0.0.1:{API_PORT}
    certificate-authority: {ca}
users:
- name: {user}
  user:
    client-certificate: {crt}
    client-key: {key}
contexts:
- name: chalk
  context: {{cluster: chalk, user: {user}}}
current-context: chalk
"#,
        ca = p("ca.crt"),
        crt = p(&format!("{user}.crt")),
        key = p(&format!("{user}.key")),
    )
}

fn kubelet_config(dir: &Path, pki: &Path, runtime: &Path) -> String {
    let p = |f: &str| pki.join(f).display().to_string();
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: {NODE_IP}
port: {KUBELET_PORT}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {KUBELET_HEALTHZ}
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
        crt = p("kubelet.crt"),
        key = p("kubelet.key"),
        runtime = runtime.display(),
        logs = dir.join("pod-logs").display(),
    )
}

fn spawn(dir: &Path, name: &'static str, bin: &Path, args: &[String]) -> Result<Child, String> {
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

impl Node {
    /// Starts the node: containerd with its CRI, etcd, the API server and the kubelet, and
    /// waits until the node is Ready.
    pub fn start(bins: Binaries, cni_bin: PathBuf) -> Result<Node, String> {
        // Its etcd, API server and kubelet are children in this process's group: a stop on a
        // signal ends those first (crate::stop).
        let on_stop = crate::stop::on_stop("the node's address and cgroups", || {
            remove_kubelet_cgroups();
            let _ = node_link(false);
        });
        let containerd = Containerd::start_cri(Some(cni_bin), None, None)
            .map_err(|e| format!("containerd: {e}"))?;
        let dir = containerd.dir().join("k8s");
        let pki = dir.join("pki");
        make_pki(&pki)?;
        node_link(true)?;
        let mut node = Node {
            _on_stop: on_stop,
            containerd,
            dir: dir.clone(),
            bins,
            children: Vec::new(),
        };
        let s = |v: &str| v.to_string();
        let etcd = spawn(
            &dir,
            "etcd",
            &node.bins.etcd,
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
        node.children.push(("etcd", etcd));
        let p = |f: &str| pki.join(f).display().to_string();
        let apiserver = spawn(
            &dir,
            "kube-apiserver",
            &node.bins.apiserver,
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
        node.children.push(("kube-apiserver", apiserver));
        fs::write(dir.join("admin.kubeconfig"), kubeconfig(&pki, "admin"))
            .map_err(|e| e.to_string())?;
        fs::write(
            dir.join("kubelet.kubeconfig"),
            kubeconfig(&pki, "kubelet-client"),
        )
        .map_err(|e| e.to_string())?;
        node.wait("the API server to answer", Duration::from_secs(120), |n| {
            n.kubectl(&["get", "--raw", "/readyz"]).code == 0
        })?;
        fs::write(
            dir.join("kubelet.yaml"),
            kubelet_config(&dir, &pki, &node.containerd.socket()),
        )
        .map_err(|e| e.to_string())?;
        let kubelet = spawn(
            &dir,
            "kubelet",
            &node.bins.kubelet,
            &[
                format!("--config={}", dir.join("kubelet.yaml").display()),
                format!("--kubeconfig={}", dir.join("kubelet.kubeconfig").display()),
                format!("--root-dir={}", dir.join("kubelet").display()),
                format!("--hostname-override={NODE}"),
                format!("--node-ip={NODE_IP}"),
            ],
        )?;
        node.children.push(("kubelet", kubelet));
        node.wait("the node to be Ready", Duration::from_secs(120), |n| {
            let out = n.kubectl(&[
                "get",
                "node",
                NODE,
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
            ]);
            out.stdout.trim() == "True"
        })?;
        // Pods are admitted only with their namespace's default service account (made by the
        // controller manager on a full cluster).
        let sa = node.kubectl(&["create", "serviceaccount", "default"]);
        if sa.code != 0 && !sa.stderr.contains("AlreadyExists") {
            return Err(format!("create the default service account: {sa:?}"));
        }
        Ok(node)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.join("admin.kubeconfig")
    }

    /// The tail of the log of `name` (etcd, kube-apiserver, kubelet).
    pub fn log_tail(&self, name: &str, lines: usize) -> String {
        let text = fs::read_to_string(self.dir.join(format!("{name}.log"))).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    fn wait(
        &mut self,
        what: &str,
        timeout: Duration,
        ready: impl Fn(&Node) -> bool,
    ) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        loop {
            if ready(self) {
                return Ok(());
            }
            let exited = self
                .children
                .iter_mut()
                .find_map(|(name, child)| Some((*name, child.try_wait().ok()??)));
            if let Some((name, status)) = exited {
                return Err(format!(
                    "{name} exited ({status}) while waiting for {what}:\n{}",
                    self.log_tail(name, 30)
                ));
            }
            if Instant::now() >= deadline {
                return Err(format!("timed out waiting for {what}"));
            }
            std::thread::sleep(Duration::from_millis(500));
        }
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

    /// `kubectl apply -f -` of `yaml`.
    pub fn apply(&self, yaml: &str) -> CtrOutput {
        self.kubectl_with_stdin(&["apply", "-f", "-"], Some(yaml))
    }

    fn stop(&mut self) {
        // The kubelet first (it would restart what goes), then the API server and etcd.
        for (_, child) in self.children.iter_mut().rev() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.children.clear();
        remove_kubelet_cgroups();
        let _ = node_link(false);
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Adds (or removes) [`NODE_IP`] on the loopback interface: an address of this machine's
/// only, not in the loopback range.
fn node_link(make: bool) -> Result<(), String> {
    let ip = |verb: &str| {
        Command::new("ip")
            .args(["addr", verb, &format!("{NODE_IP}/32"), "dev", "lo"])
            .output()
            .map_err(|e| format!("ip: {e}"))
            .and_then(|o| {
                if o.status.success() {
                    Ok(())
                } else {
                    Err(format!(
                        "ip addr {verb} {NODE_IP}: {}",
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

/// The kubelet's QoS cgroups (`kubepods`, cgroupfs driver), removed deepest first once empty.
fn remove_kubelet_cgroups() {
    fn rm(dir: &Path) {
        for e in fs::read_dir(dir).into_iter().flatten().flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                rm(&e.path());
            }
        }
        let _ = fs::remove_dir(dir);
    }
    for root in [
        "/sys/fs/cgroup",
        "/sys/fs/cgroup/memory",
        "/sys/fs/cgroup/cpu",
        "/sys/fs/cgroup/pids",
    ] {
        let d = Path::new(root).join("kubepods");
        if d.is_dir() {
            rm(&d);
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
