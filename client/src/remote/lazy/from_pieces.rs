//! A lazily served memory file whose snapshot was pushed as pieces. A window a reader waits
//! for (a piece of the chalk manifest's, 1 MiB) is put together from the pieces its extents
//! take from; behind the readers, the pieces are fetched in the order of their packs (long
//! ranges, as a whole pull does), each written where the index puts it, and a window counts
//! once every piece it takes from is written. Every piece is checked against the index (which
//! the manifest's digest pins) before a byte of it is written; the whole file is checked
//! against the snapshot's digest before it becomes a blob (`fetch::check_whole`). Where this
//! host vouches for the index (it hashed that memory itself when it pushed or pulled it), the
//! packs it kept are its own writing: their pieces are read unhashed and the whole file is
//! not hashed again, so a resume where the sandbox was suspended costs no hashing.

use std::{
    collections::{BTreeMap, VecDeque},
    ops::Range,
    path::PathBuf,
    sync::{Arc, Mutex},
};

use chalk_runtime::snapshot::memory::{
    index::Extent,
    pages::{PageDigest, ZERO},
    MemoryIndex, PageTable,
};
use chalk_runtime::snapshot::{pieces::Pieces, store::Store};
use oci_client::Reference;

use crate::remote::{
    packed::fetch::{fetch_run, place_digests, runs, Kept, Run},
    session::Session,
};

/// Opened pieces kept for the windows after (a piece's extents often reach into the next).
const KEPT: usize = 32;
/// The largest memory file whose page digests are gathered as it arrives (a digest per 4 KiB:
/// 128 MiB of them here); a larger one is hashed by the push that needs them.
const PAGES_UP_TO: u64 = 16 << 30;

pub struct FromPieces {
    pub index: MemoryIndex,
    kept: Mutex<VecDeque<(usize, Arc<Vec<u8>>)>>,
    /// The packs this host kept, by their index in the index's packs, each with whether its
    /// pieces may be read unhashed: the host vouches for the index and the pack is unchanged.
    packs_here: Vec<Option<(PathBuf, bool)>>,
    /// The extents that take from each piece.
    pub uses: Vec<Vec<Extent>>,
    /// This host vouches for the index (`Store::catalog_vouches`).
    pub vouched: bool,
    /// The page digests of the file, from each checked piece's, and which pieces gave theirs:
    /// once all did, the next push from here needs not hash this memory again. None past
    /// [`PAGES_UP_TO`].
    pages: Option<Mutex<(PageTable, Vec<bool>)>>,
}

impl FromPieces {
    pub fn new(index: MemoryIndex, store: &Store, vouched: bool) -> FromPieces {
        let packs_here = index
            .packs
            .iter()
            .map(|d| {
                let path = store.kept_pack(d)?;
                Some((path, vouched && store.kept_pack_unchanged(d)))
            })
            .collect();
        let uses = index.extents_by_piece();
        let pages = (index.size <= PAGES_UP_TO).then(|| {
            let table = PageTable {
                size: index.size,
                pages: vec![ZERO; PageTable::count_for(index.size) as usize],
            };
            Mutex::new((table, vec![false; index.pieces.len()]))
        });
        FromPieces {
            index,
            kept: Mutex::new(VecDeque::new()),
            packs_here,
            uses,
            vouched,
            pages,
        }
    }

    /// Records the page digests of checked piece `i` (none: read unhashed, not recorded).
    fn note(&self, i: usize, digests: &[PageDigest]) {
        let Some(pages) = self.pages.as_ref().filter(|_| !digests.is_empty()) else {
            return;
        };
        let mut pages = pages.lock().unwrap();
        let (table, noted) = &mut *pages;
        if !noted[i] {
            place_digests(digests, &self.uses[i], table);
            noted[i] = true;
        }
    }

    /// The file's page digests, once every piece was checked (not when any was read unhashed).
    pub fn page_table(&self) -> Option<PageTable> {
        let pages = self.pages.as_ref()?.lock().unwrap();
        pages.1.iter().all(|n| *n).then(|| pages.0.clone())
    }

    fn here(&self, pack: usize) -> Option<Kept<'_>> {
        self.packs_here[pack].as_ref().map(|(path, vouched)| Kept {
            path,
            vouched: *vouched,
        })
    }

    fn kept(&self, i: usize) -> Option<Arc<Vec<u8>>> {
        let kept = self.kept.lock().unwrap();
        kept.iter().find(|(k, _)| *k == i).map(|(_, b)| b.clone())
    }

    fn keep(&self, i: usize, bytes: Arc<Vec<u8>>) {
        let mut kept = self.kept.lock().unwrap();
        if kept.iter().any(|(k, _)| *k == i) {
            return;
        }
        if kept.len() == KEPT {
            kept.pop_front();
        }
        kept.push_back((i, bytes));
    }
}

/// Why windows could not be put together: worth another try, or never.
pub enum Trouble {
    Again(String),
    Never(String),
}

impl FromPieces {
    /// Windows `run` of the file (of `size` bytes, cut as `windows` says), each put together
    /// from checked pieces: `(window, offset, bytes)`.
    pub fn windows(
        &self,
        session: &Session,
        reference: &Reference,
        windows: &Pieces,
        size: u64,
        run: Range<u64>,
    ) -> Result<Vec<(u64, u64, Vec<u8>)>, Trouble> {
        let (start, _) = windows.range(run.start, size);
        let (last, last_len) = windows.range(run.end - 1, size);
        let end = last + last_len;
        let index = &self.index;
        let mut got: BTreeMap<usize, Arc<Vec<u8>>> = BTreeMap::new();
        let mut wanted = Vec::new();
        for e in index.covering(start, end - start) {
            let i = e.piece as usize;
            match self.kept(i) {
                Some(bytes) => {
                    got.insert(i, bytes);
                }
                None => wanted.push(i),
            }
        }
        for r in runs(index, wanted) {
            fetch_run(
                session,
                reference,
                index,
                &r,
                None,
                self.here(r.pack()),
                |i, bytes, digests| {
                    self.note(i, &digests);
                    got.insert(i, Arc::new(bytes));
                    Ok(())
                },
            )
            .map_err(trouble)?;
        }
        let mut out = Vec::with_capacity((run.end - run.start) as usize);
        for w in run {
            let (at, len) = windows.range(w, size);
            let mut buf = vec![0u8; len as usize];
            for e in index.covering(at, len) {
                let piece = &got[&(e.piece as usize)];
                let (from, to) = (e.offset.max(at), e.end().min(at + len));
                let inside = (e.at + from - e.offset) as usize;
                buf[(from - at) as usize..(to - at) as usize]
                    .copy_from_slice(&piece[inside..inside + (to - from) as usize]);
            }
            out.push((w, at, buf));
        }
        // Pieces that reach past this run serve the windows after it.
        for e in index.covering(end, u64::MAX).iter().take(KEPT) {
            if let Some(bytes) = got.get(&(e.piece as usize)) {
                self.keep(e.piece as usize, bytes.clone());
            }
        }
        Ok(out)
    }
}

/// What the background fetch does with each piece of a run: where its bytes go.
pub struct Placed {
    pub piece: usize,
    pub bytes: Vec<u8>,
}

impl FromPieces {
    /// Every piece in pack order, in runs: what the background fetch goes through.
    pub fn background_runs(&self) -> Vec<Run> {
        runs(&self.index, 0..self.index.pieces.len())
    }

    /// The pieces of `run`, each checked.
    pub fn fetch(
        &self,
        session: &Session,
        reference: &Reference,
        run: &Run,
    ) -> Result<Vec<Placed>, Trouble> {
        let mut out = Vec::with_capacity(run.pieces().len());
        fetch_run(
            session,
            reference,
            &self.index,
            run,
            None,
            self.here(run.pack()),
            |piece, bytes, digests| {
                self.note(piece, &digests);
                out.push(Placed { piece, bytes });
                Ok(())
            },
        )
        .map_err(trouble)?;
        Ok(out)
    }
}

/// A failed fetch of pieces: never to be tried again when the bytes were wrong.
fn trouble(e: crate::Error) -> Trouble {
    let text = e.to_string();
    if text.contains("does not match")
        || text.contains("decompress")
        || text.contains("byte ranges")
    {
        Trouble::Never(format!(
            "{text}: the snapshot's pieces were changed or damaged in the registry"
        ))
    } else {
        Trouble::Again(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chalk_runtime::snapshot::memory::{index::PieceRef, pages::PAGE};

    fn piece(len: u64) -> PieceRef {
        PieceRef {
            digest: "ab".repeat(32),
            len,
            pack: 0,
            offset: 0,
            stored: len,
        }
    }

    #[test]
    fn page_digests_are_whole_once_every_piece_gave_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        // Four pages: page 0 from piece 1, pages 1-2 from piece 0, page 3 a hole of zeros.
        let index = MemoryIndex {
            size: 4 * PAGE,
            depth: 0,
            packs: vec![format!("sha256:{}", "cd".repeat(32))],
            pieces: vec![piece(2 * PAGE), piece(PAGE)],
            extents: vec![
                Extent {
                    offset: 0,
                    len: PAGE,
                    piece: 1,
                    at: 0,
                },
                Extent {
                    offset: PAGE,
                    len: 2 * PAGE,
                    piece: 0,
                    at: 0,
                },
            ],
        };
        let source = FromPieces::new(index, &store, false);
        source.note(0, &[[1; 32], [2; 32]]);
        assert!(source.page_table().is_none(), "piece 1 gave nothing yet");
        // Read unhashed (a vouched pack): no digests, nothing recorded.
        source.note(1, &[]);
        assert!(source.page_table().is_none());
        source.note(1, &[[3; 32]]);
        let table = source.page_table().unwrap();
        assert_eq!(table.size, 4 * PAGE);
        assert_eq!(table.pages, vec![[3; 32], [1; 32], [2; 32], ZERO]);
    }
}
