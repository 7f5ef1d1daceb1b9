//! Which pieces of a lazily served blob are here, wanted or on their way, and the one failure
//! that ends serving. Readers wait on it; the fetchers claim work from it. Pure (threads and a
//! condition variable, no I/O), so the serving rules are tested without a registry or FUSE.

use std::{
    ops::Range,
    sync::{Condvar, Mutex},
    time::{Duration, Instant},
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Piece {
    Missing,
    /// A reader waits for it: the demand fetcher takes it before the background does.
    Wanted,
    Fetching,
    Here,
}

#[derive(Debug)]
struct State {
    pieces: Vec<Piece>,
    here: u64,
    failed: Option<String>,
    /// Where the background fetch goes on from: the lowest piece it has not passed.
    cursor: u64,
}

/// What is told of a failure before any reader hears of it.
type OnFail = Box<dyn Fn(&str) + Send + Sync>;

/// The pieces of one blob, shared by the FUSE readers and the fetchers.
pub struct Arrivals {
    state: Mutex<State>,
    changed: Condvar,
    on_fail: Option<OnFail>,
}

impl Arrivals {
    #[cfg(test)]
    pub fn new(count: u64) -> Arrivals {
        Arrivals::telling(count, None)
    }

    /// Arrivals whose failure is first handed to `on_fail` (the store's note of why, which
    /// the shim reads once runsc's read failed).
    pub fn telling(count: u64, on_fail: Option<OnFail>) -> Arrivals {
        Arrivals {
            on_fail,
            state: Mutex::new(State {
                pieces: vec![Piece::Missing; count as usize],
                here: 0,
                failed: None,
                cursor: 0,
            }),
            changed: Condvar::new(),
        }
    }

    pub fn count(&self) -> u64 {
        self.state.lock().unwrap().pieces.len() as u64
    }

    /// Whether all of `pieces` are here (false once failed: nothing more is served).
    pub fn have(&self, pieces: &Range<u64>) -> bool {
        let st = self.state.lock().unwrap();
        st.failed.is_none() && pieces.clone().all(|i| st.pieces[i as usize] == Piece::Here)
    }

    /// Waits until all of `pieces` are here, marking the missing ones wanted; the failure
    /// that ended serving, or a timeout after `limit`, else.
    pub fn wait_for(&self, pieces: Range<u64>, limit: Duration) -> Result<(), String> {
        self.wait(pieces, limit, true)
    }

    /// Like [`Arrivals::wait_for`], without asking for the pieces (the whole file's hash
    /// follows the fetch, it does not lead it).
    pub fn wait_quietly(&self, pieces: Range<u64>, limit: Duration) -> Result<(), String> {
        self.wait(pieces, limit, false)
    }

    fn wait(&self, pieces: Range<u64>, limit: Duration, ask: bool) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        let mut st = self.state.lock().unwrap();
        let mut asked = !ask;
        loop {
            if let Some(why) = &st.failed {
                return Err(why.clone());
            }
            if pieces.clone().all(|i| st.pieces[i as usize] == Piece::Here) {
                return Ok(());
            }
            if !asked {
                for i in pieces.clone() {
                    if st.pieces[i as usize] == Piece::Missing {
                        st.pieces[i as usize] = Piece::Wanted;
                    }
                }
                asked = true;
                self.changed.notify_all();
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(format!(
                    "pages {}..{} did not arrive within {limit:?}",
                    pieces.start, pieces.end
                ));
            }
            st = self.changed.wait_timeout(st, deadline - now).unwrap().0;
        }
    }

    /// A piece a reader waits for and up to `max - 1` pieces after it not here or on their
    /// way, claimed by the caller (waits up to `idle` for one); None when there is none, or
    /// serving has ended. runsc's own loader reads ahead in order, so what it waits for is
    /// usually the start of a run worth one request.
    pub fn next_wanted(&self, max: u64, idle: Duration) -> Option<Range<u64>> {
        let mut st = self.state.lock().unwrap();
        if let Some(run) = Self::take_wanted(&mut st, max) {
            return Some(run);
        }
        if st.failed.is_some() || st.here == st.pieces.len() as u64 {
            return None;
        }
        st = self.changed.wait_timeout(st, idle).unwrap().0;
        Self::take_wanted(&mut st, max)
    }

    fn take_wanted(st: &mut State, max: u64) -> Option<Range<u64>> {
        if st.failed.is_some() {
            return None;
        }
        let start = st.pieces.iter().position(|p| *p == Piece::Wanted)?;
        let mut end = start;
        while end < st.pieces.len()
            && ((end - start) as u64) < max
            && matches!(st.pieces[end], Piece::Wanted | Piece::Missing)
        {
            st.pieces[end] = Piece::Fetching;
            end += 1;
        }
        Some(start as u64..end as u64)
    }

    /// The next run of up to `max` missing pieces in order, claimed for the background
    /// fetch; None when every piece is here, on its way, or serving has ended.
    pub fn next_run(&self, max: u64) -> Option<Range<u64>> {
        let mut st = self.state.lock().unwrap();
        if st.failed.is_some() {
            return None;
        }
        let n = st.pieces.len() as u64;
        let mut start = st.cursor;
        while start < n && st.pieces[start as usize] != Piece::Missing {
            start += 1;
        }
        if start == n {
            // Passed over pieces a reader wanted (then being fetched): look again from 0.
            start = (0..n).find(|&i| st.pieces[i as usize] == Piece::Missing)?;
        }
        let mut end = start;
        while end < n && end - start < max && st.pieces[end as usize] == Piece::Missing {
            st.pieces[end as usize] = Piece::Fetching;
            end += 1;
        }
        st.cursor = end;
        Some(start..end)
    }

    /// Piece `i` is here, checked and written.
    pub fn arrived(&self, i: u64) {
        let mut st = self.state.lock().unwrap();
        if st.pieces[i as usize] != Piece::Here {
            st.pieces[i as usize] = Piece::Here;
            st.here += 1;
        }
        self.changed.notify_all();
    }

    /// Pieces claimed but not fetched (a fetch that will be tried again) go back.
    pub fn give_back(&self, pieces: Range<u64>) {
        let mut st = self.state.lock().unwrap();
        for i in pieces {
            if st.pieces[i as usize] == Piece::Fetching {
                st.pieces[i as usize] = Piece::Wanted;
            }
        }
        self.changed.notify_all();
    }

    /// Serving has failed for `why`: every reader, now and later, gets it (the first reason
    /// is kept).
    pub fn fail(&self, why: &str) {
        let mut st = self.state.lock().unwrap();
        if st.failed.is_none() {
            if let Some(tell) = &self.on_fail {
                tell(why);
            }
            st.failed = Some(why.to_string());
        }
        self.changed.notify_all();
    }

    pub fn failure(&self) -> Option<String> {
        self.state.lock().unwrap().failed.clone()
    }

    /// Whether every piece is here.
    pub fn complete(&self) -> bool {
        let st = self.state.lock().unwrap();
        st.here == st.pieces.len() as u64
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn the_background_goes_in_order_and_a_reader_jumps_the_queue() {
        let a = Arc::new(Arrivals::new(10));
        assert_eq!(a.next_run(4), Some(0..4));
        let reader = {
            let a = a.clone();
            std::thread::spawn(move || a.wait_for(7..9, Duration::from_secs(10)))
        };
        let wanted = loop {
            if let Some(run) = a.next_wanted(2, Duration::from_millis(50)) {
                break run;
            }
        };
        assert_eq!(wanted, 7..9);
        a.arrived(7);
        a.arrived(8);
        reader.join().unwrap().unwrap();
        // The background skips what a reader had fetched.
        assert_eq!(a.next_run(4), Some(4..7));
        assert_eq!(a.next_run(4), Some(9..10));
        assert_eq!(a.next_run(4), None);
        for i in (0..7).chain([9]) {
            a.arrived(i);
        }
        assert!(a.complete());
        assert!(a.have(&(0..10)));
    }

    #[test]
    fn a_failure_reaches_every_reader_and_stops_the_fetchers() {
        let a = Arc::new(Arrivals::new(3));
        let readers: Vec<_> = (0..3)
            .map(|i| {
                let a = a.clone();
                std::thread::spawn(move || a.wait_for(i..i + 1, Duration::from_secs(10)))
            })
            .collect();
        std::thread::sleep(Duration::from_millis(50));
        a.fail("piece 1 does not match its digest");
        a.fail("a later reason");
        for r in readers {
            assert_eq!(
                r.join().unwrap().unwrap_err(),
                "piece 1 does not match its digest"
            );
        }
        assert_eq!(a.next_run(4), None);
        assert_eq!(a.next_wanted(4, Duration::ZERO), None);
        assert!(!a.have(&(0..0)) || a.failure().is_some());
    }

    #[test]
    fn a_failure_is_told_once_before_readers_hear_of_it() {
        let told = Arc::new(Mutex::new(Vec::new()));
        let a = {
            let told = told.clone();
            Arrivals::telling(
                1,
                Some(Box::new(move |why: &str| {
                    told.lock().unwrap().push(why.to_string())
                })),
            )
        };
        a.fail("first");
        a.fail("second");
        assert_eq!(*told.lock().unwrap(), ["first"]);
        assert_eq!(a.wait_for(0..1, Duration::ZERO).unwrap_err(), "first");
    }

    #[test]
    fn a_reader_gives_up_at_its_deadline_and_pieces_given_back_are_fetched_again() {
        let a = Arrivals::new(2);
        let err = a.wait_for(0..1, Duration::from_millis(20)).unwrap_err();
        assert!(err.contains("did not arrive"), "{err}");
        assert_eq!(a.next_wanted(1, Duration::ZERO), Some(0..1));
        a.give_back(0..1);
        // A run from a wanted piece takes the missing ones after it.
        assert_eq!(a.next_wanted(8, Duration::ZERO), Some(0..2));
        assert_eq!(a.next_run(8), None);
    }
}
