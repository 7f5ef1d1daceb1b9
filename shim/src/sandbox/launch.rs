//! Making a sandbox with its init's stdio: by `runsc create` (Create) or by restoring a
//! checkpoint (Start of a restore, or the 2022 runsc's snapshot, which replaces the source).

use chalk_runtime::bundle;
use std::{path::Path, sync::atomic::Ordering, time::Duration};

use chalk_runtime::{
    runsc::{MemoryLoad, ProcessStdio},
    terminal::TerminalState,
};

use super::Sandboxes;
use crate::container::Container;
use crate::{
    errors::{Result, ShimError},
    io::{self, ConsoleSocket, StdioPaths},
};

/// How long runsc may take to hand over a terminal.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);

/// How a sandbox comes to be.
pub enum Launch<'a> {
    Create,
    /// From the checkpoint in `image`; `previous` is the IO of the sandbox it replaces, when it
    /// replaces one under the same id (its terminal's state carries over). A fork or resume
    /// gives its new terminal `terminal` (from the snapshot, with the last ResizePty's size).
    Restore {
        image: &'a Path,
        previous: Option<&'a io::ProcessIo>,
        terminal: Option<TerminalState>,
        /// Where the keys of its terminal that raise signals go (runsc delivers none).
        signals: Option<io::TerminalSignals>,
        /// How its memory loads (runsc's `--background` and `--share-pages`).
        memory: MemoryLoad,
    },
}

impl Launch<'_> {
    fn name(&self) -> &'static str {
        match self {
            Launch::Create => "create",
            Launch::Restore { .. } => "restore",
        }
    }
}

impl Sandboxes {
    /// Makes the sandbox of `c` with its init's stdio; returns the sandbox pid and the IO the
    /// shim holds for it. Takes no lock.
    pub(super) fn launch_sandbox(
        &self,
        c: &Container,
        stdio: &StdioPaths,
        how: Launch,
    ) -> Result<(i32, io::ProcessIo)> {
        let pid_file = c.init_pid_path();
        let _ = std::fs::remove_file(&pid_file);
        let ctx = self.log_context(&c.id);
        let open_err =
            |e: std::io::Error| ShimError::InvalidArgument(format!("open stdio of {}: {e}", c.id));
        let (runtime_stdio, console, mut pio) = if stdio.terminal {
            let socket =
                ConsoleSocket::new().map_err(|e| ShimError::failed("console socket", e))?;
            (
                ProcessStdio::default(),
                Some(socket),
                io::ProcessIo::default(),
            )
        } else if c.in_pod() {
            // runsc gives a pod container its stdio at start (see pod.rs).
            (ProcessStdio::default(), None, io::ProcessIo::default())
        } else {
            let previous = match &how {
                Launch::Restore { previous, .. } => *previous,
                Launch::Create => None,
            };
            let (s, pio) = io::open_plain(stdio, &ctx, previous).map_err(open_err)?;
            (s, None, pio)
        };
        let socket_path = console.as_ref().map(|s| s.path());
        match &how {
            Launch::Create => {
                c.runtime
                    .create(&c.id, &c.bundle, &pid_file, runtime_stdio, socket_path)?
            }
            Launch::Restore { image, memory, .. } => {
                c.runtime.restore(
                    &c.id,
                    &c.bundle,
                    image,
                    &pid_file,
                    runtime_stdio,
                    socket_path,
                    *memory,
                )?;
                c.restored.store(true, Ordering::Relaxed);
            }
        }
        let pid = bundle::read_pid(&pid_file).ok_or_else(|| {
            ShimError::Internal(format!(
                "runsc {} {} wrote no pid to {}",
                how.name(),
                c.id,
                pid_file.display()
            ))
        })?;
        if let Some(console) = console {
            let master = console
                .receive(START_TIMEOUT)
                .map_err(|e| ShimError::failed(format!("terminal of {}", c.id), e))?;
            pio = match how {
                Launch::Create => {
                    let size =
                        bundle::read_spec(&c.bundle).and_then(|s| io::console_size(&s["process"]));
                    if let Some((w, h)) = size {
                        let _ = io::set_size(&master, w, h);
                    }
                    io::attach_console(stdio, master, &ctx, None)
                }
                Launch::Restore {
                    previous: Some(previous),
                    signals,
                    ..
                } => io::reattach_console(stdio, master, &ctx, previous, signals),
                Launch::Restore {
                    previous: None,
                    terminal,
                    signals,
                    ..
                } => {
                    // Before any input: keys typed into default settings would echo twice.
                    if let Some(t) = &terminal {
                        if let Err(e) = t.apply(&master) {
                            log::warn!("container {}: terminal settings not restored: {e}", c.id);
                        }
                    }
                    io::attach_console(stdio, master, &ctx, signals)
                }
            }
            .map_err(open_err)?;
        }
        Ok((pid, pio))
    }
}
