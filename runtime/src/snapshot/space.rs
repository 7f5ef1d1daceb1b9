//! Room for a checkpoint, checked before the sandbox is touched: a checkpoint that runs out of
//! disk half-way fails, and on runsc builds whose checkpoint stops the sandbox (the 2022 one),
//! the sandbox is gone with it.

use std::{io, path::Path};

/// What a checkpoint of a sandbox using `memory` bytes may write: its memory, a tenth more
/// (kernel state and the page metadata), and 16 MiB of files and manifest.
pub fn needed(memory: u64) -> u64 {
    memory.saturating_add(memory / 10).saturating_add(16 << 20)
}

/// The bytes an unprivileged writer may still put on the filesystem of `dir` (what root may
/// use beyond that is kept for the system).
pub fn available(dir: &Path) -> io::Result<u64> {
    let path = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // SAFETY: statvfs fills a struct that outlives the call, from a valid C string.
    let st = unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(path.as_ptr(), &mut st) != 0 {
            return Err(io::Error::last_os_error());
        }
        st
    };
    Ok((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

/// Refuses a checkpoint of `memory` bytes into a directory with `free` bytes left, with the
/// figures.
pub fn check(dir: &Path, memory: u64, free: u64) -> Result<(), String> {
    let need = needed(memory);
    if free >= need {
        return Ok(());
    }
    Err(format!(
        "no room for the checkpoint in {}: the sandbox uses {} of memory, so its checkpoint \
         may take up to {}, but that filesystem has {} free; free space there (containerd \
         checkpoints into its temporary directory, $TMPDIR or /tmp, unless given a path), or \
         set check_free_space = false under [snapshot] in the runtime options to try anyway",
        dir.display(),
        mib(memory),
        mib(need),
        mib(free)
    ))
}

/// What a pull must leave free on the store's filesystem beyond what it brings.
pub const PULL_MARGIN: u64 = 64 << 20;

/// Refuses to bring in blobs of the `incoming` sizes (each named) when one of them, or all of
/// them, is more than `max`, or more than `free` (the store filesystem's room) less
/// [`PULL_MARGIN`]: checked on what a registry declares, before a byte is fetched or a file
/// is sized.
pub fn check_incoming(incoming: &[(String, u64)], free: u64, max: u64) -> Result<(), String> {
    if let Some((name, size)) = incoming.iter().find(|(_, size)| *size > max) {
        return Err(format!(
            "{name} declares {}, more than the {} a snapshot may bring to this host ([snapshot] \
             max_pull_bytes in the runtime options)",
            mib(*size),
            mib(max)
        ));
    }
    let total = incoming
        .iter()
        .fold(0u64, |sum, (_, size)| sum.saturating_add(*size));
    if total > max {
        return Err(format!(
            "its blobs declare {} in all, more than the {} a snapshot may bring to this host \
             ([snapshot] max_pull_bytes in the runtime options)",
            mib(total),
            mib(max)
        ));
    }
    if total.saturating_add(PULL_MARGIN) > free {
        return Err(format!(
            "its blobs declare {}, and the snapshot store's filesystem has {} free (a pull \
             leaves {} beside what it brings): make room there first",
            mib(total),
            mib(free),
            mib(PULL_MARGIN)
        ));
    }
    Ok(())
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn room_is_the_memory_and_a_margin() {
        assert_eq!(needed(0), 16 << 20);
        assert_eq!(needed(1000 << 20), (1100 << 20) + (16 << 20));
        let dir = Path::new("/ck");
        assert!(check(dir, 100 << 20, 200 << 20).is_ok());
        let err = check(dir, 100 << 20, 50 << 20).unwrap_err();
        assert!(
            err.contains("100.0 MiB") && err.contains("126.0 MiB") && err.contains("50.0 MiB"),
            "{err}"
        );
        assert!(err.contains("check_free_space"), "{err}");
    }

    #[test]
    fn declared_sizes_are_bounded_before_anything_arrives() {
        let gib = 1u64 << 30;
        let ok = [
            ("pages.img".to_string(), gib),
            ("checkpoint.img".into(), 1 << 20),
        ];
        assert!(check_incoming(&ok, 4 * gib, 64 * gib).is_ok());
        let huge = [("pages.img".to_string(), 2 << 40)];
        let err = check_incoming(&huge, 4 * gib, 64 * gib).unwrap_err();
        assert!(
            err.contains("pages.img") && err.contains("max_pull_bytes"),
            "{err}"
        );
        let err = check_incoming(&ok, gib, 64 * gib).unwrap_err();
        assert!(err.contains("make room"), "{err}");
        let many = vec![("x".to_string(), u64::MAX / 2); 3];
        assert!(check_incoming(&many, u64::MAX, u64::MAX - 1).is_err());
    }

    #[test]
    fn available_space_is_read_from_the_filesystem() {
        let dir = tempfile::tempdir().unwrap();
        assert!(available(dir.path()).unwrap() > 0);
        assert!(available(&dir.path().join("missing")).is_err());
    }
}
