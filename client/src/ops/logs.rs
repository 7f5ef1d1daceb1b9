//! `chalkctl logs`: what a sandbox's init has printed, as its stdio keeper logged it (both
//! streams, in the order they came), and with `-f` what it prints next, until its keeper
//! ends (the init exited, or the sandbox was suspended).

use std::{io::Write, time::Duration};

use crate::{
    stdio::{
        keeper,
        log::{self, Follower},
        state::SandboxDir,
    },
    Error, Result,
};

/// Writes the log of the sandbox kept in `dir` to `out` (following it with `follow`).
pub fn logs(dir: &SandboxDir, id: &str, follow: bool, out: &mut impl Write) -> Result<()> {
    if !dir.exists() {
        return Err(format!(
            "chalkctl keeps no output of {id}: it was not started by chalkctl run, fork or \
             resume (its output went where its task's stdio was pointed: ctr task attach, \
             crictl logs)"
        )
        .into());
    }
    let io = |e: std::io::Error| Error::from(format!("read the log of {id}: {e}"));
    let write = |out: &mut dyn Write, data: &[u8]| {
        out.write_all(data)
            .and_then(|_| out.flush())
            .map_err(|e| Error::from(format!("write the log of {id}: {e}")))
    };
    if !follow {
        return write(out, &log::read_all(&dir.log(), &dir.old_log()).map_err(io)?);
    }
    // The current file is opened first: what is written while the older one is read is not
    // missed.
    let mut current = Follower::new(&dir.log(), false).map_err(io)?;
    if let Ok(old) = std::fs::read(dir.old_log()) {
        write(out, &old)?;
    }
    loop {
        let running = keeper::running(dir);
        let data = current.read_new().map_err(io)?;
        write(out, &data)?;
        if data.is_empty() && !running {
            return Ok(());
        }
        if data.is_empty() {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}
