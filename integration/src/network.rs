//! What the network tests need beside containerd: a server in a network namespace of the
//! test's own, attached to a sandbox network's bridge by a veth pair (its address outside
//! what the network's IPAM hands out), work done inside such a namespace from a thread of
//! this process, and the traces a sandbox's network leaves on the host (its namespace, its
//! iptables rules, its IPAM lease, its veth).

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

/// The default network's bridge, and the address the tests' server takes on it (the last
/// of the default subnet, 10.77.0.0/16, whose leases start from its beginning).
pub const BRIDGE: &str = "chalk0";
pub const SERVER_IP: &str = "10.77.255.250";
pub const GATEWAY: &str = "10.77.0.1";
const PREFIX: u8 = 16;

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {args:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {args:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// A network namespace of the test's own on `bridge`, with `address`; an HTTP server
/// (busybox httpd) serving `root` on port 8000 there. All of it goes on drop.
pub struct ServerNetns {
    pub name: String,
    host_veth: String,
    httpd: Option<Child>,
    pub root: tempfile::TempDir,
}

impl ServerNetns {
    /// Makes it (and the bridge, when no sandbox has made it yet: the bridge plugin takes
    /// an existing one as it is).
    pub fn start(tag: &str, bridge: &str, address: &str, gateway: &str) -> Result<Self, String> {
        let name = format!("chalk-t-{tag}-{}", std::process::id());
        let host_veth = format!(
            "vt{}{}",
            tag.chars().take(4).collect::<String>(),
            std::process::id() % 100000
        );
        let _ = ip(&["netns", "del", &name]);
        let _ = ip(&["link", "del", &host_veth]);
        if !Path::new("/sys/class/net").join(bridge).exists() {
            let _ = ip(&["link", "add", bridge, "type", "bridge"]);
        }
        let root = tempfile::tempdir().map_err(|e| e.to_string())?;
        let mut s = ServerNetns {
            name: name.clone(),
            host_veth: host_veth.clone(),
            httpd: None,
            root,
        };
        ip(&["link", "set", bridge, "up"])?;
        ip(&["netns", "add", &name])?;
        ip(&[
            "link", "add", &host_veth, "type", "veth", "peer", "name", "eth0", "netns", &name,
        ])?;
        ip(&["link", "set", &host_veth, "master", bridge, "up"])?;
        let cidr = format!("{address}/{PREFIX}");
        ip(&["-n", &name, "addr", "add", &cidr, "dev", "eth0"])?;
        ip(&["-n", &name, "link", "set", "eth0", "up"])?;
        ip(&["-n", &name, "link", "set", "lo", "up"])?;
        ip(&["-n", &name, "route", "add", "default", "via", gateway])?;
        std::fs::write(
            s.root.path().join("file.txt"),
            "served-from-the-test-netns\n",
        )
        .map_err(|e| e.to_string())?;
        let httpd = Command::new("ip")
            .args([
                "netns", "exec", &name, "busybox", "httpd", "-f", "-p", "8000", "-h",
            ])
            .arg(s.root.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("start httpd: {e}"))?;
        s.httpd = Some(httpd);
        Ok(s)
    }

    pub fn path(&self) -> PathBuf {
        PathBuf::from("/run/netns").join(&self.name)
    }
}

impl Drop for ServerNetns {
    fn drop(&mut self) {
        if let Some(mut h) = self.httpd.take() {
            let _ = h.kill();
            let _ = h.wait();
        }
        let _ = ip(&["link", "del", &self.host_veth]);
        let _ = ip(&["netns", "del", &self.name]);
    }
}

/// Runs `f` on a thread that has entered network namespace `netns`: sockets it makes are
/// that namespace's (and stay so when handed back).
pub fn in_netns<T: Send + 'static>(
    netns: &Path,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, String> {
    let file = std::fs::File::open(netns).map_err(|e| format!("open {}: {e}", netns.display()))?;
    std::thread::spawn(move || {
        use std::os::fd::AsRawFd;
        // SAFETY: setns on this thread only, with a namespace file we hold open.
        if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(format!("setns: {}", std::io::Error::last_os_error()));
        }
        Ok(f())
    })
    .join()
    .map_err(|_| "the thread in the namespace panicked".to_string())?
}

/// GET `path` from `addr` over plain HTTP/1.0; the body, or why not.
pub fn http_get(addr: SocketAddr, path: &str) -> Result<String, String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .map_err(|e| format!("connect {addr}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").map_err(|e| e.to_string())?;
    let mut text = String::new();
    s.read_to_string(&mut text)
        .map_err(|e| format!("read from {addr}: {e}"))?;
    match text.split_once("\r\n\r\n") {
        Some((head, body)) if head.starts_with("HTTP/1.") && head.contains(" 200 ") => {
            Ok(body.to_string())
        }
        _ => Err(format!("{addr}{path} answered {text:?}")),
    }
}

/// GET `path` from `addr` until it answers, for up to `limit` (a server in a sandbox that
/// just started or was restored takes a moment to be reachable).
pub fn http_get_within(addr: SocketAddr, path: &str, limit: Duration) -> Result<String, String> {
    let deadline = std::time::Instant::now() + limit;
    loop {
        match http_get(addr, path) {
            Err(_) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(200))
            }
            answer => return answer,
        }
    }
}

/// CNI's container id for sandbox `id` of containerd namespace `namespace` (as the shim
/// names it).
pub fn cni_id(namespace: &str, id: &str) -> String {
    chalk_runtime::network::cni_container_id(namespace, id)
}

/// The host veth of a sandbox's attachment, from the record in its bundle (while it runs).
pub fn host_veth(bundle: &Path) -> Option<String> {
    let record = chalk_runtime::bundle::Record::read(bundle).ok()??;
    let result = record.network?.result?;
    result["interfaces"]
        .as_array()?
        .iter()
        .find(|i| {
            i["sandbox"].as_str().is_none_or(str::is_empty)
                && i["mac"].is_string()
                && i["name"].as_str().is_some_and(|n| n.starts_with("veth"))
        })
        .and_then(|i| i["name"].as_str().map(str::to_string))
}

/// What the network of CNI container `cni_id` left on the host: iptables rules naming it, and
/// IPAM leases held for it.
pub fn leftovers(cni_id: &str) -> Vec<String> {
    let mut found = Vec::new();
    let quoted = format!("\\\"{cni_id}\\\"");
    for save in ["iptables-save", "ip6tables-save"] {
        if let Ok(out) = Command::new(save).output() {
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                if line.contains(&quoted) {
                    found.push(format!("{save}: {line}"));
                }
            }
        }
    }
    for dir in std::fs::read_dir("/var/lib/cni/networks")
        .into_iter()
        .flatten()
        .flatten()
    {
        for lease in std::fs::read_dir(dir.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let holder = std::fs::read_to_string(lease.path()).unwrap_or_default();
            if holder.lines().next() == Some(cni_id) {
                found.push(format!("IPAM lease {}", lease.path().display()));
            }
        }
    }
    found
}

/// Where a test host's default network is written on first use.
pub fn default_conflist_path(host_dir: &Path) -> PathBuf {
    crate::containerd::network_conf_dir(host_dir).join("chalk.conflist")
}
