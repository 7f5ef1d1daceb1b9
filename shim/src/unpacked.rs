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
}
