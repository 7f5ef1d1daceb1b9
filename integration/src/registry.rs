//! A local image registry (distribution's `registry`, built by `scripts/peers`) serving
//! busybox-based stand-ins where the public registries cannot be reached.

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use base64::Engine;

/// The registry's config: its store under `dir`, listening on `addr`, with the TLS key pair
/// `dir/srv.crt` and `dir/srv.key` when `tls`.
pub fn config(dir: &Path, addr: &str, tls: bool) -> String {
    config_with(dir, addr, tls, &storage_filesystem(dir))
}

/// Distribution's filesystem storage under `dir/registry`.
pub fn storage_filesystem(dir: &Path) -> String {
    format!(
        "storage:\n  filesystem:\n    rootdirectory: {}\n",
        dir.join("registry").display()
    )
}

/// Like [`config`], with `storage` (a YAML `storage:` block) for the blobs.
pub fn config_with(dir: &Path, addr: &str, tls: bool, storage: &str) -> String {
    // Info: each request is logged (method, URI, user), which tests read.
    let mut c = format!("version: 0.1\nlog:\n  level: info\n{storage}http:\n  addr: {addr}\n");
    if tls {
        let _ = write!(
            c,
            "  tls:\n    certificate: {}\n    key: {}\n",
            dir.join("srv.crt").display(),
            dir.join("srv.key").display()
        );
    }
    c
}

/// A CA (`dir/ca.crt`) and a server key pair it signed (`dir/srv.crt`, `dir/srv.key`) for
/// `names` and 127.0.0.1, valid two days: a throwaway CA of the test's own.
pub fn make_certs(dir: &Path, names: &[&str]) -> Result<(), String> {
    let d = |f: &str| dir.join(f);
    let run = |cmd: &mut Command, what: &str| -> Result<(), String> {
        let out = cmd.output().map_err(|e| format!("{what}: {e}"))?;
        if !out.status.success() {
            return Err(format!("{what}: {}", String::from_utf8_lossy(&out.stderr)));
        }
        Ok(())
    };
    run(
        Command::new("openssl")
            .args([
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            ])
            .args(["-subj", "/CN=chalk test CA"])
            .arg("-keyout")
            .arg(d("ca.key"))
            .arg("-out")
            .arg(d("ca.crt")),
        "openssl ca",
    )?;
    run(
        Command::new("openssl")
            .args([
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-subj",
                "/CN=chalk test registry",
            ])
            .arg("-keyout")
            .arg(d("srv.key"))
            .arg("-out")
            .arg(d("srv.csr")),
        "openssl csr",
    )?;
    let mut sans: Vec<String> = names.iter().map(|h| format!("DNS:{h}")).collect();
    sans.push("IP:127.0.0.1".into());
    std::fs::write(d("ext.cnf"), format!("subjectAltName={}\n", sans.join(",")))
        .map_err(|e| e.to_string())?;
    run(
        Command::new("openssl")
            .args(["x509", "-req", "-days", "2", "-CAcreateserial"])
            .arg("-in")
            .arg(d("srv.csr"))
            .arg("-CA")
            .arg(d("ca.crt"))
            .arg("-CAkey")
            .arg(d("ca.key"))
            .arg("-out")
            .arg(d("srv.crt"))
            .arg("-extfile")
            .arg(d("ext.cnf")),
        "openssl sign",
    )
}

/// A background process killed on drop.
pub struct Guard(pub Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Serves a plain-HTTP registry from `binary` on `addr`, its store under `dir`; returns once
/// it listens (an error if it does not within 10 s). It stops when the guard is dropped.
pub fn serve_plain(binary: &Path, dir: &Path, addr: &str) -> Result<Guard, String> {
    serve(binary, dir, addr, &config(dir, addr, false), &[])
}

/// Serves an HTTPS registry on `addr` with certificates from [`make_certs`] in `dir`, blobs
/// in `storage` (see [`storage_filesystem`]), and HTTP basic auth for `user`:`password`
/// (bcrypt, in an htpasswd file). `env` goes to its environment (a storage driver's keys).
pub fn serve_tls(
    binary: &Path,
    dir: &Path,
    addr: &str,
    storage: &str,
    (user, password): (&str, &str),
    env: &[(&str, &str)],
) -> Result<Guard, String> {
    let hash = bcrypt::hash(password, 6).map_err(|e| e.to_string())?;
    let htpasswd = dir.join("htpasswd");
    std::fs::write(&htpasswd, format!("{user}:{hash}\n")).map_err(|e| e.to_string())?;
    let config = format!(
        "{}auth:\n  htpasswd:\n    realm: chalk-test\n    path: {}\n",
        config_with(dir, addr, true, storage),
        htpasswd.display()
    );
    serve(binary, dir, addr, &config, env)
}

fn serve(
    binary: &Path,
    dir: &Path,
    addr: &str,
    config: &str,
    env: &[(&str, &str)],
) -> Result<Guard, String> {
    let file = dir.join(format!("registry-{}.yml", addr.replace(':', "_")));
    std::fs::write(&file, config).map_err(|e| e.to_string())?;
    let log = std::fs::File::create(dir.join("registry.log")).map_err(|e| e.to_string())?;
    let guard = Guard(
        Command::new(binary)
            .arg("serve")
            .arg(&file)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("start registry {}: {e}", binary.display()))?,
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(addr).is_err() {
        if Instant::now() > deadline {
            return Err(format!("registry did not listen on {addr}"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(guard)
}

/// The credentials of a [`Secured`] registry.
pub const USER: &str = "chalk";
pub const PASSWORD: &str = "travel-pw-7f3a";

/// A registry over HTTPS on a free loopback port, with a CA and credentials of its own, and
/// what a client needs to reach it as containerd's tools would: a hosts directory holding
/// its CA (`<addr>/ca.crt`) and a docker config directory holding the credentials.
pub struct Secured {
    pub addr: String,
    /// The registry's files: certificates, config, log, and (filesystem storage) blobs.
    pub dir: PathBuf,
    pub hosts_dir: PathBuf,
    pub docker_config: PathBuf,
    guard: Option<Guard>,
    binary: PathBuf,
    storage: String,
    env: Vec<(String, String)>,
    _tmp: tempfile::TempDir,
}

impl Secured {
    /// Starts `binary` with `storage` (a YAML `storage:` block; None: the filesystem under
    /// [`Secured::blobs`]) and `env` in its environment.
    pub fn start(
        binary: &Path,
        storage: Option<&str>,
        env: &[(&str, &str)],
    ) -> Result<Self, String> {
        let tmp = tempfile::Builder::new()
            .prefix("chalk-registry-")
            .tempdir_in("/tmp")
            .map_err(|e| e.to_string())?;
        let dir = tmp.path().to_path_buf();
        make_certs(&dir, &["localhost"])?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("a free port: {e}"))?
            .port();
        let addr = format!("127.0.0.1:{port}");
        let storage = storage.map_or_else(|| storage_filesystem(&dir), String::from);
        let guard = serve_tls(binary, &dir, &addr, &storage, (USER, PASSWORD), env)?;
        let hosts_dir = dir.join("certs.d");
        std::fs::create_dir_all(hosts_dir.join(&addr)).map_err(|e| e.to_string())?;
        std::fs::copy(dir.join("ca.crt"), hosts_dir.join(&addr).join("ca.crt"))
            .map_err(|e| e.to_string())?;
        let docker_config = dir.join("docker");
        std::fs::create_dir_all(&docker_config).map_err(|e| e.to_string())?;
        let auth = base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"));
        std::fs::write(
            docker_config.join("config.json"),
            format!(r#"{{"auths": {{"{addr}": {{"auth": "{auth}"}}}}}}"#),
        )
        .map_err(|e| e.to_string())?;
        Ok(Secured {
            addr,
            dir,
            hosts_dir,
            docker_config,
            guard: Some(guard),
            binary: binary.to_path_buf(),
            storage,
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            _tmp: tmp,
        })
    }

    /// SIGKILLs the registry (a registry going away mid-transfer).
    pub fn stop(&mut self) {
        self.guard.take();
    }

    /// Serves again on the same address and storage after [`Secured::stop`].
    pub fn serve_again(&mut self) -> Result<(), String> {
        let env: Vec<(&str, &str)> = self
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let guard = serve_tls(
            &self.binary,
            &self.dir,
            &self.addr,
            &self.storage,
            (USER, PASSWORD),
            &env,
        )?;
        self.guard = Some(guard);
        Ok(())
    }

    /// Runs Distribution's garbage collection over the storage (stopped meanwhile, as it
    /// asks): blobs no manifest refers to are deleted.
    pub fn collect_garbage(&mut self) -> Result<String, String> {
        self.stop();
        let config = self
            .dir
            .join(format!("registry-{}.yml", self.addr.replace(':', "_")));
        let out = Command::new(&self.binary)
            .arg("garbage-collect")
            .arg(&config)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .output()
            .map_err(|e| format!("registry garbage-collect: {e}"))?;
        let said = String::from_utf8_lossy(&out.stdout).to_string();
        self.serve_again()?;
        if !out.status.success() {
            return Err(format!(
                "registry garbage-collect: {}: {said}{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(said)
    }

    /// Deletes manifest `digest` of `repo` (the registry must allow deletes).
    pub fn delete_manifest(&self, repo: &str, digest: &str) -> Result<(), String> {
        let url = format!("https://{}/v2/{repo}/manifests/{digest}", self.addr);
        let out = Command::new("curl")
            .args(["-sf", "-X", "DELETE", "--cacert"])
            .arg(self.dir.join("ca.crt"))
            .args(["-u", &format!("{USER}:{PASSWORD}"), &url])
            .output()
            .map_err(|e| format!("curl: {e}"))?;
        if !out.status.success() {
            return Err(format!("DELETE {url}: {}", out.status));
        }
        Ok(())
    }

    /// Bytes of the blobs in filesystem storage.
    pub fn stored_bytes(&self) -> u64 {
        fn walk(dir: &Path) -> u64 {
            std::fs::read_dir(dir)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| match e.file_type() {
                    Ok(t) if t.is_dir() => walk(&e.path()),
                    Ok(_) => e.metadata().map_or(0, |m| m.len()),
                    Err(_) => 0,
                })
                .sum()
        }
        walk(&self.blobs().join("docker/registry/v2/blobs"))
    }

    /// Where filesystem storage keeps the blobs.
    pub fn blobs(&self) -> PathBuf {
        self.dir.join("registry")
    }

    /// The file holding blob `digest` (`sha256:…`) in this registry's storage.
    pub fn blob_file(&self, digest: &str) -> Option<PathBuf> {
        let hex = digest.strip_prefix("sha256:")?;
        let file = self
            .blobs()
            .join("docker/registry/v2/blobs/sha256")
            .join(hex.get(..2)?)
            .join(hex)
            .join("data");
        file.exists().then_some(file)
    }

    /// The digest of the layer titled `title` of manifest `digest` (a manifest, or a
    /// snapshot's own manifest held as a blob by its packed form).
    pub fn layer_digest(&self, digest: &str, title: &str) -> Option<String> {
        let manifest = std::fs::read(self.blob_file(digest)?).ok()?;
        let m: serde_json::Value = serde_json::from_slice(&manifest).ok()?;
        let layer = m["layers"]
            .as_array()?
            .iter()
            .find(|l| l["annotations"]["org.opencontainers.image.title"] == title)?;
        layer["digest"].as_str().map(String::from)
    }

    /// The file of the layer titled `title` of manifest `digest` as pushed here.
    pub fn layer_titled(&self, digest: &str, title: &str) -> Option<PathBuf> {
        self.blob_file(&self.layer_digest(digest, title)?)
    }

    /// Manifest `path` (`<repo>/manifests/<ref>`) as JSON, read behind the clients' backs.
    pub fn get_manifest(&self, path: &str) -> Result<serde_json::Value, String> {
        let out = self
            .curl(path)
            .args(["-H", "Accept: application/vnd.oci.image.manifest.v1+json"])
            .output()
            .map_err(|e| format!("curl: {e}"))?;
        if !out.status.success() {
            return Err(format!("GET {path}: {:?}", out.status));
        }
        serde_json::from_slice(&out.stdout).map_err(|e| format!("{path}: {e}"))
    }

    /// Puts manifest `m` at `path` (an attacker's write, for the tests).
    pub fn put_manifest(&self, path: &str, m: &serde_json::Value) -> Result<(), String> {
        let file = tempfile::NamedTempFile::new().map_err(|e| e.to_string())?;
        std::fs::write(file.path(), m.to_string()).map_err(|e| e.to_string())?;
        let out = self
            .curl(path)
            .args([
                "-X",
                "PUT",
                "-H",
                "Content-Type: application/vnd.oci.image.manifest.v1+json",
            ])
            .arg("--data-binary")
            .arg(format!("@{}", file.path().display()))
            .output()
            .map_err(|e| format!("curl: {e}"))?;
        if !out.status.success() {
            return Err(format!("PUT {path}: {:?}", out.status));
        }
        Ok(())
    }

    /// How far its log has come: what [`Secured::requests_since`] counts from.
    pub fn log_len(&self) -> usize {
        std::fs::metadata(self.dir.join("registry.log")).map_or(0, |m| m.len() as usize)
    }

    /// The requests the registry logged since `from` (a [`Secured::log_len`]): `METHOD URI`.
    pub fn requests_since(&self, from: usize) -> Vec<String> {
        let log = std::fs::read_to_string(self.dir.join("registry.log")).unwrap_or_default();
        log.get(from..)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("response completed"))
            .filter_map(|l| {
                let field = |k: &str| {
                    l.split_whitespace()
                        .find_map(|w| w.strip_prefix(k))
                        .map(|v| v.trim_matches('"').to_string())
                };
                Some(format!(
                    "{} {}",
                    field("http.request.method=")?,
                    field("http.request.uri=")?
                ))
            })
            .collect()
    }

    /// Blob `digest` of repository `repo`, read behind the clients' backs.
    pub fn get_blob(&self, repo: &str, digest: &str) -> Result<Vec<u8>, String> {
        let out = self
            .curl(&format!("{repo}/blobs/{digest}"))
            .arg("-L")
            .output()
            .map_err(|e| format!("curl: {e}"))?;
        if !out.status.success() {
            return Err(format!("GET {repo} blob {digest}: {:?}", out.status));
        }
        Ok(out.stdout)
    }

    /// Uploads `bytes` as a blob of repository `repo` (an attacker's write): its digest.
    pub fn put_blob(&self, repo: &str, bytes: &[u8]) -> Result<String, String> {
        let digest = format!(
            "sha256:{}",
            chalk_runtime::snapshot::hash::sha256_hex(bytes)
        );
        let file = tempfile::NamedTempFile::new().map_err(|e| e.to_string())?;
        std::fs::write(file.path(), bytes).map_err(|e| e.to_string())?;
        // One POST-then-PUT upload: the POST says where the PUT goes.
        let out = self
            .curl(&format!("{repo}/blobs/uploads/"))
            .args(["-X", "POST", "-D", "-", "-o", "/dev/null"])
            .output()
            .map_err(|e| format!("curl: {e}"))?;
        let head = String::from_utf8_lossy(&out.stdout);
        let location = head
            .lines()
            .find_map(|l| {
                l.split_once(':')
                    .filter(|(k, _)| k.eq_ignore_ascii_case("location"))
                    .map(|(_, v)| v.trim().to_string())
            })
            .ok_or_else(|| format!("POST {repo} upload: no Location in {head:?}"))?;
        let url = if location.starts_with("http") {
            location
        } else {
            format!("https://{}{location}", self.addr)
        };
        let sep = if url.contains('?') { '&' } else { '?' };
        let out = Command::new("curl")
            .arg("-sf")
            .arg("--cacert")
            .arg(self.dir.join("ca.crt"))
            .args(["-u", &format!("{USER}:{PASSWORD}")])
            .args(["-X", "PUT", "-H", "Content-Type: application/octet-stream"])
            .arg("--data-binary")
            .arg(format!("@{}", file.path().display()))
            .arg(format!("{url}{sep}digest={digest}"))
            .output()
            .map_err(|e| format!("curl: {e}"))?;
        if !out.status.success() {
            return Err(format!("PUT {repo} blob {digest}: {:?}", out.status));
        }
        Ok(digest)
    }

    /// Links blob `digest` of repository `from` into `to` (a cross-repository mount).
    pub fn mount_blob(&self, from: &str, to: &str, digest: &str) -> Result<(), String> {
        let out = self
            .curl(&format!("{to}/blobs/uploads/?mount={digest}&from={from}"))
            .args(["-X", "POST", "-o", "/dev/null", "-w", "%{http_code}"])
            .output()
            .map_err(|e| format!("curl: {e}"))?;
        let code = String::from_utf8_lossy(&out.stdout).to_string();
        if code.trim() != "201" {
            return Err(format!("mount {digest} from {from} into {to}: HTTP {code}"));
        }
        Ok(())
    }

    /// curl of `/v2/<path>` with this registry's CA and credentials.
    fn curl(&self, path: &str) -> Command {
        let mut cmd = Command::new("curl");
        cmd.arg("-sf")
            .arg("--cacert")
            .arg(self.dir.join("ca.crt"))
            .args(["-u", &format!("{USER}:{PASSWORD}")])
            .arg(format!("https://{}/v2/{path}", self.addr));
        cmd
    }

    /// `command` (a chalkctl) pointed at this registry's hosts directory and credentials.
    pub fn client<'c>(&self, command: &'c mut Command) -> &'c mut Command {
        command
            .env("CHALK_HOSTS_DIR", &self.hosts_dir)
            .env("DOCKER_CONFIG", &self.docker_config)
    }
}
