//! The server's sandboxes and what a page can do with them: launch, split (snapshot while
//! running, fork into a new sandbox, delete the snapshot), suspend, resume, close. Every
//! containerd call goes through chalkctl's library on a blocking thread, each operation
//! with a client (and so a lease) of its own.

use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use chalk_client::{
    containerd::{Client, Stdio},
    ops::{
        fork::{self, ForkOptions},
        resume, run, snapshot,
    },
    progress::Progress,
    records::{registry, snapshots},
};
use serde_json::{json, Value};
use tokio::{net::unix::pipe, sync::broadcast, task::JoinHandle};

use crate::{
    limits::{self, Limits},
    procs,
    replay::Replay,
    terminal::{self, Ends, Fifos},
};

/// On every container the server makes, its value the server's state directory (one per
/// server): what a server reclaims at start is only its own.
pub const OWNER_LABEL: &str = chalk_labels::WEB_OWNER_LABEL;
/// On every snapshot the server takes: the sandbox it was taken for (deleted when unused)...
const SNAPSHOT_LABEL: &str = "chalk-web";
/// ... and the server that took it (its state directory).
const SNAPSHOT_SERVER_LABEL: &str = "chalk-web-server";
const REPLAY_BYTES: usize = 256 * 1024;
/// How long an exited sandbox stays listed (its exit code shown) before it is forgotten.
const EXITED_KEPT: Duration = Duration::from_secs(600);

pub struct Config {
    pub address: String,
    pub namespace: String,
    pub runtime_config: Option<PathBuf>,
    pub image: String,
    pub snapshotter: String,
    pub state_dir: PathBuf,
    pub limits: Limits,
    pub token: Option<String>,
}

/// An error for the page: its HTTP status and what to do.
#[derive(Debug)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
}

impl ApiError {
    pub fn new(status: u16, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
        }
    }
}

impl From<chalk_client::Error> for ApiError {
    fn from(e: chalk_client::Error) -> Self {
        ApiError::new(500, e.to_string())
    }
}

type ApiResult<T> = Result<T, ApiError>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Starting,
    Running,
    Suspended,
    Exited,
}

impl State {
    fn as_str(self) -> &'static str {
        match self {
            State::Starting => "starting",
            State::Running => "running",
            State::Suspended => "suspended",
            State::Exited => "exited",
        }
    }
}

/// What the terminal's websocket forwards: bytes the sandbox printed, or a state change.
#[derive(Clone)]
pub enum Out {
    Bytes(Arc<[u8]>),
    Event(String),
}

/// A running task's terminal: its fifos and the pump reading them.
struct Attached {
    _fifos: Fifos,
    input: Arc<pipe::Sender>,
    pump: JoinHandle<()>,
}

impl Drop for Attached {
    fn drop(&mut self) {
        self.pump.abort();
    }
}

struct Inner {
    state: State,
    /// The operation under way (`splitting`, `suspending`, `resuming`, `closing`).
    busy: Option<&'static str>,
    /// Counts the sandbox's tasks: an exit seen by a watcher of an older task is not this one's.
    task: u64,
    pid: u32,
    exit_code: Option<u32>,
    exited_at: Option<Instant>,
    size: (u32, u32),
    replay: Replay,
    attached: Option<Attached>,
    expires_at: Option<String>,
    /// The suspend snapshot's id, and since when.
    suspended: Option<(String, Instant)>,
    split: Option<Value>,
    suspend: Option<Value>,
    resume: Option<Value>,
}

pub struct Entry {
    pub id: String,
    pub owner: String,
    pub parent: Option<String>,
    tx: broadcast::Sender<Out>,
    inner: Mutex<Inner>,
}

impl Entry {
    fn new(id: String, owner: &str, parent: Option<String>, size: (u32, u32)) -> Arc<Self> {
        Arc::new(Entry {
            id,
            owner: owner.to_string(),
            parent,
            tx: broadcast::channel(1024).0,
            inner: Mutex::new(Inner {
                state: State::Starting,
                busy: None,
                task: 0,
                pid: 0,
                exit_code: None,
                exited_at: None,
                size,
                replay: Replay::new(REPLAY_BYTES),
                attached: None,
                expires_at: None,
                suspended: None,
                split: None,
                suspend: None,
                resume: None,
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What the page shows of the sandbox.
    pub fn view(&self) -> Value {
        let i = self.lock();
        json!({
            "id": self.id,
            "parent": self.parent,
            "state": i.state.as_str(),
            "busy": i.busy,
            "pid": i.pid,
            "exit_code": i.exit_code,
            "expires_at": i.expires_at,
            "cols": i.size.0,
            "rows": i.size.1,
            "split": i.split,
            "suspend": i.suspend,
            "resume": i.resume,
            "processes": procs::runsc_processes(&self.id),
        })
    }

    fn announce(&self) {
        let event = json!({"type": "state", "sandbox": self.view()}).to_string();
        let _ = self.tx.send(Out::Event(event));
    }

    /// The screen so far and what comes after it, with nothing lost or repeated between.
    pub fn subscribe(&self) -> (Vec<u8>, broadcast::Receiver<Out>) {
        let i = self.lock();
        (i.replay.contents(), self.tx.subscribe())
    }

    pub fn input(&self) -> Option<Arc<pipe::Sender>> {
        self.lock().attached.as_ref().map(|a| a.input.clone())
    }

    pub fn set_size(&self, cols: u32, rows: u32) -> bool {
        let mut i = self.lock();
        i.size = (cols, rows);
        i.state == State::Running
    }

    fn output(&self, bytes: &[u8]) {
        self.lock().replay.push(bytes);
        let _ = self.tx.send(Out::Bytes(bytes.into()));
    }

    /// Marks an operation under way, refused unless the sandbox is in state `want`.
    fn begin(&self, what: &'static str, want: State) -> ApiResult<()> {
        let mut i = self.lock();
        if let Some(busy) = i.busy {
            return Err(ApiError::new(
                409,
                format!("sandbox {} is {busy}: wait for that to finish", self.id),
            ));
        }
        if i.state != want {
            return Err(ApiError::new(
                409,
                format!(
                    "sandbox {} is {}, and only a {} one can be {what}",
                    self.id,
                    i.state.as_str(),
                    want.as_str()
                ),
            ));
        }
        i.busy = Some(what);
        Ok(())
    }

    fn end(&self) {
        self.lock().busy = None;
        self.announce();
    }

    /// Connects a started task: its output pumped into the replay and to every page.
    fn attach(self: &Arc<Self>, ends: Ends, pid: u32) -> u64 {
        let me = self.clone();
        let pump = tokio::spawn(terminal::pump(ends.output, move |b| me.output(b)));
        let mut i = self.lock();
        i.task += 1;
        i.pid = pid;
        i.state = State::Running;
        i.suspended = None;
        i.attached = Some(Attached {
            _fifos: ends.fifos,
            input: ends.input,
            pump,
        });
        i.task
    }
}

pub struct App {
    pub cfg: Config,
    /// For quick calls (a window size); operations connect their own.
    control: Arc<Client>,
    entries: Mutex<HashMap<String, Arc<Entry>>>,
}

/// `n` random bytes from the kernel, as hex.
pub fn random_hex(n: usize) -> String {
    let mut b = vec![0u8; n];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = std::io::Read::read_exact(&mut f, &mut b);
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A new sandbox id: `web-` and 8 random hex digits.
fn new_id() -> String {
    format!("web-{}", random_hex(4))
}

fn millis(since: Instant) -> u64 {
    since.elapsed().as_millis() as u64
}

/// Runs blocking chalkctl work off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> ApiResult<T> + Send + 'static,
) -> ApiResult<T> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(ApiError::new(500, format!("internal error: {e}"))))
}

impl App {
    /// Connects to containerd (call it outside the async runtime: the client blocks).
    pub fn new(cfg: Config) -> chalk_client::Result<Arc<Self>> {
        let mut control = Client::connect(&cfg.address, &cfg.namespace)?;
        if let Some(c) = &cfg.runtime_config {
            control.set_config(c.clone());
        }
        let image = control.image(&cfg.image).map_err(|e| {
            chalk_client::Error::from(format!(
                "{e} (the sandboxes' image {} must be in namespace {}: import or pull it, or \
                 pass --image)",
                cfg.image, cfg.namespace
            ))
        })?;
        drop(image);
        Ok(Arc::new(App {
            cfg,
            control: Arc::new(control),
            entries: Mutex::new(HashMap::new()),
        }))
    }

    /// The value of this server's labels: its state directory.
    fn owner(&self) -> String {
        self.cfg.state_dir.display().to_string()
    }

    /// The labels of a snapshot taken for sandbox `for_id`.
    fn snapshot_labels(&self, for_id: &str) -> Vec<(String, String)> {
        vec![
            (SNAPSHOT_LABEL.to_string(), for_id.to_string()),
            (SNAPSHOT_SERVER_LABEL.to_string(), self.owner()),
        ]
    }

    fn client(&self) -> ApiResult<Client> {
        let mut c = Client::connect(&self.cfg.address, &self.cfg.namespace)?;
        if let Some(path) = &self.cfg.runtime_config {
            c.set_config(path.clone());
        }
        Ok(c)
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Entry>>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sandbox `id` when it is `owner`'s (another client's reads as absent).
    pub fn get(&self, owner: &str, id: &str) -> ApiResult<Arc<Entry>> {
        self.map()
            .get(id)
            .filter(|e| e.owner == owner)
            .cloned()
            .ok_or_else(|| ApiError::new(404, format!("no sandbox {id} of yours here")))
    }

    pub fn list(&self, owner: &str) -> Vec<Value> {
        let mut entries: Vec<Arc<Entry>> = self
            .map()
            .values()
            .filter(|e| e.owner == owner)
            .cloned()
            .collect();
        entries.sort_by(|a, b| a.id.cmp(&b.id));
        entries.iter().map(|e| e.view()).collect()
    }

    /// A new entry for `owner`, within the limits (counted with it, under one lock).
    fn reserve(
        &self,
        owner: &str,
        parent: Option<String>,
        size: (u32, u32),
    ) -> ApiResult<Arc<Entry>> {
        let mut map = self.map();
        let live: Vec<&Arc<Entry>> = map
            .values()
            .filter(|e| e.lock().state != State::Exited)
            .collect();
        let mine = live.iter().filter(|e| e.owner == owner).count();
        limits::admit(&self.cfg.limits, live.len(), mine).map_err(|m| ApiError::new(429, m))?;
        let entry = Entry::new(new_id(), owner, parent, size);
        map.insert(entry.id.clone(), entry.clone());
        Ok(entry)
    }

    fn forget(&self, id: &str) {
        self.map().remove(id);
    }

    /// The fifos of the next task of `entry`, opened.
    fn ends(&self, entry: &Entry) -> ApiResult<Ends> {
        let task = entry.lock().task + 1;
        Fifos::make(&self.cfg.state_dir, &format!("{}.{task}", entry.id))
            .and_then(Ends::open)
            .map_err(|e| {
                ApiError::new(
                    500,
                    format!(
                        "make the terminal's fifos in {}: {e}",
                        self.cfg.state_dir.display()
                    ),
                )
            })
    }

    /// The spec of a new sandbox: the image's, its init a shell on a terminal, with this
    /// server's memory limit and lifetime (destroyed when it ends).
    fn spec(&self, id: &str, config: &Value) -> chalk_client::Result<Value> {
        let lifetime = format!("{}s", self.cfg.limits.lifetime.as_secs());
        let mut spec = run::spec(
            id,
            config,
            (Some(&lifetime), Some("destroy")),
            &["/bin/sh".into()],
        )?;
        spec["process"]["terminal"] = true.into();
        if let Some(env) = spec["process"]["env"].as_array_mut() {
            env.retain(|e| {
                !e.as_str()
                    .is_some_and(|e| e.starts_with("TERM=") || e.starts_with("HOME="))
            });
            env.push("TERM=xterm-256color".into());
            env.push("HOME=/root".into());
        }
        spec["process"]["cwd"] = "/root".into();
        spec["linux"]["resources"] = json!({"memory": {"limit": self.cfg.limits.memory}});
        spec["linux"]["cgroupsPath"] = format!("/chalk-web/{id}").into();
        Ok(spec)
    }

    /// Launches a shell in a new sandbox for `owner`, its terminal `size`.
    pub async fn launch(self: &Arc<Self>, owner: &str, size: (u32, u32)) -> ApiResult<Value> {
        let entry = self.reserve(owner, None, size)?;
        let made = self.start_new(&entry, size).await;
        match made {
            Ok(()) => Ok(entry.view()),
            Err(e) => {
                self.forget(&entry.id);
                Err(e)
            }
        }
    }

    async fn start_new(self: &Arc<Self>, entry: &Arc<Entry>, size: (u32, u32)) -> ApiResult<()> {
        let ends = self.ends(entry)?;
        let stdio = ends.fifos.stdio();
        let (app, id) = (self.clone(), entry.id.clone());
        let (pid, expires) = blocking(move || {
            let mut client = app.client()?;
            let labels = HashMap::from([(OWNER_LABEL.to_string(), app.owner())]);
            let image = app.cfg.image.clone();
            let snapshotter = app.cfg.snapshotter.clone();
            let pid = run::create(
                &mut client,
                &image,
                &id,
                &snapshotter,
                labels,
                |config| app.spec(&id, config),
                Some((&stdio, Some(size))),
            )?;
            Ok((pid, expires_at(&client, &id)))
        })
        .await?;
        let task = entry.attach(ends, pid);
        entry.lock().expires_at = expires;
        self.watch(entry.clone(), task);
        entry.announce();
        Ok(())
    }

    /// Splits `id`: snapshots it while it runs, forks the snapshot into a new sandbox (its
    /// terminal `size`), then deletes the snapshot. The source runs on whatever happens.
    pub async fn split(
        self: &Arc<Self>,
        owner: &str,
        id: &str,
        size: (u32, u32),
    ) -> ApiResult<Value> {
        let source = self.get(owner, id)?;
        source.begin("splitting", State::Running)?;
        let split = self.split_into(&source, owner, size).await;
        source.end();
        split
    }

    async fn split_into(
        self: &Arc<Self>,
        source: &Arc<Entry>,
        owner: &str,
        size: (u32, u32),
    ) -> ApiResult<Value> {
        let fork = self.reserve(owner, Some(source.id.clone()), size)?;
        let ends = match self.ends(&fork) {
            Ok(e) => e,
            Err(e) => {
                self.forget(&fork.id);
                return Err(e);
            }
        };
        let stdio = ends.fifos.stdio();
        let (app, from, new) = (self.clone(), source.id.clone(), fork.id.clone());
        let made = blocking(move || {
            let mut client = app.client()?;
            let made = split_blocking(&app, &mut client, (&from, &new), &stdio, size);
            // The snapshot served its purpose (or failed): whatever became of it goes.
            delete_snapshots_for(&client, &new, false);
            made
        })
        .await;
        let (pid, timing, expires) = match made {
            Ok(m) => m,
            Err(e) => {
                self.forget(&fork.id);
                return Err(e);
            }
        };
        // The fork's screen is its source's as it was snapshotted: its panes start alike.
        let screen = source.lock().replay.contents();
        fork.lock().replay.push(&screen);
        let task = fork.attach(ends, pid);
        {
            let mut i = fork.lock();
            i.split = Some(timing);
            i.expires_at = expires;
        }
        self.watch(fork.clone(), task);
        self.resize_soon(&fork);
        fork.announce();
        Ok(fork.view())
    }

    /// Suspends `id`: checkpointed, its task (and every runsc process) gone; the page's
    /// terminal detaches and shows the state.
    pub async fn suspend(self: &Arc<Self>, owner: &str, id: &str) -> ApiResult<Value> {
        let entry = self.get(owner, id)?;
        entry.begin("suspending", State::Running)?;
        let (app, sid) = (self.clone(), id.to_string());
        let done = blocking(move || {
            let mut client = app.client()?;
            let started = Instant::now();
            let labels = app.snapshot_labels(&sid);
            let taken = snapshot::create(&mut client, &sid, labels, true, &Progress::quiet());
            let snap = match taken {
                Ok(s) => s,
                Err(e) => {
                    delete_snapshots_for(&client, &sid, true);
                    return Err(e.into());
                }
            };
            let ms = millis(started);
            let bytes = snapshot_bytes(&client, &snap);
            Ok(json!({"snapshot": snap.digest, "ms": ms, "bytes": bytes}))
        })
        .await;
        let result = match done {
            Ok(info) => {
                let mut i = entry.lock();
                i.attached = None;
                i.state = State::Suspended;
                i.pid = 0;
                let digest = info["snapshot"].as_str().unwrap_or_default().to_string();
                i.suspended = Some((digest, Instant::now()));
                i.suspend = Some(info);
                i.resume = None;
                Ok(())
            }
            Err(e) => {
                // The checkpoint failed: the sandbox runs on, unless it went meanwhile.
                let (app, sid) = (self.clone(), id.to_string());
                let alive = blocking(move || Ok(app.control.task_status(&sid)?))
                    .await
                    .ok()
                    .flatten()
                    .is_some_and(|(s, _)| s == "running");
                if !alive {
                    self.exited(&entry, None).await;
                }
                Err(e)
            }
        };
        entry.end();
        result.map(|()| entry.view())
    }

    /// Resumes suspended `id` under the same id, its terminal `size`; the snapshot it came
    /// back from is deleted.
    pub async fn resume(
        self: &Arc<Self>,
        owner: &str,
        id: &str,
        size: (u32, u32),
    ) -> ApiResult<Value> {
        let entry = self.get(owner, id)?;
        entry.begin("resuming", State::Suspended)?;
        entry.lock().size = size;
        let resumed = self.resume_entry(&entry, size).await;
        entry.end();
        resumed.map(|()| entry.view())
    }

    async fn resume_entry(self: &Arc<Self>, entry: &Arc<Entry>, size: (u32, u32)) -> ApiResult<()> {
        let ends = self.ends(entry)?;
        let stdio = ends.fifos.stdio();
        let (app, id) = (self.clone(), entry.id.clone());
        let (pid, ms, expires) = blocking(move || {
            let mut client = app.client()?;
            let started = Instant::now();
            let (digest, pid) = resume::resume_with(
                &mut client,
                &id,
                Some((&stdio, Some(size))),
                &Progress::quiet(),
            )?;
            let ms = millis(started);
            if let Ok(snap) = snapshots::find(&client, &digest) {
                let _ = snapshots::delete(&client, &snap);
            }
            Ok((pid, ms, expires_at(&client, &id)))
        })
        .await?;
        let task = entry.attach(ends, pid);
        {
            let mut i = entry.lock();
            i.resume = Some(json!({"ms": ms}));
            i.expires_at = expires;
        }
        self.watch(entry.clone(), task);
        self.resize_soon(entry);
        Ok(())
    }

    /// Closes `id`: its sandbox (and a suspend snapshot) removed, whatever state it is in.
    pub async fn close(self: &Arc<Self>, owner: &str, id: &str) -> ApiResult<()> {
        let entry = self.get(owner, id)?;
        {
            let mut i = entry.lock();
            if let Some(busy) = i.busy {
                return Err(ApiError::new(
                    409,
                    format!("sandbox {id} is {busy}: close it once that is done"),
                ));
            }
            i.busy = Some("closing");
        }
        self.remove(&entry).await;
        Ok(())
    }

    /// Removes what the sandbox has in containerd and forgets it.
    async fn remove(self: &Arc<Self>, entry: &Arc<Entry>) {
        let suspended = {
            let mut i = entry.lock();
            i.attached = None;
            i.suspended.take().map(|s| s.0)
        };
        let (app, id) = (self.clone(), entry.id.clone());
        let _ = blocking(move || {
            let client = app.client()?;
            remove_sandbox(&client, &app.cfg.snapshotter, &id);
            if let Some(digest) = suspended {
                if let Ok(snap) = snapshots::find(&client, &digest) {
                    let _ = snapshots::delete(&client, &snap);
                }
            }
            Ok(())
        })
        .await;
        {
            let mut i = entry.lock();
            i.state = State::Exited;
        }
        entry.announce();
        self.forget(&entry.id);
    }

    /// Sends the window size again once a restored task runs (its terminal had the size at
    /// create; a shell redraws on the change).
    fn resize_soon(self: &Arc<Self>, entry: &Arc<Entry>) {
        let (cols, rows) = entry.lock().size;
        self.resize(entry, cols, rows);
    }

    pub fn resize(self: &Arc<Self>, entry: &Arc<Entry>, cols: u32, rows: u32) {
        if !entry.set_size(cols, rows) {
            return;
        }
        let (control, id) = (self.control.clone(), entry.id.clone());
        tokio::task::spawn_blocking(move || {
            if let Err(e) = control.resize_pty(&id, cols, rows) {
                eprintln!("chalk-web: {e}");
            }
        });
    }

    /// Waits for task number `task` of `entry` to exit; an exit that is not a suspend's ends
    /// the sandbox (removed from containerd, its exit code kept for the page).
    fn watch(self: &Arc<Self>, entry: Arc<Entry>, task: u64) {
        let app = self.clone();
        tokio::spawn(async move {
            let (a, id) = (app.clone(), entry.id.clone());
            let code = blocking(move || Ok(wait_for_exit(&a.control, &id))).await;
            let current = {
                let i = entry.lock();
                i.task == task && i.state == State::Running && i.busy != Some("suspending")
            };
            if current {
                app.exited(&entry, code.ok().flatten()).await;
            }
        });
    }

    async fn exited(self: &Arc<Self>, entry: &Arc<Entry>, code: Option<u32>) {
        {
            let mut i = entry.lock();
            i.attached = None;
            i.state = State::Exited;
            i.exit_code = code;
            i.exited_at = Some(Instant::now());
            i.pid = 0;
        }
        let (app, id) = (self.clone(), entry.id.clone());
        let _ = blocking(move || {
            let client = app.client()?;
            remove_sandbox(&client, &app.cfg.snapshotter, &id);
            Ok(())
        })
        .await;
        entry.announce();
    }

    /// Every few seconds: a sandbox suspended for longer than the lifetime is removed with
    /// its snapshot; an exited one is forgotten after a while.
    pub async fn reap(self: Arc<Self>) {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            let entries: Vec<Arc<Entry>> = self.map().values().cloned().collect();
            for e in entries {
                let (expired, forgotten) = {
                    let i = e.lock();
                    let expired = i.busy.is_none()
                        && i.suspended
                            .as_ref()
                            .is_some_and(|(_, at)| at.elapsed() > self.cfg.limits.lifetime);
                    let forgotten = i.exited_at.is_some_and(|at| at.elapsed() > EXITED_KEPT);
                    (expired, forgotten)
                };
                if expired {
                    eprintln!(
                        "chalk-web: {} stayed suspended past its lifetime: removed",
                        e.id
                    );
                    e.lock().busy = Some("closing");
                    self.remove(&e).await;
                } else if forgotten {
                    self.forget(&e.id);
                }
            }
        }
    }

    /// Removes every sandbox this server made (at exit: their terminals end with it).
    pub async fn shutdown(self: &Arc<Self>) {
        let entries: Vec<Arc<Entry>> = self.map().values().cloned().collect();
        for e in entries {
            self.remove(&e).await;
        }
    }

    /// Removes what an earlier run of the server left (it died without its shutdown): its
    /// sandboxes have no terminal any more.
    pub fn reclaim(&self) -> chalk_client::Result<usize> {
        let client = self
            .client()
            .map_err(|e| chalk_client::Error::from(e.message))?;
        let mut n = 0;
        let owner = self.owner();
        for c in client.containers()? {
            if c.labels.get(OWNER_LABEL) == Some(&owner) {
                remove_sandbox(&client, &c.snapshotter, &c.id);
                n += 1;
            }
        }
        for snap in snapshots::all(&client)? {
            if snap.labels.get(SNAPSHOT_SERVER_LABEL) == Some(&owner) {
                let _ = snapshots::delete(&client, &snap);
            }
        }
        // The dead server's fifos: nothing has them open any more.
        for dir in std::fs::read_dir(&self.cfg.state_dir)
            .into_iter()
            .flatten()
            .flatten()
        {
            let _ = std::fs::remove_dir_all(dir.path());
        }
        Ok(n)
    }
}

/// The split itself: snapshot `from` (running on), fork it as `new`; the times it took.
fn split_blocking(
    app: &App,
    client: &mut Client,
    (from, new): (&str, &str),
    stdio: &Stdio,
    size: (u32, u32),
) -> ApiResult<(u32, Value, Option<String>)> {
    let started = Instant::now();
    let labels = app.snapshot_labels(new);
    let snap = snapshot::create(client, from, labels, false, &Progress::quiet())?;
    let snapshot_ms = millis(started);
    let bytes = snapshot_bytes(client, &snap);
    let restoring = Instant::now();
    let pid = fork::fork_to(
        client,
        &snap.digest,
        new,
        &ForkOptions::default(),
        stdio,
        Some(size),
    )?;
    let restore_ms = millis(restoring);
    if let Err(e) = client.set_container_label(new, OWNER_LABEL, Some(&app.owner())) {
        remove_sandbox(client, "", new);
        return Err(e.into());
    }
    let timing = json!({"snapshot_ms": snapshot_ms, "restore_ms": restore_ms, "bytes": bytes});
    Ok((pid, timing, expires_at(client, new)))
}

/// Deletes the snapshots taken for `sandbox` (labelled so): all of them, or with
/// `only_failed` those that failed (a suspend that did not happen).
fn delete_snapshots_for(client: &Client, sandbox: &str, only_failed: bool) {
    for snap in snapshots::all(client).unwrap_or_default() {
        let failed = snap.status == registry::Status::Failed;
        if snap.labels.get(SNAPSHOT_LABEL).map(String::as_str) == Some(sandbox)
            && (failed || !only_failed)
        {
            if let Err(e) = snapshots::delete(client, &snap) {
                eprintln!("chalk-web: delete snapshot {}: {e}", snap.name);
            }
        }
    }
}

/// The bytes of a snapshot's files (0 when its manifest cannot be read).
fn snapshot_bytes(client: &Client, snap: &registry::Snapshot) -> u64 {
    snapshots::stored_manifest(client, &snap.index)
        .ok()
        .flatten()
        .map_or(0, |m| m.total_size())
}

/// Removes sandbox `id`: its task (killed), its container and root filesystem snapshot.
fn remove_sandbox(client: &Client, snapshotter: &str, id: &str) {
    let snapshotter = match client.container(id) {
        Ok(c) => c.snapshotter,
        Err(_) => snapshotter.to_string(),
    };
    if !client.kill_and_delete_task(id) {
        eprintln!("chalk-web: the task of {id} could not be removed: its container is kept");
        return;
    }
    client.delete_container(id);
    if !snapshotter.is_empty() {
        client.remove_snapshot(&snapshotter, id);
    }
}

/// Waits for sandbox `id`'s init to exit: its exit status (None once it has no task). A
/// wait cut short (containerd restarting) is waited again while the task still runs.
fn wait_for_exit(client: &Client, id: &str) -> Option<u32> {
    loop {
        match client.wait(id) {
            Ok(code) => return code,
            Err(e) => {
                eprintln!("chalk-web: wait for {id}: {e}");
                std::thread::sleep(Duration::from_secs(1));
                match client.task_status(id) {
                    Ok(Some((status, _))) if status != "stopped" => continue,
                    Ok(_) => return None,
                    // containerd not answering yet: keep waiting for it.
                    Err(_) => continue,
                }
            }
        }
    }
}

/// When the sandbox's lifetime ends, as the shim recorded it at start.
fn expires_at(client: &Client, id: &str) -> Option<String> {
    client
        .container(id)
        .ok()?
        .labels
        .get(chalk_runtime::lifetime::EXPIRES_AT_LABEL)
        .cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_valid_container_ids_and_differ() {
        let (a, b) = (new_id(), new_id());
        assert_ne!(a, b);
        chalk_runtime::ids::container_id(&a).unwrap();
        assert_eq!(a.len(), "web-".len() + 8);
    }

    #[test]
    fn an_operation_needs_the_right_state_and_no_other_under_way() {
        let e = Entry::new("web-1".into(), "me", None, (80, 24));
        assert!(e
            .begin("suspended", State::Running)
            .unwrap_err()
            .message
            .contains("starting"));
        e.lock().state = State::Running;
        e.begin("suspending", State::Running).unwrap();
        let busy = e.begin("splitting", State::Running).unwrap_err();
        assert_eq!(busy.status, 409);
        assert!(busy.message.contains("suspending"));
        e.end();
        assert!(e.begin("resuming", State::Suspended).is_err());
    }

    #[test]
    fn subscribers_get_the_screen_then_what_follows() {
        let e = Entry::new("web-1".into(), "me", None, (80, 24));
        e.output(b"before\r\n");
        let (screen, mut rx) = e.subscribe();
        e.output(b"after");
        assert_eq!(screen, b"before\r\n");
        match rx.try_recv().unwrap() {
            Out::Bytes(b) => assert_eq!(&b[..], b"after"),
            Out::Event(_) => panic!("expected bytes"),
        }
    }
}
