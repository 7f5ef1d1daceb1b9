//! Keeping the server's sandboxes in bounds over time: those suspended past their lifetime
//! removed, exited ones forgotten, all removed at shutdown, and an earlier run's reclaimed.

use std::{sync::Arc, time::Duration};

use chalk_client::records::snapshots;

use super::{
    containerd::{remove_sandbox, OWNER_LABEL, SNAPSHOT_SERVER_LABEL},
    entry::Entry,
    state::App,
};

/// How long an exited sandbox stays listed (its exit code shown) before it is forgotten.
const EXITED_KEPT: Duration = Duration::from_secs(600);

impl App {
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
