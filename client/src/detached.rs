//! Helpers of chalkctl that outlive the command that started them (a stdio keeper, a lazy
//! blob's server).

use std::os::unix::process::CommandExt;

/// Makes `cmd`'s process the leader of a session of its own: it outlives the terminal it was
/// started from, and that terminal's keys (Ctrl-C) are not for it.
pub fn in_own_session(cmd: &mut std::process::Command) -> &mut std::process::Command {
    // SAFETY: setsid is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        })
    }
}
