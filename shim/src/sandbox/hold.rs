//! Stop signals held for the node agent (`chalk.io/hold-stop`, a task Update's annotation).
//! While a pod's sandbox is armed, a signal other than SIGKILL to one of its containers is
//! answered but kept until one of these happens:
//! - the agent releases it: delivered as it was, or as SIGKILL once the pod is snapshotted;
//! - a SIGKILL comes for that container (its grace period is over);
//! - [`HOLD_LIMIT`] passes.
//!
//! The agent arms the pods of agent-sandbox Sandboxes, so that the pod delete of a suspend
//! waits for the pod's snapshot. The bookkeeping is here; delivery is [`Sandboxes::kill`]'s.

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicU64, Ordering},
        Mutex,
    },
    time::Duration,
};

use chalk_labels::HOLD_STOP;

use super::Sandboxes;
use crate::{
    container::Container,
    errors::{Result, ShimError},
};

/// The longest a signal is held when nothing releases it (a node agent gone, a kill that
/// no SIGKILL follows).
pub const HOLD_LIMIT: Duration = Duration::from_secs(600);

/// What a `chalk.io/hold-stop` annotation asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Arm,
    /// Deliver what is held, as it was.
    Release,
    /// Deliver SIGKILL for what is held: the pod's snapshot is its state now.
    Kill,
}

impl Verdict {
    pub fn parse(value: &str) -> Result<Verdict> {
        match value {
            "arm" => Ok(Verdict::Arm),
            "release" => Ok(Verdict::Release),
            "kill" => Ok(Verdict::Kill),
            other => Err(ShimError::InvalidArgument(format!(
                "{HOLD_STOP} {other:?}: give arm, release or kill"
            ))),
        }
    }
}

/// A signal kept for a container of an armed pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub container: String,
    pub signal: u32,
    pub all: bool,
    seq: u64,
}

/// The armed pods (by sandbox id) and what each holds.
#[derive(Default)]
pub struct Holds {
    armed: Mutex<HashMap<String, Vec<Held>>>,
    seq: AtomicU64,
}

impl Holds {
    pub fn arm(&self, sandbox: &str) {
        self.armed
            .lock()
            .unwrap()
            .entry(sandbox.to_string())
            .or_default();
    }

    /// Keeps `signal` for `container` of pod `sandbox` when it is armed: the held signal's
    /// number, for [`Holds::expire`]. None: deliver it now.
    pub fn hold(&self, sandbox: &str, container: &str, signal: u32, all: bool) -> Option<u64> {
        let mut armed = self.armed.lock().unwrap();
        let held = armed.get_mut(sandbox)?;
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        held.push(Held {
            container: container.to_string(),
            signal,
            all,
            seq,
        });
        Some(seq)
    }

    /// Disarms pod `sandbox`: what it held, to deliver.
    pub fn release(&self, sandbox: &str) -> Vec<Held> {
        self.armed
            .lock()
            .unwrap()
            .remove(sandbox)
            .unwrap_or_default()
    }

    /// A SIGKILL for `container` supersedes what it has held.
    pub fn drop_for(&self, sandbox: &str, container: &str) {
        if let Some(held) = self.armed.lock().unwrap().get_mut(sandbox) {
            held.retain(|h| h.container != container);
        }
    }

    /// Held signal `seq`, taken if it is still held (its limit passed).
    pub fn expire(&self, sandbox: &str, seq: u64) -> Option<Held> {
        let mut armed = self.armed.lock().unwrap();
        let held = armed.get_mut(sandbox)?;
        let at = held.iter().position(|h| h.seq == seq)?;
        Some(held.remove(at))
    }

    #[cfg(test)]
    pub fn is_armed(&self, sandbox: &str) -> bool {
        self.armed.lock().unwrap().contains_key(sandbox)
    }
}

impl Sandboxes {
    /// Whether signal `signal` to running container `c` is held (answered, not delivered).
    pub(super) fn held(&self, c: &Container, id: &str, signal: u32, all: bool) -> bool {
        let holds = &self.inner.holds;
        if signal == libc::SIGKILL as u32 {
            holds.drop_for(&c.sandbox_id, id);
            return false;
        }
        let Some(seq) = holds.hold(&c.sandbox_id, id, signal, all) else {
            return false;
        };
        log::info!(
            "{id}: signal {signal} held for the node agent ({HOLD_STOP} on pod {})",
            c.sandbox_id
        );
        let (me, sandbox) = (self.clone(), c.sandbox_id.clone());
        std::thread::spawn(move || {
            std::thread::sleep(HOLD_LIMIT);
            if let Some(h) = me.inner.holds.expire(&sandbox, seq) {
                log::warn!(
                    "{}: signal {} held for {HOLD_LIMIT:?} with no word from the node agent: \
                     delivered",
                    h.container,
                    h.signal
                );
                me.deliver(&h, h.signal);
            }
        });
        true
    }

    /// Arms, or releases, the stop signals of pod sandbox `id`'s containers.
    pub fn hold_stop(&self, id: &str, verdict: Verdict) -> Result<()> {
        let c = self.container(id)?;
        if c.sandbox_id != id {
            return Err(ShimError::FailedPrecondition(format!(
                "container {id} is a member of pod {}: {HOLD_STOP} is set on the pod's sandbox \
                 container",
                c.sandbox_id
            )));
        }
        match verdict {
            Verdict::Arm => self.inner.holds.arm(id),
            Verdict::Release | Verdict::Kill => {
                let held = self.inner.holds.release(id);
                if !held.is_empty() {
                    log::info!("pod {id}: {verdict:?} of {} held signals", held.len());
                }
                for h in held {
                    let signal = match verdict {
                        Verdict::Kill => libc::SIGKILL as u32,
                        _ => h.signal,
                    };
                    self.deliver(&h, signal);
                }
            }
        }
        Ok(())
    }

    fn deliver(&self, h: &Held, signal: u32) {
        if let Err(e) = self.kill(&h.container, "", signal, h.all) {
            log::info!("{}: held signal {signal} not delivered: {e}", h.container);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_armed_pod_holds_and_a_release_disarms_it() {
        let holds = Holds::default();
        assert_eq!(holds.hold("pod", "web", 15, false), None);
        holds.arm("pod");
        let first = holds.hold("pod", "web", 15, false).unwrap();
        holds.hold("pod", "side", 2, true).unwrap();
        holds.drop_for("pod", "side");
        let held = holds.release("pod");
        assert_eq!(held.len(), 1);
        assert_eq!((held[0].container.as_str(), held[0].signal), ("web", 15));
        assert!(!holds.is_armed("pod"));
        assert_eq!(holds.expire("pod", first), None, "released already");
        assert_eq!(holds.hold("pod", "web", 15, false), None);
    }

    #[test]
    fn a_held_signal_expires_once() {
        let holds = Holds::default();
        holds.arm("pod");
        let seq = holds.hold("pod", "web", 15, false).unwrap();
        assert_eq!(holds.expire("pod", seq).unwrap().signal, 15);
        assert_eq!(holds.expire("pod", seq), None);
        assert!(holds.is_armed("pod"), "still armed for the next");
    }

    #[test]
    fn verdicts_parse_and_others_are_named() {
        assert_eq!(Verdict::parse("arm").unwrap(), Verdict::Arm);
        assert_eq!(Verdict::parse("kill").unwrap(), Verdict::Kill);
        let e = Verdict::parse("hold").unwrap_err().to_string();
        assert!(
            e.contains(HOLD_STOP) && e.contains("arm, release or kill"),
            "{e}"
        );
    }
}
