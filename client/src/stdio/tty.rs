//! This side's terminal, for `exec -t` and `attach`: raw mode for as long as a session lasts
//! (every key, Ctrl-C included, goes to the sandbox's terminal), its window size, and the
//! signals chalkctl takes itself (SIGWINCH to resize the sandbox's terminal; SIGINT, SIGTERM,
//! SIGHUP passed on or ending the session), blocked in every thread and taken by the
//! session's loop with `sigtimedwait`.

use std::os::fd::{AsFd, BorrowedFd};

use nix::sys::{
    signal::{SigSet, Signal},
    termios::{self, SetArg, Termios},
};

/// A terminal put in raw mode; set back as it was when dropped.
pub struct RawMode {
    saved: Termios,
}

/// Whether standard input is a terminal.
pub fn stdin_is_tty() -> bool {
    nix::unistd::isatty(std::io::stdin().as_fd()).unwrap_or(false)
}

impl RawMode {
    /// Raw mode on standard input, when it is a terminal.
    pub fn stdin() -> Option<RawMode> {
        if !stdin_is_tty() {
            return None;
        }
        let fd = std::io::stdin();
        let saved = termios::tcgetattr(fd.as_fd()).ok()?;
        let mut raw = saved.clone();
        termios::cfmakeraw(&mut raw);
        termios::tcsetattr(fd.as_fd(), SetArg::TCSANOW, &raw).ok()?;
        Some(RawMode { saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = termios::tcsetattr(std::io::stdin().as_fd(), SetArg::TCSANOW, &self.saved);
    }
}

/// The window size (columns, rows) of the terminal on `fd`, if it is one.
pub fn window_size(fd: BorrowedFd<'_>) -> Option<(u32, u32)> {
    use std::os::fd::AsRawFd;
    let mut ws = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one winsize into `ws`.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCGWINSZ, &mut ws) };
    (rc == 0 && ws.ws_col > 0 && ws.ws_row > 0).then_some((ws.ws_col as u32, ws.ws_row as u32))
}

/// The size of the terminal chalkctl runs on (standard output's, else standard input's).
pub fn my_window_size() -> Option<(u32, u32)> {
    window_size(std::io::stdout().as_fd()).or_else(|| window_size(std::io::stdin().as_fd()))
}

/// The signals a session takes itself.
fn session_signals() -> SigSet {
    let mut set = SigSet::empty();
    for s in [
        Signal::SIGWINCH,
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
    ] {
        set.add(s);
    }
    set
}

/// Blocks the session's signals in this thread and every thread started after: call it
/// first thing (before containerd's client starts its threads), so that they wait for
/// [`next_signal`] instead of ending chalkctl.
pub fn block_session_signals() {
    let _ = session_signals().thread_block();
}

/// The next session signal sent to chalkctl, waiting at most `timeout` for one.
pub fn next_signal(timeout: std::time::Duration) -> Option<Signal> {
    let set = session_signals();
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: sigtimedwait reads the set and the timeout, and writes no info (null).
    let sig = unsafe { libc::sigtimedwait(set.as_ref(), std::ptr::null_mut(), &ts) };
    Signal::try_from(sig).ok()
}
