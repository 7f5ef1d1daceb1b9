//! What a page can do with a sandbox, each through chalk-client on a blocking thread: launch,
//! split (snapshot, fork, delete the snapshot), suspend, resume, close; and the watch on each
//! task that ends the sandbox when it exits.

use std::{collections::HashMap, sync::Arc, time::Instant};

use chalk_client::{
    containerd::{Client, Stdio},
    ops::{fork::ForkOptions, fork_running, resume, run, snapshot},
    progress::Progress,
    records::snapshots,
};
use serde_json::{json, Value};

use super::{
    containerd::{
        blocking, delete_snapshots_for, expires_at, remove_sandbox, snapshot_bytes, wait_for_exit,
        OWNER_LABEL, SNAPSHOT_LABEL, SNAPSHOT_SERVER_LABEL,
    },
    entry::{Entry, State},
    error::{ApiError, ApiResult},
    state::App,
};

fn millis(since: Instant) -> u64 {
    since.elapsed().as_millis() as u64
}

impl App {
    /// The labels of a snapshot taken for sandbox `for_id`.
    fn snapshot_labels(&self, for_id: &str) -> Vec<(String, String)> {
        vec![
            (SNAPSHOT_LABEL.to_string(), for_id.to_string()),
            (SNAPSHOT_SERVER_LABEL.to_string(), self.owner()),
        ]
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
        chalk_client::ops::network::set_network(&mut spec, Some(&self.cfg.network), &[])?;
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
    pub(super) async fn remove(self: &Arc<Self>, entry: &Arc<Entry>) {
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
}

/// The split itself: checkpoint `from` (running on), fork it as `new` from runsc's files as
/// soon as they are written (the checkpoint is never kept as a snapshot); the times it took.
fn split_blocking(
    app: &App,
    client: &mut Client,
    (from, new): (&str, &str),
    stdio: &Stdio,
    size: (u32, u32),
) -> ApiResult<(u32, Value, Option<String>)> {
    let started = Instant::now();
    let (pid, checkpoint) = fork_running::fork_running_to(
        client,
        from,
        new,
        &ForkOptions::default(),
        stdio,
        Some(size),
    )?;
    let snapshot_ms = checkpoint.elapsed.as_millis() as u64;
    let restore_ms = millis(started).saturating_sub(snapshot_ms);
    let bytes = checkpoint.bytes;
    drop(checkpoint);
    if let Err(e) = client.set_container_label(new, OWNER_LABEL, Some(&app.owner())) {
        remove_sandbox(client, "", new);
        return Err(e.into());
    }
    let timing = json!({"snapshot_ms": snapshot_ms, "restore_ms": restore_ms, "bytes": bytes});
    Ok((pid, timing, expires_at(client, new)))
}
