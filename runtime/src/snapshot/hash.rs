//! sha256 of snapshot files, streamed, files spread over the cores.
//!
//! Each file's digest is its plain sha256: the digest it is stored and pushed under as a
//! content-addressed blob, so a file is hashed once, when it is sealed. Manifests written
//! before snapshots were stored as blobs hashed files over 64 MiB as chunks (their digest the
//! sha256 of the chunk digests, see `MANIFEST.md`); [`hash_files_chunked`] still verifies
//! those.

use std::{
    fs::File,
    os::unix::fs::FileExt,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicUsize, Ordering},
        Mutex,
    },
};

use sha2::{Digest, Sha256};

use super::pieces::{self, PieceHasher, Pieces};

use crate::{Error, Result};

/// The unit of parallel hashing of older manifests' big files.
pub const CHUNK_SIZE: u64 = 64 << 20;
const READ_BUF: usize = 1 << 20;

/// The digest of one file as the manifest records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileDigest {
    pub size: u64,
    /// Hex sha256: of the content, or (older manifests) of the chunk digests when `chunks` is
    /// not empty.
    pub sha256: String,
    /// Hex sha256 of each [`CHUNK_SIZE`] piece, for files larger than one chunk.
    pub chunks: Vec<String>,
    /// The memory file's piece digests (see [`super::pieces`]).
    pub pieces: Option<Pieces>,
}

/// One unit of work: a byte range of one file.
struct Job {
    file: usize,
    chunk: usize,
    offset: u64,
    len: u64,
}

/// The plain sha256 of each of `paths`, up to `threads` files at once (0: one per core), in
/// input order.
pub fn hash_files(paths: &[PathBuf], threads: usize) -> Result<Vec<FileDigest>> {
    let sizes = paths
        .iter()
        .map(|p| {
            std::fs::metadata(p)
                .map(|m| m.len())
                .map_err(|e| Error::io(format!("stat {}", p.display()), e))
        })
        .collect::<Result<Vec<u64>>>()?;
    // Biggest first, so the big memory file does not start last and run alone.
    let mut order: Vec<usize> = (0..paths.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(sizes[i]));
    type Hashed = Option<([u8; 32], Option<Pieces>)>;
    let results: Vec<Mutex<Hashed>> = paths.iter().map(|_| Mutex::new(None)).collect();
    in_parallel(workers(threads, paths.len()), order.len(), |k, buf| {
        let i = order[k];
        let mut piece_hasher = pieces::wanted(&paths[i]).then(PieceHasher::default);
        let d = hash_range(&paths[i], 0, sizes[i], buf, piece_hasher.as_mut())?;
        *results[i].lock().unwrap() = Some((d, piece_hasher.map(PieceHasher::finish)));
        Ok(())
    })?;
    Ok(sizes
        .into_iter()
        .zip(results)
        .map(|(size, d)| {
            let (d, pieces) = d.into_inner().unwrap().expect("every file hashed");
            FileDigest {
                size,
                sha256: hex(&d),
                chunks: Vec::new(),
                pieces,
            }
        })
        .collect())
}

/// Runs `job(0..count)` on `threads` workers, each with a read buffer of its own; the first
/// failure stops the others and is returned.
pub(crate) fn in_parallel(
    threads: usize,
    count: usize,
    job: impl Fn(usize, &mut [u8]) -> Result<()> + Sync,
) -> Result<()> {
    let next = AtomicUsize::new(0);
    let failure: Mutex<Option<Error>> = Mutex::new(None);
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                let mut buf = vec![0u8; READ_BUF];
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= count || failure.lock().unwrap().is_some() {
                        break;
                    }
                    if let Err(e) = job(i, &mut buf) {
                        failure.lock().unwrap().get_or_insert(e);
                        break;
                    }
                }
            });
        }
    });
    failure.into_inner().unwrap().map_or(Ok(()), Err)
}

pub(crate) fn workers(threads: usize, jobs: usize) -> usize {
    match threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    }
    .min(jobs.max(1))
}

/// The digests of older manifests: files over [`CHUNK_SIZE`] hashed as chunks in parallel,
/// their digest the sha256 of the chunk digests; smaller files their plain sha256.
pub fn hash_files_chunked(paths: &[PathBuf], threads: usize) -> Result<Vec<FileDigest>> {
    let mut sizes = Vec::with_capacity(paths.len());
    let mut jobs = Vec::new();
    for (i, path) in paths.iter().enumerate() {
        let size = std::fs::metadata(path)
            .map_err(|e| Error::io(format!("stat {}", path.display()), e))?
            .len();
        sizes.push(size);
        let chunks = size.div_ceil(CHUNK_SIZE).max(1);
        for c in 0..chunks {
            let offset = c * CHUNK_SIZE;
            jobs.push(Job {
                file: i,
                chunk: c as usize,
                offset,
                len: (size - offset.min(size)).min(CHUNK_SIZE),
            });
        }
    }
    // Biggest first, so one large chunk does not start last and run alone.
    jobs.sort_by_key(|j| std::cmp::Reverse(j.len));
    let chunk_digests: Vec<Mutex<Vec<Option<[u8; 32]>>>> = sizes
        .iter()
        .map(|s| Mutex::new(vec![None; s.div_ceil(CHUNK_SIZE).max(1) as usize]))
        .collect();
    in_parallel(workers(threads, jobs.len()), jobs.len(), |i, buf| {
        let job = &jobs[i];
        let d = hash_range(&paths[job.file], job.offset, job.len, buf, None)?;
        chunk_digests[job.file].lock().unwrap()[job.chunk] = Some(d);
        Ok(())
    })?;
    Ok(sizes
        .into_iter()
        .zip(chunk_digests)
        .map(|(size, chunks)| {
            let chunks: Vec<[u8; 32]> = chunks
                .into_inner()
                .unwrap()
                .into_iter()
                .map(|d| d.expect("every chunk hashed"))
                .collect();
            combine(size, &chunks)
        })
        .collect())
}

/// The file digest from its chunk digests: the plain sha256 for a one-chunk file.
fn combine(size: u64, chunks: &[[u8; 32]]) -> FileDigest {
    if size <= CHUNK_SIZE {
        return FileDigest {
            size,
            sha256: hex(&chunks[0]),
            chunks: Vec::new(),
            pieces: None,
        };
    }
    let mut tree = Sha256::new();
    for c in chunks {
        tree.update(c);
    }
    FileDigest {
        size,
        sha256: hex(&tree.finalize().into()),
        chunks: chunks.iter().map(hex).collect(),
        pieces: None,
    }
}

fn hash_range(
    path: &Path,
    offset: u64,
    len: u64,
    buf: &mut [u8],
    mut pieces: Option<&mut PieceHasher>,
) -> Result<[u8; 32]> {
    let file = File::open(path).map_err(|e| Error::io(format!("open {}", path.display()), e))?;
    let mut hasher = Sha256::new();
    let mut done = 0u64;
    while done < len {
        let want = (len - done).min(buf.len() as u64) as usize;
        let n = read_some(&file, &mut buf[..want], offset + done, path)?;
        hasher.update(&buf[..n]);
        if let Some(p) = pieces.as_deref_mut() {
            p.update(&buf[..n]);
        }
        done += n as u64;
    }
    Ok(hasher.finalize().into())
}

/// Reads into `buf` at `offset`: how many bytes, never none (a file shorter than its size said
/// shrank while it was hashed).
pub(crate) fn read_some(file: &File, buf: &mut [u8], offset: u64, path: &Path) -> Result<usize> {
    let n = file
        .read_at(buf, offset)
        .map_err(|e| Error::io(format!("read {}", path.display()), e))?;
    if n == 0 {
        return Err(Error::io(
            format!("read {}", path.display()),
            std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "file shrank while being hashed",
            ),
        ));
    }
    Ok(n)
}

pub fn hex(bytes: &[u8; 32]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Hex sha256 of a byte slice.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes).into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_files_have_their_plain_sha256() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        let empty = dir.path().join("empty");
        std::fs::write(&a, b"hello\n").unwrap();
        std::fs::write(&empty, b"").unwrap();
        let got = hash_files(&[a, empty], 4).unwrap();
        assert_eq!(
            got[0].sha256,
            "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03"
        );
        assert_eq!(got[0].size, 6);
        assert!(got[0].chunks.is_empty());
        assert_eq!(
            got[1].sha256,
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn big_files_have_their_plain_sha256_whatever_the_threads() {
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("big");
        let small = dir.path().join("small");
        let f = File::create(&big).unwrap();
        f.set_len(CHUNK_SIZE + 5).unwrap();
        f.write_at(b"x", 3).unwrap();
        std::fs::write(&small, b"hello\n").unwrap();
        let one = hash_files(&[big.clone(), small.clone()], 1).unwrap();
        let many = hash_files(&[big.clone(), small], 8).unwrap();
        assert_eq!(one, many);
        let mut content = vec![0u8; CHUNK_SIZE as usize + 5];
        content[3] = b'x';
        assert_eq!(one[0].sha256, sha256_hex(&content));
        assert!(one[0].chunks.is_empty());
        assert_eq!(one[1].size, 6);
    }

    #[test]
    fn older_manifests_chunks_do_not_depend_on_threads() {
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("big");
        let f = File::create(&big).unwrap();
        // Two full chunks and a tail; sparse, so the test stays cheap on disk.
        f.set_len(2 * CHUNK_SIZE + 5).unwrap();
        f.write_at(b"x", CHUNK_SIZE + 3).unwrap();
        let one = hash_files_chunked(std::slice::from_ref(&big), 1).unwrap();
        let many = hash_files_chunked(&[big], 8).unwrap();
        assert_eq!(one, many);
        assert_eq!(one[0].chunks.len(), 3);
        assert_eq!(one[0].size, 2 * CHUNK_SIZE + 5);
        let zero_chunk = hex(&Sha256::digest(vec![0u8; CHUNK_SIZE as usize]).into());
        assert_eq!(one[0].chunks[0], zero_chunk);
        assert_ne!(one[0].chunks[1], zero_chunk);
    }

    #[test]
    fn missing_file_is_an_error_naming_it() {
        let err = hash_files(&[PathBuf::from("/nonexistent/chalk")], 1).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/chalk"));
    }
}
