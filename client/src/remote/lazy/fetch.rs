//! The fetchers of a lazily served blob: one goes through the blob in order, a few fetch the
//! pieces readers wait for, and one hashes the whole file behind them. Every piece is checked
//! against its digest before it is written where readers can see it; a range that does not
//! arrive is asked again a few times, and then serving fails.

use std::{
    fs::File,
    ops::Range,
    os::unix::fs::FileExt,
    sync::{Arc, Mutex},
    time::Duration,
};

use chalk_runtime::snapshot::pieces::Pieces;
use oci_client::Reference;
use sha2::{Digest, Sha256};

use super::super::session::Session;
use super::arrivals::Arrivals;
use super::from_pieces::{FromPieces, Placed, Trouble};
use crate::remote::packed::fetch::Run;
use chalk_runtime::snapshot::memory::index::Extent;
use std::collections::BTreeSet;

/// Pieces the in-order fetch asks for at once (16 MiB at 1 MiB pieces).
const RUN: u64 = 16;
/// Fetchers of pieces that readers wait for.
pub const DEMAND_FETCHERS: usize = 3;
/// Waits between tries of a range that did not arrive.
const RETRIES: [Duration; 3] = [
    Duration::from_millis(200),
    Duration::from_secs(1),
    Duration::from_secs(3),
];

pub struct Fetch {
    pub session: Arc<Session>,
    pub reference: Reference,
    pub digest: String,
    pub size: u64,
    pub pieces: Pieces,
    pub arrivals: Arc<Arrivals>,
    pub data: Arc<File>,
    /// The whole file's sha256 so far, and the piece it goes on from.
    pub whole: Mutex<(u64, Sha256)>,
    /// Where the file's bytes come from when its snapshot was pushed as pieces.
    pub from_pieces: Option<FromPieces>,
}

/// Why a range was not fetched: worth another try, or never.
enum Failed {
    Again(String),
    Never(String),
}

impl Fetch {
    /// Fetches pieces `run` (claimed already), trying again as any fetch does.
    pub fn first(&self, run: Range<u64>) {
        self.with_retries(run);
    }

    /// Fetches the blob in order until every piece is here or serving failed.
    pub fn in_order(&self) {
        if let Some(source) = &self.from_pieces {
            return self.in_pack_order(source);
        }
        while let Some(run) = self.arrivals.next_run(RUN) {
            self.with_retries(run);
        }
    }

    /// Fetches pieces readers wait for until every piece is here or serving failed.
    pub fn on_demand(&self) {
        while !self.arrivals.complete() && self.arrivals.failure().is_none() {
            if let Some(run) = self.arrivals.next_wanted(RUN, Duration::from_millis(100)) {
                self.with_retries(run);
            }
        }
    }

    fn with_retries(&self, run: Range<u64>) {
        let mut tries = RETRIES.iter();
        loop {
            match self.fetch(run.clone()) {
                Ok(()) => return,
                Err(Failed::Never(why)) => return self.arrivals.fail(&why),
                Err(Failed::Again(why)) => match tries.next() {
                    Some(wait) if self.arrivals.failure().is_none() => {
                        std::thread::sleep(*wait);
                        // A registry's token may have expired: ask for a new one.
                        let _ = self
                            .session
                            .login(&self.reference, oci_client::RegistryOperation::Pull);
                    }
                    _ => {
                        self.arrivals.give_back(run);
                        return self
                            .arrivals
                            .fail(&format!("{why} (tried {} times)", RETRIES.len() + 1));
                    }
                },
            }
        }
    }

    /// One ranged fetch of pieces `run`, each checked and written as it completes.
    fn fetch(&self, run: Range<u64>) -> Result<(), Failed> {
        if let Some(source) = &self.from_pieces {
            return self.fetch_from_pieces(source, run);
        }
        let (offset, _) = self.pieces.range(run.start, self.size);
        let (last_offset, last_len) = self.pieces.range(run.end - 1, self.size);
        let len = last_offset + last_len - offset;
        let mut piece = run.start;
        let mut buf: Vec<u8> = Vec::with_capacity(self.pieces.size as usize);
        let mut bad = None;
        let fetched =
            self.session
                .blob_range(&self.reference, &self.digest, offset, len, |mut bytes| {
                    while !bytes.is_empty() {
                        let (at, want) = self.pieces.range(piece, self.size);
                        let take = (want as usize - buf.len()).min(bytes.len());
                        buf.extend_from_slice(&bytes[..take]);
                        bytes = &bytes[take..];
                        if buf.len() as u64 == want {
                            if !self.pieces.matches(piece, &buf) {
                                bad = Some(format!(
                                    "bytes {at}..{} of {} from the registry do not match their \
                                 digest in the snapshot's manifest: the blob was changed or \
                                 damaged there",
                                    at + want,
                                    self.digest
                                ));
                                return Err(crate::Error::from(
                                    "a piece did not match its digest".to_string(),
                                ));
                            }
                            self.data
                                .write_all_at(&buf, at)
                                .map_err(|e| crate::Error::from(format!("write the blob: {e}")))?;
                            self.arrivals.arrived(piece);
                            piece += 1;
                            buf.clear();
                        }
                    }
                    Ok(())
                });
        if let Some(why) = bad {
            return Err(Failed::Never(why));
        }
        match fetched {
            Ok(()) => Ok(()),
            Err(e) => {
                // What arrived whole stays; the rest is asked again.
                if piece < run.end {
                    self.arrivals.give_back(piece..run.end);
                }
                let text = e.to_string();
                if text.contains("write the blob") || text.contains("byte ranges") {
                    Err(Failed::Never(text))
                } else {
                    Err(Failed::Again(text))
                }
            }
        }
    }

    /// Fetches a packed snapshot's pieces in the order of their packs, writing each where the
    /// index puts it; a window counts once every piece it takes from is written (one of zeros
    /// at once).
    fn in_pack_order(&self, source: &FromPieces) {
        let windows = self.arrivals.count() as usize;
        let uses = &source.uses;
        let window_size = self.pieces.size.max(1);
        let touched = |exts: &[Extent]| -> BTreeSet<u64> {
            exts.iter()
                .flat_map(|e| e.offset / window_size..=(e.end() - 1) / window_size)
                .collect()
        };
        let mut pending = vec![0u32; windows];
        for exts in uses {
            for w in touched(exts) {
                pending[w as usize] += 1;
            }
        }
        for (w, n) in pending.iter().enumerate() {
            if *n == 0 {
                self.arrivals.arrived(w as u64);
            }
        }
        for run in source.background_runs() {
            let wanted = run.pieces().iter().any(|&i| {
                touched(&uses[i])
                    .iter()
                    .any(|w| !self.arrivals.have(&(*w..*w + 1)))
            });
            if !wanted {
                continue;
            }
            let placed = match self.pieces_with_retries(source, &run) {
                Some(p) => p,
                None => return,
            };
            for p in placed {
                for e in &uses[p.piece] {
                    let slice = &p.bytes[e.at as usize..(e.at + e.len) as usize];
                    if let Err(err) = self.data.write_all_at(slice, e.offset) {
                        return self.arrivals.fail(&format!("write the blob: {err}"));
                    }
                }
                for w in touched(&uses[p.piece]) {
                    pending[w as usize] -= 1;
                    if pending[w as usize] == 0 {
                        self.arrivals.arrived(w);
                    }
                }
            }
        }
    }

    /// The pieces of `run`, tried again as any fetch is; None once serving failed.
    fn pieces_with_retries(&self, source: &FromPieces, run: &Run) -> Option<Vec<Placed>> {
        let mut tries = RETRIES.iter();
        loop {
            if self.arrivals.failure().is_some() {
                return None;
            }
            match source.fetch(&self.session, &self.reference, run) {
                Ok(p) => return Some(p),
                Err(Trouble::Never(why)) => {
                    self.arrivals.fail(&why);
                    return None;
                }
                Err(Trouble::Again(why)) => match tries.next() {
                    Some(wait) => {
                        std::thread::sleep(*wait);
                        let _ = self
                            .session
                            .login(&self.reference, oci_client::RegistryOperation::Pull);
                    }
                    None => {
                        self.arrivals
                            .fail(&format!("{why} (tried {} times)", RETRIES.len() + 1));
                        return None;
                    }
                },
            }
        }
    }

    /// Windows `run` put together from the snapshot's pieces, each written and counted.
    fn fetch_from_pieces(&self, source: &FromPieces, run: Range<u64>) -> Result<(), Failed> {
        let made = source.windows(
            &self.session,
            &self.reference,
            &self.pieces,
            self.size,
            run.clone(),
        );
        let windows = match made {
            Ok(w) => w,
            Err(trouble) => {
                self.arrivals.give_back(run);
                return Err(match trouble {
                    Trouble::Again(why) => Failed::Again(why),
                    Trouble::Never(why) => Failed::Never(why),
                });
            }
        };
        for (w, at, bytes) in windows {
            if let Err(e) = self.data.write_all_at(&bytes, at) {
                self.arrivals.give_back(w..run.end);
                return Err(Failed::Never(format!("write the blob: {e}")));
            }
            self.arrivals.arrived(w);
        }
        Ok(())
    }

    /// Hashes the pieces from the next one on that are here.
    fn catch_up(&self, whole: &mut (u64, Sha256)) -> Result<(), String> {
        let mut buf = Vec::new();
        while whole.0 < self.arrivals.count() && self.arrivals.have(&(whole.0..whole.0 + 1)) {
            let (at, len) = self.pieces.range(whole.0, self.size);
            buf.resize(len as usize, 0);
            self.data
                .read_exact_at(&mut buf, at)
                .map_err(|e| format!("read back the blob: {e}"))?;
            whole.1.update(&buf);
            whole.0 += 1;
        }
        Ok(())
    }

    /// Once every piece is here, hashes the whole file (read back from the page cache):
    /// whether it hashes to the blob's digest. Fails serving when not. Not before: on few
    /// cores a second hash beside the fetch slows the loading it only confirms (every piece
    /// was checked already).
    pub fn check_whole(&self, wait_limit: Duration) -> Result<(), String> {
        self.arrivals
            .wait_quietly(0..self.arrivals.count(), wait_limit)?;
        // A vouched-for index puts together the very file this host hashed: each piece of it
        // is the file's own, so the whole is not hashed again.
        if self.from_pieces.as_ref().is_some_and(|s| s.vouched) {
            return Ok(());
        }
        let mut whole = self.whole.lock().unwrap();
        self.catch_up(&mut whole)?;
        if whole.0 != self.arrivals.count() {
            return Err("the blob's pieces were not all hashed".into());
        }
        let got = format!("sha256:{:x}", std::mem::take(&mut whole.1).finalize());
        if got != self.digest {
            let why = format!(
                "the blob fetched hashes to {got}, not {}: every piece matched, so the \
                 snapshot's manifest and its blob disagree",
                self.digest
            );
            self.arrivals.fail(&why);
            return Err(why);
        }
        Ok(())
    }
}
