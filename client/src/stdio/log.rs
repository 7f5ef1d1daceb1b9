//! A sandbox's output kept in a bounded log, as containerd's CRI keeps container logs: the
//! current file grows to a limit, then becomes `log.1` (the one before it is dropped) and a
//! new one begins; `logs` reads both, `logs -f` follows across the turn.

use std::{
    fs::File,
    io::{self, Read, Seek, Write},
    os::unix::fs::{MetadataExt, OpenOptionsExt},
    path::{Path, PathBuf},
};

/// Each file's limit: a sandbox keeps at most twice this.
pub const MAX_BYTES: u64 = 1 << 20;

/// The writing end (the keeper's).
pub struct BoundedLog {
    path: PathBuf,
    old: PathBuf,
    file: File,
    len: u64,
    max: u64,
}

fn open_append(path: &Path) -> io::Result<File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
}

impl BoundedLog {
    /// Appends to `path` (what a resumed sandbox prints follows what it printed before),
    /// turning it into `old` at `max` bytes.
    pub fn open(path: &Path, old: &Path, max: u64) -> io::Result<Self> {
        let file = open_append(path)?;
        let len = file.metadata()?.len();
        Ok(BoundedLog {
            path: path.to_path_buf(),
            old: old.to_path_buf(),
            file,
            len,
            max,
        })
    }

    pub fn write(&mut self, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            if self.len >= self.max {
                std::fs::rename(&self.path, &self.old)?;
                self.file = open_append(&self.path)?;
                self.len = 0;
            }
            let room = (self.max - self.len).min(data.len() as u64) as usize;
            self.file.write_all(&data[..room])?;
            self.len += room as u64;
            data = &data[room..];
        }
        Ok(())
    }
}

/// All that is kept: `old` then `path` (either may be missing).
pub fn read_all(path: &Path, old: &Path) -> io::Result<Vec<u8>> {
    let mut out = Vec::new();
    for p in [old, path] {
        match File::open(p) {
            Ok(mut f) => {
                f.read_to_end(&mut out)?;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// Reads a log as it grows, across its turns: `read_new` gives what was written since the last
/// call (empty when nothing was).
pub struct Follower {
    path: PathBuf,
    file: Option<File>,
}

impl Follower {
    /// Starts at the end of what [`read_all`] returned when `from_end`, else at the start.
    pub fn new(path: &Path, from_end: bool) -> io::Result<Self> {
        let mut f = Follower {
            path: path.to_path_buf(),
            file: None,
        };
        if let Some(file) = f.open()? {
            let mut file = file;
            if from_end {
                file.seek(io::SeekFrom::End(0))?;
            }
            f.file = Some(file);
        }
        Ok(f)
    }

    fn open(&self) -> io::Result<Option<File>> {
        match File::open(&self.path) {
            Ok(f) => Ok(Some(f)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub fn read_new(&mut self) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        loop {
            let Some(file) = self.file.as_mut() else {
                self.file = self.open()?;
                if self.file.is_none() {
                    return Ok(out);
                }
                continue;
            };
            file.read_to_end(&mut out)?;
            // The log turned: the old file (now log.1) has been read to its end; go on with
            // the new one from its start.
            let current = std::fs::metadata(&self.path).ok().map(|m| m.ino());
            let mine = file.metadata()?.ino();
            match current {
                Some(ino) if ino != mine => self.file = self.open()?,
                _ => return Ok(out),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_turns_at_its_bound_and_keeps_two_files() {
        let d = tempfile::tempdir().unwrap();
        let (path, old) = (d.path().join("log"), d.path().join("log.1"));
        let mut log = BoundedLog::open(&path, &old, 10).unwrap();
        let mut follow = Follower::new(&path, false).unwrap();
        log.write(b"0123456").unwrap();
        assert_eq!(follow.read_new().unwrap(), b"0123456");
        log.write(b"789abcdef").unwrap();
        assert_eq!(follow.read_new().unwrap(), b"789abcdef");
        assert_eq!(std::fs::read(&old).unwrap(), b"0123456789");
        assert_eq!(read_all(&path, &old).unwrap(), b"0123456789abcdef");
        log.write(b"ghijklmnopq").unwrap();
        // The first ten bytes are gone: two files of at most ten are kept.
        assert_eq!(read_all(&path, &old).unwrap(), b"abcdefghijklmnopq");
        assert_eq!(follow.read_new().unwrap(), b"ghijklmnopq");
        assert!(follow.read_new().unwrap().is_empty());
    }

    #[test]
    fn a_reopened_log_appends_and_a_follower_waits_for_one() {
        let d = tempfile::tempdir().unwrap();
        let (path, old) = (d.path().join("log"), d.path().join("log.1"));
        let mut follow = Follower::new(&path, true).unwrap();
        assert!(follow.read_new().unwrap().is_empty());
        BoundedLog::open(&path, &old, MAX_BYTES)
            .unwrap()
            .write(b"before\n")
            .unwrap();
        let mut log = BoundedLog::open(&path, &old, MAX_BYTES).unwrap();
        log.write(b"after\n").unwrap();
        assert_eq!(read_all(&path, &old).unwrap(), b"before\nafter\n");
        assert_eq!(follow.read_new().unwrap(), b"before\nafter\n");
        let mut tail = Follower::new(&path, true).unwrap();
        log.write(b"more\n").unwrap();
        assert_eq!(tail.read_new().unwrap(), b"more\n");
    }
}
