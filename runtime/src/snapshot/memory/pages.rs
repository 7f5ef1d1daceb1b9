//! Page digests of a memory file: what recognises memory that did not change when a restore
//! placed it elsewhere. runsc writes the pages a sandbox committed packed in the order of its
//! own memory file, so a page that moved or a page inserted before it shifts everything after
//! it by whole pages: fixed 1 MiB pieces no longer line up, but each page is still there, at
//! another page boundary (measured in `../shared/notes/incremental-snapshots.md`: 96.9% of
//! a restored sandbox's pages were in its first checkpoint, 0 of 257 MiB-pieces).
//!
//! A page's digest is its sha256; an all-zero page has none (it is never stored). A piece's
//! digest is the sha256 of its pages' digests, so checking a piece yields its page digests.

use std::{fs::File, os::unix::fs::FileExt, path::Path, sync::Mutex};

use sha2::{Digest, Sha256};

use crate::{Error, Result};

pub const PAGE: u64 = 4096;
/// The digest that stands for a page of zeros: no sha256 is all zeros.
pub const ZERO: PageDigest = [0; 32];
/// Pages hashed per job of the parallel scan (64 MiB).
const JOB_PAGES: u64 = 16 << 10;

pub type PageDigest = [u8; 32];

/// Whether `bytes` are all zero.
pub fn is_zero(bytes: &[u8]) -> bool {
    // Wide words first: the compiler turns this into vector compares.
    // SAFETY: every bit pattern is a valid u128.
    let (head, body, tail) = unsafe { bytes.align_to::<u128>() };
    head.iter().all(|b| *b == 0) && body.iter().all(|w| *w == 0) && tail.iter().all(|b| *b == 0)
}

/// The digest of one page (or the short last page of a file).
pub fn page_digest(bytes: &[u8]) -> PageDigest {
    if is_zero(bytes) {
        ZERO
    } else {
        Sha256::digest(bytes).into()
    }
}

/// The digest of a piece made of pages with these digests, in order.
pub fn piece_digest(pages: &[PageDigest]) -> String {
    let mut h = Sha256::new();
    for p in pages {
        h.update(p);
    }
    format!("{:x}", h.finalize())
}

/// The digest of a piece's bytes and its pages' digests.
pub fn digest_piece(bytes: &[u8]) -> (String, Vec<PageDigest>) {
    let pages: Vec<PageDigest> = bytes.chunks(PAGE as usize).map(page_digest).collect();
    (piece_digest(&pages), pages)
}

/// The page digests of a memory file, one per page (the last may be short).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageTable {
    pub size: u64,
    pub pages: Vec<PageDigest>,
}

const MAGIC: &[u8; 8] = b"CHALKPT1";

impl PageTable {
    pub fn count_for(size: u64) -> u64 {
        size.div_ceil(PAGE)
    }

    /// The byte length of page `p`.
    pub fn page_len(&self, p: u64) -> u64 {
        self.size.saturating_sub(p * PAGE).min(PAGE)
    }

    /// Hashes every page of the file at `path`, on `threads` workers (0: one per core).
    pub fn of_file(path: &Path, threads: usize) -> Result<PageTable> {
        let file =
            File::open(path).map_err(|e| Error::io(format!("open {}", path.display()), e))?;
        let size = file
            .metadata()
            .map_err(|e| Error::io(format!("stat {}", path.display()), e))?
            .len();
        let count = Self::count_for(size);
        let jobs = count.div_ceil(JOB_PAGES) as usize;
        let pages: Vec<Mutex<Vec<PageDigest>>> =
            (0..jobs).map(|_| Mutex::new(Vec::new())).collect();
        let workers = super::super::hash::workers(threads, jobs);
        super::super::hash::in_parallel(workers, jobs, |j, buf| {
            let first = j as u64 * JOB_PAGES;
            let last = (first + JOB_PAGES).min(count);
            let mut out = Vec::with_capacity((last - first) as usize);
            let mut p = first;
            while p < last {
                let want = ((last * PAGE).min(size) - p * PAGE).min(buf.len() as u64) as usize;
                let got = &mut buf[..want];
                file.read_exact_at(got, p * PAGE)
                    .map_err(|e| Error::io(format!("read {}", path.display()), e))?;
                out.extend(got.chunks(PAGE as usize).map(page_digest));
                p += want.div_ceil(PAGE as usize) as u64;
            }
            *pages[j].lock().unwrap() = out;
            Ok(())
        })?;
        let pages = pages
            .into_iter()
            .flat_map(|m| m.into_inner().unwrap())
            .collect();
        Ok(PageTable { size, pages })
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 + self.pages.len() * 32);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&self.size.to_le_bytes());
        for p in &self.pages {
            out.extend_from_slice(p);
        }
        out
    }

    /// A table from [`PageTable::to_bytes`], refused unless it holds one digest per page.
    pub fn parse(bytes: &[u8]) -> std::result::Result<PageTable, String> {
        let body = bytes
            .strip_prefix(MAGIC.as_slice())
            .ok_or("not a page table (no CHALKPT1 header)")?;
        let (size, digests) = body.split_at_checked(8).ok_or("a page table cut short")?;
        let size = u64::from_le_bytes(size.try_into().expect("8 bytes"));
        if digests.len() as u64 != Self::count_for(size) * 32 {
            return Err(format!(
                "a page table of {} digest bytes for a file of {size} bytes",
                digests.len()
            ));
        }
        let pages = digests
            .chunks_exact(32)
            .map(|c| c.try_into().expect("32 bytes"))
            .collect();
        Ok(PageTable { size, pages })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_of(bytes: &[u8]) -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), bytes).unwrap();
        f
    }

    #[test]
    fn zero_pages_have_the_zero_digest_and_others_their_sha256() {
        assert_eq!(page_digest(&[0u8; 4096]), ZERO);
        let mut page = [0u8; 4096];
        page[4095] = 1;
        assert_eq!(page_digest(&page), <[u8; 32]>::from(Sha256::digest(page)));
        assert!(is_zero(&[0u8; 7]));
        assert!(!is_zero(&page[1..]));
    }

    #[test]
    fn a_file_is_hashed_page_by_page_whatever_the_workers() {
        let mut data: Vec<u8> = (0..(3 * 4096 + 100) as u32)
            .map(|i| (i % 251) as u8)
            .collect();
        data[4096..8192].fill(0);
        let f = file_of(&data);
        let one = PageTable::of_file(f.path(), 1).unwrap();
        assert_eq!(one, PageTable::of_file(f.path(), 4).unwrap());
        assert_eq!(one.size, data.len() as u64);
        assert_eq!(one.pages.len(), 4);
        assert_eq!(one.pages[1], ZERO);
        assert_eq!(one.pages[3], page_digest(&data[3 * 4096..]));
        assert_eq!(one.page_len(3), 100);
        let (digest, pages) = digest_piece(&data);
        assert_eq!(pages, one.pages);
        assert_eq!(digest, piece_digest(&one.pages));
    }

    #[test]
    fn a_table_reads_back_and_a_cut_one_is_refused() {
        let t = PageTable {
            size: 5000,
            pages: vec![[1; 32], [2; 32]],
        };
        let bytes = t.to_bytes();
        assert_eq!(PageTable::parse(&bytes).unwrap(), t);
        assert!(PageTable::parse(&bytes[..bytes.len() - 1]).is_err());
        assert!(PageTable::parse(b"nonsense").is_err());
    }
}
