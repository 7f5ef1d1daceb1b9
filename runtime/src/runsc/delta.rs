//! A delta checkpoint (`runsc checkpoint --base-pages=BASE`, packaging/gvisor's patch 0003):
//! runsc writes only the memory that is not an unmodified copy of BASE, the pages file the
//! sandbox was restored from with `--share-pages`, to `pages_delta.img`, and in
//! `pages_runs.json` how BASE and it make up the `pages.img` a full checkpoint would have
//! written. [`assemble`] writes that `pages.img`, so that the image is an ordinary one that any
//! runsc restores and the store seals as before; the source's pause and the bytes runsc writes
//! scale with what changed.
//!
//! ```json
//! {"version": 1, "size": 1073819648, "delta_size": 17248256, "base_size": 1073815552,
//!  "runs": [[17235968, 0, 0], [4096, 1, 236998656], ...]}
//! ```
//! A run `[len, 0, 0]` is the next `len` bytes of `pages_delta.img`; `[len, 1, off]` is `len`
//! bytes at `off` in BASE.

use std::{
    fs::{File, OpenOptions},
    io::Read,
    os::unix::{fs::OpenOptionsExt, io::AsRawFd},
    path::Path,
};

use serde::Deserialize;

use crate::{Error, Result};

pub const DELTA_FILE: &str = "pages_delta.img";
pub const RUNS_FILE: &str = "pages_runs.json";
/// The memory file of an ordinary image, which [`assemble`] writes.
pub const PAGES_FILE: &str = "pages.img";
const PAGE: u64 = 4096;
/// The largest runs file read: runs are about as many as the sandbox's memory mappings.
const MAX_RUNS_BYTES: u64 = 64 << 20;
/// The largest memory file put together.
const MAX_SIZE: u64 = 1 << 40;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RunsFile {
    version: u32,
    size: u64,
    delta_size: u64,
    base_size: u64,
    runs: Vec<(u64, u8, u64)>,
}

/// Where a run's bytes come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The next bytes of `pages_delta.img`.
    Delta,
    /// Bytes at this offset of the base.
    Base(u64),
}

/// A delta checkpoint's layout, checked against the sizes of its two files.
#[derive(Debug, PartialEq, Eq)]
pub struct Runs {
    pub size: u64,
    pub runs: Vec<(u64, Source)>,
}

impl Runs {
    /// Parses and checks `pages_runs.json`: every run page-aligned and within its file, the
    /// delta runs adding up to `delta_len` (the file runsc wrote) and the base runs within
    /// `base_len`.
    pub fn parse(json: &[u8], delta_len: u64, base_len: u64) -> Result<Runs> {
        let bad = |m: String| Error::parse(format!("runsc's {RUNS_FILE}"), m);
        let f: RunsFile = serde_json::from_slice(json).map_err(|e| bad(e.to_string()))?;
        if f.version != 1 {
            return Err(bad(format!(
                "version {} (this shim reads 1: a runsc newer than the shim?)",
                f.version
            )));
        }
        if f.base_size != base_len || f.delta_size != delta_len || f.size > MAX_SIZE {
            return Err(bad(format!(
                "sizes {} (base) and {} (delta) of {} bytes differ from the files' {base_len} \
                 and {delta_len}",
                f.base_size, f.delta_size, f.size
            )));
        }
        let (mut total, mut delta) = (0u64, 0u64);
        let mut runs = Vec::with_capacity(f.runs.len());
        for (len, kind, off) in f.runs {
            let source = match kind {
                0 => Source::Delta,
                1 => Source::Base(off),
                k => return Err(bad(format!("run of kind {k}"))),
            };
            let aligned = len % PAGE == 0 && off % PAGE == 0 && len != 0;
            let within = match source {
                Source::Delta => {
                    delta = delta.saturating_add(len);
                    delta <= delta_len
                }
                Source::Base(off) => off.checked_add(len).is_some_and(|end| end <= base_len),
            };
            if !aligned || !within {
                return Err(bad(format!(
                    "run of {len} bytes at {off} is not page-aligned or lies outside its file"
                )));
            }
            total = total.saturating_add(len);
            runs.push((len, source));
        }
        if total != f.size || delta != delta_len {
            return Err(bad(format!(
                "runs cover {total} bytes, {delta} of them from the delta, not {} and \
                 {delta_len}",
                f.size
            )));
        }
        Ok(Runs { size: f.size, runs })
    }

    /// Bytes taken from the base.
    pub fn from_base(&self) -> u64 {
        self.runs
            .iter()
            .filter(|(_, s)| matches!(s, Source::Base(_)))
            .map(|(len, _)| len)
            .sum()
    }
}

/// Whether `dir` holds a delta checkpoint rather than a `pages.img`.
pub fn is_delta(dir: &Path) -> bool {
    dir.join(RUNS_FILE).exists()
}

/// Puts `dir`'s `pages.img` together from `base` and the delta runsc wrote, then removes the
/// delta's two files. The new file is root-only, as the store keeps memory. On failure
/// nothing new is left in `dir` but runsc's own files.
pub fn assemble(dir: &Path, base: &Path) -> Result<Runs> {
    let open = |p: &Path| File::open(p).map_err(|e| Error::io(format!("open {}", p.display()), e));
    let len = |f: &File, p: &Path| {
        f.metadata()
            .map(|m| m.len())
            .map_err(|e| Error::io(format!("stat {}", p.display()), e))
    };
    let (runs_path, delta_path) = (dir.join(RUNS_FILE), dir.join(DELTA_FILE));
    let mut json = Vec::new();
    open(&runs_path)?
        .take(MAX_RUNS_BYTES + 1)
        .read_to_end(&mut json)
        .map_err(|e| Error::io(format!("read {}", runs_path.display()), e))?;
    if json.len() as u64 > MAX_RUNS_BYTES {
        return Err(Error::parse(
            format!("runsc's {RUNS_FILE}"),
            format!("larger than {MAX_RUNS_BYTES} bytes"),
        ));
    }
    let (base_file, delta_file) = (open(base)?, open(&delta_path)?);
    let runs = Runs::parse(
        &json,
        len(&delta_file, &delta_path)?,
        len(&base_file, base)?,
    )?;
    // Written in place, in increasing offsets as runsc writes: the seal's follower hashes it
    // as it grows (`snapshot::follow`).
    let part = dir.join(PAGES_FILE);
    let written = (|| {
        let out = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&part)
            .map_err(|e| Error::io(format!("create {}", part.display()), e))?;
        let (mut delta_at, mut out_at) = (0, 0);
        for &(len, source) in &runs.runs {
            let mut base_at;
            let (from, at) = match source {
                Source::Delta => (&delta_file, &mut delta_at),
                Source::Base(off) => {
                    base_at = off;
                    (&base_file, &mut base_at)
                }
            };
            copy_range(from, at, &out, &mut out_at, len)
                .map_err(|e| Error::io(format!("write {}", part.display()), e))?;
        }
        Ok(())
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&part);
        return Err(e);
    }
    for p in [&runs_path, &delta_path] {
        std::fs::remove_file(p).map_err(|e| Error::io(format!("remove {}", p.display()), e))?;
    }
    Ok(runs)
}

/// Copies `len` bytes in the kernel (no trip through this process; a reflink where the
/// filesystem shares blocks), advancing both offsets.
fn copy_range(
    from: &File,
    from_at: &mut u64,
    to: &File,
    to_at: &mut u64,
    mut len: u64,
) -> std::io::Result<()> {
    while len > 0 {
        let (mut f, mut t) = (*from_at as libc::loff_t, *to_at as libc::loff_t);
        // SAFETY: both descriptors are open for the call; the offsets are locals it updates.
        let n = unsafe {
            libc::copy_file_range(
                from.as_raw_fd(),
                &mut f,
                to.as_raw_fd(),
                &mut t,
                len.min(1 << 30) as usize,
                0,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "a file ended before its runs did",
            ));
        }
        *from_at += n as u64;
        *to_at += n as u64;
        len -= n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: u64 = PAGE;

    fn runs_json(size: u64, delta: u64, base: u64, runs: &str) -> Vec<u8> {
        format!(
            r#"{{"version":1,"size":{size},"delta_size":{delta},"base_size":{base},"runs":{runs}}}"#
        )
        .into_bytes()
    }

    #[test]
    fn a_delta_and_its_base_make_the_full_pages_file() {
        let dir = tempfile::tempdir().unwrap();
        let page = |b: u8| vec![b; P as usize];
        let base: Vec<u8> = [page(1), page(2), page(3), page(4)].concat();
        std::fs::write(dir.path().join("base"), &base).unwrap();
        std::fs::write(dir.path().join(DELTA_FILE), [page(9), page(8)].concat()).unwrap();
        // The full file: 9, 3, 4, 8, 1.
        let runs = format!("[[{P},0,0],[{},1,{}],[{P},0,0],[{P},1,0]]", 2 * P, 2 * P);
        std::fs::write(
            dir.path().join(RUNS_FILE),
            runs_json(5 * P, 2 * P, 4 * P, &runs),
        )
        .unwrap();
        assert!(is_delta(dir.path()));
        let r = assemble(dir.path(), &dir.path().join("base")).unwrap();
        assert_eq!(r.from_base(), 3 * P);
        let full = std::fs::read(dir.path().join(PAGES_FILE)).unwrap();
        assert_eq!(full, [page(9), page(3), page(4), page(8), page(1)].concat());
        assert!(!is_delta(dir.path()) && !dir.path().join(DELTA_FILE).exists());
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join(PAGES_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn runs_that_do_not_fit_their_files_are_refused_and_leave_nothing() {
        let cases = [
            // Past the base's end.
            runs_json(2 * P, P, 4 * P, &format!("[[{P},0,0],[{P},1,{}]]", 4 * P)),
            // Delta runs longer than the delta.
            runs_json(2 * P, P, 4 * P, &format!("[[{},0,0]]", 2 * P)),
            // Not page-aligned.
            runs_json(P + 1, P, 4 * P, &format!("[[{P},0,0],[1,1,0]]")),
            // A size the runs do not add up to.
            runs_json(3 * P, P, 4 * P, &format!("[[{P},0,0]]")),
            // Sizes that are not the files'.
            runs_json(P, P, 8 * P, &format!("[[{P},0,0]]")),
            // An unknown kind, an unknown version.
            runs_json(P, P, 4 * P, &format!("[[{P},2,0]]")),
            br#"{"version":2,"size":0,"delta_size":0,"base_size":0,"runs":[]}"#.to_vec(),
        ];
        for json in cases {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("base"), vec![1u8; 4 * P as usize]).unwrap();
            std::fs::write(dir.path().join(DELTA_FILE), vec![2u8; P as usize]).unwrap();
            std::fs::write(dir.path().join(RUNS_FILE), &json).unwrap();
            let e = assemble(dir.path(), &dir.path().join("base")).unwrap_err();
            assert!(e.to_string().contains(RUNS_FILE), "{e}");
            let left: Vec<_> = std::fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            assert_eq!(left.len(), 3, "{left:?}");
            assert!(!dir.path().join(PAGES_FILE).exists());
        }
    }
}
