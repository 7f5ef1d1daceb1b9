//! Piece digests of a snapshot's memory file (`pages.img`): what a restore that reads the file
//! while it still arrives from a registry checks each fetched range against, before runsc may
//! read a byte of it. The file's own digest stays its plain sha256 (its blob name in the store
//! and in registries); these are kept beside it in the chalk manifest.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The one file a restore may read before it is all here: runsc's other files are small and
/// read whole, in order, before the sandbox runs.
pub const LAZY_FILE: &str = "pages.img";

/// The size of a piece: what one demand fetch brings and one check covers. runsc reads at most
/// 256 KiB at a time, so a read waits for one piece, or two where it straddles a boundary.
pub const PIECE_SIZE: u64 = 1 << 20;

/// The sha256 of each [`Pieces::size`] piece of a file, in order; the last may be shorter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pieces {
    pub size: u64,
    pub sha256: Vec<String>,
}

impl Pieces {
    /// How many pieces a file of `len` bytes has.
    pub fn count_for(&self, len: u64) -> u64 {
        len.div_ceil(self.size.max(1))
    }

    /// Whether these digests can describe a file of `len` bytes.
    pub fn fit(&self, len: u64) -> bool {
        self.size > 0
            && self.size.is_multiple_of(4096)
            && self.count_for(len) == self.sha256.len() as u64
    }

    /// The byte range (offset, length) of piece `i` of a file of `len` bytes.
    pub fn range(&self, i: u64, len: u64) -> (u64, u64) {
        let offset = i * self.size;
        (offset, len.saturating_sub(offset).min(self.size))
    }

    /// The pieces that bytes `offset..offset+len` fall in.
    pub fn covering(&self, offset: u64, len: u64) -> std::ops::Range<u64> {
        if len == 0 {
            return 0..0;
        }
        offset / self.size..(offset + len - 1) / self.size + 1
    }

    /// Whether `bytes` are piece `i`.
    pub fn matches(&self, i: u64, bytes: &[u8]) -> bool {
        self.sha256
            .get(i as usize)
            .is_some_and(|want| *want == format!("{:x}", Sha256::digest(bytes)))
    }
}

/// Piece digests of bytes fed in order.
pub struct PieceHasher {
    size: u64,
    current: Sha256,
    filled: u64,
    done: Vec<String>,
}

impl Default for PieceHasher {
    fn default() -> Self {
        PieceHasher::new(PIECE_SIZE)
    }
}

impl PieceHasher {
    pub fn new(size: u64) -> PieceHasher {
        PieceHasher {
            size,
            current: Sha256::new(),
            filled: 0,
            done: Vec::new(),
        }
    }

    pub fn update(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let take = ((self.size - self.filled) as usize).min(bytes.len());
            self.current.update(&bytes[..take]);
            self.filled += take as u64;
            bytes = &bytes[take..];
            if self.filled == self.size {
                let full = std::mem::replace(&mut self.current, Sha256::new());
                self.done.push(format!("{:x}", full.finalize()));
                self.filled = 0;
            }
        }
    }

    pub fn finish(mut self) -> Pieces {
        if self.filled > 0 {
            self.done.push(format!("{:x}", self.current.finalize()));
        }
        Pieces {
            size: self.size,
            sha256: self.done,
        }
    }
}

/// Whether the file at `path` is one whose pieces are recorded.
pub fn wanted(path: &std::path::Path) -> bool {
    path.file_name().is_some_and(|n| n == LAZY_FILE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::hash::sha256_hex;

    #[test]
    fn pieces_of_bytes_fed_in_any_slices_are_the_same() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let mut one = PieceHasher::new(4096);
        one.update(&data);
        let mut many = PieceHasher::new(4096);
        for s in data.chunks(333) {
            many.update(s);
        }
        let (one, many) = (one.finish(), many.finish());
        assert_eq!(one, many);
        assert_eq!(one.sha256.len(), 3);
        assert_eq!(one.sha256[2], sha256_hex(&data[8192..]));
        assert!(one.fit(10_000));
        assert!(!one.fit(20_000));
        assert!(one.matches(1, &data[4096..8192]));
        assert!(!one.matches(1, &data[0..4096]));
        assert!(!one.matches(3, &data[0..4096]));
    }

    #[test]
    fn ranges_and_covering_pieces() {
        let p = Pieces {
            size: 4096,
            sha256: vec![String::new(); 3],
        };
        assert_eq!(p.range(2, 10_000), (8192, 10_000 - 8192));
        assert_eq!(p.range(0, 10_000), (0, 4096));
        assert_eq!(p.covering(4095, 2), 0..2);
        assert_eq!(p.covering(4096, 4096), 1..2);
        assert_eq!(p.covering(0, 0), 0..0);
    }

    #[test]
    fn an_empty_file_has_no_pieces() {
        let p = PieceHasher::default().finish();
        assert!(p.sha256.is_empty());
        assert!(p.fit(0));
    }
}
