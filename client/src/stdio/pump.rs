//! Reading a fifo of a task's stdio until it is done: the keeper's (the init's output) and
//! exec's (a command's). Done is the writer's close (a reader opened alone sees POLLHUP then:
//! Linux reports it on a FIFO only once a writer has come and gone), or, once `ended` is set
//! (the process has exited), a moment of quiet: the last output is still on its way through
//! the shim, and a reader opened read-write, or a child still holding the fifo, never sees a
//! close.

use std::{
    fs::File,
    io::Read,
    os::fd::AsFd,
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use nix::poll::{PollFd, PollFlags, PollTimeout};

/// Hands what `from` gives to `sink` until it is done (see the module's comment), `quiet`
/// being the moment.
pub fn pump(mut from: File, ended: &AtomicBool, quiet: Duration, mut sink: impl FnMut(&[u8])) {
    let mut buf = vec![0u8; 16 * 1024];
    let mut quiet_since = Instant::now();
    loop {
        let revents = {
            let mut fds = [PollFd::new(from.as_fd(), PollFlags::POLLIN)];
            match nix::poll::poll(&mut fds, PollTimeout::from(100u16)) {
                Ok(n) if n > 0 => fds[0].revents().unwrap_or(PollFlags::empty()),
                _ => PollFlags::empty(),
            }
        };
        if revents.intersects(PollFlags::POLLIN | PollFlags::POLLHUP) {
            match from.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => {
                    sink(&buf[..n]);
                    quiet_since = Instant::now();
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
                    ) => {}
                Err(_) => return,
            }
        } else if ended.load(Ordering::SeqCst) && quiet_since.elapsed() > quiet {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pipe_is_read_to_its_close_and_a_quiet_one_ends_with_its_process() {
        let (r, w) = std::io::pipe().unwrap();
        let mut w = File::from(std::os::fd::OwnedFd::from(w));
        std::io::Write::write_all(&mut w, b"out").unwrap();
        drop(w);
        let mut got = Vec::new();
        pump(
            File::from(std::os::fd::OwnedFd::from(r)),
            &AtomicBool::new(false),
            Duration::from_secs(60),
            |d| got.extend_from_slice(d),
        );
        assert_eq!(got, b"out");
        // A writer that stays open: only `ended` and the quiet end it.
        let (r, _w) = std::io::pipe().unwrap();
        let started = Instant::now();
        pump(
            File::from(std::os::fd::OwnedFd::from(r)),
            &AtomicBool::new(true),
            Duration::from_millis(200),
            |_| {},
        );
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
