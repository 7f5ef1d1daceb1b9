//! Snapshots restored while their memory arrives: a pull that may go lazy fetches the small
//! files whole and hands `pages.img` to a server process of its own (`chalkctl serve-lazy`,
//! started here, outliving the command), which mounts a FUSE file over the store's
//! `lazy/<hex>/pages.img`, answers runsc's reads from pieces it fetches by HTTP range and
//! checks against the manifest's piece digests, fetches the rest in order meanwhile, and
//! makes the blob an ordinary store blob once the whole matches its digest. A piece that
//! does not match, or a registry that stops answering, fails the file: runsc's reads get
//! EIO, runsc kills the sandbox, and the shim reports why (from the store's `failed` note).
//!
//! FUSE rather than a file filled in the background: runsc reads pages.img with preadv at
//! any offset and cannot be told to wait for a range, and a page a process touches must jump
//! the queue; only a file system sees each read and can hold it until its bytes are here.

mod arrivals;
mod fetch;
mod from_pieces;
mod fuse;
pub mod serve;

use std::{
    io::{BufRead, BufReader, Write},
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use chalk_runtime::snapshot::pieces::Pieces;
use serde::{Deserialize, Serialize};

use super::auth::Credentials;
use crate::{Error, Result};

/// What a server is asked to serve, sent over its stdin (never argv or the environment: it
/// carries the registry credentials).
#[derive(Serialize, Deserialize)]
pub struct Job {
    pub store: PathBuf,
    /// The whole reference the snapshot was pulled by.
    pub reference: String,
    pub digest: String,
    pub size: u64,
    pub pieces: Pieces,
    /// The index over the file's pieces, for a snapshot pushed as pieces (else the file is
    /// fetched by range from blob `digest`).
    #[serde(default)]
    pub index: Option<chalk_runtime::snapshot::memory::MemoryIndex>,
    /// The snapshot's id: whether this host vouches for the packed form (and then reads the
    /// packs it kept unhashed) and where the memory's page digests go once all checked.
    #[serde(default)]
    pub snapshot_id: Option<String>,
    /// The digest of the packed form whose index the server puts the memory together by.
    #[serde(default)]
    pub packed: Option<String>,
    pub hosts_dir: PathBuf,
    pub plain_http: bool,
    /// The endpoint (host[:port]) the pull fetched from.
    pub endpoint: String,
    pub credentials: Option<(String, String)>,
    /// The pull's record, dropped if serving fails (its memory never arrived).
    pub record: Option<Record>,
    /// How long the server may serve: the whole blob is here by then, or serving fails.
    pub deadline_secs: u64,
}

#[derive(Serialize, Deserialize)]
pub struct Record {
    pub address: String,
    pub namespace: String,
    pub name: String,
}

impl Job {
    pub fn credentials(&self) -> Credentials {
        match &self.credentials {
            Some((user, password)) => Credentials::Basic {
                user: user.clone(),
                password: password.clone(),
            },
            None => Credentials::Anonymous,
        }
    }
}

/// Why this host cannot serve a file lazily (then the pull fetches it whole), if it cannot.
pub fn unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("only root mounts the FUSE file it needs".into());
    }
    if let Err(e) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
    {
        return Some(format!("/dev/fuse cannot be opened ({e})"));
    }
    None
}

/// Starts a server of `job` with program `exe` (chalkctl) and waits until it serves (until
/// `deadline` at most, when there is one): an error (the server's own reason) when it did not
/// start.
pub fn start(exe: &Path, job: &Job, deadline: Option<std::time::Instant>) -> Result<()> {
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("serve-lazy")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    crate::detached::in_own_session(&mut cmd);
    let mut child = cmd
        .spawn()
        .map_err(|e| Error::from(format!("start the server of pages.img: {e}")))?;
    let text = serde_json::to_vec(job).map_err(|e| Error::from(e.to_string()))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(&text)
            .map_err(|e| Error::from(format!("hand pages.img to its server: {e}")))?;
    }
    let (said, heard) = std::sync::mpsc::channel();
    if let Some(out) = child.stdout.take() {
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(out).read_line(&mut line);
            let _ = said.send(line);
        });
    }
    let heard = match deadline {
        Some(d) => heard.recv_timeout(d.saturating_duration_since(std::time::Instant::now())),
        None => heard
            .recv()
            .map_err(|_| std::sync::mpsc::RecvTimeoutError::Disconnected),
    };
    let line =
        heard.unwrap_or_else(|_| "error: it was not serving by the pull's time limit".into());
    if line.trim() == "ready" {
        // Reaped by init once this command ends; a zombie meanwhile.
        std::thread::spawn(move || child.wait());
        return Ok(());
    }
    let _ = child.kill();
    let _ = child.wait();
    let why = line.trim().strip_prefix("error: ").unwrap_or(line.trim());
    Err(Error::from(if why.is_empty() {
        "its server ended before serving".to_string()
    } else {
        why.to_string()
    }))
}

/// How long one read of runsc's may wait for its pieces: past it, the registry is taken as
/// gone and the sandbox ends (nothing in runsc or the kernel bounds such a read).
pub const READ_WAIT: Duration = Duration::from_secs(60);

/// How long a server of a blob of `size` bytes may live: five minutes, and a second per MiB
/// (a registry slower than that is taken as gone), whatever the pull's own limit was.
pub fn deadline_secs(size: u64) -> u64 {
    300 + size / (1 << 20)
}
