//! The server's shared state: its configuration, the containerd client for quick calls, and
//! its sandboxes by id (admitted within the limits, looked up by owner).

use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{Arc, Mutex},
};

use chalk_client::containerd::Client;
use serde_json::Value;

use super::{
    entry::{Entry, State},
    error::{ApiError, ApiResult},
};
use crate::{
    limits::{self, Limits},
    terminal::{Ends, Fifos},
};

pub struct Config {
    pub address: String,
    pub namespace: String,
    pub runtime_config: Option<PathBuf>,
    pub image: String,
    pub snapshotter: String,
    pub state_dir: PathBuf,
    /// The sandboxes' network (`none`: loopback only).
    pub network: String,
    pub limits: Limits,
    pub token: Option<String>,
}

pub struct App {
    pub cfg: Config,
    /// For quick calls (a window size); operations connect their own.
    pub(super) control: Arc<Client>,
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
pub(super) fn new_id() -> String {
    format!("web-{}", random_hex(4))
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
    pub(super) fn owner(&self) -> String {
        self.cfg.state_dir.display().to_string()
    }

    pub(super) fn client(&self) -> ApiResult<Client> {
        let mut c = Client::connect(&self.cfg.address, &self.cfg.namespace)?;
        if let Some(path) = &self.cfg.runtime_config {
            c.set_config(path.clone());
        }
        Ok(c)
    }

    pub(super) fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Entry>>> {
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
    pub(super) fn reserve(
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

    pub(super) fn forget(&self, id: &str) {
        self.map().remove(id);
    }

    /// The fifos of the next task of `entry`, opened.
    pub(super) fn ends(&self, entry: &Entry) -> ApiResult<Ends> {
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
}
