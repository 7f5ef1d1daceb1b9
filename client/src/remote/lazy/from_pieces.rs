//! A lazily served memory file whose snapshot was pushed as pieces: each window of the file
//! (a piece of the chalk manifest's, 1 MiB) is put together from the pieces its extents take
//! from, fetched from their packs by range (neighbouring ones in one request), each checked
//! against the index, then the window checked against the manifest's digest of it, as a window
//! of a whole blob is, before readers see it.

use std::{
    collections::{BTreeMap, VecDeque},
    ops::Range,
    sync::{Arc, Mutex},
};

use chalk_runtime::snapshot::{memory::MemoryIndex, pieces::Pieces};
use oci_client::Reference;

use crate::remote::{
    packed::fetch::{fetch_run, runs},
    session::Session,
};

/// Opened pieces kept for the windows after (a piece's extents often reach into the next).
const KEPT: usize = 32;

pub struct FromPieces {
    pub index: MemoryIndex,
    kept: Mutex<VecDeque<(usize, Arc<Vec<u8>>)>>,
}

impl FromPieces {
    pub fn new(index: MemoryIndex) -> FromPieces {
        FromPieces {
            index,
            kept: Mutex::new(VecDeque::new()),
        }
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
    /// and checked: `(window, offset, bytes)`.
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
            fetch_run(session, reference, index, &r, None, |i, bytes, _| {
                got.insert(i, Arc::new(bytes));
                Ok(())
            })
            .map_err(|e| {
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
            })?;
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
            if !windows.matches(w, &buf) {
                return Err(Trouble::Never(format!(
                    "bytes {at}..{} put together from the snapshot's pieces do not match their \
                     digest in its manifest: its index and its manifest disagree",
                    at + len
                )));
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
