//! The detach keys of `chalkctl attach`: Ctrl-P Ctrl-Q, as docker and nerdctl have them.
//! Bytes typed pass through unchanged, except that a Ctrl-P waits for the next key: Ctrl-Q
//! detaches (neither reaches the sandbox), anything else follows the Ctrl-P through.

const CTRL_P: u8 = 0x10;
const CTRL_Q: u8 = 0x11;

#[derive(Default)]
pub struct Detach {
    held: bool,
}

/// What one chunk of input comes to.
#[derive(Debug, PartialEq, Eq)]
pub struct Scanned {
    /// What goes on to the sandbox.
    pub forward: Vec<u8>,
    /// The keys were pressed: detach (what followed them in the chunk is dropped).
    pub detach: bool,
}

impl Detach {
    pub fn scan(&mut self, input: &[u8]) -> Scanned {
        let mut forward = Vec::with_capacity(input.len() + 1);
        for &b in input {
            if self.held {
                self.held = false;
                if b == CTRL_Q {
                    return Scanned {
                        forward,
                        detach: true,
                    };
                }
                forward.push(CTRL_P);
                if b == CTRL_P {
                    self.held = true;
                    continue;
                }
                forward.push(b);
            } else if b == CTRL_P {
                self.held = true;
            } else {
                forward.push(b);
            }
        }
        Scanned {
            forward,
            detach: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan_all(chunks: &[&[u8]]) -> (Vec<u8>, bool) {
        let mut d = Detach::default();
        let mut out = Vec::new();
        for c in chunks {
            let s = d.scan(c);
            out.extend(s.forward);
            if s.detach {
                return (out, true);
            }
        }
        (out, false)
    }

    #[test]
    fn ctrl_p_ctrl_q_detaches_and_nothing_else_does() {
        assert_eq!(scan_all(&[b"ls\r"]), (b"ls\r".to_vec(), false));
        assert_eq!(scan_all(&[b"a\x10\x11b"]), (b"a".to_vec(), true));
        // Split across reads.
        assert_eq!(scan_all(&[b"a\x10", b"\x11"]), (b"a".to_vec(), true));
        // Ctrl-P then another key: both go through.
        assert_eq!(scan_all(&[b"\x10x"]), (b"\x10x".to_vec(), false));
        assert_eq!(scan_all(&[b"\x10", b"\x03"]), (b"\x10\x03".to_vec(), false));
        assert_eq!(scan_all(&[b"\x10\x10\x11"]), (b"\x10".to_vec(), true));
        // Ctrl-Q alone is a key like any other.
        assert_eq!(scan_all(&[b"\x11"]), (b"\x11".to_vec(), false));
    }
}
