//! Runs Kubernetes' CRI validation suite (`critest`, from cri-tools, built by
//! `scripts/peers --cri`) against a private containerd whose CRI plugin runs pods with the
//! `chalk` handler (registered by packaging/install.sh), and writes a Markdown report: every
//! spec with its result, and the first line of each failure.
//!
//! critest pulls its images from public registries; none is reachable here, so a local
//! registry, set as containerd's mirror for those registries, serves busybox-based stand-ins
//! under the same names: the
//! plain busybox, web servers (busybox httpd where critest expects nginx/httpd), and images
//! whose config carries the users the image tests look for. Pods get networks from the CNI
//! bridge plugin.
//!
//!   chalk-critest REPORT.md [FOCUS-REGEX]
//!
//! Needs root, CHALK_CRITEST, CHALK_REGISTRY, CHALK_CNI_BIN (scripts/peers --cri), and the
//! containerd/runsc pair to test in CHALK_CONTAINERD/CHALK_CTR/CHALK_RUNSC.

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use chalk_integration::{
    containerd::{program, CRI_HANDLER},
    image, procs, registry, Containerd,
};

const REGISTRY: &str = "127.0.0.1:5599";
const STAGING: &str = "k8s-staging-cri-tools";
const E2E: &str = "e2e-test-images";

/// One stand-in image: its path in the registry, the image config's User and Cmd, and files
/// to add (Debian's static busybox lacks `pgrep` and `ipcs`, which critest runs: small
/// scripts over /proc stand in for them in every image).
struct StandIn {
    path: String,
    user: &'static str,
    cmd: Vec<String>,
    files: Vec<(&'static str, u32, &'static [u8])>,
}

const INDEX_HTML: &[u8] = b"<html><body>chalk stand-in web server</body></html>\n";
const PGREP: &[u8] = br#"#!/bin/sh
# pgrep stand-in: pids whose name (or, with -f, command line) contains the pattern.
full=; [ "$1" = -f ] && { full=1; shift; }
status=1
for d in /proc/[0-9]*; do
    pid=${d#/proc/}
    [ "$pid" = "$$" ] && continue
    if [ -n "$full" ]; then line=$(tr '\0' ' ' < "$d/cmdline" 2>/dev/null); else line=$(cat "$d/comm" 2>/dev/null); fi
    case "$line" in *"$1"*) echo "$pid"; status=0 ;; esac
done
exit $status
"#;
const IPCS: &[u8] = br#"#!/bin/sh
# ipcs -m stand-in: the System V shared memory segments, from /proc/sysvipc/shm.
echo "------ Shared Memory Segments --------"
echo "key        shmid      owner      perms      bytes      nattch"
tail -n +2 /proc/sysvipc/shm 2>/dev/null | while read -r key shmid perms size cpid lpid nattch uid rest; do
    echo "$key $shmid $uid $perms $size $nattch"
done
"#;
/// A stand-in web server: busybox httpd, saying what it stands for in its log and (for
/// nginx) in its command line, where critest looks for them.
fn web_cmd(what: &str, port: &str) -> Vec<String> {
    let root = if what == "nginx" {
        "/www/nginx: master process"
    } else {
        "/www"
    };
    vec![
        "/bin/sh".into(),
        "-c".into(),
        format!("echo '{what} stand-in (busybox httpd) on port {port}'; exec /bin/httpd -f -p {port} -h '{root}'"),
    ]
}
/// For the predefined-group image: a user 1000 in a group 50000 that only the image defines.
const PREDEFINED_PASSWD: &[u8] =
    b"root:x:0:0:root:/root:/bin/sh\ndefault-user:x:1000:1000::/home/default-user:/bin/sh\n";
const PREDEFINED_GROUP: &[u8] =
    b"root:x:0:\ndefault-user:x:1000:\ngroup-defined-in-image:x:50000:default-user\n";

fn stand_ins() -> Vec<StandIn> {
    let sh = || vec!["/bin/sh".to_string()];
    let plain = |path: String| StandIn {
        path,
        user: "",
        cmd: sh(),
        files: vec![],
    };
    let web = |path: String, what: &str, port: &str| StandIn {
        path,
        user: "",
        cmd: web_cmd(what, port),
        files: vec![
            ("www/index.html", 0o644, INDEX_HTML),
            ("www/nginx: master process/index.html", 0o644, INDEX_HTML),
        ],
    };
    let user = |name: &str, user: &'static str| StandIn {
        path: format!("{STAGING}/{name}:latest"),
        user,
        cmd: sh(),
        files: vec![],
    };
    let mut all = vec![
        plain(format!("{E2E}/busybox:1.29-2")),
        plain(format!("{E2E}/busybox:latest")),
        web(format!("{E2E}/nginx:1.14-2"), "nginx", "80"),
        web(format!("{E2E}/httpd:2.4.39-4"), "httpd", "80"),
        web(
            format!("{STAGING}/hostnet-nginx-amd64:latest"),
            "nginx",
            "12003",
        ),
        user("test-image-user-uid", "1002"),
        user("test-image-user-username", "www-data"),
        user("test-image-user-uid-group", "1003:1003"),
        user("test-image-user-username-group", "www-data:www-data"),
        StandIn {
            path: format!("{STAGING}/test-image-predefined-group:latest"),
            user: "1000",
            cmd: sh(),
            files: vec![
                ("etc/passwd", 0o644, PREDEFINED_PASSWD),
                ("etc/group", 0o644, PREDEFINED_GROUP),
            ],
        },
    ];
    for name in [
        "test-image-latest:latest",
        "test-image-tag:test",
        "test-image-tag:all",
        "test-image-tags:1",
        "test-image-tags:2",
        "test-image-tags:3",
    ] {
        all.push(plain(format!("{STAGING}/{name}")));
    }
    // Three tags that must be three different images: a file of their own makes them differ.
    for (i, marker) in [(1, &b"1\n"[..]), (2, b"2\n"), (3, b"3\n")] {
        all.push(StandIn {
            path: format!("{STAGING}/test-image-{i}:latest"),
            user: "",
            cmd: sh(),
            files: vec![("image-number", 0o644, marker)],
        });
    }
    all
}

fn env_path(var: &str) -> Result<PathBuf, String> {
    std::env::var_os(var)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .ok_or_else(|| format!("{var} is not set: run `eval \"$(scripts/peers --cri)\"` first"))
}

/// Builds every stand-in with a plain private containerd and pushes it to the registry.
fn fill_registry() -> Result<(), String> {
    let c = Containerd::start().map_err(|e| e.to_string())?;
    let busybox = program("CHALK_BUSYBOX", "/bin/busybox");
    for s in stand_ins() {
        let mut files = s.files.clone();
        files.push(("bin/pgrep", 0o755, PGREP));
        files.push(("bin/ipcs", 0o755, IPCS));
        let layer = image::busybox_layer_with(&busybox, &files).map_err(|e| e.to_string())?;
        let mut config = serde_json::json!({
            "Env": ["PATH=/bin:/sbin:/usr/bin"], "Cmd": s.cmd, "WorkingDir": "/"
        });
        if !s.user.is_empty() {
            config["User"] = s.user.into();
        }
        // One image per name (critest counts an image's tags), but the three tags critest
        // wants to be one image are one.
        let identity = if s.path.contains("/test-image-tags:") {
            "test-image-tags".to_string()
        } else {
            s.path.clone()
        };
        config["Labels"] = serde_json::json!({ "chalk.stand-in": identity });
        let name = format!("{REGISTRY}/{}", s.path);
        let archive =
            image::oci_archive_configured(&layer, &name, config).map_err(|e| e.to_string())?;
        let file = s.path.replace(['/', ':'], "-");
        c.import_archive(&file, &archive)
            .map_err(|e| format!("import {name}: {e}"))?;
        let out = c.ctr(["images", "push", "--plain-http", &name]);
        if out.code != 0 {
            return Err(format!("push {name}: {}", out.stderr));
        }
    }
    Ok(())
}

/// One spec of ginkgo's JSON report.
struct Spec {
    name: String,
    state: String,
    failure: String,
}

fn specs(report: &serde_json::Value) -> Vec<Spec> {
    let mut out = Vec::new();
    for suite in report.as_array().into_iter().flatten() {
        for spec in suite["SpecReports"].as_array().into_iter().flatten() {
            if spec["LeafNodeType"] != "It" {
                continue;
            }
            let mut parts: Vec<String> = spec["ContainerHierarchyTexts"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|t| t.as_str().map(str::to_string))
                .collect();
            parts.push(spec["LeafNodeText"].as_str().unwrap_or("").to_string());
            let failure = spec["Failure"]["Message"]
                .as_str()
                .unwrap_or("")
                .lines()
                .map(str::trim)
                .find(|l| !l.is_empty())
                .unwrap_or("")
                .to_string();
            out.push(Spec {
                name: parts.join(" / "),
                state: spec["State"].as_str().unwrap_or("?").to_string(),
                failure,
            });
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(report) = args.get(1) else {
        eprintln!("usage: chalk-critest REPORT.md [FOCUS-REGEX]");
        std::process::exit(2);
    };
    if let Err(e) = run(Path::new(report), args.get(2).map(String::as_str)) {
        eprintln!("critest: {e}");
        std::process::exit(1);
    }
}

fn run(report: &Path, focus: Option<&str>) -> Result<(), String> {
    let critest = env_path("CHALK_CRITEST")?;
    let registry = env_path("CHALK_REGISTRY")?;
    let cni = env_path("CHALK_CNI_BIN")?;
    let work = tempfile::Builder::new()
        .prefix("chalk-critest-")
        .tempdir_in("/tmp")
        .map_err(|e| e.to_string())?;
    let _registry = registry::serve_plain(&registry, work.path(), REGISTRY)?;
    fill_registry()?;
    let hosts = work.path().join("hosts");
    for upstream in ["registry.k8s.io", "gcr.io"] {
        let dir = hosts.join(upstream);
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        std::fs::write(
            dir.join("hosts.toml"),
            format!(
                "server = \"https://{upstream}\"\n\n[host.\"http://{REGISTRY}\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
            ),
        )
        .map_err(|e| e.to_string())?;
    }
    let c = Containerd::start_cri(chalk_integration::containerd::CriOptions {
        cni_bin: Some(cni),
        registry_hosts: Some(hosts),
        ..Default::default()
    })
    .map_err(|e| e.to_string())?;
    let endpoint = format!("unix://{}", c.socket().display());
    let json = work.path().join("critest.json");
    let mut cmd = Command::new(&critest);
    cmd.arg(format!("-runtime-endpoint={endpoint}"))
        .arg(format!("-image-endpoint={endpoint}"))
        .arg(format!("-runtime-handler={CRI_HANDLER}"))
        .arg("--ginkgo.no-color")
        .arg(format!("--ginkgo.json-report={}", json.display()))
        .current_dir(work.path());
    if let Some(f) = focus {
        cmd.arg(format!("--ginkgo.focus={f}"));
    }
    let started = Instant::now();
    let out = cmd
        .output()
        .map_err(|e| format!("run {}: {e}", critest.display()))?;
    let log = report.with_extension("log");
    let _ = std::fs::write(
        &log,
        [out.stdout.as_slice(), out.stderr.as_slice()].concat(),
    );
    let parsed: serde_json::Value = std::fs::read(&json)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .ok_or_else(|| {
            format!(
                "critest wrote no report; its output is in {}",
                log.display()
            )
        })?;
    let specs = specs(&parsed);
    let count = |s: &str| specs.iter().filter(|x| x.state == s).count();
    let mut md = String::new();
    let _ = writeln!(
        md,
        "critest {} ({}), containerd {}, runsc {}, handler `{CRI_HANDLER}`; {:.0?}\n",
        critest.display(),
        focus.unwrap_or("all specs"),
        procs::first_line(&program("CHALK_CONTAINERD", "containerd"), &["--version"]),
        procs::first_line(&program("CHALK_RUNSC", "runsc"), &["--version"]),
        started.elapsed()
    );
    let _ = writeln!(
        md,
        "| spec | result | first line of the failure |\n|---|---|---|"
    );
    for s in specs
        .iter()
        .filter(|s| focus.is_none() || s.state != "skipped")
    {
        let _ = writeln!(
            md,
            "| {} | {} | {} |",
            s.name.replace('|', "\\|"),
            s.state,
            s.failure.replace('|', "\\|")
        );
    }
    let summary = format!(
        "{} passed, {} failed, {} skipped",
        count("passed"),
        specs.len() - count("passed") - count("skipped") - count("pending"),
        count("skipped") + count("pending")
    );
    let _ = writeln!(md, "\n{summary}");
    std::fs::write(report, md).map_err(|e| e.to_string())?;
    println!(
        "{summary} (report {}, log {})",
        report.display(),
        log.display()
    );
    drop(c);
    Ok(())
}
