//! `chalkctl attach`: this terminal on a sandbox's init, through its stdio keeper: what it
//! prints comes out here, keys typed here go to it (raw mode, so Ctrl-C reaches its terminal),
//! its window follows this one's, and Ctrl-P Ctrl-Q detaches, leaving it running. Works the
//! same on forks and resumed sandboxes: each has a keeper of its own.

use std::{
    io::{Read, Write},
    sync::mpsc,
    time::Duration,
};

use nix::sys::signal::Signal;

use crate::{
    containerd::spec_of,
    containerd::Client,
    stdio::{detach::Detach, keeper, state::SandboxDir, tty},
    Error, Result,
};

/// How a session ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    /// Ctrl-P Ctrl-Q (or a signal to chalkctl): the sandbox runs on.
    Detached,
    /// The init exited with this status (None: not known).
    Exited(Option<u32>),
    /// The sandbox was suspended.
    Suspended,
}

enum Event {
    Detach,
    Output,
}

/// Attaches to sandbox `id`, kept in `dir`. Call [`tty::block_session_signals`] first.
pub fn attach(client: &Client, dir: &SandboxDir, id: &str) -> Result<Ended> {
    let container = client.container(id)?;
    if !keeper::running(dir) {
        let status = client.task_status(id)?.map(|(s, _)| s);
        return Err(match status {
            Some(s) if s == "running" || s == "paused" => format!(
                "sandbox {id} is {s} but chalkctl does not keep its stdio (it was not started \
                 by chalkctl run, fork or resume): use ctr task attach"
            ),
            Some(s) => format!("sandbox {id} is {s}: there is nothing to attach to"),
            None if container.labels.contains_key(chalk_labels::SUSPENDED_FROM) => {
                format!("sandbox {id} is suspended: chalkctl resume --id {id}, then attach")
            }
            None => format!("sandbox {id} is not running: there is nothing to attach to"),
        }
        .into());
    }
    let stream = keeper::connect(dir)
        .map_err(|e| Error::from(format!("attach to the stdio keeper of {id}: {e}")))?;
    let terminal = spec_of(&container)["process"]["terminal"]
        .as_bool()
        .unwrap_or(false);
    let resize = || {
        if let Some((cols, rows)) = tty::my_window_size() {
            let _ = client.resize_pty(id, cols, rows);
        }
    };
    if terminal {
        resize();
    }
    let raw = if terminal {
        tty::RawMode::stdin()
    } else {
        None
    };
    let (tx, rx) = mpsc::channel();
    let mut output = stream.try_clone().map_err(|e| Error::from(e.to_string()))?;
    let out_tx = tx.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        let mut stdout = std::io::stdout();
        loop {
            match output.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let _ = stdout.write_all(&buf[..n]).and_then(|_| stdout.flush());
                }
            }
        }
        let _ = out_tx.send(Event::Output);
    });
    let mut input = stream.try_clone().map_err(|e| Error::from(e.to_string()))?;
    // Not joined: a read of this side's stdin may never return.
    std::thread::spawn(move || {
        let mut keys = Detach::default();
        let mut buf = [0u8; 1024];
        let mut stdin = std::io::stdin();
        loop {
            match stdin.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    let scanned = keys.scan(&buf[..n]);
                    if input.write_all(&scanned.forward).is_err() {
                        return;
                    }
                    if scanned.detach {
                        let _ = tx.send(Event::Detach);
                        return;
                    }
                }
            }
        }
    });
    let event = loop {
        if let Ok(ev) = rx.try_recv() {
            break ev;
        }
        match tty::next_signal(Duration::from_millis(100)) {
            Some(Signal::SIGWINCH) if terminal => resize(),
            Some(Signal::SIGWINCH) | None => {}
            // Without a raw terminal, Ctrl-C is chalkctl's: it detaches.
            Some(_) => break Event::Detach,
        }
    };
    drop(raw);
    let _ = stream.shutdown(std::net::Shutdown::Both);
    Ok(match event {
        Event::Detach => Ended::Detached,
        Event::Output => {
            // The keeper writes the exit status before it lets its clients go; a suspend
            // labels the sandbox just after its task stopped.
            for _ in 0..10 {
                let suspended = client
                    .container(id)
                    .is_ok_and(|c| c.labels.contains_key(chalk_labels::SUSPENDED_FROM));
                if suspended {
                    return Ok(Ended::Suspended);
                }
                if matches!(client.task_status(id), Ok(None)) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            Ended::Exited(keeper::exit_status(dir))
        }
    })
}
