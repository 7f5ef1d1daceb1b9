//! What the shim keeps in the bundle so that containerd's separate `shim delete` invocation
//! (after a shim crash) can find the sandbox and clean it up.

use std::{
    io::Write,
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

pub const RECORD_FILE: &str = "chalk-shim.json";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// runsc binary used for this container.
    pub binary: PathBuf,
    /// runsc `--root`.
    pub root: PathBuf,
    /// Global runsc flags from the options.
    pub flags: Vec<String>,
    /// Whether the shim mounted the rootfs under `<bundle>/rootfs` (and must unmount it).
    pub rootfs_mounted: bool,
    /// A network namespace the shim made for the sandbox (and must remove).
    #[serde(default)]
    pub netns: Option<PathBuf>,
}

impl Record {
    /// Writes the record (0600: it names paths of a root-owned runtime).
    pub fn write(&self, bundle: &Path) -> Result<()> {
        let path = bundle.join(RECORD_FILE);
        let text = serde_json::to_vec_pretty(self).map_err(|e| Error::parse("record", e))?;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| Error::io(format!("write {}", path.display()), e))?;
        f.write_all(&text)
            .map_err(|e| Error::io(format!("write {}", path.display()), e))
    }

    /// `Ok(None)` when the shim never got as far as writing one.
    pub fn read(bundle: &Path) -> Result<Option<Record>> {
        let path = bundle.join(RECORD_FILE);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| Error::parse(path.display().to_string(), e)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io(format!("read {}", path.display()), e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn round_trip_private_file() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(Record::read(dir.path()).unwrap(), None);
        let r = Record {
            binary: "/usr/bin/runsc".into(),
            root: "/run/chalk/default".into(),
            flags: vec!["--platform=ptrace".into()],
            rootfs_mounted: true,
            netns: Some("/run/chalk/.netns/default-c1".into()),
        };
        r.write(dir.path()).unwrap();
        assert_eq!(Record::read(dir.path()).unwrap(), Some(r));
        let mode = std::fs::metadata(dir.path().join(RECORD_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
