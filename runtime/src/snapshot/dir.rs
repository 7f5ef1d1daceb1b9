//! The checkpoint directory: runsc creates its files exclusively, so it must be new or
//! empty, root-only; a failed checkpoint leaves it as empty as it found it.

use std::{os::unix::fs::DirBuilderExt, path::Path};

/// Makes `dir` (root-only) if needed and checks it is empty; what is wrong otherwise.
pub fn prepare(dir: &Path) -> Result<(), String> {
    if !dir.is_absolute() {
        return Err(format!(
            "checkpoint directory {} is not absolute",
            dir.display()
        ));
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| format!("create {}: {e}", dir.display()))?;
    let mut entries = std::fs::read_dir(dir).map_err(|e| format!("list {}: {e}", dir.display()))?;
    if entries.next().is_some() {
        return Err(format!(
            "checkpoint directory {} is not empty: give a new or empty one",
            dir.display()
        ));
    }
    Ok(())
}

/// Removes what a failed checkpoint left in `dir` (which was empty before it).
pub fn empty(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let _ = if path.is_dir() && !path.is_symlink() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checkpoint_directory_must_be_absolute_and_empty() {
        assert!(prepare(Path::new("relative")).is_err());
        let dir = tempfile::tempdir().unwrap();
        let fresh = dir.path().join("a/b");
        prepare(&fresh).unwrap();
        std::fs::write(fresh.join("old.img"), b"x").unwrap();
        let err = prepare(&fresh).unwrap_err();
        assert!(err.contains("not empty"), "{err}");
        std::fs::create_dir(fresh.join("sub")).unwrap();
        empty(&fresh);
        prepare(&fresh).unwrap();
    }
}
