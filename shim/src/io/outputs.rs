//! Opening a process's stdout and stderr: fifos or files each, or both on one logging binary,
//! for runsc to hand straight to the sandbox.

use std::{
    fs::{File, OpenOptions},
    io,
    os::unix::fs::OpenOptionsExt,
};

use super::{
    release::HeldOutputs,
    targets::{parse_target, Target},
    StdioPaths,
};
use crate::logger::{self, LogContext};

/// A process's opened stdout and stderr.
#[derive(Default)]
pub(super) struct Outputs {
    pub stdout: Option<File>,
    pub stderr: Option<File>,
    /// The ends of each output fifo the shim holds itself: see [`HeldOutputs`].
    pub held: HeldOutputs,
}

/// Opens a process's stdout and stderr: fifos or files each, or both on one logging binary.
pub(super) fn open_outputs(paths: &StdioPaths, ctx: &LogContext) -> io::Result<Outputs> {
    let mut out = Outputs::default();
    match parse_target(&paths.stdout)? {
        Target::Binary(spec) => {
            let (stdout, stderr) = logger::start(&spec, ctx)?;
            out.stdout = Some(stdout);
            out.stderr = Some(stderr);
        }
        stdout => {
            out.stdout = open_output(&stdout, &mut out.held)?;
            out.stderr = open_output(&parse_target(&paths.stderr)?, &mut out.held)?;
        }
    }
    Ok(out)
}

/// Opens an output stream for writing without blocking on containerd's reader.
fn open_output(target: &Target, held: &mut HeldOutputs) -> io::Result<Option<File>> {
    match target {
        Target::None => Ok(None),
        Target::Binary(spec) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "stderr alone cannot go to logging binary {}",
                spec.path.display()
            ),
        )),
        Target::File(path) => {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            OpenOptions::new()
                .append(true)
                .create(true)
                .mode(0o640)
                .open(path)
                .map(Some)
        }
        Target::Fifo(path) => {
            // A read end first, so that opening the write end never blocks.
            let reader = OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(path)?;
            let writer = OpenOptions::new().write(true).open(path)?;
            held.hold(path, reader, &writer)?;
            Ok(Some(writer))
        }
    }
}

/// Writers on the output fifos of `paths`, held while a sandbox is replaced by its restore
/// (a snapshot on a runsc that cannot resume in place): the old sandbox's (or its terminal
/// copier's) writers close before the new one's open, and a reader that sees no writer
/// reads end-of-file and stops (`ctr run` would lose the rest of the output).
pub fn hold_outputs(paths: &StdioPaths) -> Vec<File> {
    let mut held = Vec::new();
    for uri in [&paths.stdout, &paths.stderr] {
        if let Ok(target @ Target::Fifo(_)) = parse_target(uri) {
            if let Ok(Some(w)) = open_output(&target, &mut HeldOutputs::default()) {
                held.push(w);
            }
        }
    }
    held
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_outputs_keep_a_fifo_reader_from_end_of_file() {
        use std::io::Read;
        let dir = tempfile::tempdir().unwrap();
        let o = dir.path().join("out");
        nix::unistd::mkfifo(&o, nix::sys::stat::Mode::from_bits(0o600).unwrap()).unwrap();
        let mut reader = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&o)
            .unwrap();
        let paths = StdioPaths {
            stdout: o.display().to_string(),
            ..Default::default()
        };
        let first = OpenOptions::new().write(true).open(&o).unwrap();
        let held = hold_outputs(&paths);
        assert_eq!(held.len(), 1);
        drop(first); // the old sandbox goes
        let mut buf = [0u8; 8];
        // With a writer held, an empty fifo reads "would block", not end-of-file.
        assert_eq!(
            reader.read(&mut buf).unwrap_err().kind(),
            std::io::ErrorKind::WouldBlock
        );
        drop(held);
        assert_eq!(
            reader.read(&mut buf).unwrap(),
            0,
            "end-of-file once nothing holds it"
        );
    }
}
