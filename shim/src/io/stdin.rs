//! The stdin copier: containerd's stdin fifo into the process's stdin pipe or pty master.

use std::{
    fs::File,
    io,
    io::{Read, Write},
    sync::{Arc, Mutex},
};

use chalk_runtime::terminal::{signals_in, TerminalState};

use super::targets::{parse_target, Target};

/// Called with each signal that typing into a restored sandbox's terminal raises (runsc
/// delivers none there: see `chalk_runtime::terminal`).
pub type TerminalSignals = Arc<dyn Fn(i32) + Send + Sync>;

/// Where a terminal's stdin copier finds its [`TerminalSignals`]: set once the sandbox has
/// been restored (a copier outlives an in-place restore).
pub(super) type SignalSlot = Arc<Mutex<Option<TerminalSignals>>>;

/// Where stdin bytes go: the process's stdin pipe or a pty master. CloseIO empties it.
pub(super) type StdinSink = Arc<Mutex<Option<File>>>;

/// Copies containerd's stdin fifo into `sink` on a thread of its own. The fifo is opened in
/// blocking mode, which waits for containerd's writer, so the process sees EOF exactly when
/// containerd closes its end (or when CloseIO empties the sink), never before it connects.
/// With `signals`, the sink is a terminal: keys that raise a signal under its settings of
/// the moment are reported (after they are written, as a terminal echoes them first).
pub(super) fn spawn_stdin_copier(
    uri: &str,
    sink: StdinSink,
    signals: Option<SignalSlot>,
) -> io::Result<()> {
    let source = match parse_target(uri)? {
        Target::None => return Ok(()),
        Target::Fifo(path) | Target::File(path) => path,
        Target::Binary(_) => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "stdin cannot come from a logging binary",
            ))
        }
    };
    std::thread::Builder::new()
        .name("stdin".into())
        .spawn(move || {
            if let Ok(mut fifo) = File::open(&source) {
                let mut buf = [0u8; 32 * 1024];
                loop {
                    let n = match fifo.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    // Write through a duplicate, outside the lock: a process that does not read
                    // its stdin must not make CloseIO (which takes the lock) wait.
                    let out = match sink.lock().unwrap().as_ref().map(File::try_clone) {
                        Some(Ok(out)) => out,
                        _ => break,
                    };
                    let report = signals.as_ref().and_then(|s| s.lock().unwrap().clone());
                    let raised = match (&report, TerminalState::read(&out)) {
                        (Some(_), Ok(t)) => signals_in(&buf[..n], t.lflag, &t.cc),
                        _ => Vec::new(),
                    };
                    if (&out).write_all(&buf[..n]).is_err() {
                        break;
                    }
                    if let Some(report) = report {
                        raised.into_iter().for_each(|sig| report(sig));
                    }
                }
            }
            sink.lock().unwrap().take();
        })?;
    Ok(())
}
