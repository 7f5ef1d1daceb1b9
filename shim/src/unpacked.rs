//! The directory containerd unpacks a checkpoint into for a restore (`ctr container restore`,
//! or any client that creates a task from a checkpoint in its content store). containerd
//! makes it (`ctrd-checkpoint<digits>` in its temporary directory) and never removes it: it
//! holds the sandbox's memory, secrets included, and a node that forks a 1 GB sandbox a
//! hundred times would keep a hundred copies. The shim removes it once runsc has opened what
//! it needs (or the restore is refused or abandoned), and never any other directory: a path
//! a client passed itself is the client's.

use std::{
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

/// The prefix containerd gives its checkpoint unpack directories (`os.MkdirTemp`).
const PREFIX: &str = "ctrd-checkpoint";

/// Removed when dropped.
#[derive(Debug)]
pub struct UnpackedCheckpoint(PathBuf);

impl UnpackedCheckpoint {
    /// `dir` if it is one containerd made for this restore, in `temp` (containerd's temporary
    /// directory: `$XDG_RUNTIME_DIR`, else `$TMPDIR`, else /tmp, as the shim inherits them).
    pub fn of(dir: &Path, temp: &Path) -> Option<Self> {
        let name = dir.file_name()?.to_str()?;
        let digits = name.strip_prefix(PREFIX)?;
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let parent = dir.parent()?.canonicalize().ok()?;
        if parent != temp.canonicalize().ok()? {
            return None;
        }
        // A real directory of root's, as containerd makes it (never a link to elsewhere).
        let meta = std::fs::symlink_metadata(dir).ok()?;
        (meta.is_dir() && meta.uid() == 0).then(|| UnpackedCheckpoint(dir.to_path_buf()))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for UnpackedCheckpoint {
    fn drop(&mut self) {
        match std::fs::remove_dir_all(&self.0) {
            Ok(()) => log::info!(
                "removed containerd's unpacked checkpoint {}",
                self.0.display()
            ),
            Err(e) => log::warn!("unpacked checkpoint {} not removed: {e}", self.0.display()),
        }
    }
}

/// How old an unpack directory must be before [`sweep_abandoned`] takes it: containerd
/// unpacks, then starts the shim, within a second; this leaves room for a loaded host.
pub const ABANDONED_AFTER: Duration = Duration::from_secs(600);

/// Removes what containerd unpacked for restores that never reached a shim (containerd
/// killed between its unpack and the shim's Create, or a Create that failed before the
/// shim was started): such a directory is never removed otherwise. Only the directories
/// [`UnpackedCheckpoint::of`] takes, older than `older_than`, that hold nothing but this
/// runtime's pointer to a stored snapshot (no memory; a runc checkpoint is not ours).
/// Returns how many went.
pub fn sweep_abandoned(temp: &Path, older_than: Duration) -> usize {
    let Ok(entries) = std::fs::read_dir(temp) else {
        return 0;
    };
    let now = SystemTime::now();
    let old = |dir: &Path| {
        std::fs::symlink_metadata(dir).is_ok_and(|m| {
            let changed = SystemTime::UNIX_EPOCH + Duration::from_secs(m.ctime().max(0) as u64);
            now.duration_since(changed)
                .is_ok_and(|age| age > older_than)
        })
    };
    entries
        .flatten()
        .map(|e| e.path())
        .filter(|dir| old(dir) && chalk_runtime::snapshot::store::holds_only_a_pointer(dir))
        // Taken only now: dropping one removes it.
        .filter_map(|dir| UnpackedCheckpoint::of(&dir, temp))
        .map(drop)
        .count()
}

/// containerd's temporary directory, as Go's `os.MkdirTemp("")` under the environment the
/// shim inherited from containerd would pick it (containerd asks for `$XDG_RUNTIME_DIR`).
pub fn containerd_temp_dir() -> PathBuf {
    ["XDG_RUNTIME_DIR", "TMPDIR"]
        .iter()
        .find_map(|k| std::env::var_os(k).filter(|v| !v.is_empty()))
        .map_or_else(|| PathBuf::from("/tmp"), PathBuf::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_containerds_own_unpack_directories_are_taken() {
        let temp = tempfile::tempdir().unwrap();
        let t = temp.path();
        let ours = t.join("ctrd-checkpoint123456");
        std::fs::create_dir(&ours).unwrap();
        std::fs::write(ours.join("checkpoint.img"), b"memory").unwrap();
        for (name, why) in [
            ("ctrd-checkpoint", "no digits"),
            ("ctrd-checkpointx1", "not digits"),
            ("my-checkpoint123", "another name"),
        ] {
            let d = t.join(name);
            std::fs::create_dir(&d).unwrap();
            assert!(UnpackedCheckpoint::of(&d, t).is_none(), "{why}");
        }
        let elsewhere = tempfile::tempdir().unwrap();
        let other = elsewhere.path().join("ctrd-checkpoint9");
        std::fs::create_dir(&other).unwrap();
        assert!(
            UnpackedCheckpoint::of(&other, t).is_none(),
            "outside containerd's temporary directory"
        );
        let link = t.join("ctrd-checkpoint77");
        std::os::unix::fs::symlink(&other, &link).unwrap();
        assert!(UnpackedCheckpoint::of(&link, t).is_none(), "a link");
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            drop(UnpackedCheckpoint::of(&ours, t).expect("containerd's directory"));
            assert!(!ours.exists(), "removed when dropped");
        }
        assert!(other.exists() && link.exists());
    }

    #[test]
    fn only_old_pointer_only_unpack_directories_are_swept() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return; // containerd's directories are root's
        }
        let temp = tempfile::tempdir().unwrap();
        let t = temp.path();
        let pointer = chalk_runtime::snapshot::store::POINTER;
        let make = |name: &str, files: &[&str]| {
            let d = t.join(name);
            std::fs::create_dir(&d).unwrap();
            for f in files {
                std::fs::write(d.join(f), b"{}").unwrap();
            }
            d
        };
        let abandoned = make("ctrd-checkpoint1", &[pointer]);
        let runc = make("ctrd-checkpoint2", &["pages-1.img"]);
        let more = make("ctrd-checkpoint3", &[pointer, "extra"]);
        let other = make("elsewhere4", &[pointer]);
        // Too young: nothing goes.
        assert_eq!(sweep_abandoned(t, ABANDONED_AFTER), 0);
        assert!(abandoned.exists());
        std::thread::sleep(Duration::from_millis(1100));
        assert_eq!(sweep_abandoned(t, Duration::from_millis(500)), 1);
        assert!(!abandoned.exists(), "an old pointer-only directory goes");
        assert!(runc.exists() && more.exists() && other.exists());
    }
}
