//! What a push of a memory file must send: each of its pages is a page of zeros (sent as
//! nothing), a page its parent's pieces already hold (referred to), a page met earlier in the
//! same file (referred to), or new; new pages are gathered, in file order, into pieces of at
//! most [`PIECE_MAX`] for one new pack. Pages are matched by digest wherever they sit, so a
//! restore that moved them costs nothing.
//!
//! A chain is cut at `max_depth`: a snapshot whose parent is that deep already takes nothing
//! from it and sends all of its pieces, so no restore reads more than `max_depth + 1` packs.

use std::collections::HashMap;

use super::{
    index::{Extent, MemoryIndex, PieceRef, PIECE_MAX},
    pages::{piece_digest, PageDigest, PageTable, PAGE, ZERO},
};

/// The snapshot a push may take pieces from: its index in the registry and its page digests.
pub struct Parent<'a> {
    pub index: &'a MemoryIndex,
    pub pages: &'a PageTable,
}

/// A piece to be sent: where its bytes are in the memory file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewPiece {
    /// `(offset, len)` in the memory file, in the piece's order.
    pub runs: Vec<(u64, u64)>,
    pub len: u64,
    pub pages: Vec<PageDigest>,
}

impl NewPiece {
    pub fn digest(&self) -> String {
        piece_digest(&self.pages)
    }
}

#[derive(Debug)]
pub struct Plan {
    /// The index, with the new pieces in the last pack, not yet placed (see [`Plan::place`]).
    pub index: MemoryIndex,
    pub new: Vec<NewPiece>,
    /// Whether the parent was taken from (false: no parent, or the chain was cut).
    pub took_from_parent: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Source {
    Old(u32),
    New(u32),
}

/// The plan for a memory file with page digests `file`, taking from `parent` unless its
/// chain is `max_depth` deep already.
pub fn plan(file: &PageTable, parent: Option<Parent>, max_depth: u32) -> Plan {
    let parent = parent.filter(|p| p.index.depth < max_depth && p.pages.size == p.index.size);
    let mut known: HashMap<PageDigest, (Source, u64)> = HashMap::new();
    if let Some(p) = &parent {
        for e in &p.index.extents {
            // Whole pages only, as this build cuts them.
            if !e.offset.is_multiple_of(PAGE) || !e.at.is_multiple_of(PAGE) {
                continue;
            }
            for k in 0..e.len / PAGE {
                let d = p.pages.pages[(e.offset / PAGE + k) as usize];
                if d != ZERO {
                    known
                        .entry(d)
                        .or_insert((Source::Old(e.piece), e.at + k * PAGE));
                }
            }
        }
    }
    let mut new: Vec<NewPiece> = Vec::new();
    let mut open = false;
    let mut extents: Vec<(u64, u64, Source, u64)> = Vec::new();
    for (p, d) in file.pages.iter().enumerate() {
        if *d == ZERO {
            continue;
        }
        let (offset, len) = (p as u64 * PAGE, file.page_len(p as u64));
        let found = (len == PAGE).then(|| known.get(d).copied()).flatten();
        let (source, at) = match found {
            Some(f) => f,
            None => {
                if !open || new.last().is_some_and(|n| n.len + len > PIECE_MAX) {
                    new.push(NewPiece {
                        runs: Vec::new(),
                        len: 0,
                        pages: Vec::new(),
                    });
                }
                let k = new.len() - 1;
                let piece = &mut new[k];
                let at = piece.len;
                match piece.runs.last_mut() {
                    Some(r) if r.0 + r.1 == offset => r.1 += len,
                    _ => piece.runs.push((offset, len)),
                }
                piece.len += len;
                piece.pages.push(*d);
                // A short page ends its piece: pieces hold whole pages but for their last.
                open = len == PAGE;
                let source = Source::New(k as u32);
                if len == PAGE {
                    known.insert(*d, (source, at));
                }
                (source, at)
            }
        };
        match extents.last_mut() {
            Some(e) if e.2 == source && e.0 + e.1 == offset && e.3 + e.1 == at => e.1 += len,
            _ => extents.push((offset, len, source, at)),
        }
    }
    build(file.size, parent, new, &extents)
}

/// The index of a plan: the parent's pieces and packs that are used, in their order, then the
/// new pieces in a new last pack.
fn build(
    size: u64,
    parent: Option<Parent>,
    new: Vec<NewPiece>,
    extents: &[(u64, u64, Source, u64)],
) -> Plan {
    let mut old_used: Vec<u32> = extents
        .iter()
        .filter_map(|e| match e.2 {
            Source::Old(i) => Some(i),
            Source::New(_) => None,
        })
        .collect();
    old_used.sort_unstable();
    old_used.dedup();
    let (mut packs, mut pieces) = (Vec::new(), Vec::new());
    let mut piece_of_old = HashMap::new();
    let mut depth = 0;
    if let Some(p) = &parent {
        let mut pack_of_old = HashMap::new();
        let mut packs_used: Vec<u32> = old_used
            .iter()
            .map(|i| p.index.pieces[*i as usize].pack)
            .collect();
        packs_used.sort_unstable();
        packs_used.dedup();
        for k in packs_used {
            pack_of_old.insert(k, packs.len() as u32);
            packs.push(p.index.packs[k as usize].clone());
        }
        for i in &old_used {
            let mut piece = p.index.pieces[*i as usize].clone();
            piece.pack = pack_of_old[&piece.pack];
            piece_of_old.insert(*i, pieces.len() as u32);
            pieces.push(piece);
        }
        if !old_used.is_empty() {
            depth = p.index.depth + 1;
        }
    }
    let first_new = pieces.len() as u32;
    if !new.is_empty() {
        packs.push(String::new());
    }
    let new_pack = packs.len().saturating_sub(1) as u32;
    pieces.extend(new.iter().map(|n| PieceRef {
        digest: n.digest(),
        len: n.len,
        pack: new_pack,
        offset: 0,
        stored: 0,
    }));
    let extents = extents
        .iter()
        .map(|(offset, len, source, at)| Extent {
            offset: *offset,
            len: *len,
            piece: match source {
                Source::Old(i) => piece_of_old[i],
                Source::New(k) => first_new + k,
            },
            at: *at,
        })
        .collect();
    Plan {
        index: MemoryIndex {
            size,
            depth,
            packs,
            pieces,
            extents,
        },
        new,
        took_from_parent: !old_used.is_empty(),
    }
}

impl Plan {
    /// The index once the new pieces are in pack `digest`, at `(offset, stored)` each.
    pub fn place(mut self, digest: &str, places: &[(u64, u64)]) -> MemoryIndex {
        assert_eq!(places.len(), self.new.len(), "a place for each new piece");
        let first = self.index.pieces.len() - self.new.len();
        for (piece, (offset, stored)) in self.index.pieces[first..].iter_mut().zip(places) {
            piece.offset = *offset;
            piece.stored = *stored;
        }
        if let Some(last) = self.index.packs.last_mut().filter(|_| !self.new.is_empty()) {
            *last = digest.to_string();
        }
        self.index
    }

    /// Bytes of memory the new pieces hold.
    pub fn new_bytes(&self) -> u64 {
        self.new.iter().map(|n| n.len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::memory::pages::page_digest;

    /// A file of pages, each given by a byte it is filled with (0: zeros).
    fn table(fills: &[u8]) -> PageTable {
        PageTable {
            size: fills.len() as u64 * PAGE,
            pages: fills
                .iter()
                .map(|f| page_digest(&[*f; PAGE as usize]))
                .collect(),
        }
    }

    /// The fill of each page the index describes, read through its pieces.
    fn read(index: &MemoryIndex, pieces: &HashMap<String, Vec<u8>>) -> Vec<u8> {
        (0..index.size / PAGE)
            .map(|p| match index.covering(p * PAGE, PAGE).first() {
                None => 0,
                Some(e) => {
                    let piece = &index.pieces[e.piece as usize];
                    pieces[&piece.digest][((e.at + p * PAGE - e.offset) / PAGE) as usize]
                }
            })
            .collect()
    }

    fn placed(
        plan: Plan,
        fills: &[u8],
        pieces: &mut HashMap<String, Vec<u8>>,
        pack: &str,
    ) -> MemoryIndex {
        for n in &plan.new {
            let bytes: Vec<u8> = n
                .runs
                .iter()
                .flat_map(|(o, l)| (o / PAGE..(o + l) / PAGE).map(|p| fills[p as usize]))
                .collect();
            pieces.insert(n.digest(), bytes);
        }
        let places: Vec<(u64, u64)> = (0..plan.new.len() as u64).map(|k| (k * 10, 10)).collect();
        let index = plan.place(pack, &places);
        index.check().unwrap();
        index
    }

    #[test]
    fn zeros_are_never_stored_and_repeats_are_stored_once() {
        let fills = [1, 0, 2, 1, 0, 3];
        let plan = plan(&table(&fills), None, 8);
        assert!(!plan.took_from_parent);
        assert_eq!(plan.new.len(), 1);
        assert_eq!(plan.new_bytes(), 3 * PAGE);
        assert_eq!(
            plan.new[0].runs,
            vec![(0, PAGE), (2 * PAGE, PAGE), (5 * PAGE, PAGE)]
        );
        let mut pieces = HashMap::new();
        let index = placed(
            plan,
            &fills,
            &mut pieces,
            &format!("sha256:{}", "a".repeat(64)),
        );
        assert_eq!(read(&index, &pieces), fills);
        assert_eq!(index.depth, 0);
        assert_eq!(index.zero_bytes(), 2 * PAGE);
    }

    #[test]
    fn pages_a_restore_moved_are_taken_from_the_parent() {
        let first: Vec<u8> = (1..=200).collect();
        let mut pieces = HashMap::new();
        let pack1 = format!("sha256:{}", "1".repeat(64));
        let parent = placed(plan(&table(&first), None, 8), &first, &mut pieces, &pack1);
        // One page inserted at the front shifts every page; two are rewritten.
        let mut second = vec![250];
        second.extend(&first);
        second[50] = 251;
        second[120] = 252;
        let pt1 = table(&first);
        let p = plan(
            &table(&second),
            Some(Parent {
                index: &parent,
                pages: &pt1,
            }),
            8,
        );
        assert!(p.took_from_parent);
        assert_eq!(p.new_bytes(), 3 * PAGE);
        let pack2 = format!("sha256:{}", "2".repeat(64));
        let index = placed(p, &second, &mut pieces, &pack2);
        assert_eq!(read(&index, &pieces), second);
        assert_eq!(index.depth, 1);
        assert_eq!(index.packs, vec![pack1, pack2]);
        // Runs, not a row per page: the shifted parent pages stay whole runs.
        assert!(index.extents.len() <= 6, "{:?}", index.extents);
    }

    #[test]
    fn a_chain_at_its_depth_sends_everything_again() {
        let fills: Vec<u8> = (1..=10).collect();
        let mut pieces = HashMap::new();
        let mut parent = placed(
            plan(&table(&fills), None, 2),
            &fills,
            &mut pieces,
            &format!("sha256:{}", "1".repeat(64)),
        );
        let pt = table(&fills);
        for (n, want_depth) in [(2u8, 1), (3, 2), (4, 0), (5, 1)] {
            let p = plan(
                &pt,
                Some(Parent {
                    index: &parent,
                    pages: &pt,
                }),
                2,
            );
            let pack = format!("sha256:{}", n.to_string().repeat(64));
            parent = placed(p, &fills, &mut pieces, &pack);
            assert_eq!(parent.depth, want_depth, "snapshot {n}");
            assert_eq!(read(&parent, &pieces), fills);
        }
        assert_eq!(
            parent.packs.len(),
            1,
            "only the pack of the full one is reached"
        );
    }

    #[test]
    fn nothing_new_makes_no_pack() {
        let fills: Vec<u8> = (1..=40).collect();
        let mut pieces = HashMap::new();
        let pack = format!("sha256:{}", "1".repeat(64));
        let parent = placed(plan(&table(&fills), None, 8), &fills, &mut pieces, &pack);
        let pt = table(&fills);
        let again = plan(
            &pt,
            Some(Parent {
                index: &parent,
                pages: &pt,
            }),
            8,
        );
        assert!(again.new.is_empty());
        let index = placed(again, &fills, &mut pieces, "unused");
        assert_eq!(index.packs, vec![pack]);
        assert_eq!(read(&index, &pieces), fills);
    }

    #[test]
    fn pieces_hold_at_most_a_mebibyte() {
        // Page 0 is zeros; the other 599 differ.
        let big = PageTable {
            size: 600 * PAGE,
            pages: (0..600u32)
                .map(|i| page_digest(&i.to_le_bytes().repeat(1024)))
                .collect(),
        };
        let p = plan(&big, None, 8);
        let pages: Vec<u64> = p.new.iter().map(|n| n.len / PAGE).collect();
        assert_eq!(pages, vec![256, 256, 87]);
    }

    #[test]
    fn a_short_last_page_ends_its_piece_and_is_never_matched() {
        let mut t = table(&[1, 2]);
        t.size -= 100;
        t.pages[1] = page_digest(&[2; PAGE as usize - 100]);
        let p = plan(&t, None, 8);
        assert_eq!(p.new.len(), 1);
        assert_eq!(p.new[0].len, 2 * PAGE - 100);
    }
}
