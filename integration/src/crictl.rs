//! Kubernetes' CRI command line (cri-tools' `crictl`, built by scripts/peers) against a
//! harness containerd: pods and containers from JSON configs, as a node admin drives CRI by
//! hand. And the pod cgroup a kubelet would make for a pod, with its limits.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use serde_json::{json, Value};

use crate::CtrOutput;

pub struct Crictl {
    bin: PathBuf,
    socket: PathBuf,
    /// Where the configs and the pods' log directories are written.
    dir: tempfile::TempDir,
}

/// What a pod is made with.
#[derive(Default)]
pub struct PodConfig<'a> {
    pub name: &'a str,
    pub annotations: &'a [(&'a str, &'a str)],
    /// `linux.cgroup_parent`: the pod's cgroup, as the kubelet names it.
    pub cgroup_parent: Option<&'a str>,
}

impl Crictl {
    /// crictl from CHALK_CRICTL, or None when it is not set.
    pub fn from_env(socket: &Path) -> Option<Crictl> {
        let bin = std::env::var_os("CHALK_CRICTL").filter(|v| !v.is_empty())?;
        Some(Crictl {
            bin: bin.into(),
            socket: socket.to_path_buf(),
            dir: tempfile::Builder::new()
                .prefix("chalk-crictl-")
                .tempdir()
                .ok()?,
        })
    }

    /// `crictl ARGS` against this containerd.
    pub fn run(&self, args: &[&str]) -> CtrOutput {
        let endpoint = format!("unix://{}", self.socket.display());
        Command::new(&self.bin)
            .args([
                "--runtime-endpoint",
                &endpoint,
                "--image-endpoint",
                &endpoint,
            ])
            .args(["--timeout", "60s"])
            .args(args)
            .output()
            .map(CtrOutput::from)
            .unwrap_or_else(|e| CtrOutput {
                code: -1,
                stdout: String::new(),
                stderr: format!("{}: {e}", self.bin.display()),
            })
    }

    fn ok(&self, args: &[&str]) -> Result<String, String> {
        let out = self.run(args);
        if out.code != 0 {
            return Err(format!("crictl {args:?}: {}", out.stderr.trim()));
        }
        Ok(out.stdout.trim().to_string())
    }

    fn write(&self, name: &str, v: &Value) -> Result<String, String> {
        let p = self.dir.path().join(name);
        std::fs::write(&p, v.to_string()).map_err(|e| format!("{}: {e}", p.display()))?;
        Ok(p.display().to_string())
    }

    fn pod_config(&self, pod: &PodConfig) -> Value {
        let logs = self.dir.path().join(format!("logs-{}", pod.name));
        let _ = std::fs::create_dir_all(&logs);
        let annotations: serde_json::Map<String, Value> = pod
            .annotations
            .iter()
            .map(|(k, v)| (k.to_string(), Value::from(*v)))
            .collect();
        let mut linux = json!({
            // The node's network (2: NODE): the CRI tests run without CNI.
            "security_context": {"namespace_options": {"network": 2}}
        });
        if let Some(parent) = pod.cgroup_parent {
            linux["cgroup_parent"] = parent.into();
        }
        json!({
            "metadata": {"name": pod.name, "namespace": "default", "uid": format!("uid-{}", pod.name), "attempt": 0},
            "hostname": pod.name,
            "log_directory": logs.display().to_string(),
            "annotations": annotations,
            "linux": linux,
        })
    }

    /// `crictl runp --runtime HANDLER`: the pod's id.
    pub fn runp(&self, pod: &PodConfig, handler: &str) -> Result<String, String> {
        let config = self.write(&format!("pod-{}.json", pod.name), &self.pod_config(pod))?;
        self.ok(&["runp", "--runtime", handler, &config])
    }

    /// `crictl create` of container `name` (`command` in `image`, never pulled) in pod `pod`
    /// (made from `config`), then `crictl start`: its id.
    pub fn run_container(
        &self,
        pod_id: &str,
        pod: &PodConfig,
        name: &str,
        image: &str,
        command: &[&str],
    ) -> Result<String, String> {
        let container = json!({
            "metadata": {"name": name},
            "image": {"image": image},
            "command": command,
            "log_path": format!("{name}.log"),
            "linux": {},
        });
        let c = self.write(&format!("ctr-{}-{name}.json", pod.name), &container)?;
        let p = self.write(&format!("pod-{}.json", pod.name), &self.pod_config(pod))?;
        let id = self.ok(&["create", "--no-pull", pod_id, &c, &p])?;
        self.ok(&["start", &id])?;
        Ok(id)
    }

    /// `crictl exec -s ID CMD…`: its output.
    pub fn exec(&self, id: &str, cmd: &[&str]) -> Result<String, String> {
        let mut args = vec!["exec", "-s", id];
        args.extend_from_slice(cmd);
        self.ok(&args)
    }

    /// `crictl inspect ID` (its `status`).
    pub fn inspect(&self, id: &str) -> Result<Value, String> {
        let out = self.ok(&["inspect", "-o", "json", id])?;
        let v: Value = serde_json::from_str(&out).map_err(|e| format!("{e}: {out}"))?;
        Ok(v["status"].clone())
    }

    /// Container `name`'s log in pod `pod`'s log directory.
    pub fn log(&self, pod: &str, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("logs-{pod}/{name}.log")))
            .unwrap_or_default()
    }

    /// `crictl stopp` then `crictl rmp`.
    pub fn remove_pod(&self, pod_id: &str) -> Result<(), String> {
        self.ok(&["stopp", pod_id])?;
        self.ok(&["rmp", pod_id]).map(drop)
    }
}

/// A pod's cgroup as the kubelet makes one (cgroupfs driver), with its memory limit and CPU
/// quota, in every hierarchy; removed (once empty) when dropped.
pub struct PodCgroup {
    /// Its path below the hierarchies' roots (`/chalk-test/pod<uid>`).
    pub path: String,
}

impl PodCgroup {
    pub fn make(path: &str, memory: u64, cpu_quota_us: u64) -> Result<PodCgroup, String> {
        let made = PodCgroup {
            path: path.to_string(),
        };
        let rel = path.trim_start_matches('/');
        let base = Path::new("/sys/fs/cgroup");
        if base.join("cgroup.controllers").exists() {
            let d = base.join(rel);
            std::fs::create_dir_all(&d).map_err(|e| format!("{}: {e}", d.display()))?;
            write(&d.join("memory.max"), &memory.to_string())?;
            write(&d.join("cpu.max"), &format!("{cpu_quota_us} 100000"))?;
            return Ok(made);
        }
        for h in cgroup_hierarchies() {
            let mut d = h.clone();
            // Each level made in turn: a v1 cpuset takes no child until it has CPUs and
            // memory nodes.
            for part in rel.split('/') {
                d = d.join(part);
                if !d.exists() {
                    std::fs::create_dir(&d).map_err(|e| format!("{}: {e}", d.display()))?;
                    for f in ["cpuset.cpus", "cpuset.mems"] {
                        if let Ok(v) = std::fs::read_to_string(h.join(f)) {
                            write(&d.join(f), v.trim())?;
                        }
                    }
                }
            }
            if d.join("memory.limit_in_bytes").exists() {
                write(&d.join("memory.limit_in_bytes"), &memory.to_string())?;
            }
            if d.join("cpu.cfs_quota_us").exists() {
                write(&d.join("cpu.cfs_quota_us"), &cpu_quota_us.to_string())?;
            }
        }
        Ok(made)
    }
}

fn write(path: &Path, value: &str) -> Result<(), String> {
    std::fs::write(path, value).map_err(|e| format!("write {value} to {}: {e}", path.display()))
}

/// The roots of this host's cgroup hierarchies: v2's one tree, or each v1 controller's.
pub fn cgroup_hierarchies() -> Vec<PathBuf> {
    chalk_runtime::bundle::cgroup_hierarchies(Path::new("/sys/fs/cgroup"))
}

impl Drop for PodCgroup {
    fn drop(&mut self) {
        let rel = self.path.trim_start_matches('/');
        for root in cgroup_hierarchies() {
            // Deepest first; rmdir(2) refuses one that is still in use.
            let mut d = root.join(rel);
            while d != root {
                let _ = std::fs::remove_dir(&d);
                if !d.pop() {
                    break;
                }
            }
        }
    }
}
