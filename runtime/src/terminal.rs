//! A sandbox's terminal across a checkpoint and restore.
//!
//! runsc gives a TTY sandbox a host pseudo-terminal: its line settings are the host pty's (the
//! sandbox passes them through), and its signals (^C, ^\, ^Z, a window size change) reach
//! the sandbox as host signals that runsc forwards to the foreground process group of the
//! terminal it attached at create. A restore attaches no terminal (both generations: "no
//! TTY attached"), and its fresh host pty starts with default settings and no size. So the
//! shim records the terminal's state ([`TerminalState`]) with a snapshot and puts it back on
//! the new pty, and after a restore delivers terminal signals itself: it reads which keys
//! raise which signals ([`signals_in`]), finds the foreground job from the sandbox's process
//! table ([`foreground`]), and signals it through runsc. Parsers and rules here are pure.

use std::{io, os::fd::AsRawFd};

use serde::{Deserialize, Serialize};

/// A terminal's window size and line settings (termios), as a manifest records them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TerminalState {
    pub cols: u16,
    pub rows: u16,
    pub iflag: u32,
    pub oflag: u32,
    pub cflag: u32,
    pub lflag: u32,
    /// The control characters (`c_cc`), VINTR first.
    pub cc: Vec<u8>,
}

impl TerminalState {
    /// Reads the state of the terminal `tty` (either end of a pty).
    pub fn read(tty: &impl AsRawFd) -> io::Result<Self> {
        // SAFETY: tcgetattr and TIOCGWINSZ write into structs that outlive the calls.
        let (t, ws) = unsafe {
            let mut t: libc::termios = std::mem::zeroed();
            if libc::tcgetattr(tty.as_raw_fd(), &mut t) != 0 {
                return Err(io::Error::last_os_error());
            }
            let mut ws: libc::winsize = std::mem::zeroed();
            if libc::ioctl(tty.as_raw_fd(), libc::TIOCGWINSZ, &mut ws) != 0 {
                return Err(io::Error::last_os_error());
            }
            (t, ws)
        };
        Ok(TerminalState {
            cols: ws.ws_col,
            rows: ws.ws_row,
            iflag: t.c_iflag,
            oflag: t.c_oflag,
            cflag: t.c_cflag,
            lflag: t.c_lflag,
            cc: t.c_cc.to_vec(),
        })
    }

    /// Puts the line settings, and the window size unless it is unknown (0x0), on `tty`.
    pub fn apply(&self, tty: &impl AsRawFd) -> io::Result<()> {
        // SAFETY: tcgetattr/tcsetattr and TIOCSWINSZ read structs that outlive the calls.
        unsafe {
            let mut t: libc::termios = std::mem::zeroed();
            if libc::tcgetattr(tty.as_raw_fd(), &mut t) != 0 {
                return Err(io::Error::last_os_error());
            }
            t.c_iflag = self.iflag;
            t.c_oflag = self.oflag;
            t.c_cflag = self.cflag;
            t.c_lflag = self.lflag;
            for (slot, v) in t.c_cc.iter_mut().zip(&self.cc) {
                *slot = *v;
            }
            if libc::tcsetattr(tty.as_raw_fd(), libc::TCSANOW, &t) != 0 {
                return Err(io::Error::last_os_error());
            }
            if self.cols > 0 && self.rows > 0 {
                let ws = libc::winsize {
                    ws_row: self.rows,
                    ws_col: self.cols,
                    ws_xpixel: 0,
                    ws_ypixel: 0,
                };
                if libc::ioctl(tty.as_raw_fd(), libc::TIOCSWINSZ, &ws) != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
        }
        Ok(())
    }
}

/// The signals typing `input` raises on a terminal with local flags `lflag` and control
/// characters `cc`: none unless ISIG is set (a program in raw mode reads the keys itself).
pub fn signals_in(input: &[u8], lflag: u32, cc: &[u8]) -> Vec<i32> {
    if lflag & libc::ISIG == 0 {
        return Vec::new();
    }
    let keys = [
        (libc::VINTR, libc::SIGINT),
        (libc::VQUIT, libc::SIGQUIT),
        (libc::VSUSP, libc::SIGTSTP),
    ];
    let mut out = Vec::new();
    for b in input {
        for (slot, sig) in keys {
            // A control character of 0 (_POSIX_VDISABLE) is switched off.
            if cc.get(slot).is_some_and(|c| *c != 0 && c == b) && !out.contains(&sig) {
                out.push(sig);
            }
        }
    }
    out
}

/// One process of the sandbox, as its process table says (pids in its root pid namespace).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcRow {
    pub pid: i32,
    pub ppid: i32,
    /// Not every runsc reports it (the 2022 build's `ps` has no PGID column).
    pub pgid: Option<i32>,
}

/// Rows of `runsc ps`'s table (a header naming PID, PPID and, on newer builds, PGID).
pub fn parse_ps_table(text: &str) -> Vec<ProcRow> {
    let mut lines = text.lines();
    let Some(header) = lines.next() else {
        return Vec::new();
    };
    let col = |name: &str| header.split_whitespace().position(|h| h == name);
    let (Some(pid), Some(ppid)) = (col("PID"), col("PPID")) else {
        return Vec::new();
    };
    let pgid = col("PGID");
    lines
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let num = |i: usize| f.get(i)?.parse::<i32>().ok();
            Some(ProcRow {
                pid: num(pid)?,
                ppid: num(ppid)?,
                pgid: match pgid {
                    Some(i) => Some(num(i)?),
                    None => None,
                },
            })
        })
        .collect()
}

/// Rows from `/proc/<pid>/stat` lines (`pid (comm) state ppid pgrp ...`; comm may hold
/// spaces and parentheses, so fields are counted from its last `)`). Cut lines are skipped.
pub fn parse_proc_stat(text: &str) -> Vec<ProcRow> {
    text.lines()
        .filter_map(|l| {
            let (head, rest) = l.rsplit_once(')')?;
            let pid = head.split_once(" (")?.0.trim().parse().ok()?;
            let f: Vec<&str> = rest.split_whitespace().collect();
            Some(ProcRow {
                pid,
                ppid: f.get(1)?.parse().ok()?,
                pgid: Some(f.get(2)?.parse().ok()?),
            })
        })
        .collect()
}

/// What a terminal signal is delivered to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SignalTarget {
    /// A process group.
    Group(i32),
    /// These processes (where the process table has no groups).
    Processes(Vec<i32>),
}

/// The terminal's foreground job, from the process table: among the processes that descend
/// from the sandbox's init (exec'd ones do not: they are not on its terminal), the newest
/// process group other than the init's own, else the init's group. A shell puts each job in
/// a group of its own, and pids grow, so the newest group is the job it waits for; the
/// shell's own group is the foreground when it runs none (a process in raw mode, such as a
/// shell at its prompt, reads its keys itself). Without groups: the newest child of the init
/// with its descendants, else the init. `exclude` are the shim's own helpers. The table says
/// nothing of the terminal's own foreground group: a shell at its prompt with a job in the
/// background reads as a shell waiting for that job, and the job gets the signal.
pub fn foreground(rows: &[ProcRow], exclude: &[i32]) -> Option<SignalTarget> {
    let rows: Vec<&ProcRow> = rows.iter().filter(|r| !exclude.contains(&r.pid)).collect();
    let init = rows.iter().min_by_key(|r| r.pid)?;
    let descends = |r: &ProcRow| {
        let mut ppid = r.ppid;
        // Bounded: a table with a ring of parents must not loop.
        for _ in 0..rows.len() {
            if ppid == init.pid {
                return true;
            }
            match rows.iter().find(|p| p.pid == ppid) {
                Some(parent) => ppid = parent.ppid,
                None => return false,
            }
        }
        false
    };
    let family: Vec<&ProcRow> = rows
        .iter()
        .copied()
        .filter(|r| r.pid != init.pid && descends(r))
        .collect();
    if let Some(init_group) = init.pgid.filter(|_| rows.iter().all(|r| r.pgid.is_some())) {
        let newest = family
            .iter()
            .filter(|r| r.pgid != Some(init_group))
            .max_by_key(|r| r.pid);
        return Some(SignalTarget::Group(
            newest.and_then(|r| r.pgid).unwrap_or(init_group),
        ));
    }
    let Some(job) = family
        .iter()
        .filter(|r| r.ppid == init.pid)
        .max_by_key(|r| r.pid)
    else {
        return Some(SignalTarget::Processes(vec![init.pid]));
    };
    let mut pids = vec![job.pid];
    let mut i = 0;
    while i < pids.len() {
        let parent = pids[i];
        pids.extend(family.iter().filter(|r| r.ppid == parent).map(|r| r.pid));
        i += 1;
    }
    Some(SignalTarget::Processes(pids))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(pid: i32, ppid: i32, pgid: Option<i32>) -> ProcRow {
        ProcRow { pid, ppid, pgid }
    }

    #[test]
    fn keys_raise_signals_only_with_isig() {
        let mut cc = vec![0u8; 32];
        cc[libc::VINTR] = 3;
        cc[libc::VQUIT] = 0x1c;
        cc[libc::VSUSP] = 0x1a;
        assert_eq!(
            signals_in(b"ls\x03\x1a\x03", libc::ISIG, &cc),
            [libc::SIGINT, libc::SIGTSTP]
        );
        assert!(
            signals_in(b"\x03", 0, &cc).is_empty(),
            "raw mode reads ^C itself"
        );
        cc[libc::VINTR] = 0;
        assert!(
            signals_in(b"\x00", libc::ISIG, &cc).is_empty(),
            "a disabled key"
        );
    }

    #[test]
    fn reads_both_ps_tables_and_proc_stat() {
        let current = "UID  PID  PPID  PGID  C  TTY  STIME  TIME  CMD\n\
                       0    1    0     1     0  pts/0 10:49 10ms sh\n\
                       0    4    1     4     0  pts/0 10:49 10ms sleep 100\n";
        assert_eq!(
            parse_ps_table(current),
            [row(1, 0, Some(1)), row(4, 1, Some(4))]
        );
        let old = "UID PID PPID C TTY STIME TIME CMD\n0 1 0 0 ? 10:36 20ms sh\n0 5 1 0 ? 10:53 10ms sleep\n";
        assert_eq!(parse_ps_table(old), [row(1, 0, None), row(5, 1, None)]);
        assert!(parse_ps_table("").is_empty());
        let stat = "ut 0 1 1 0\n1 (sh) S 0 1 1 0 0\n7 (my (odd) prog) R 1 7 1 0 0\n";
        assert_eq!(
            parse_proc_stat(stat),
            [row(1, 0, Some(1)), row(7, 1, Some(7))]
        );
    }

    #[test]
    fn the_foreground_job_is_the_newest_group_under_the_init() {
        // A shell (1) runs `sleep 100 | cat` (group 9) after a background job (group 4); an
        // exec'd process (20, a session of its own) is not on the terminal.
        let rows = [
            row(1, 0, Some(1)),
            row(4, 1, Some(4)),
            row(9, 1, Some(9)),
            row(10, 1, Some(9)),
            row(20, 0, Some(20)),
            row(21, 20, Some(21)),
        ];
        assert_eq!(foreground(&rows, &[]), Some(SignalTarget::Group(9)));
        // The shell at its prompt: its own group.
        assert_eq!(foreground(&rows[..1], &[]), Some(SignalTarget::Group(1)));
        // An init that is not a job-control shell: its children stay in its group.
        let plain = [row(1, 0, Some(1)), row(2, 1, Some(1))];
        assert_eq!(foreground(&plain, &[]), Some(SignalTarget::Group(1)));
        // The shim's helper is left out.
        assert_eq!(
            foreground(&[row(1, 0, Some(1)), row(30, 1, Some(30))], &[30]),
            Some(SignalTarget::Group(1))
        );
    }

    #[test]
    fn a_background_job_is_taken_for_the_foreground_at_a_prompt() {
        // The known limit of reading a process table with no terminal's foreground group in
        // it: a shell waiting at its prompt with a job in the background (`sleep 100 &`)
        // looks like a shell waiting for that job.
        let rows = [row(1, 0, Some(1)), row(6, 1, Some(6))];
        assert_eq!(foreground(&rows, &[]), Some(SignalTarget::Group(6)));
    }

    #[test]
    fn without_groups_the_newest_child_and_its_descendants() {
        let rows = [
            row(1, 0, None),
            row(4, 1, None),
            row(9, 1, None),
            row(11, 9, None),
            row(12, 11, None),
            row(20, 0, None),
        ];
        assert_eq!(
            foreground(&rows, &[]),
            Some(SignalTarget::Processes(vec![9, 11, 12]))
        );
        assert_eq!(
            foreground(&rows[..1], &[]),
            Some(SignalTarget::Processes(vec![1]))
        );
        assert_eq!(foreground(&[], &[]), None);
    }
}
