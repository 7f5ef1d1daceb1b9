//! Installing the runtime: packaging/install.sh against a private config (never the system's):
//! what containerd then reads, idempotence, --dry-run, --uninstall, and a foreign `chalk`
//! runtime left alone; the Debian package's install and purge; the node installer's image run
//! as a sandbox of a private containerd.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use chalk_integration::{
    cases,
    containerd::{program, shim_binary},
    ensure,
    testkit::{self, Env, Failed, TestResult},
    Containerd, CtrOutput, RUNTIME,
};

fn installer() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../packaging/install.sh")
}

/// Runs the installer with every path under `dir`, containerd (for the config version) first
/// on PATH.
/// The PATH the installer runs with: the cell's containerd and runsc first, as on a node.
fn installer_path() -> String {
    let dir_of = |p: std::path::PathBuf| {
        p.parent()
            .map(|p| p.display().to_string())
            .filter(|p| !p.is_empty())
    };
    let mut dirs: Vec<String> = Vec::new();
    dirs.extend(dir_of(program("CHALK_CONTAINERD", "containerd")));
    dirs.extend(dir_of(program("CHALK_RUNSC", "runsc")));
    dirs.push(std::env::var("PATH").unwrap_or_default());
    dirs.join(":")
}

fn install(dir: &Path, extra: &[&str]) -> CtrOutput {
    let from = shim_binary().expect("shim built");
    let from = from.parent().expect("bin dir");
    let path = installer_path();
    Command::new("bash")
        .arg(installer())
        .arg("--from")
        .arg(from)
        .arg("--bin-dir")
        .arg(dir.join("bin"))
        .arg("--config")
        .arg(dir.join("config.toml"))
        .arg("--options")
        .arg(dir.join("chalk.toml"))
        .arg("--state")
        .arg(dir.join("state"))
        .args(extra)
        .env("PATH", path)
        .stdin(Stdio::null())
        .output()
        .expect("run install.sh")
        .into()
}

/// What containerd makes of `config`: its `config dump`.
fn dump(config: &Path) -> Result<String, Failed> {
    let out = Command::new(program("CHALK_CONTAINERD", "containerd"))
        .arg("--config")
        .arg(config)
        .args(["config", "dump"])
        .output()
        .map_err(|e| e.to_string())?;
    ensure!(
        out.status.success(),
        "config dump: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

pub fn installer_registers_the_runtime_and_uninstalls_exactly(_e: &Env) -> TestResult {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let d = dir.path();
    let config = d.join("config.toml");
    // A config someone already has: the installer must keep all of it.
    let version = Command::new(program("CHALK_CONTAINERD", "containerd"))
        .arg("--version")
        .output()
        .map_err(|e| e.to_string())?;
    let major2 = String::from_utf8_lossy(&version.stdout).contains("/v2 ");
    let original = if major2 {
        "version = 3\n\n[plugins.\"io.containerd.cri.v1.images\"]\n  snapshotter = \"native\"\n"
    } else {
        "version = 2\n\n[plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"pause:3.9\"\n"
    };
    std::fs::write(&config, original).map_err(|e| e.to_string())?;

    let dry = install(d, &["--dry-run"]);
    ensure!(
        dry.code == 0 && dry.stdout.contains("would"),
        "dry run: {dry:?}"
    );
    ensure!(
        std::fs::read_to_string(&config).unwrap_or_default() == original && !d.join("bin").exists(),
        "--dry-run changed something"
    );

    let out = install(d, &[]);
    ensure!(
        out.code == 0 && out.stdout.contains("Restart containerd"),
        "install: {out:?}"
    );
    let installed = std::fs::read_to_string(&config).map_err(|e| e.to_string())?;
    ensure!(
        installed.starts_with(original),
        "the old config was not kept: {installed}"
    );
    for b in ["containerd-shim-chalk-v1", "chalkctl"] {
        ensure!(d.join("bin").join(b).exists(), "{b} not installed");
    }
    ensure!(d.join("chalk.toml").exists(), "options not installed");
    // Pods get their CNI network where the runsc on the node can give it.
    let help = Command::new("runsc")
        .args(["help", "checkpoint"])
        .env("PATH", installer_path())
        .output()
        .map_err(|e| e.to_string())?;
    let recent = [help.stdout, help.stderr]
        .iter()
        .any(|o| String::from_utf8_lossy(o).contains("save-restore-exec-argv"));
    let options = std::fs::read_to_string(d.join("chalk.toml")).unwrap_or_default();
    let want = if recent {
        "network = \"sandbox\""
    } else {
        "network = \"none\""
    };
    ensure!(
        options.lines().any(|l| l == want),
        "runsc on PATH is {}recent, so the options should say {want}: {options}",
        if recent { "" } else { "not " }
    );
    // containerd reads the runtime, pointing at the options file.
    let text = dump(&config)?;
    let options = d.join("chalk.toml").display().to_string();
    ensure!(
        text.contains("runtimes.chalk]")
            && text.contains("io.containerd.chalk.v1")
            && text.contains(&options),
        "containerd does not see the runtime: {text}"
    );
    // containerd 1.6 drops its default runc runtime when a config names any runtime: the
    // installer keeps it, or CRI would not load.
    ensure!(
        text.contains("runtimes.runc]") || text.contains("runtimes.runc']"),
        "the default runc runtime is gone: {text}"
    );
    if major2 {
        ensure!(
            text.contains("snapshotter = 'native'"),
            "the old setting is gone: {text}"
        );
    } else {
        ensure!(
            text.contains("sandbox_image = \"pause:3.9\""),
            "the old setting is gone: {text}"
        );
    }

    // Again: nothing changes.
    let again = install(d, &[]);
    ensure!(again.code == 0, "{again:?}");
    ensure!(
        std::fs::read_to_string(&config).unwrap_or_default() == installed,
        "a second install changed the config"
    );

    // Uninstall: exactly the original config, no binaries, no options file.
    let out = install(d, &["--uninstall"]);
    ensure!(out.code == 0, "uninstall: {out:?}");
    ensure!(
        std::fs::read_to_string(&config).unwrap_or_default() == original,
        "uninstall left the config changed"
    );
    for p in ["bin/containerd-shim-chalk-v1", "bin/chalkctl", "chalk.toml"] {
        ensure!(!d.join(p).exists(), "uninstall left {p}");
    }

    // A `chalk` runtime the installer did not write is not touched.
    let foreign = format!(
        "{original}\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.chalk]\n  runtime_type = \"x\"\n"
    );
    std::fs::write(&config, &foreign).map_err(|e| e.to_string())?;
    let out = install(d, &[]);
    ensure!(
        out.code != 0 && out.stderr.contains("already has a runtime named chalk"),
        "foreign runtime: {out:?}"
    );
    ensure!(
        std::fs::read_to_string(&config).unwrap_or_default() == foreign,
        "the refused install changed the config"
    );
    Ok(())
}

/// The Debian package (packaging/deb/build) installed on this machine with dpkg, then purged.
pub fn debian_package_installs_and_purges(_e: &Env) -> TestResult {
    let installed = Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", "chalk-shim"])
        .output()
        .map_err(|e| e.to_string())?;
    ensure!(
        !String::from_utf8_lossy(&installed.stdout).contains("installed"),
        "chalk-shim is already installed here: this test installs and purges the package, \
         remove it first (dpkg --purge chalk-shim)"
    );
    let out_dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let from = shim_binary().map_err(|e| e.to_string())?;
    let build = Command::new("bash")
        .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../packaging/deb/build"))
        .arg("--from")
        .arg(from.parent().ok_or("no bin dir")?)
        .arg("--out")
        .arg(out_dir.path())
        .output()
        .map_err(|e| e.to_string())?;
    let deb = String::from_utf8_lossy(&build.stdout).trim().to_string();
    ensure!(
        build.status.success() && deb.ends_with(".deb"),
        "deb/build: {}",
        String::from_utf8_lossy(&build.stderr)
    );
    let dpkg = |args: &[&str]| -> CtrOutput {
        Command::new("dpkg")
            .args(["--force-confdef", "--force-confold"])
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .output()
            .expect("run dpkg")
            .into()
    };
    // containerd may come from another package name here (or be built): the dependency is
    // what apt resolves on a node; this checks the files.
    let out = dpkg(&["--force-depends", "-i", &deb]);
    let result = (|| {
        ensure!(out.code == 0, "dpkg -i: {out:?}");
        ensure!(
            out.stdout.contains("install.sh --config-only"),
            "postinst: {out:?}"
        );
        for f in [
            "/usr/bin/containerd-shim-chalk-v1",
            "/usr/bin/chalkctl",
            "/etc/containerd/chalk.toml",
            "/usr/share/chalk-shim/install.sh",
            "/usr/share/chalk-shim/kubernetes/runtimeclass.yaml",
            "/usr/share/bash-completion/completions/chalkctl",
            "/usr/share/zsh/vendor-completions/_chalkctl",
            "/usr/share/fish/vendor_completions.d/chalkctl.fish",
            "/usr/share/man/man1/chalkctl.1.gz",
        ] {
            ensure!(Path::new(f).exists(), "{f} is not installed");
        }
        let bash = std::fs::read_to_string("/usr/share/bash-completion/completions/chalkctl")
            .unwrap_or_default();
        ensure!(
            bash.contains("attach") && bash.contains("--snapshot-id"),
            "the bash completion does not know chalkctl's commands"
        );
        let man = Command::new("sh")
            .args(["-c", "gzip -dc /usr/share/man/man1/chalkctl.1.gz"])
            .output()
            .map_err(|e| e.to_string())?;
        let man = String::from_utf8_lossy(&man.stdout);
        ensure!(
            man.contains(".TH chalkctl") && man.contains("attach"),
            "the man page: {man:.200}"
        );
        let v = Command::new("/usr/bin/chalkctl")
            .arg("--version")
            .output()
            .map_err(|e| e.to_string())?;
        ensure!(v.status.success(), "chalkctl --version failed");
        // The packaged installer registers the runtime only (dry run on a private config).
        let cfg = out_dir.path().join("config.toml");
        std::fs::write(&cfg, "version = 2\n").map_err(|e| e.to_string())?;
        let reg = Command::new("bash")
            .args([
                "/usr/share/chalk-shim/install.sh",
                "--config-only",
                "--config",
            ])
            .arg(&cfg)
            .output()
            .map_err(|e| e.to_string())?;
        let text = std::fs::read_to_string(&cfg).unwrap_or_default();
        ensure!(
            reg.status.success() && text.contains("ConfigPath = \"/etc/containerd/chalk.toml\""),
            "packaged installer: {} {text}",
            String::from_utf8_lossy(&reg.stderr)
        );
        Ok(())
    })();
    let purge = dpkg(&["--purge", "chalk-shim"]);
    result?;
    ensure!(purge.code == 0, "dpkg --purge: {purge:?}");
    for f in [
        "/usr/bin/containerd-shim-chalk-v1",
        "/usr/bin/chalkctl",
        "/etc/containerd/chalk.toml",
    ] {
        ensure!(!Path::new(f).exists(), "{f} is still there after purge");
    }
    Ok(())
}

/// The node installer's image (what the DaemonSet runs), run in a sandbox with a directory
/// standing for the node's root: it copies the binaries, installer and options there.
pub fn node_installer_image_installs_onto_the_host_root(e: &Env) -> TestResult {
    let id = "node-installer";
    e.remove(id);
    let shim = shim_binary().map_err(|e| e.to_string())?;
    let bin_dir = shim.parent().ok_or("no bin dir")?;
    let archive = e.c.dir().join("installer.oci.tar");
    let name = "docker.io/chalk/chalk-shim-installer:test";
    let built = Command::new(bin_dir.join("chalk-installer-image"))
        .arg("--bin-dir")
        .arg(bin_dir)
        .arg("--out")
        .arg(&archive)
        .args(["--name", name])
        .output()
        .map_err(|e| e.to_string())?;
    ensure!(
        built.status.success(),
        "chalk-installer-image: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    let out = e.ctr(&["images", "import", archive.to_str().unwrap_or("")]);
    ensure!(out.code == 0, "import: {out:?}");
    let host = tempfile::tempdir().map_err(|e| e.to_string())?;
    std::fs::create_dir_all(host.path().join("etc")).map_err(|e| e.to_string())?;
    std::fs::write(host.path().join("etc/hostname"), "node-1\n").map_err(|e| e.to_string())?;
    let mount = format!(
        "type=bind,src={},dst=/host,options=rbind:rw",
        host.path().display()
    );
    let result = (|| {
        let out = e.ctr(&[
            "run",
            "-d",
            "--runtime",
            RUNTIME,
            "--env",
            "REGISTER_RUNTIME=false",
            "--mount",
            &mount,
            name,
            id,
        ]);
        ensure!(out.code == 0, "run the installer: {out:?}");
        let deadline = Instant::now() + Duration::from_secs(60);
        while e.sh(id, "done", "test -e /tmp/installed").code != 0 {
            ensure!(Instant::now() < deadline, "the installer did not finish");
            std::thread::sleep(Duration::from_millis(200));
        }
        let h = host.path();
        let same = |a: &Path, b: &Path| std::fs::read(a).ok() == std::fs::read(b).ok();
        ensure!(
            same(&h.join("usr/local/bin/containerd-shim-chalk-v1"), &shim),
            "the shim on the host differs from the built one"
        );
        ensure!(
            same(&h.join("usr/local/bin/chalkctl"), &bin_dir.join("chalkctl")),
            "chalkctl on the host differs from the built one"
        );
        for f in [
            "usr/local/share/chalk-shim/install.sh",
            "usr/local/share/chalk-shim/runtimeclass.yaml",
            "etc/containerd/chalk.toml",
        ] {
            ensure!(h.join(f).exists(), "{f} is not on the host");
        }
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(h.join("usr/local/bin/containerd-shim-chalk-v1"))
            .map_err(|e| e.to_string())?
            .permissions()
            .mode();
        ensure!(mode & 0o777 == 0o755, "shim mode {mode:o}");
        Ok(())
    })();
    e.remove(id);
    e.ctr(&["images", "rm", name]);
    result?;
    e.assert_clean(id)
}

fn main() {
    testkit::check_args();
    let c = Containerd::start().unwrap_or_else(|e| panic!("cannot start containerd: {e}"));
    let all = cases![
        installer_registers_the_runtime_and_uninstalls_exactly,
        debian_package_installs_and_purges,
        node_installer_image_installs_onto_the_host_root,
    ];
    testkit::run(Env { c }, all, |_| Ok(()))
}
