//! runsc driven directly, with the flags the shim gives it (ptrace, no network, root writes in
//! memory): the floor the shim adds to. Bundles share one busybox root filesystem.

use std::{
    fs,
    io::{Read, Seek},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use chalk_runtime::runsc::features::{Features, LeaveRunning};

use super::timed;
use crate::containerd::program;

pub struct RunscAlone {
    binary: PathBuf,
    root: PathBuf,
    dir: PathBuf,
    rootfs: PathBuf,
    flags: Vec<String>,
    pub features: Features,
}

/// Everything runsc printed, stdout and stderr together (the 2022 build prints some help on
/// stderr).
fn both(binary: &Path, args: &[&str]) -> String {
    Command::new(binary)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map(|o| {
            let mut s = String::from_utf8_lossy(&o.stdout).into_owned();
            s.push_str(&String::from_utf8_lossy(&o.stderr));
            s
        })
        .unwrap_or_default()
}

impl RunscAlone {
    /// Probes `CHALK_RUNSC` (or `runsc`) and unpacks the busybox root filesystem under `dir`.
    pub fn new(dir: &Path, busybox_layer: &[u8]) -> Result<Self, String> {
        let named = program("CHALK_RUNSC", "runsc");
        let binary = chalk_runtime::runsc::features::resolve_binary(&named).unwrap_or(named);
        let features =
            Features::from_outputs(&both(&binary, &["--version"]), &both(&binary, &["flags"]))
                .with_checkpoint_help(&both(&binary, &["help", "checkpoint"]))
                .with_restore_help(
                    &both(&binary, &["help", "restore"]),
                    &both(&binary, &["help", "wait"]),
                );
        let mut flags = vec!["--platform=ptrace".to_string(), "--network=none".into()];
        flags.extend(features.memory_overlay_flag().map(String::from));
        let rootfs = dir.join("rootfs");
        fs::create_dir_all(&rootfs).map_err(|e| format!("{}: {e}", rootfs.display()))?;
        tar::Archive::new(busybox_layer)
            .unpack(&rootfs)
            .map_err(|e| format!("unpack busybox into {}: {e}", rootfs.display()))?;
        Ok(RunscAlone {
            binary,
            root: dir.join("root"),
            dir: dir.to_path_buf(),
            rootfs,
            flags,
            features,
        })
    }

    /// The global flags every command gets, for the report and the runc shim's wrapper.
    pub fn flags(&self) -> &[String] {
        &self.flags
    }

    pub fn binary(&self) -> &Path {
        &self.binary
    }

    /// Runs runsc with `args`. Its output goes to a file, never a pipe: the sandbox that
    /// `create` starts inherits it and would hold a pipe open for its whole life.
    fn ok(&self, args: &[&str]) -> Result<(), String> {
        let what = || format!("runsc {}", args.join(" "));
        let log = tempfile::tempfile_in(&self.dir).map_err(|e| format!("{}: {e}", what()))?;
        let status = Command::new(&self.binary)
            .arg("--root")
            .arg(&self.root)
            .args(&self.flags)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log.try_clone().map_err(|e| e.to_string())?)
            .status()
            .map_err(|e| format!("{}: {e}", what()))?;
        if !status.success() {
            let mut text = String::new();
            let mut log = log;
            let _ = log.seek(std::io::SeekFrom::Start(0));
            let _ = log.read_to_string(&mut text);
            return Err(format!("{}: {status}: {}", what(), text.trim()));
        }
        Ok(())
    }

    /// A bundle named `name` whose process runs `args`, made by `runsc spec`.
    pub fn bundle(&self, name: &str, args: &[&str]) -> Result<PathBuf, String> {
        let b = self.dir.join("bundles").join(name);
        fs::create_dir_all(&b).map_err(|e| format!("{}: {e}", b.display()))?;
        let spec = b.join("config.json");
        let _ = fs::remove_file(&spec);
        let out = Command::new(&self.binary)
            .arg("spec")
            .arg("--bundle")
            .arg(&b)
            .arg("--")
            .args(args)
            .output()
            .map_err(|e| format!("runsc spec: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "runsc spec: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let text = fs::read_to_string(&spec).map_err(|e| format!("{}: {e}", spec.display()))?;
        let mut v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", spec.display()))?;
        v["root"] = serde_json::json!({"path": self.rootfs, "readonly": false});
        v["process"]["terminal"] = false.into();
        fs::write(&spec, v.to_string()).map_err(|e| format!("{}: {e}", spec.display()))?;
        Ok(b)
    }

    /// `runsc run` of a bundle whose process exits by itself.
    pub fn run(&self, bundle: &Path, id: &str) -> Result<Duration, String> {
        let b = bundle.to_string_lossy();
        let took = timed(|| self.ok(&["run", "--bundle", &b, id]))?.0;
        self.remove(id);
        Ok(took)
    }

    /// `runsc create` then `runsc start`.
    pub fn create_start(&self, bundle: &Path, id: &str) -> Result<Duration, String> {
        let b = bundle.to_string_lossy();
        Ok(timed(|| {
            self.ok(&["create", "--bundle", &b, id])?;
            self.ok(&["start", id])
        })?
        .0)
    }

    pub fn exec_true(&self, id: &str) -> Result<Duration, String> {
        Ok(timed(|| self.ok(&["exec", id, "true"]))?.0)
    }

    /// Kills and removes a running container (`runsc delete --force`).
    pub fn kill_delete(&self, id: &str) -> Result<Duration, String> {
        Ok(timed(|| self.ok(&["delete", "--force", id]))?.0)
    }

    /// Removes a container whose checkpoint is stopping its sandbox. As the shim does, with
    /// `--force`: a plain delete can time out waiting for the sandbox to stop (runsc 2022,
    /// "waiting sandbox stop: context deadline exceeded"), so it is tried a few times.
    fn delete_stopping(&self, id: &str) -> Result<(), String> {
        let mut last = Ok(());
        for _ in 0..3 {
            last = self.ok(&["delete", "--force", id]);
            if last.is_ok() {
                break;
            }
        }
        last
    }

    /// Best effort, for cleanup.
    pub fn remove(&self, id: &str) {
        let _ = self.ok(&["delete", "--force", id]);
    }

    /// Waits until `path` exists in container `id`.
    pub fn wait_file(&self, id: &str, path: &str, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        while self.ok(&["exec", id, "test", "-e", path]).is_err() {
            if Instant::now() > deadline {
                return Err(format!("{path} did not appear in {id} within {timeout:?}"));
            }
            std::thread::sleep(Duration::from_millis(300));
        }
        Ok(())
    }

    /// `runsc checkpoint` with `args`, uncompressed where this runsc has the choice (as the
    /// shim takes them).
    fn checkpoint(&self, args: &[&str]) -> Result<(), String> {
        let flags = self.features.uncompressed_checkpoint_flags();
        let mut all = vec!["checkpoint"];
        all.extend(flags.iter().map(String::as_str));
        all.extend_from_slice(args);
        self.ok(&all)
    }

    /// `restore --detach --background` then `wait --restore`, where this runsc has them: the
    /// time to running and the time to fully loaded.
    pub fn restore_lazy(
        &self,
        bundle: &Path,
        image: &Path,
        id: &str,
    ) -> Result<Option<(Duration, Duration)>, String> {
        if !self.features.lazy_restore() {
            return Ok(None);
        }
        let (b, img) = (bundle.to_string_lossy(), image.to_string_lossy());
        let started = Instant::now();
        self.ok(&[
            "restore",
            "--detach",
            "--background",
            "--image-path",
            &img,
            "--bundle",
            &b,
            id,
        ])?;
        let running = started.elapsed();
        self.ok(&["wait", "--restore", id])?;
        Ok(Some((running, started.elapsed())))
    }

    /// A checkpoint into `image` that leaves `id` running: in place where this runsc can,
    /// else checkpoint, delete and restore under the same id (what the shim does there).
    pub fn snapshot(&self, bundle: &Path, id: &str, image: &Path) -> Result<Duration, String> {
        let img = image.to_string_lossy();
        Ok(timed(|| match self.features.leave_running() {
            LeaveRunning::InPlace => {
                self.checkpoint(&["--leave-running", "--image-path", &img, id])
            }
            LeaveRunning::RestoreAfter => {
                self.checkpoint(&["--image-path", &img, id])?;
                self.delete_stopping(id)?;
                self.restore_untimed(bundle, image, id)
            }
        })?
        .0)
    }

    /// A checkpoint that stops `id`, then its removal: suspend.
    pub fn suspend(&self, id: &str, image: &Path) -> Result<Duration, String> {
        let img = image.to_string_lossy();
        Ok(timed(|| {
            self.checkpoint(&["--image-path", &img, id])?;
            // Current runsc may still read the container as running while its sandbox exits.
            self.delete_stopping(id)
        })?
        .0)
    }

    fn restore_untimed(&self, bundle: &Path, image: &Path, id: &str) -> Result<(), String> {
        let (b, img) = (bundle.to_string_lossy(), image.to_string_lossy());
        self.ok(&[
            "restore",
            "--detach",
            "--image-path",
            &img,
            "--bundle",
            &b,
            id,
        ])
    }

    /// `runsc restore --detach`: fork and resume.
    pub fn restore(&self, bundle: &Path, image: &Path, id: &str) -> Result<Duration, String> {
        Ok(timed(|| self.restore_untimed(bundle, image, id))?.0)
    }

    /// `ids.len()` restores of one image at once.
    pub fn restore_many(
        &self,
        bundle: &Path,
        image: &Path,
        ids: &[String],
    ) -> Result<Duration, String> {
        Ok(timed(|| {
            std::thread::scope(|s| {
                let all: Vec<_> = ids
                    .iter()
                    .map(|id| s.spawn(move || self.restore_untimed(bundle, image, id)))
                    .collect();
                all.into_iter()
                    .map(|h| h.join().unwrap_or_else(|_| Err("restore panicked".into())))
                    .collect::<Result<Vec<()>, String>>()
            })
        })?
        .0)
    }
}

/// The bytes of every file under `dir`.
pub fn size_of(dir: &Path) -> u64 {
    fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => size_of(&e.path()),
            _ => e.metadata().map_or(0, |m| m.len()),
        })
        .sum()
}

/// How long openssl takes to sha256 every file of `dir`, one after another on one core: what
/// hashing a checkpoint costs at best.
pub fn openssl_sha256(dir: &Path) -> Result<Duration, String> {
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    let started = std::time::Instant::now();
    let out = std::process::Command::new("openssl")
        .args(["dgst", "-sha256", "-r"])
        .args(&files)
        .stdout(std::process::Stdio::null())
        .status()
        .map_err(|e| format!("openssl: {e}"))?;
    if !out.success() {
        return Err(format!("openssl dgst -sha256 of {}: {out}", dir.display()));
    }
    Ok(started.elapsed())
}
