//! Whether this host can restore a snapshot taken elsewhere: checked from its manifest alone,
//! before any of its memory is fetched. runsc refuses a restore under another runsc build,
//! platform or architecture, gVisor refuses a CPU that lacks a feature the source's had,
//! and a GPU sandbox needs the same GPU model and driver.

use std::{collections::BTreeSet, path::Path, sync::Arc};

use crate::{
    options::RuntimeOptions,
    runsc::{
        args::GlobalArgs,
        features::{resolve_binary, FeatureCache},
        Runsc,
    },
    snapshot::{manifest::HostInfo, Manifest},
    Error, Result,
};

/// What this host would restore with.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Host {
    pub runsc_version: String,
    pub platform: String,
    /// The root filesystem overlay flag the shim would use.
    pub overlay: Option<String>,
    pub arch: String,
    /// Empty when unknown.
    pub cpu_flags: BTreeSet<String>,
    /// The GPU models and the driver version (`nvidia-smi`), when asked for and found.
    pub gpu: Option<(Vec<String>, String)>,
    /// Whether this runsc restores in the background (and so may start while pages.img
    /// still arrives).
    pub lazy_restore: bool,
}

/// What differs between snapshot `m` and `here`, one phrase each; empty when it can run here.
pub fn differences(m: &Manifest, here: &Host) -> Vec<String> {
    let mut out = m.check_runtime(&here.runsc_version, &here.platform, &here.arch);
    if m.runsc.overlay != here.overlay {
        out.push(format!(
            "root filesystem overlay: snapshot {:?}, here {:?}",
            m.runsc.overlay, here.overlay
        ));
    }
    if !here.cpu_flags.is_empty() {
        let missing: Vec<&str> = m
            .host
            .cpu_flags
            .iter()
            .filter(|f| !here.cpu_flags.contains(*f))
            .map(String::as_str)
            .collect();
        if !missing.is_empty() {
            out.push(format!(
                "CPU features this host lacks: {} (snapshot taken on {:?}, here {})",
                missing.join(" "),
                m.host.cpu_model,
                cpu_model_here()
            ));
        }
    }
    if let Some(gpu) = &m.extra.gpu {
        match &here.gpu {
            None => out.push(format!(
                "the snapshot holds GPU state ({} x {}), and this host has no NVIDIA GPU",
                gpu.gpu_count,
                gpu.gpu_models.join(", ")
            )),
            Some((models, driver)) => {
                if !gpu.gpu_models.is_empty() && &gpu.gpu_models != models {
                    out.push(format!(
                        "GPU models: snapshot {:?}, here {models:?}",
                        gpu.gpu_models
                    ));
                }
                if let Some(d) = gpu.driver_version.as_ref().filter(|d| *d != driver) {
                    out.push(format!("GPU driver: snapshot {d:?}, here {driver:?}"));
                }
            }
        }
    }
    out
}

fn cpu_model_here() -> String {
    format!("{:?}", HostInfo::current().cpu_model)
}

impl Host {
    /// This host as the shim with runtime options `opts` would restore: its runsc's version
    /// (from the shim's feature cache, else by running it), the platform and overlay flags
    /// the shim would pass, the CPU, and the GPUs when `want_gpu`.
    pub fn probe(opts: &RuntimeOptions, want_gpu: bool) -> Result<Host> {
        let flags = opts
            .runsc_flags()
            .map_err(|e| Error::parse("runsc_config", e))?;
        let binary = resolve_binary(Path::new(&opts.binary_name)).ok_or_else(|| {
            Error::parse(
                "binary_name",
                format!(
                    "{}: no such runsc on this host (install runsc, or set binary_name in the \
                     runtime options)",
                    opts.binary_name
                ),
            )
        })?;
        let cache = FeatureCache::new(opts.root.join(".features"));
        let features = match cache.get(&binary) {
            Some(f) => f,
            None => {
                let f = Runsc::new(
                    &binary,
                    GlobalArgs {
                        root: opts.root.clone(),
                        flags: Vec::new(),
                    },
                    Path::new("/"),
                    Arc::new(crate::runsc::spawn::StdSpawner),
                )
                .features()?;
                // The shim's cache: its first sandbox here need not probe runsc again.
                cache.put(&binary, &f);
                f
            }
        };
        let mut global = GlobalArgs {
            root: opts.root.clone(),
            flags,
        };
        if let Some(flag) = opts.added_overlay_flag(&features) {
            global.flags.push(flag.to_string());
        }
        let info = HostInfo::current();
        Ok(Host {
            runsc_version: features.version.clone(),
            platform: global.platform().to_string(),
            overlay: global.overlay().map(String::from),
            arch: info.arch,
            cpu_flags: info.cpu_flags.into_iter().collect(),
            gpu: if want_gpu { nvidia_gpus() } else { None },
            lazy_restore: features.lazy_restore() && opts.snapshot.lazy_restore,
        })
    }
}

/// The GPU models and driver version `nvidia-smi` reports; None without one.
fn nvidia_gpus() -> Option<(Vec<String>, String)> {
    let out = std::process::Command::new("nvidia-smi")
        .args(["--query-gpu=name,driver_version", "--format=csv,noheader"])
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    let text = String::from_utf8_lossy(&out.stdout);
    let rows: Vec<(String, String)> = text
        .lines()
        .filter_map(|l| {
            let (name, driver) = l.split_once(',')?;
            Some((name.trim().to_string(), driver.trim().to_string()))
        })
        .collect();
    let driver = rows.first()?.1.clone();
    Some((rows.into_iter().map(|(n, _)| n).collect(), driver))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::{
        describe::describe,
        extra::GpuFacts,
        manifest::{Kind, Source},
    };

    fn manifest() -> Manifest {
        let g = GlobalArgs {
            root: "/run/chalk/default/web".into(),
            flags: vec!["--platform=ptrace".into(), "--overlay2=root:memory".into()],
        };
        let source = Source {
            namespace: "default".into(),
            container_id: "web".into(),
            sandbox_id: "web".into(),
        };
        let mut m = describe(Kind::Snapshot, source, "runsc 1", &g, b"{}", None).unwrap();
        m.host.arch = "x86_64".into();
        m.host.cpu_flags = vec!["avx2".into(), "sse4_2".into()];
        m
    }

    fn here() -> Host {
        Host {
            runsc_version: "runsc 1".into(),
            platform: "ptrace".into(),
            overlay: Some("--overlay2=root:memory".into()),
            arch: "x86_64".into(),
            cpu_flags: ["avx2", "sse4_2", "avx512f"].map(String::from).into(),
            gpu: None,
            lazy_restore: false,
        }
    }

    #[test]
    fn the_same_host_can_restore() {
        assert_eq!(differences(&manifest(), &here()), Vec::<String>::new());
        // Flags unknown here: not a reason to refuse.
        let unknown = Host {
            cpu_flags: BTreeSet::new(),
            ..here()
        };
        assert!(differences(&manifest(), &unknown).is_empty());
    }

    #[test]
    fn each_difference_is_named() {
        let other = Host {
            runsc_version: "runsc 2".into(),
            platform: "systrap".into(),
            overlay: None,
            cpu_flags: ["sse4_2"].map(String::from).into(),
            ..here()
        };
        let d = differences(&manifest(), &other).join("; ");
        for word in ["runsc version", "platform", "overlay", "lacks: avx2"] {
            assert!(d.contains(word), "{word} missing from {d}");
        }
    }

    #[test]
    fn a_gpu_snapshot_needs_the_same_gpu_and_driver() {
        let mut m = manifest();
        m.extra.gpu = Some(GpuFacts {
            handoff: "chalk".into(),
            driver_version: Some("550.1".into()),
            gpu_models: vec!["NVIDIA H100".into()],
            gpu_count: 1,
            ..Default::default()
        });
        assert!(differences(&m, &here())[0].contains("no NVIDIA GPU"));
        let same = Host {
            gpu: Some((vec!["NVIDIA H100".into()], "550.1".into())),
            ..here()
        };
        assert!(differences(&m, &same).is_empty());
        let other = Host {
            gpu: Some((vec!["NVIDIA H200".into()], "560.0".into())),
            ..here()
        };
        let d = differences(&m, &other).join("; ");
        assert!(d.contains("GPU models") && d.contains("GPU driver"), "{d}");
    }
}
