//! The keeper: one small chalkctl process per sandbox whose stdio chalkctl keeps (`run`,
//! `fork`, `resume`). It makes the init's fifos and holds them open read-write (a restore's
//! reopen never reads as the end), writes what the sandbox prints to its bounded log and to
//! every attached client, writes what a client types to the init's stdin, and ends once the
//! init has exited, leaving the log and the exit status. containerd's CRI keeps logs through
//! its shim's fifos the same way; chalkctl has no daemon, so each sandbox has one of these.
//!
//! Starting one is a handshake: the keeper prints `ready` once its fifos are open, the
//! command creates the task on them and writes `go`; if the command fails or dies first, the
//! keeper sees its stdin close and removes what it made.

use std::{
    fs::File,
    io::{BufRead, BufReader, Read, Write},
    os::unix::{
        fs::OpenOptionsExt,
        net::{UnixListener, UnixStream},
    },
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Stdio as Piped},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use nix::fcntl::{Flock, FlockArg};
use serde_json::{json, Value};

use super::{
    log::{BoundedLog, MAX_BYTES},
    pump::pump,
    state::{self, SandboxDir},
};
use crate::{
    containerd::{Client, Stdio},
    Error, Result,
};

/// How to start keepers: this chalkctl, its containerd and namespace, its state root.
#[derive(Clone, Debug)]
pub struct Keeping {
    pub exe: PathBuf,
    pub address: String,
    pub namespace: String,
    pub root: PathBuf,
}

/// A keeper started and ready, until [`Keeper::go`].
pub struct Keeper {
    child: Child,
    stdin: Option<ChildStdin>,
    dir: SandboxDir,
    terminal: bool,
}

impl Keeping {
    pub fn dir(&self, id: &str) -> Result<SandboxDir> {
        state::sandbox_dir(&self.root, &self.namespace, id)
    }

    /// Starts the keeper of sandbox `id` (whose init has a terminal when `terminal`) and
    /// waits for its fifos.
    pub fn start(&self, id: &str, terminal: bool) -> Result<Keeper> {
        let dir = self.dir(id)?;
        // The keeper of the task before (a suspend's) may still be draining its output.
        let deadline = Instant::now() + Duration::from_secs(15);
        while running(&dir) {
            if Instant::now() >= deadline {
                return Err(format!(
                    "sandbox {id} already has a stdio keeper: a sandbox of this id is running"
                )
                .into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let mut cmd = std::process::Command::new(&self.exe);
        cmd.args(["--address", &self.address, "--namespace", &self.namespace])
            .arg("--state-dir")
            .arg(&self.root)
            .args(["keep", "--id", id]);
        if terminal {
            cmd.arg("--terminal");
        }
        cmd.stdin(Piped::piped())
            .stdout(Piped::piped())
            .stderr(Piped::null());
        crate::detached::in_own_session(&mut cmd);
        let mut child = cmd
            .spawn()
            .map_err(|e| Error::from(format!("start the stdio keeper of {id}: {e}")))?;
        let mut line = String::new();
        if let Some(out) = child.stdout.take() {
            let _ = BufReader::new(out).read_line(&mut line);
        }
        let stdin = child.stdin.take();
        if line.trim() != "ready" {
            drop(stdin);
            let _ = child.wait();
            let why = line.trim().strip_prefix("error: ").unwrap_or(line.trim());
            return Err(format!(
                "the stdio keeper of {id} did not start: {}",
                if why.is_empty() { "it exited" } else { why }
            )
            .into());
        }
        Ok(Keeper {
            child,
            stdin,
            dir,
            terminal,
        })
    }
}

impl Keeper {
    /// What the task is created with.
    pub fn stdio(&self) -> Stdio {
        Stdio {
            stdin: if self.terminal {
                self.dir.stdin().display().to_string()
            } else {
                String::new()
            },
            stdout: self.dir.stdout().display().to_string(),
            stderr: if self.terminal {
                String::new()
            } else {
                self.dir.stderr().display().to_string()
            },
            terminal: self.terminal,
        }
    }

    /// The task runs on the fifos: the keeper goes on by itself.
    pub fn go(mut self) {
        if let Some(mut stdin) = self.stdin.take() {
            let _ = stdin.write_all(b"go\n");
        }
    }
}

impl Drop for Keeper {
    /// Without [`Keeper::go`]: the keeper removes what it made; waited for, so that nothing
    /// of it is left when the failed command returns.
    fn drop(&mut self) {
        if let Some(stdin) = self.stdin.take() {
            drop(stdin);
            let _ = self.child.wait();
        }
    }
}

impl Keeping {
    /// Removes what an earlier sandbox of this id left (removed by ctr, not chalkctl rm): it
    /// is not a new one's log. A suspended sandbox's stays (its container is still there).
    pub fn clear_stale(&self, client: &Client, id: &str) -> Result<()> {
        let dir = self.dir(id)?;
        if !running(&dir) && matches!(client.container(id), Err(e) if e.is_not_found()) {
            dir.remove()?;
        }
        Ok(())
    }
}

/// Runs `make` (which creates and starts sandbox `id`'s task) on the stdio of a keeper
/// started for it when `keep` is given, on none otherwise; the keeper goes on once `make`
/// succeeds and removes what it made when it fails.
pub fn kept<T>(
    keep: Option<&Keeping>,
    id: &str,
    terminal: bool,
    make: impl FnOnce(Option<(&Stdio, Option<(u32, u32)>)>) -> Result<T>,
) -> Result<T> {
    let Some(keep) = keep else {
        return make(None);
    };
    let keeper = keep.start(id, terminal)?;
    let io = keeper.stdio();
    let made = make(Some((&io, None)))?;
    keeper.go();
    Ok(made)
}

/// As [`kept`] for a new sandbox `id`: what an earlier one of that id left goes first.
pub fn with_keeper<T>(
    client: &Client,
    keep: Option<&Keeping>,
    id: &str,
    terminal: bool,
    make: impl FnOnce(Option<(&Stdio, Option<(u32, u32)>)>) -> Result<T>,
) -> Result<T> {
    if let Some(k) = keep {
        k.clear_stale(client, id)?;
    }
    kept(keep, id, terminal, make)
}

/// Removes what chalkctl kept of sandboxes that are gone (removed with ctr or by their
/// lifetime, not chalkctl rm): their logs live as long as their containers. Best effort.
pub fn sweep(client: &Client, keep: &Keeping) {
    let ns = keep.root.join(&keep.namespace);
    let Ok(entries) = std::fs::read_dir(&ns) else {
        return;
    };
    let Ok(containers) = client.containers() else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if containers.iter().any(|c| c.id == name) {
            continue;
        }
        // A sandbox being made has its directory before its container: only old ones go.
        let young = entry
            .metadata()
            .and_then(|m| m.modified())
            .is_ok_and(|t| t.elapsed().unwrap_or_default() < Duration::from_secs(60));
        if young {
            continue;
        }
        if let Ok(dir) = keep.dir(&name) {
            if !running(&dir) {
                let _ = dir.remove();
            }
        }
    }
}

/// Waits (up to 10 s) for the keeper of `dir` to end: it ends with its sandbox's task.
pub fn wait_ended(dir: &SandboxDir) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while running(dir) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Whether a keeper runs for `dir` (it holds the lock).
pub fn running(dir: &SandboxDir) -> bool {
    let Ok(f) = File::open(dir.lock()) else {
        return false;
    };
    Flock::lock(f, FlockArg::LockSharedNonblock).is_err()
}

/// The init's exit status as the keeper recorded it: None when it has not ended (or ended
/// without one being known).
pub fn exit_status(dir: &SandboxDir) -> Option<u32> {
    let text = std::fs::read(dir.exit()).ok()?;
    let v: Value = serde_json::from_slice(&text).ok()?;
    v["exit_status"].as_u64().map(|s| s as u32)
}

/// Connects to the keeper of `dir`: what the sandbox prints comes out of the stream, what is
/// written to it goes to the init's stdin.
pub fn connect(dir: &SandboxDir) -> std::io::Result<UnixStream> {
    let d = File::open(dir.path())?;
    UnixStream::connect(state::socket_path(&d, &dir.socket()))
}

/// Everything the keeper holds open.
struct Held {
    dir: SandboxDir,
    _lock: Flock<File>,
    stdin: Option<File>,
    outputs: Vec<File>,
    listener: UnixListener,
}

fn open_rw(path: &Path) -> Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| Error::from(format!("open {}: {e}", path.display())))
}

/// Makes and opens what the task will be created with.
fn prepare(dir: SandboxDir, terminal: bool) -> Result<Held> {
    dir.make()?;
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(dir.lock())
        .map_err(|e| Error::from(format!("open {}: {e}", dir.lock().display())))?;
    // Its starter waited for an earlier keeper of this id to end; another may start now.
    let deadline = Instant::now() + Duration::from_secs(1);
    let mut lock = lock;
    let lock = loop {
        match Flock::lock(lock, FlockArg::LockExclusiveNonblock) {
            Ok(l) => break l,
            Err((f, _)) if Instant::now() < deadline => {
                lock = f;
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(_) => {
                return Err(format!(
                    "another stdio keeper of {} still runs",
                    dir.path().display()
                )
                .into())
            }
        }
    };
    let _ = std::fs::remove_file(dir.exit());
    let _ = std::fs::remove_file(dir.socket());
    let mut outputs = Vec::new();
    state::fifo(&dir.stdout())?;
    outputs.push(open_rw(&dir.stdout())?);
    let stdin = if terminal {
        state::fifo(&dir.stdin())?;
        Some(open_rw(&dir.stdin())?)
    } else {
        state::fifo(&dir.stderr())?;
        outputs.push(open_rw(&dir.stderr())?);
        None
    };
    let d = File::open(dir.path()).map_err(|e| Error::from(e.to_string()))?;
    let listener = UnixListener::bind(state::socket_path(&d, &dir.socket()))
        .map_err(|e| Error::from(format!("listen on {}: {e}", dir.socket().display())))?;
    Ok(Held {
        dir,
        _lock: lock,
        stdin,
        outputs,
        listener,
    })
}

impl Held {
    /// Removes what the keeper made but the log and the exit status; the directory too when
    /// nothing else is in it (a run that never started).
    fn clean(&self) {
        for p in [
            self.dir.socket(),
            self.dir.stdin(),
            self.dir.stdout(),
            self.dir.stderr(),
            self.dir.lock(),
        ] {
            let _ = std::fs::remove_file(p);
        }
        let _ = std::fs::remove_dir(self.dir.path().join("exec"));
        let _ = std::fs::remove_dir(self.dir.path());
    }
}

/// The `keep` command: the keeper's whole life (see the module's comment).
pub fn serve(address: &str, namespace: &str, root: &Path, id: &str, terminal: bool) -> Result<()> {
    let dir = state::sandbox_dir(root, namespace, id)?;
    // Files it makes are the sandbox's: root only.
    // SAFETY: umask only sets the process's mask.
    unsafe { libc::umask(0o077) };
    let mut out = std::io::stdout();
    let held = match prepare(dir, terminal) {
        Ok(h) => h,
        Err(e) => {
            let _ = writeln!(out, "error: {e}");
            return Err(e);
        }
    };
    let _ = writeln!(out, "ready");
    let _ = out.flush();
    let mut line = String::new();
    let _ = std::io::stdin().lock().read_line(&mut line);
    if line.trim() != "go" {
        held.clean();
        return Ok(());
    }
    detach_stdio(&held.dir);
    keep(&held, address, namespace, id);
    held.clean();
    Ok(())
}

/// Points stdin and stdout at /dev/null and stderr at the keeper's own log: the command that
/// started it is gone.
fn detach_stdio(dir: &SandboxDir) {
    use std::os::fd::AsRawFd;
    let null = File::options().read(true).write(true).open("/dev/null");
    let log = File::options()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(dir.keeper_log());
    // SAFETY: dup2 onto the standard descriptors, from files open here.
    unsafe {
        if let Ok(null) = &null {
            libc::dup2(null.as_raw_fd(), 0);
            libc::dup2(null.as_raw_fd(), 1);
        }
        if let Ok(log) = &log {
            libc::dup2(log.as_raw_fd(), 2);
        }
    }
}

type Clients = Arc<Mutex<Vec<UnixStream>>>;

/// Pumps output and input until the init exits, then records its exit status.
fn keep(held: &Held, address: &str, namespace: &str, id: &str) {
    let log = match BoundedLog::open(&held.dir.log(), &held.dir.old_log(), MAX_BYTES) {
        Ok(l) => Arc::new(Mutex::new(l)),
        Err(e) => {
            eprintln!("keeper of {id}: open the log: {e}");
            wait_for_exit(address, namespace, id);
            return;
        }
    };
    let clients: Clients = Arc::default();
    let ended = Arc::new(AtomicBool::new(false));
    let mut pumps = Vec::new();
    for output in &held.outputs {
        let Ok(output) = output.try_clone() else {
            continue;
        };
        let (log, clients, ended) = (log.clone(), clients.clone(), ended.clone());
        pumps.push(std::thread::spawn(move || {
            pump(output, &ended, Duration::from_millis(300), |data| {
                if let Err(e) = log.lock().unwrap().write(data) {
                    eprintln!("keeper: write the log: {e}");
                }
                let mut all = clients.lock().unwrap();
                all.retain_mut(|c| c.write_all(data).is_ok());
            })
        }));
    }
    if let Ok(listener) = held.listener.try_clone() {
        let stdin = held.stdin.as_ref().and_then(|f| f.try_clone().ok());
        let clients = clients.clone();
        std::thread::spawn(move || accept(listener, stdin, clients));
    }
    let status = wait_for_exit(address, namespace, id);
    ended.store(true, Ordering::SeqCst);
    for p in pumps {
        let _ = p.join();
    }
    // Before the clients are let go: an attached one reads it when its stream ends.
    let _ = std::fs::write(
        held.dir.exit(),
        serde_json::to_vec(&json!({"exit_status": status, "at": crate::clock::now()}))
            .unwrap_or_default(),
    );
    for c in clients.lock().unwrap().drain(..) {
        let _ = c.shutdown(std::net::Shutdown::Both);
    }
}

/// Takes attaching clients: each gets the output from now on, and what it writes goes to the
/// init's stdin (dropped when the init has none).
fn accept(listener: UnixListener, stdin: Option<File>, clients: Clients) {
    for stream in listener.incoming().flatten() {
        let _ = stream.set_write_timeout(Some(Duration::from_secs(2)));
        let Ok(reader) = stream.try_clone() else {
            continue;
        };
        clients.lock().unwrap().push(stream);
        let stdin = stdin.as_ref().and_then(|f| f.try_clone().ok());
        std::thread::spawn(move || {
            let mut reader = reader;
            let mut buf = [0u8; 4096];
            loop {
                match reader.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        if let Some(mut s) = stdin.as_ref() {
                            if s.write_all(&buf[..n]).is_err() {
                                return;
                            }
                        }
                    }
                }
            }
        });
    }
}

/// Waits for the init of `id` to exit, through containerd restarts: its exit status, None
/// when its task is gone without one or containerd stays away for a minute.
fn wait_for_exit(address: &str, namespace: &str, id: &str) -> Option<u32> {
    let mut failing_since: Option<Instant> = None;
    loop {
        match Client::connect(address, namespace).and_then(|c| c.wait(id)) {
            Ok(status) => return status,
            Err(e) => {
                let since = *failing_since.get_or_insert_with(Instant::now);
                if since.elapsed() > Duration::from_secs(60) {
                    eprintln!("keeper of {id}: containerd is gone ({e}): giving up");
                    return None;
                }
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    }
}
