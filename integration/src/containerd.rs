//! A private containerd: its own root, state, sockets and runsc root under a temp dir, with the
//! chalk shim on its PATH. It never touches a system containerd. Dropping it stops the daemon
//! and removes everything it made.

use std::{
    ffi::OsStr,
    fs,
    io::{self, Write},
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    sync::{
        atomic::{AtomicU32, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant, SystemTime},
};

/// When this process killed a containerd (see [`Containerd::left_by_a_kill`]).
static KILLED_AT: Mutex<Vec<SystemTime>> = Mutex::new(Vec::new());

/// The image every test and the demo runs.
pub const IMAGE: &str = "docker.io/chalk/busybox:test";
/// The pod sandbox ("pause") image of the CRI setup: busybox waiting for ever.
pub const PAUSE_IMAGE: &str = "docker.io/chalk/pause:test";
/// The containerd namespace containerd's CRI plugin keeps pods in.
pub const CRI_NAMESPACE: &str = "k8s.io";
/// The runtime handler the installer registers for CRI (a RuntimeClass's `handler`).
pub const CRI_HANDLER: &str = "chalk";
/// The busybox image with the cuda-checkpoint stand-in at /bin (and /usr/bin)/cuda-checkpoint.
pub const GPU_STANDIN_IMAGE: &str = "docker.io/chalk/busybox-cuda-standin:test";
/// The stand-in itself (integration/standin/cuda-checkpoint).
pub const CUDA_CHECKPOINT_STANDIN: &[u8] = include_bytes!("../standin/cuda-checkpoint");

mod config;
mod teardown;
use config::{config, register_with_installer, runtime_options, snapshot_store};
pub use config::{installer_script, network_conf_dir, Setup};
pub(crate) use teardown::unmount_under;
use teardown::Teardown;

/// Picks a program from an environment variable, else the name on PATH.
pub fn program(var: &str, default: &str) -> PathBuf {
    std::env::var_os(var)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(default))
}

/// Where the shim binary was built: `CHALK_SHIM_BINARY`, else next to this executable.
pub fn shim_binary() -> io::Result<PathBuf> {
    built_binary("CHALK_SHIM_BINARY", "containerd-shim-chalk-v1")
}

/// Where chalkctl was built: `CHALK_CHALKCTL`, else next to this executable.
pub fn chalkctl_binary() -> io::Result<PathBuf> {
    built_binary("CHALK_CHALKCTL", "chalkctl")
}

/// `var` if set, else `name` in the cargo profile directory this executable runs from
/// (target/<profile>/, also for tests in target/<profile>/deps/).
pub fn built_binary(var: &str, name: &str) -> io::Result<PathBuf> {
    if let Some(p) = std::env::var_os(var).filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    let exe = std::env::current_exe()?;
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.file_name() == Some(OsStr::new("deps")) {
        dir.pop();
    }
    let candidate = dir.join(name);
    if candidate.exists() {
        return Ok(candidate);
    }
    Err(io::Error::other(format!(
        "{} is not built: run `cargo build --workspace --bins` first (or set {var})",
        candidate.display()
    )))
}

/// What a `ctr` invocation printed and how it ended.
#[derive(Debug)]
pub struct CtrOutput {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// Once the program is stopping on a signal (`crate::stop`), no more ctr or chalkctl is
/// started: its containerd is going or gone, and a command started now would outlive the
/// program. What a caller gets instead.
fn stopping() -> Option<CtrOutput> {
    crate::stop::requested().map(|sig| CtrOutput {
        code: -1,
        stdout: String::new(),
        stderr: format!("not run: the program is stopping on signal {sig}"),
    })
}

impl From<Output> for CtrOutput {
    fn from(o: Output) -> Self {
        use std::os::unix::process::ExitStatusExt;
        CtrOutput {
            code: o
                .status
                .code()
                .unwrap_or_else(|| 128 + o.status.signal().unwrap_or(0)),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }
}

/// Whether `CHALK_CONTAINERD` (or containerd on PATH) is a 2.x, which reads config version 3.
pub fn containerd_is_2x() -> bool {
    Command::new(program("CHALK_CONTAINERD", "containerd"))
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("/v2 "))
        .unwrap_or(false)
}

/// What a CRI node's containerd is given (see [`Setup::Cri`]).
#[derive(Debug, Clone, Default)]
pub struct CriOptions {
    pub cni_bin: Option<PathBuf>,
    pub registry_hosts: Option<PathBuf>,
    pub registry_auth: Option<PathBuf>,
    pub network: u8,
    /// Appended to the node's runtime options.
    pub options: String,
    /// Appended to its `[restore_from]` (which lets the `default` namespace in).
    pub restore_from: String,
}

pub struct Containerd {
    dir: tempfile::TempDir,
    daemon: Child,
    ctr: PathBuf,
    pub namespace: String,
    started: std::time::SystemTime,
    teardown: Arc<Teardown>,
    on_stop: Option<crate::stop::Registration>,
}

/// Starts containerd on the config in `d`, with the shim first on its PATH (and a containerd
/// picked by CHALK_CONTAINERD finding its own shims, its runc shim, next), logging to
/// `d/containerd.log`. Its temporary directory is the environment's, as for any containerd.
fn spawn_daemon(d: &Path) -> io::Result<Child> {
    let log = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(d.join("containerd.log"))?;
    let daemon_bin = program("CHALK_CONTAINERD", "containerd");
    let own = daemon_bin
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .map(|d| format!("{}:", d.display()))
        .unwrap_or_default();
    let path = format!(
        "{}:{own}{}",
        d.join("bin").display(),
        std::env::var("PATH").unwrap_or_else(|_| "/usr/sbin:/usr/bin:/sbin:/bin".into())
    );
    Command::new(daemon_bin)
        .arg("--config")
        .arg(d.join("config.toml"))
        .env("PATH", path)
        .env("CHALK_SHIM_CONFIG", d.join("chalk.toml"))
        .env("CHALK_FAULT_DIR", d.join("faults"))
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        // A group of its own: a terminal's Ctrl-C must not stop it before the program has
        // removed its sandboxes through it (see crate::stop).
        .process_group(0)
        .spawn()
}

/// The bytes of the files below `dir`.
pub fn bytes_under(dir: &Path) -> u64 {
    fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => bytes_under(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

impl Containerd {
    /// Starts containerd (`CHALK_CONTAINERD` or `containerd` on PATH) and waits for its socket.
    pub fn start() -> io::Result<Self> {
        Self::start_with(Setup::Plain)
    }

    /// Starts containerd (API only) whose shim runs `runsc`: a host with another runsc.
    pub fn start_with_runsc(runsc: &Path) -> io::Result<Self> {
        Self::start_with(Setup::Runsc(runsc.to_path_buf()))
    }

    /// Starts containerd with its CRI plugin, configured by the installer (see [`Setup::Cri`]),
    /// with the busybox and pause images imported into the CRI namespace.
    pub fn start_cri(o: CriOptions) -> io::Result<Self> {
        let c = Self::start_with(Setup::Cri {
            cni_bin: o.cni_bin,
            registry_hosts: o.registry_hosts,
            registry_auth: o.registry_auth,
            network: o.network,
            options: o.options,
            restore_from: o.restore_from,
        })?;
        c.import_busybox()?;
        // Blocks for ever, as `tail` rather than `sleep`: critest looks for its own sleeps.
        c.import_running(PAUSE_IMAGE, &["/bin/tail", "-f", "/dev/null"])?;
        Ok(c)
    }

    fn start_with(setup: Setup) -> io::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("chalk-it-")
            .tempdir_in("/tmp")?;
        let d = dir.path();
        let bin = d.join("bin");
        fs::create_dir_all(&bin)?;
        fs::create_dir_all(d.join("faults"))?;
        std::os::unix::fs::symlink(shim_binary()?, bin.join("containerd-shim-chalk-v1"))?;

        let cri = matches!(setup, Setup::Cri { .. });
        fs::write(d.join("chalk.toml"), runtime_options(d, &setup))?;
        fs::write(d.join("config.toml"), config(d, &setup))?;
        if cri {
            register_with_installer(d)?;
        }

        let daemon = spawn_daemon(d)?;
        let ctr = program("CHALK_CTR", "ctr");
        let namespace: String = if cri { CRI_NAMESPACE } else { "chalk-test" }.into();
        let teardown = Arc::new(Teardown {
            dir: d.to_path_buf(),
            ctr: ctr.clone(),
            namespace: namespace.clone(),
            pid: AtomicU32::new(daemon.id()),
        });
        let on_stop = {
            let teardown = teardown.clone();
            crate::stop::on_stop("a private containerd", move || {
                teardown.run();
                let _ = fs::remove_dir_all(&teardown.dir);
            })
        };
        let mut c = Containerd {
            dir,
            daemon,
            ctr,
            namespace,
            started: std::time::SystemTime::now(),
            teardown,
            on_stop: Some(on_stop),
        };
        c.wait_ready(Duration::from_secs(30))?;
        Ok(c)
    }

    /// Stops the daemon (SIGKILL, as a crash would) and starts it again on the same root and
    /// state: its shims and sandboxes carry on, and it reconnects to them.
    pub fn restart(&mut self) -> io::Result<()> {
        self.kill_daemon();
        self.daemon = spawn_daemon(self.dir.path())?;
        self.teardown.pid.store(self.daemon.id(), Ordering::SeqCst);
        self.wait_ready(Duration::from_secs(30))
    }

    /// The directories containerd unpacked checkpoints of this instance's namespace into
    /// (`ctrd-checkpoint*` in its temporary directory, the default one: this instance sets
    /// none) since it started, with the bytes each still holds: what restores left behind. One
    /// whose manifest is gone (half removed) counts too.
    pub fn unpacked_checkpoints(&self) -> Vec<(PathBuf, u64)> {
        // As containerd picks it (Go's os.MkdirTemp with $XDG_RUNTIME_DIR).
        let temp = ["XDG_RUNTIME_DIR", "TMPDIR"]
            .iter()
            .find_map(|k| std::env::var_os(k).filter(|v| !v.is_empty()))
            .map_or_else(|| PathBuf::from("/tmp"), PathBuf::from);
        let since = self.started - Duration::from_secs(1);
        let found = fs::read_dir(&temp)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with("ctrd-checkpoint")
            })
            .filter(|e| {
                e.metadata()
                    .and_then(|m| m.modified())
                    .is_ok_and(|t| t >= since)
            })
            .filter(|e| {
                let m = fs::read(e.path().join("chalk.manifest.json")).unwrap_or_default();
                let m: serde_json::Value = serde_json::from_slice(&m).unwrap_or_default();
                m.is_null() || m["source"]["namespace"] == self.namespace.as_str()
            })
            .map(|e| e.path())
            .collect::<Vec<_>>();
        // Another containerd on this host may be restoring right now: a directory of a
        // restore under way goes within moments, one left behind stays.
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut left = found;
        while !left.is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(250));
            left.retain(|p| p.exists());
        }
        left.into_iter()
            .map(|p| {
                let bytes = bytes_under(&p);
                (p, bytes)
            })
            .collect()
    }

    fn wait_ready(&mut self, timeout: Duration) -> io::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.daemon.try_wait()? {
                return Err(io::Error::other(format!(
                    "containerd exited with {status} during start:\n{}",
                    self.log()
                )));
            }
            if self.socket().exists() && self.ctr(["version"]).code == 0 {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(io::Error::other(format!(
                    "containerd did not come up in {timeout:?}:\n{}",
                    self.log()
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Kills the daemon (SIGKILL), leaving its shims and sandboxes without it.
    pub fn kill_daemon(&mut self) {
        KILLED_AT.lock().unwrap().push(SystemTime::now());
        let _ = self.daemon.kill();
        let _ = self.daemon.wait();
    }

    /// Whether unpack directory `dir` is one a containerd made just before this process
    /// killed it: containerd unpacks a checkpoint, then starts the shim, and killed in between
    /// no shim ever learns of the directory (the shim sweeps such directories at a restore
    /// ten minutes on). Only one that holds nothing but the runtime's pointer (no memory),
    /// made within five seconds before a kill, counts.
    pub fn left_by_a_kill(dir: &Path) -> bool {
        let pointer_only = chalk_runtime::snapshot::store::holds_only_a_pointer(dir);
        let Some(made) = fs::metadata(dir).and_then(|m| m.created()).ok() else {
            return false;
        };
        pointer_only
            && KILLED_AT.lock().unwrap().iter().any(|&kill| {
                kill.duration_since(made)
                    .is_ok_and(|d| d < Duration::from_secs(5))
            })
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Arms the shim's fault point `stage` for container `id` (debug builds stop there, see
    /// `chalk_runtime::fault`).
    pub fn arm_fault(&self, id: &str, stage: &str) -> io::Result<()> {
        fs::write(self.dir().join("faults").join(format!("{id}.{stage}")), b"")
    }

    /// Waits up to `timeout` for a shim to stop at the armed point `stage` of `id`.
    pub fn fault_reached(&self, id: &str, stage: &str, timeout: Duration) -> bool {
        let reached = self
            .dir()
            .join("faults")
            .join(format!("{id}.{stage}.reached"));
        let deadline = std::time::Instant::now() + timeout;
        while !reached.exists() {
            if std::time::Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        true
    }

    /// Disarms `stage` of `id` (a shim waiting there goes on) and forgets it was reached.
    pub fn disarm_fault(&self, id: &str, stage: &str) {
        let dir = self.dir().join("faults");
        let _ = fs::remove_file(dir.join(format!("{id}.{stage}")));
        let _ = fs::remove_file(dir.join(format!("{id}.{stage}.reached")));
    }

    /// Container `id`'s bundle directory, which containerd makes for its task.
    pub fn bundle(&self, id: &str) -> PathBuf {
        self.dir()
            .join("state/io.containerd.runtime.v2.task")
            .join(&self.namespace)
            .join(id)
    }

    pub fn socket(&self) -> PathBuf {
        self.dir().join("containerd.sock")
    }

    /// The runsc root the shim uses for this namespace.
    pub fn runsc_root(&self) -> PathBuf {
        self.dir().join("runsc").join(&self.namespace)
    }

    /// containerd's content store: the directory of its sha256 blobs.
    pub fn content_blobs(&self) -> PathBuf {
        self.dir()
            .join("root/io.containerd.content.v1.content/blobs/sha256")
    }

    /// The file of blob `digest` in containerd's content store.
    pub fn content_blob(&self, digest: &str) -> PathBuf {
        self.content_blobs()
            .join(digest.trim_start_matches("sha256:"))
    }

    /// The snapshot store this containerd's shims and chalkctl share (its options say so).
    pub fn snapshot_store(&self) -> PathBuf {
        snapshot_store(self.dir())
    }

    /// The default runtime options file (also reachable via --runtime-config-path).
    pub fn options_path(&self) -> PathBuf {
        self.dir().join("chalk.toml")
    }

    pub fn log(&self) -> String {
        fs::read_to_string(self.dir().join("containerd.log")).unwrap_or_default()
    }

    /// The shim's `chalk-timing` figures of its `nth` (from 0) `op` of container `id`, from
    /// this containerd's log (where shim logs go, a moment after the fact), waiting up to
    /// `within` for the line.
    pub fn chalk_timing(
        &self,
        op: &str,
        id: &str,
        nth: usize,
        within: std::time::Duration,
    ) -> Option<std::collections::HashMap<String, f64>> {
        let deadline = std::time::Instant::now() + within;
        loop {
            let log = self.log();
            let line = log
                .lines()
                .filter(|l| {
                    l.contains(&format!("chalk-timing op={op} "))
                        && l.contains(&format!(" id={id} "))
                })
                .nth(nth);
            if let Some(line) = line {
                let body = line.split("chalk-timing ").nth(1)?.trim_end_matches('"');
                return Some(
                    body.split_whitespace()
                        .filter_map(|kv| {
                            let (k, v) = kv.split_once('=')?;
                            Some((k.to_string(), v.trim_end_matches('"').parse().ok()?))
                        })
                        .collect(),
                );
            }
            if std::time::Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }

    /// A `ctr` command bound to this containerd and namespace.
    pub fn ctr_command(&self) -> Command {
        let mut cmd = Command::new(&self.ctr);
        cmd.arg("--address")
            .arg(self.socket())
            .arg("--namespace")
            .arg(&self.namespace);
        cmd
    }

    /// A `chalkctl` command bound to this containerd and namespace, with an empty stdin.
    pub fn chalkctl_command(&self) -> io::Result<Command> {
        let argv = self.chalkctl_argv()?;
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..]).stdin(Stdio::null());
        Ok(cmd)
    }

    /// chalkctl and the flags that bind it to this containerd, its namespace, options and
    /// state directory: for a command line another program runs (a terminal's).
    pub fn chalkctl_argv(&self) -> io::Result<Vec<String>> {
        Ok(vec![
            chalkctl_binary()?.display().to_string(),
            "--address".into(),
            self.socket().display().to_string(),
            "--namespace".into(),
            self.namespace.clone(),
            "--config".into(),
            self.options_path().display().to_string(),
            "--state-dir".into(),
            self.chalkctl_state().display().to_string(),
        ])
    }

    /// Where the chalkctl of this containerd keeps sandboxes' stdio.
    pub fn chalkctl_state(&self) -> PathBuf {
        self.dir().join("chalkctl")
    }

    /// Runs ctr with no stdin and collects its output.
    /// `chalkctl args` on this containerd (its namespace and options).
    pub fn chalkctl(&self, args: &[&str]) -> CtrOutput {
        if let Some(stopping) = stopping() {
            return stopping;
        }
        self.chalkctl_command()
            .expect("chalkctl is built")
            .args(args)
            .output()
            .expect("run chalkctl")
            .into()
    }

    pub fn ctr<I, S>(&self, args: I) -> CtrOutput
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        if let Some(stopping) = stopping() {
            return stopping;
        }
        let out = self
            .ctr_command()
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run ctr");
        out.into()
    }

    /// Runs ctr feeding `input` on its stdin (nothing once the program is stopping).
    pub fn ctr_with_input<I, S>(&self, args: I, input: &[u8]) -> CtrOutput
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        if let Some(stopping) = stopping() {
            return stopping;
        }
        let mut child = self
            .ctr_command()
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run ctr");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input)
            .expect("write stdin");
        child.wait_with_output().expect("wait ctr").into()
    }

    /// Builds the busybox image and imports it as [`IMAGE`].
    pub fn import_busybox(&self) -> io::Result<()> {
        self.import_variant(IMAGE, "")
    }

    /// Imports the busybox image as `name`; a non-empty `variant` gives it another digest.
    pub fn import_variant(&self, name: &str, variant: &str) -> io::Result<()> {
        self.import_with(name, variant, &[])
    }

    /// Imports the busybox image with `extra` files as `name` (`variant` names its archive).
    pub fn import_with(
        &self,
        name: &str,
        variant: &str,
        extra: &[crate::image::ExtraFile],
    ) -> io::Result<()> {
        let busybox = program("CHALK_BUSYBOX", "/bin/busybox");
        let layer = crate::image::busybox_layer_with(&busybox, extra)?;
        let archive = crate::image::oci_archive_labelled(&layer, name, variant)?;
        self.import_archive(
            &format!(
                "busybox-{}",
                if variant.is_empty() { "plain" } else { variant }
            ),
            &archive,
        )
    }

    /// Imports the busybox image as `name`, with `cmd` as its command.
    pub fn import_running(&self, name: &str, cmd: &[&str]) -> io::Result<()> {
        let busybox = program("CHALK_BUSYBOX", "/bin/busybox");
        let layer = crate::image::busybox_layer(&busybox)?;
        let archive = crate::image::oci_archive_running(&layer, name, "", cmd)?;
        let file = name.rsplit('/').next().unwrap_or(name).replace(':', "-");
        self.import_archive(&file, &archive)
    }

    /// Imports an OCI archive (one image), kept as `file`.oci.tar in this instance's dir.
    pub fn import_archive(&self, file: &str, archive: &[u8]) -> io::Result<()> {
        let archive_path = self.dir().join(format!("{file}.oci.tar"));
        std::fs::write(&archive_path, archive)?;
        self.import_archive_file(&archive_path)
    }

    /// Imports the OCI archive at `archive` (one image).
    pub fn import_archive_file(&self, archive: &Path) -> io::Result<()> {
        let out = self.ctr([
            OsStr::new("images"),
            OsStr::new("import"),
            archive.as_os_str(),
        ]);
        if out.code != 0 {
            return Err(io::Error::other(format!(
                "ctr images import: {}",
                out.stderr
            )));
        }
        Ok(())
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        // First, so that a stop under way (which runs the same teardown) is left to finish.
        drop(self.on_stop.take());
        self.teardown.run();
        // CHALK_KEEP_LOGS=<dir>: each containerd's log is kept there, to read after a failure.
        if let Some(keep) = std::env::var_os("CHALK_KEEP_LOGS") {
            let name = self.dir.path().file_name().unwrap_or_default();
            let _ = fs::create_dir_all(&keep);
            let _ = fs::copy(
                self.dir.path().join("containerd.log"),
                Path::new(&keep).join(name).with_extension("log"),
            );
        }
    }
}
