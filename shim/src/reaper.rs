//! Exit statuses for everything the shim spawns or adopts.
//!
//! The containerd-shim crate makes the shim a child subreaper and reaps every child in its
//! SIGCHLD handler, then broadcasts `(pid, status)`. This module turns that broadcast into
//! per-pid deliveries. A child spawned through [`ReaperSpawner`] is registered while the
//! registry lock is held, and delivery takes the same lock, so no exit is missed. Processes
//! adopted after the fact (a runsc sandbox, orphaned by `runsc create`) are watched with
//! [`watch`]; an exit reaped before the watch is kept for a while and handed over then.

use std::{
    collections::HashMap,
    io,
    process::{ChildStdout, Command},
    sync::{
        mpsc::{channel, Receiver, Sender, TryRecvError},
        LazyLock, Mutex, Once,
    },
    time::{Duration, Instant},
};

use chalk_runtime::runsc::{Child, Spawner};
use containerd_shim::monitor::{monitor_subscribe, Subject, Topic};

/// How long an unclaimed exit is kept for a late [`watch`].
const UNCLAIMED_TTL: Duration = Duration::from_secs(120);

#[derive(Default)]
struct Registry {
    waiters: HashMap<i32, Sender<i32>>,
    unclaimed: HashMap<i32, (i32, Instant)>,
}

static REGISTRY: LazyLock<Mutex<Registry>> = LazyLock::new(Default::default);
static STARTED: Once = Once::new();

/// Subscribes to the crate's exit broadcast. Must run before the first spawn.
pub fn start() {
    STARTED.call_once(|| {
        let subscription = monitor_subscribe(Topic::Pid).expect("subscribe to child exits");
        std::thread::Builder::new()
            .name("exit-dispatch".into())
            .spawn(move || {
                let subscription = subscription;
                while let Ok(event) = subscription.rx.recv() {
                    if let Subject::Pid(pid) = event.subject {
                        deliver(pid, event.exit_code);
                    }
                }
            })
            .expect("spawn exit dispatcher");
    });
}

fn deliver(pid: i32, status: i32) {
    let mut reg = REGISTRY.lock().unwrap();
    match reg.waiters.remove(&pid) {
        Some(tx) => {
            let _ = tx.send(status);
        }
        None => {
            let now = Instant::now();
            reg.unclaimed
                .retain(|_, (_, at)| now.duration_since(*at) < UNCLAIMED_TTL);
            reg.unclaimed.insert(pid, (status, now));
        }
    }
}

/// A receiver that gets the exit status of `pid`, a process the shim adopted that was not
/// yet running at `not_before` (an exit kept from before then belongs to an earlier process
/// that had the same pid).
pub fn watch(pid: i32, not_before: Instant) -> Receiver<i32> {
    let (tx, rx) = channel();
    let mut reg = REGISTRY.lock().unwrap();
    match reg.unclaimed.remove(&pid) {
        Some((status, at)) if at >= not_before => {
            let _ = tx.send(status);
        }
        _ => {
            reg.waiters.insert(pid, tx);
        }
    }
    rx
}

/// Spawns children whose exits come from the reaper.
#[derive(Debug, Default, Clone, Copy)]
pub struct ReaperSpawner;

struct ReapedChild {
    pid: u32,
    stdout: Option<ChildStdout>,
    exit: Receiver<i32>,
    status: Option<i32>,
}

impl Spawner for ReaperSpawner {
    fn watch(&self, pid: i32, not_before: Instant) -> Receiver<i32> {
        watch(pid, not_before)
    }

    fn spawn(&self, cmd: &mut Command) -> io::Result<Box<dyn Child>> {
        let (tx, rx) = channel();
        let mut reg = REGISTRY.lock().unwrap();
        let mut child = cmd.spawn()?;
        let pid = child.id() as i32;
        // A fresh pid cannot have a real exit yet: anything unclaimed under it is stale.
        reg.unclaimed.remove(&pid);
        reg.waiters.insert(pid, tx);
        Ok(Box::new(ReapedChild {
            pid: pid as u32,
            stdout: child.stdout.take(),
            exit: rx,
            status: None,
        }))
    }
}

impl Child for ReapedChild {
    fn pid(&self) -> u32 {
        self.pid
    }
    fn take_stdout(&mut self) -> Option<ChildStdout> {
        self.stdout.take()
    }
    fn try_wait(&mut self) -> io::Result<Option<i32>> {
        if self.status.is_none() {
            match self.exit.try_recv() {
                Ok(s) => self.status = Some(s),
                Err(TryRecvError::Empty) => {}
                Err(TryRecvError::Disconnected) => return Err(lost(self.pid)),
            }
        }
        Ok(self.status)
    }
    fn wait(self: Box<Self>) -> io::Result<i32> {
        match self.status {
            Some(s) => Ok(s),
            None => self.exit.recv().map_err(|_| lost(self.pid)),
        }
    }
}

fn lost(pid: u32) -> io::Error {
    io::Error::other(format!("exit status of child {pid} was lost"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn late_watch_gets_an_earlier_exit_once() {
        let before = Instant::now();
        deliver(999_001, 7);
        assert_eq!(watch(999_001, before).recv().unwrap(), 7);
        let rx = watch(999_001, before);
        assert!(rx.try_recv().is_err(), "an exit is handed over once");
        deliver(999_001, 9);
        assert_eq!(rx.recv().unwrap(), 9);
    }

    #[test]
    fn an_exit_from_before_the_process_started_is_stale() {
        deliver(999_002, 1);
        let started = Instant::now();
        let rx = watch(999_002, started);
        assert!(
            rx.try_recv().is_err(),
            "the old pid's exit is not this process's"
        );
        deliver(999_002, 0);
        assert_eq!(rx.recv().unwrap(), 0);
    }
}
