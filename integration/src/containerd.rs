//! A private containerd: its own root, state, sockets and runsc root under a temp dir, with the
//! chalk shim on its PATH. It never touches a system containerd. Dropping it stops the daemon
//! and removes everything it made.

use std::{
    ffi::OsStr,
    fs,
    io::{self, Write},
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

/// The image every test and the demo runs.
pub const IMAGE: &str = "docker.io/chalk/busybox:test";
/// The busybox image with the cuda-checkpoint stand-in at /bin (and /usr/bin)/cuda-checkpoint.
pub const GPU_STANDIN_IMAGE: &str = "docker.io/chalk/busybox-cuda-standin:test";
/// The stand-in itself (integration/standin/cuda-checkpoint).
pub const CUDA_CHECKPOINT_STANDIN: &[u8] = include_bytes!("../standin/cuda-checkpoint");

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
fn built_binary(var: &str, name: &str) -> io::Result<PathBuf> {
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

pub struct Containerd {
    dir: tempfile::TempDir,
    daemon: Child,
    ctr: PathBuf,
    pub namespace: String,
}

impl Containerd {
    /// Starts containerd (`CHALK_CONTAINERD` or `containerd` on PATH) and waits for its socket.
    pub fn start() -> io::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("chalk-it-")
            .tempdir_in("/tmp")?;
        let d = dir.path();
        let bin = d.join("bin");
        fs::create_dir_all(&bin)?;
        std::os::unix::fs::symlink(shim_binary()?, bin.join("containerd-shim-chalk-v1"))?;

        fs::write(d.join("chalk.toml"), runtime_options(d))?;
        fs::write(d.join("config.toml"), config(d))?;

        let log = fs::File::create(d.join("containerd.log"))?;
        // A containerd picked by CHALK_CONTAINERD finds its own shims (its runc shim) first.
        let daemon_bin = program("CHALK_CONTAINERD", "containerd");
        let own = daemon_bin
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .map(|d| format!("{}:", d.display()))
            .unwrap_or_default();
        let path = format!(
            "{}:{own}{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_else(|_| "/usr/sbin:/usr/bin:/sbin:/bin".into())
        );
        // containerd unpacks every restored checkpoint into a temporary directory it never
        // removes: keep those inside this instance's directory.
        let tmp = d.join("tmp");
        fs::create_dir_all(&tmp)?;
        let daemon = Command::new(daemon_bin)
            .arg("--config")
            .arg(d.join("config.toml"))
            .env("PATH", path)
            .env("TMPDIR", &tmp)
            .env("CHALK_SHIM_CONFIG", d.join("chalk.toml"))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        let mut c = Containerd {
            dir,
            daemon,
            ctr: program("CHALK_CTR", "ctr"),
            namespace: "chalk-test".into(),
        };
        c.wait_ready(Duration::from_secs(30))?;
        Ok(c)
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

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn socket(&self) -> PathBuf {
        self.dir().join("containerd.sock")
    }

    /// The runsc root the shim uses for this namespace.
    pub fn runsc_root(&self) -> PathBuf {
        self.dir().join("runsc").join(&self.namespace)
    }

    /// The default runtime options file (also reachable via --runtime-config-path).
    pub fn options_path(&self) -> PathBuf {
        self.dir().join("chalk.toml")
    }

    pub fn log(&self) -> String {
        fs::read_to_string(self.dir().join("containerd.log")).unwrap_or_default()
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
        let mut cmd = Command::new(chalkctl_binary()?);
        cmd.arg("--address")
            .arg(self.socket())
            .args(["--namespace", &self.namespace])
            .stdin(Stdio::null());
        Ok(cmd)
    }

    /// Runs ctr with no stdin and collects its output.
    pub fn ctr<I, S>(&self, args: I) -> CtrOutput
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let out = self
            .ctr_command()
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run ctr");
        out.into()
    }

    /// Runs ctr feeding `input` on its stdin.
    pub fn ctr_with_input<I, S>(&self, args: I, input: &[u8]) -> CtrOutput
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
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
        let archive = self.dir().join(format!(
            "busybox-{}.oci.tar",
            if variant.is_empty() { "plain" } else { variant }
        ));
        std::fs::write(
            &archive,
            crate::image::oci_archive_labelled(&layer, name, variant)?,
        )?;
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
        // Remove what is left in the namespace, then stop the daemon.
        let tasks = self.ctr(["task", "ls", "-q"]).stdout;
        for id in tasks.lines().filter(|l| !l.is_empty()) {
            self.ctr(["task", "kill", "-a", "-s", "SIGKILL", id]);
            self.ctr(["task", "delete", "-f", id]);
        }
        for id in self
            .ctr(["containers", "ls", "-q"])
            .stdout
            .lines()
            .filter(|l| !l.is_empty())
        {
            self.ctr(["containers", "rm", id]);
        }
        let _ = nix_kill(self.daemon.id(), libc::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.daemon.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.daemon.kill();
        let _ = self.daemon.wait();
        unmount_under(self.dir.path());
    }
}

fn nix_kill(pid: u32, sig: i32) -> io::Result<()> {
    // SAFETY: plain kill(2) on our own child's pid.
    if unsafe { libc::kill(pid as i32, sig) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Lazily unmounts anything still mounted below `dir`, deepest first, so the temp dir can go.
fn unmount_under(dir: &Path) {
    let Ok(mounts) = fs::read_to_string("/proc/self/mounts") else {
        return;
    };
    let prefix = dir.display().to_string();
    let mut targets: Vec<&str> = mounts
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter(|t| t.starts_with(&prefix))
        .collect();
    targets.sort_by_key(|t| std::cmp::Reverse(t.len()));
    for t in targets {
        if let Ok(c) = std::ffi::CString::new(t) {
            // SAFETY: umount2 with a valid C string.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
    }
}

fn runtime_options(d: &Path) -> String {
    let packaged = include_str!("../../packaging/chalk.toml");
    // The packaged file with a private runsc root, so test runs never meet.
    let mut out = String::new();
    for line in packaged.lines() {
        if line.trim_start().starts_with("root") && !line.contains('[') {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    // Tests add hooks by annotation (chalk.io/hooks); nodes opt in to that themselves.
    let mut head = format!(
        "root = \"{}\"\nallow_annotation_hooks = true\n",
        d.join("runsc").display()
    );
    // CHALK_RUNSC picks another runsc (the test matrix); the packaged file names Debian's.
    if let Some(runsc) = std::env::var_os("CHALK_RUNSC").filter(|v| !v.is_empty()) {
        out = out
            .lines()
            .filter(|l| !l.trim_start().starts_with("binary_name"))
            .map(|l| format!("{l}\n"))
            .collect();
        head.push_str(&format!(
            "binary_name = \"{}\"\n",
            PathBuf::from(runsc).display()
        ));
    }
    format!("{head}{out}")
}

fn config(d: &Path) -> String {
    format!(
        r#"version = 2
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.grpc.v1.cri"]

[grpc]
  address = "{sock}"

[ttrpc]
  address = "{sock}.ttrpc"

[debug]
  level = "debug"

[plugins."io.containerd.internal.v1.opt"]
  path = "{opt}"
"#,
        root = d.join("root").display(),
        state = d.join("state").display(),
        sock = d.join("containerd.sock").display(),
        opt = d.join("opt").display(),
    )
}
