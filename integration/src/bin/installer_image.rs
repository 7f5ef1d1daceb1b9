//! Builds the node installer's image (packaging/kubernetes/installer.yaml) as an OCI archive:
//! busybox, and under /opt/chalk the shim, chalkctl, install.sh, the runtime options, the
//! RuntimeClass and the entrypoint. Load it with `ctr images import` or push it with any OCI
//! tool (e.g. `skopeo copy oci-archive:FILE docker://REGISTRY/chalk-shim-installer:TAG`).
//!
//!   chalk-installer-image --bin-dir DIR --out FILE [--name REF]

use std::{path::PathBuf, process::ExitCode};

use chalk_integration::{containerd::program, image};

fn main() -> ExitCode {
    match run() {
        Ok(out) => {
            println!("{}", out.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("chalk-installer-image: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<PathBuf, String> {
    let mut bin_dir = None;
    let mut out = None;
    let mut name = format!(
        "docker.io/chalk/chalk-shim-installer:{}",
        env!("CARGO_PKG_VERSION")
    );
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--bin-dir" => bin_dir = Some(PathBuf::from(value()?)),
            "--out" => out = Some(PathBuf::from(value()?)),
            "--name" => name = value()?,
            other => {
                return Err(format!(
                    "unknown argument {other}; usage: --bin-dir DIR --out FILE [--name REF]"
                ))
            }
        }
    }
    let bin_dir = bin_dir.ok_or("--bin-dir (where the built binaries are) is required")?;
    let out = out.ok_or("--out FILE is required")?;
    let packaging = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../packaging");
    let read = |p: PathBuf| std::fs::read(&p).map_err(|e| format!("{}: {e}", p.display()));
    let files = [
        (
            "opt/chalk/containerd-shim-chalk-v1",
            0o755,
            read(bin_dir.join("containerd-shim-chalk-v1"))?,
        ),
        ("opt/chalk/chalkctl", 0o755, read(bin_dir.join("chalkctl"))?),
        (
            "opt/chalk/chalk-agent",
            0o755,
            read(bin_dir.join("chalk-agent"))?,
        ),
        (
            "opt/chalk/install.sh",
            0o755,
            read(packaging.join("install.sh"))?,
        ),
        (
            "opt/chalk/chalk.toml",
            0o644,
            read(packaging.join("chalk.toml"))?,
        ),
        (
            "opt/chalk/runtimeclass.yaml",
            0o644,
            read(packaging.join("kubernetes/runtimeclass.yaml"))?,
        ),
        (
            "opt/chalk/entrypoint.sh",
            0o755,
            read(packaging.join("kubernetes/installer/entrypoint.sh"))?,
        ),
    ];
    // chalk-agent runs in this image (agent.yaml) by the libraries it was linked with here,
    // under /opt/chalk/lib (busybox's image has none).
    let libs: Vec<(String, Vec<u8>)> = shared_libraries(&bin_dir.join("chalk-agent"))?
        .into_iter()
        .map(|p| {
            let name = p
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .to_string();
            Ok((format!("opt/chalk/lib/{name}"), read(p)?))
        })
        .collect::<Result<_, String>>()?;
    let extra: Vec<image::ExtraFile> = files
        .iter()
        .map(|(p, m, d)| (*p, *m, d.as_slice()))
        .chain(libs.iter().map(|(p, d)| (p.as_str(), 0o755, d.as_slice())))
        .collect();
    let layer = image::busybox_layer_with(&program("CHALK_BUSYBOX", "/bin/busybox"), &extra)
        .map_err(|e| format!("busybox layer: {e}"))?;
    let archive =
        image::oci_archive_running(&layer, &name, "", &["/bin/sh", "/opt/chalk/entrypoint.sh"])
            .map_err(|e| e.to_string())?;
    std::fs::write(&out, archive).map_err(|e| format!("{}: {e}", out.display()))?;
    Ok(out)
}

/// The shared libraries `binary` loads (ldd's answer), the dynamic loader among them.
fn shared_libraries(binary: &std::path::Path) -> Result<Vec<PathBuf>, String> {
    let out = std::process::Command::new("ldd")
        .arg(binary)
        .output()
        .map_err(|e| format!("ldd: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "ldd {}: {}",
            binary.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let path = match l.split_once("=>") {
                Some((_, right)) => right.split_whitespace().next()?,
                None => l.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect())
}
