//! What a terminal printed last, kept so that a page that (re)connects is repainted: the
//! newest `cap` bytes, cut at a line start so the replay does not begin inside an escape
//! sequence of a line already dropped.

use std::collections::VecDeque;

pub struct Replay {
    bytes: VecDeque<u8>,
    cap: usize,
}

impl Replay {
    pub fn new(cap: usize) -> Self {
        Replay {
            bytes: VecDeque::with_capacity(cap.min(1 << 16)),
            cap,
        }
    }

    pub fn push(&mut self, data: &[u8]) {
        self.bytes.extend(data);
        if self.bytes.len() <= self.cap {
            return;
        }
        let excess = self.bytes.len() - self.cap;
        self.bytes.drain(..excess);
        // Drop the partial line left at the front (when there is a later line to start at).
        if let Some(nl) = self.bytes.iter().position(|&b| b == b'\n') {
            self.bytes.drain(..=nl);
        }
    }

    pub fn contents(&self) -> Vec<u8> {
        self.bytes.iter().copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_everything_under_its_capacity() {
        let mut r = Replay::new(64);
        r.push(b"one\r\n");
        r.push(b"two");
        assert_eq!(r.contents(), b"one\r\ntwo");
    }

    #[test]
    fn drops_the_oldest_lines_whole() {
        let mut r = Replay::new(10);
        r.push(b"\x1b[1mfirst\x1b[0m\r\n");
        r.push(b"second\r\n");
        assert_eq!(r.contents(), b"second\r\n");
        r.push(b"0123456789abc");
        // No newline left to cut at: the newest bytes, at most the capacity.
        assert_eq!(r.contents(), b"3456789abc");
    }
}
