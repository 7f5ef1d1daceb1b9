//! Runs containerd's own client integration suite (`integration/client`, built by
//! scripts/peers as `client.test`) with io.containerd.chalk.v1 as its runtime, one test per
//! process, and writes a Markdown report of what passed, failed and was skipped.
//!
//! The suite pulls its images from public registries. None is reachable here, so they are
//! served from loopback: a registry (CHALK_REGISTRY) holding the busybox image under every
//! name the suite uses, TLS with a throwaway CA, in a network namespace of its own; the suite
//! runs there with a private mount namespace whose /etc/hosts points those names at 127.0.0.1.
//!
//!   chalk-containerd-suite REPORT.md [REGEX]
//!
//! Needs root, CHALK_CONTAINERD_SUITE, CHALK_REGISTRY, CHALK_CONTAINERD (the containerd the
//! suite starts for itself: it runs a daemon per test under /run/containerd-test), openssl.

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use chalk_integration::{
    containerd::IMAGE,
    registry::{self as image_registry, Guard},
    Containerd,
};

/// The images the suite pulls (integration/images), all served as the busybox image.
const SUITE_IMAGES: &[&str] = &[
    "ghcr.io/containerd/busybox:1.36",
    "ghcr.io/containerd/alpine:3.14.0",
    "ghcr.io/containerd/volume-copy-up:2.2",
    "ghcr.io/containerd/volume-ownership:2.1",
    "ghcr.io/containerd/nginx:1.27.0",
    "registry.k8s.io/pause:3.10.2",
    "registry.k8s.io/e2e-test-images/resource-consumer:1.10",
    "cplatpublic.azurecr.io/args-escaped-test-image-ns:1.0",
];
const HOSTS: &str = "ghcr.io registry.k8s.io cplatpublic.azurecr.io";
const PER_TEST_TIMEOUT: Duration = Duration::from_secs(180);

fn env_path(var: &str) -> Result<PathBuf, String> {
    std::env::var_os(var)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .ok_or_else(|| format!("{var} is not set: run `eval \"$(scripts/peers)\"` first"))
}

fn run(cmd: &mut Command, what: &str) -> Result<String, String> {
    let out = cmd.output().map_err(|e| format!("{what}: {e}"))?;
    if !out.status.success() {
        return Err(format!("{what}: {}", String::from_utf8_lossy(&out.stderr)));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A network namespace with its own /etc/hosts, removed on drop.
struct Netns(String);
impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
        let _ = std::fs::remove_dir_all(format!("/etc/netns/{}", self.0));
    }
}

/// Fills a registry store with the busybox image under every suite image name.
fn fill_registry(c: &Containerd, registry: &Path, dir: &Path) -> Result<(), String> {
    let addr = "127.0.0.1:5599";
    let _reg = image_registry::serve_plain(registry, dir, addr)?;
    for name in SUITE_IMAGES {
        let repo = name.split_once('/').map_or(*name, |(_, r)| r);
        let local = format!("{addr}/{repo}");
        let out = c.ctr(["images", "tag", "--force", IMAGE, &local]);
        if out.code != 0 {
            return Err(format!("tag {local}: {}", out.stderr));
        }
        let out = c.ctr(["images", "push", "--plain-http", &local]);
        if out.code != 0 {
            return Err(format!("push {local}: {}", out.stderr));
        }
    }
    Ok(())
}

#[derive(Debug)]
enum Outcome {
    Pass,
    Skip(String),
    Fail(String),
}

/// The first line that explains a failure or a skip.
fn reason(output: &str, name: &str) -> String {
    let lines: Vec<&str> = output.lines().collect();
    let pick = lines
        .iter()
        .filter(|l| !l.contains("log_hook.go"))
        .find(|l| {
            let t = l.trim_start();
            (t.contains("_test.go:") || t.starts_with("panic:") || t.contains("test timed out"))
                && !t.starts_with("---")
        })
        .map(|l| l.trim().to_string());
    pick.unwrap_or_else(|| format!("no reason printed for {name}"))
        .chars()
        .take(300)
        .collect()
}

/// Kills what a test left running: its daemon (a process group of its own by now) and the
/// shims and sandboxes that daemon started, all of which name the suite's state directory.
fn sweep() {
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        if String::from_utf8_lossy(&cmdline).contains("containerd-test") {
            // SAFETY: kill(2) of a process left by the suite.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
    std::thread::sleep(Duration::from_millis(200));
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(report) = args.get(1) else {
        eprintln!("usage: chalk-containerd-suite REPORT.md [REGEX]");
        std::process::exit(2);
    };
    let filter = args.get(2).cloned();
    if let Err(e) = run_suite(Path::new(report), filter.as_deref()) {
        eprintln!("containerd suite: {e}");
        std::process::exit(1);
    }
}

fn run_suite(report: &Path, filter: Option<&str>) -> Result<(), String> {
    let suite = env_path("CHALK_CONTAINERD_SUITE")?;
    let registry = env_path("CHALK_REGISTRY")?;
    let containerd = env_path("CHALK_CONTAINERD")?;

    // Each test's output is kept next to the report, for reading failures afterwards.
    let logs = report.with_extension("logs");
    std::fs::create_dir_all(&logs).map_err(|e| format!("{}: {e}", logs.display()))?;
    let c = Containerd::start().map_err(|e| e.to_string())?;
    c.import_busybox().map_err(|e| e.to_string())?;
    let dir = c.dir().join("suite");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    fill_registry(&c, &registry, &dir)?;
    let names: Vec<&str> = HOSTS.split(' ').collect();
    image_registry::make_certs(&dir, &names)?;

    let ns = Netns(format!("chalk-suite-{}", std::process::id()));
    run(
        Command::new("ip").args(["netns", "add", &ns.0]),
        "ip netns add",
    )?;
    run(
        Command::new("ip").args(["-n", &ns.0, "link", "set", "lo", "up"]),
        "lo up",
    )?;
    let etc = PathBuf::from(format!("/etc/netns/{}", ns.0));
    std::fs::create_dir_all(&etc).map_err(|e| e.to_string())?;
    std::fs::write(etc.join("hosts"), format!("127.0.0.1 localhost {HOSTS}\n"))
        .map_err(|e| e.to_string())?;
    std::fs::write(
        dir.join("tls.yml"),
        image_registry::config(&dir, "127.0.0.1:443", true),
    )
    .map_err(|e| e.to_string())?;
    let _tls = Guard(
        Command::new("ip")
            .args(["netns", "exec", &ns.0])
            .arg(&registry)
            .arg("serve")
            .arg(dir.join("tls.yml"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("start TLS registry: {e}"))?,
    );
    std::thread::sleep(Duration::from_secs(1));

    // The suite's own daemon finds containerd and the chalk shim on PATH.
    let bin = c.dir().join("bin");
    // The suite runs its checkpoint tests only where it finds a `criu` on PATH. chalk-shim
    // checkpoints with runsc and never runs criu: this one only fails loudly if called.
    let criu = bin.join("criu");
    std::fs::write(
        &criu,
        "#!/bin/sh\necho 'criu called, but chalk-shim checkpoints with runsc' >&2\nexit 1\n",
    )
    .map_err(|e| format!("{}: {e}", criu.display()))?;
    std::fs::set_permissions(&criu, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .map_err(|e| format!("{}: {e}", criu.display()))?;
    let containerd_dir = containerd.parent().unwrap_or(Path::new("/"));
    let path = format!(
        "{}:{}:{}",
        containerd_dir.display(),
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    // One process per test, inside the namespace, with its own containerd daemon.
    let suite_cmd = |extra: &[String]| {
        // Not `ip netns exec`: it remounts /sys, hiding the cgroup hierarchies. A private
        // mount namespace gets the hosts file; nsenter joins the network namespace.
        let mut cmd = Command::new("timeout");
        cmd.arg(PER_TEST_TIMEOUT.as_secs().to_string())
            .args(["unshare", "-m", "--", "sh", "-c"])
            .arg("n=$1; shift; mount --bind \"$0\" /etc/hosts && exec nsenter \"--net=$n\" -- \"$@\"")
            .arg(etc.join("hosts"))
            .arg(format!("/run/netns/{}", ns.0))
            .arg("env")
            .arg(format!("PATH={path}"))
            .arg(format!("SSL_CERT_FILE={}", dir.join("ca.crt").display()))
            .arg("TEST_RUNTIME=io.containerd.chalk.v1")
            // The suite's switch for tests that drive the runc binary directly.
            .arg("RUNC_FLAVOR=runsc")
            .arg(format!("CHALK_SHIM_CONFIG={}", c.options_path().display()))
            .arg(&suite)
            .args(["-test.root", "-test.count=1"])
            .args(extra)
            .current_dir(&dir)
            .stdin(Stdio::null());
        // Its own process group, so a test that hangs takes its daemon down with it.
        // SAFETY: setpgid is async-signal-safe.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                if libc::setpgid(0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        cmd
    };
    // The suite's TestMain (daemon start, seed pull) runs before the listing too.
    let listing = run(
        &mut suite_cmd(&["-test.list".into(), ".".into()]),
        "list suite tests",
    )?;
    let names: Vec<&str> = listing
        .lines()
        .filter(|l| l.starts_with("Test"))
        .filter(|l| filter.is_none_or(|f| l.contains(f)))
        .collect();

    let mut results = Vec::new();
    for name in &names {
        let started = Instant::now();
        let out = suite_cmd(&[
            "-test.v".into(),
            format!("-test.run=^{name}$"),
            format!("-test.timeout={}s", PER_TEST_TIMEOUT.as_secs() - 10),
        ])
        .output()
        .map_err(|e| format!("run {name}: {e}"))?;
        sweep();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let outcome = if text.contains(&format!("--- PASS: {name} ")) && out.status.success() {
            Outcome::Pass
        } else if text.contains(&format!("--- SKIP: {name} ")) {
            Outcome::Skip(reason(&text, name))
        } else {
            Outcome::Fail(reason(&text, name))
        };
        eprintln!("{name}: {outcome:?} ({:.1?})", started.elapsed());
        std::fs::write(logs.join(format!("{name}.log")), &text).ok();
        results.push((name.to_string(), outcome));
    }

    let count = |f: fn(&Outcome) -> bool| results.iter().filter(|(_, o)| f(o)).count();
    let (pass, fail, skip) = (
        count(|o| matches!(o, Outcome::Pass)),
        count(|o| matches!(o, Outcome::Fail(_))),
        count(|o| matches!(o, Outcome::Skip(_))),
    );
    let mut md = String::new();
    let _ = writeln!(md, "| test | result | first reason given |\n|---|---|---|");
    for (name, o) in &results {
        let (r, why) = match o {
            Outcome::Pass => ("pass", String::new()),
            Outcome::Skip(w) => ("skip", w.clone()),
            Outcome::Fail(w) => ("FAIL", w.clone()),
        };
        let _ = writeln!(md, "| {name} | {r} | {} |", why.replace('|', "\\|"));
    }
    let _ = writeln!(md, "\n{pass} passed, {fail} failed, {skip} skipped");
    std::fs::write(report, &md).map_err(|e| e.to_string())?;
    println!("{pass} passed, {fail} failed, {skip} skipped");
    Ok(())
}
