//! The memory index: a snapshot's memory file (`pages.img`) as runs of bytes taken from
//! pieces, where each piece is stored once, zstd-compressed on its own, in a pack blob of the
//! registry. Bytes no extent covers are zeros: a page of zeros is never stored.
//!
//! ```json
//! {"size": 268435456, "depth": 2,
//!  "packs": ["sha256:<pack>", ...],
//!  "pieces": [["<piece digest>", <bytes>, <pack>, <offset in pack>, <stored bytes>], ...],
//!  "extents": [[<offset in file>, <bytes>, <piece>, <offset in piece>], ...]}
//! ```
//!
//! A piece's digest is [`super::pages::piece_digest`] of its bytes; `stored` is its length in
//! the pack (compressed, and encrypted where the snapshot is). `depth` counts the snapshots
//! back to the one whose push sent all of its pieces (0 for that one).

use serde::{Deserialize, Serialize};

use super::pages::PAGE;

pub const MEDIA_TYPE: &str = "application/vnd.chalk.memory.index.v1+json";
/// The most bytes a piece holds: what one fetch brings and one check covers.
pub const PIECE_MAX: u64 = 1 << 20;
/// The largest index read (a 1 GiB memory file's is about 150 KiB).
pub const MAX_INDEX_BYTES: usize = 32 << 20;
/// The largest memory file an index may describe.
pub const MAX_SIZE: u64 = 1 << 40;
/// The most extents or pieces an index may list.
pub const MAX_ROWS: usize = 1 << 20;
/// The most packs one index may reach (a chain is cut long before: see `plan`).
pub const MAX_PACKS: usize = 1024;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "PieceRow", into = "PieceRow")]
pub struct PieceRef {
    /// Hex [`super::pages::piece_digest`].
    pub digest: String,
    pub len: u64,
    pub pack: u32,
    pub offset: u64,
    pub stored: u64,
}

type PieceRow = (String, u64, u32, u64, u64);

impl From<PieceRow> for PieceRef {
    fn from((digest, len, pack, offset, stored): PieceRow) -> Self {
        PieceRef {
            digest,
            len,
            pack,
            offset,
            stored,
        }
    }
}

impl From<PieceRef> for PieceRow {
    fn from(p: PieceRef) -> Self {
        (p.digest, p.len, p.pack, p.offset, p.stored)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "ExtentRow", into = "ExtentRow")]
pub struct Extent {
    /// Where in the memory file.
    pub offset: u64,
    pub len: u64,
    pub piece: u32,
    /// Where in the piece.
    pub at: u64,
}

type ExtentRow = (u64, u64, u32, u64);

impl From<ExtentRow> for Extent {
    fn from((offset, len, piece, at): ExtentRow) -> Self {
        Extent {
            offset,
            len,
            piece,
            at,
        }
    }
}

impl From<Extent> for ExtentRow {
    fn from(e: Extent) -> Self {
        (e.offset, e.len, e.piece, e.at)
    }
}

impl Extent {
    pub fn end(&self) -> u64 {
        self.offset + self.len
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryIndex {
    pub size: u64,
    pub depth: u32,
    pub packs: Vec<String>,
    pub pieces: Vec<PieceRef>,
    pub extents: Vec<Extent>,
}

impl MemoryIndex {
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("an index serializes")
    }

    /// An index from its bytes, refused (the rule named) unless every row is within the
    /// bounds and refers to what the index lists.
    pub fn parse(bytes: &[u8]) -> Result<MemoryIndex, String> {
        if bytes.len() > MAX_INDEX_BYTES {
            return Err(format!(
                "the memory index has {} bytes, more than the {MAX_INDEX_BYTES} one may have",
                bytes.len()
            ));
        }
        let index: MemoryIndex = serde_json::from_slice(bytes)
            .map_err(|e| format!("the memory index is not one: {e}"))?;
        index.check()?;
        Ok(index)
    }

    /// Each rule of the format, the first broken one named.
    pub fn check(&self) -> Result<(), String> {
        if self.size > MAX_SIZE {
            return Err(format!("size {} is over the {MAX_SIZE} allowed", self.size));
        }
        if self.packs.len() > MAX_PACKS {
            return Err(format!("{} packs, more than {MAX_PACKS}", self.packs.len()));
        }
        if self.pieces.len() > MAX_ROWS || self.extents.len() > MAX_ROWS {
            return Err(format!(
                "{} pieces and {} extents, more than the {MAX_ROWS} allowed",
                self.pieces.len(),
                self.extents.len()
            ));
        }
        if let Some(p) = self
            .packs
            .iter()
            .find(|p| crate::snapshot::oci::sha256_hex_of(p).is_none())
        {
            return Err(format!("pack {p:?} is not a sha256 digest"));
        }
        for (i, p) in self.pieces.iter().enumerate() {
            let hex = p.digest.len() == 64 && p.digest.bytes().all(|b| b.is_ascii_hexdigit());
            if !hex {
                return Err(format!(
                    "pieces[{i}]: {:?} is not a 64-hex digest",
                    p.digest
                ));
            }
            if p.len == 0 || p.len > PIECE_MAX {
                return Err(format!(
                    "pieces[{i}] has {} bytes, not 1..={PIECE_MAX}",
                    p.len
                ));
            }
            if p.pack as usize >= self.packs.len() {
                return Err(format!(
                    "pieces[{i}] is in pack {}, which is not listed",
                    p.pack
                ));
            }
            if p.stored == 0 || p.stored > stored_bound(p.len) {
                return Err(format!(
                    "pieces[{i}] is stored in {} bytes, outside 1..={} for {} bytes",
                    p.stored,
                    stored_bound(p.len),
                    p.len
                ));
            }
            p.offset
                .checked_add(p.stored)
                .ok_or(format!("pieces[{i}] ends past the largest offset"))?;
        }
        let mut used = vec![false; self.pieces.len()];
        let mut end = 0;
        for (i, e) in self.extents.iter().enumerate() {
            let piece = self.pieces.get(e.piece as usize).ok_or(format!(
                "extents[{i}] names piece {}, which is not listed",
                e.piece
            ))?;
            if e.len == 0
                || e.offset < end
                || e.offset.checked_add(e.len).is_none_or(|x| x > self.size)
            {
                return Err(format!(
                    "extents[{i}] ({}+{}) is empty, overlaps the one before or ends past the \
                     file's {} bytes",
                    e.offset, e.len, self.size
                ));
            }
            if e.at.checked_add(e.len).is_none_or(|x| x > piece.len) {
                return Err(format!(
                    "extents[{i}] takes {}+{} of piece {}, which has {} bytes",
                    e.at, e.len, e.piece, piece.len
                ));
            }
            used[e.piece as usize] = true;
            end = e.end();
        }
        if let Some(i) = used.iter().position(|u| !u) {
            return Err(format!("pieces[{i}] is listed but no extent takes from it"));
        }
        Ok(())
    }

    /// The extents that bytes `offset..offset+len` of the file fall in (the gaps are zeros).
    pub fn covering(&self, offset: u64, len: u64) -> &[Extent] {
        let end = offset.saturating_add(len);
        let first = self.extents.partition_point(|e| e.end() <= offset);
        let last = self.extents.partition_point(|e| e.offset < end);
        &self.extents[first..last.max(first)]
    }

    /// The extents that take from each piece, by the piece's place in `pieces`: where its
    /// bytes go once it is opened.
    pub fn extents_by_piece(&self) -> Vec<Vec<Extent>> {
        let mut uses = vec![Vec::new(); self.pieces.len()];
        for e in &self.extents {
            if let Some(u) = uses.get_mut(e.piece as usize) {
                u.push(*e);
            }
        }
        uses
    }

    /// Bytes of memory the pieces hold (what a whole fetch decompresses).
    pub fn piece_bytes(&self) -> u64 {
        self.pieces.iter().map(|p| p.len).sum()
    }

    /// Bytes the pieces take in their packs (what a whole fetch brings).
    pub fn stored_bytes(&self) -> u64 {
        self.pieces.iter().map(|p| p.stored).sum()
    }

    /// Bytes of the file that are zeros (no extent covers them).
    pub fn zero_bytes(&self) -> u64 {
        self.size - self.extents.iter().map(|e| e.len).sum::<u64>()
    }
}

/// The most bytes a piece of `len` may take in a pack: zstd's worst case, and room for an
/// age header per recipient and its tags.
pub fn stored_bound(len: u64) -> u64 {
    len + len / 128 + 64 * PAGE
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(n: u8) -> String {
        format!("{n:02x}").repeat(32)
    }

    fn index() -> MemoryIndex {
        MemoryIndex {
            size: 10 * PAGE,
            depth: 1,
            packs: vec![format!("sha256:{}", hex(1)), format!("sha256:{}", hex(2))],
            pieces: vec![
                PieceRef {
                    digest: hex(3),
                    len: 2 * PAGE,
                    pack: 0,
                    offset: 0,
                    stored: 100,
                },
                PieceRef {
                    digest: hex(4),
                    len: 3 * PAGE,
                    pack: 1,
                    offset: 0,
                    stored: 200,
                },
            ],
            extents: vec![
                Extent {
                    offset: 0,
                    len: 2 * PAGE,
                    piece: 0,
                    at: 0,
                },
                Extent {
                    offset: 4 * PAGE,
                    len: PAGE,
                    piece: 1,
                    at: 2 * PAGE,
                },
                Extent {
                    offset: 5 * PAGE,
                    len: 2 * PAGE,
                    piece: 1,
                    at: 0,
                },
            ],
        }
    }

    #[test]
    fn an_index_reads_back_in_rows() {
        let i = index();
        let bytes = i.to_bytes();
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert!(text.contains("[0,8192,0,0]"), "{text}");
        assert_eq!(MemoryIndex::parse(&bytes).unwrap(), i);
        assert_eq!(i.zero_bytes(), 5 * PAGE);
        assert_eq!(i.piece_bytes(), 5 * PAGE);
        assert_eq!(i.stored_bytes(), 300);
    }

    #[test]
    fn each_piece_gets_the_extents_that_take_from_it_in_file_order() {
        let i = index();
        let uses = i.extents_by_piece();
        assert_eq!(uses.len(), 2);
        assert_eq!(uses[0], vec![i.extents[0]]);
        assert_eq!(uses[1], vec![i.extents[1], i.extents[2]]);
    }

    #[test]
    fn covering_finds_the_extents_of_a_range() {
        let i = index();
        assert_eq!(i.covering(0, 1).len(), 1);
        assert!(i.covering(2 * PAGE, 2 * PAGE).is_empty());
        assert_eq!(i.covering(3 * PAGE, 3 * PAGE).len(), 2);
        assert_eq!(i.covering(0, 10 * PAGE).len(), 3);
        assert!(i.covering(9 * PAGE, PAGE).is_empty());
    }

    #[test]
    fn each_broken_rule_is_named() {
        type Break = fn(&mut MemoryIndex);
        let cases: Vec<(Break, &str)> = vec![
            (|i| i.extents[1].offset = PAGE, "overlaps"),
            (|i| i.extents[2].len = 9 * PAGE, "ends past"),
            (|i| i.extents[1].at = 3 * PAGE, "which has"),
            (|i| i.extents[0].piece = 7, "not listed"),
            (|i| i.pieces[0].pack = 2, "not listed"),
            (|i| i.pieces[0].len = PIECE_MAX + 1, "not 1..="),
            (|i| i.pieces[0].stored = 0, "outside"),
            (|i| i.pieces[0].digest = "x".into(), "64-hex"),
            (|i| i.packs[0] = "md5:1".into(), "sha256"),
            (|i| i.extents.remove(0).len = 0, "no extent takes"),
            (|i| i.size = MAX_SIZE + 1, "over the"),
        ];
        for (break_it, words) in cases {
            let mut i = index();
            break_it(&mut i);
            let e = MemoryIndex::parse(&i.to_bytes()).unwrap_err();
            assert!(e.contains(words), "{e} (wanted {words:?})");
        }
        assert!(MemoryIndex::parse(&vec![b' '; MAX_INDEX_BYTES + 1]).is_err());
    }
}
