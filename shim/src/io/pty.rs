//! Pseudo-terminals: making one, and its window size.

use std::{
    fs::{File, OpenOptions},
    io,
    os::{fd::AsRawFd, unix::fs::OpenOptionsExt},
};

use nix::fcntl::OFlag;

/// Sets a terminal's window size (on either end of a pty).
pub fn set_size(tty: &impl AsRawFd, width: u32, height: u32) -> io::Result<()> {
    let size = libc::winsize {
        ws_row: height.min(u16::MAX as u32) as u16,
        ws_col: width.min(u16::MAX as u32) as u16,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads a winsize struct that outlives the call.
    if unsafe { libc::ioctl(tty.as_raw_fd(), libc::TIOCSWINSZ, &size) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A new pseudo-terminal `(master, slave)`, both close-on-exec from the start, so neither can
/// leak into a runsc started concurrently (a leaked slave would keep the master from EOF).
pub fn open_pty() -> io::Result<(File, File)> {
    use nix::pty::{grantpt, posix_openpt, ptsname_r, unlockpt};
    let master = posix_openpt(OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_CLOEXEC)?;
    grantpt(&master)?;
    unlockpt(&master)?;
    let name = ptsname_r(&master)?;
    let slave = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY)
        .open(name)?;
    // SAFETY: the fd is owned by `master` and handed over to the File.
    let master = unsafe {
        <File as std::os::fd::FromRawFd>::from_raw_fd(std::os::fd::IntoRawFd::into_raw_fd(master))
    };
    Ok((master, slave))
}

/// The `(width, height)` a process spec asks its terminal to start with (`consoleSize`), so the
/// process sees the right size from its first instruction, before any ResizePty arrives.
pub fn console_size(process: &serde_json::Value) -> Option<(u32, u32)> {
    let size = process.get("consoleSize")?;
    let width = size.get("width")?.as_u64()? as u32;
    let height = size.get("height")?.as_u64()? as u32;
    (width > 0 && height > 0).then_some((width, height))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pty_ends_are_close_on_exec_and_connected() {
        use nix::fcntl::{fcntl, FcntlArg, FdFlag};
        let (master, slave) = open_pty().unwrap();
        for f in [&master, &slave] {
            let flags = FdFlag::from_bits_truncate(fcntl(f, FcntlArg::F_GETFD).unwrap());
            assert!(flags.contains(FdFlag::FD_CLOEXEC));
        }
        set_size(&master, 80, 24).unwrap();
        let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
        assert_eq!(
            unsafe { libc::ioctl(slave.as_raw_fd(), libc::TIOCGWINSZ, &mut ws) },
            0
        );
        assert_eq!((ws.ws_col, ws.ws_row), (80, 24));
    }

    #[test]
    fn reads_console_size_from_a_process_spec() {
        let p = serde_json::json!({"terminal": true, "consoleSize": {"height": 45, "width": 123}});
        assert_eq!(console_size(&p), Some((123, 45)));
        assert_eq!(console_size(&serde_json::json!({"terminal": true})), None);
        let zero = serde_json::json!({"consoleSize": {"height": 0, "width": 0}});
        assert_eq!(console_size(&zero), None);
    }
}
