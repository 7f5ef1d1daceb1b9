//! The handoff to NVIDIA's `cuda-checkpoint`, run inside the sandbox: before gVisor
//! checkpoints a GPU sandbox, every CUDA process is locked (its running work allowed to
//! finish, within a timeout), its GPU state moved into host memory (`checkpoint`) and
//! confirmed `checkpointed`; after (in a source that keeps running, a fork, a resume) it is
//! moved back (`restore`) and let go (`unlock`). Nothing is left half-moved: a failure on the
//! way puts back every process already touched, each by the state it reached.

use std::{fmt, time::Duration};

use crate::{config::GpuOptions, error::Error};

/// A process's state as `cuda-checkpoint --get-state` prints it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CudaState {
    Running,
    Locked,
    Checkpointed,
    Failed,
}

impl CudaState {
    pub fn parse(output: &str) -> Option<Self> {
        match output.trim().to_ascii_lowercase().as_str() {
            "running" => Some(CudaState::Running),
            "locked" => Some(CudaState::Locked),
            "checkpointed" => Some(CudaState::Checkpointed),
            "failed" => Some(CudaState::Failed),
            _ => None,
        }
    }
}

/// How long the steps other than lock may take (moving GPU memory is not instant).
const MOVE_TIMEOUT: Duration = Duration::from_secs(120);
const QUERY_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs cuda-checkpoint with `args` inside the sandbox: its stdout, or why it failed.
pub trait CudaTool: Sync {
    fn run(&self, args: &[String], timeout: Duration) -> Result<String, Error>;
}

/// A failed handoff: the step, the process, what cuda-checkpoint said, and anything the
/// roll-back could not put back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandoffError {
    pub step: &'static str,
    pub pid: u32,
    pub message: String,
    pub not_rolled_back: Vec<String>,
}

impl fmt::Display for HandoffError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cuda-checkpoint --action {} of process {} failed: {}",
            self.step, self.pid, self.message
        )?;
        if !self.not_rolled_back.is_empty() {
            write!(
                f,
                "; could not put back: {}",
                self.not_rolled_back.join("; ")
            )?;
        }
        Ok(())
    }
}

impl std::error::Error for HandoffError {}

pub struct Handoff<'a> {
    tool: &'a dyn CudaTool,
    opts: &'a GpuOptions,
}

fn pid_args(action: &str, pid: u32) -> Vec<String> {
    vec![
        "--action".into(),
        action.into(),
        "--pid".into(),
        pid.to_string(),
    ]
}

impl<'a> Handoff<'a> {
    pub fn new(tool: &'a dyn CudaTool, opts: &'a GpuOptions) -> Self {
        Handoff { tool, opts }
    }

    fn call(&self, action: &'static str, pid: u32) -> Result<(), Error> {
        let mut args = pid_args(action, pid);
        let timeout = if action == "lock" {
            let ms = self.opts.lock_timeout_secs * 1000;
            args.extend(["--timeout".into(), ms.to_string()]);
            Duration::from_secs(self.opts.lock_timeout_secs) + QUERY_TIMEOUT
        } else {
            MOVE_TIMEOUT
        };
        self.tool.run(&args, timeout).map(drop)
    }

    /// `--get-state` of `pid`; None when it is no CUDA process (cuda-checkpoint refuses it).
    pub fn state(&self, pid: u32) -> Option<CudaState> {
        let args = vec!["--get-state".into(), "--pid".into(), pid.to_string()];
        self.tool
            .run(&args, QUERY_TIMEOUT)
            .ok()
            .and_then(|out| CudaState::parse(&out))
    }

    /// The CUDA processes among `pids` (the sandbox's processes).
    pub fn cuda_processes(&self, pids: &[u32]) -> Vec<u32> {
        pids.iter()
            .copied()
            .filter(|p| self.state(*p).is_some())
            .collect()
    }

    /// Runs `step` for every pid, in order (stopping at a failure) or all at once; the first
    /// failure by pid order.
    fn each(&self, pids: &[u32], step: Step) -> Result<(), (u32, Error)> {
        if !self.opts.parallel {
            for &p in pids {
                step(self, p).map_err(|e| (p, e))?;
            }
            return Ok(());
        }
        let results: Vec<(u32, Result<(), Error>)> = std::thread::scope(|s| {
            let running: Vec<_> = pids
                .iter()
                .map(|&p| (p, s.spawn(move || step(self, p))))
                .collect();
            running
                .into_iter()
                .map(|(p, h)| {
                    (
                        p,
                        h.join()
                            .unwrap_or_else(|_| Err(Error::Sandbox("the step panicked".into()))),
                    )
                })
                .collect()
        });
        results
            .into_iter()
            .find_map(|(p, r)| r.err().map(|e| (p, e)))
            .map_or(Ok(()), Err)
    }

    /// Lock, checkpoint and confirm every process of `pids`. On a failure every process is
    /// put back as far as it had gone, and the error says what failed.
    pub fn checkpoint(&self, pids: &[u32]) -> Result<(), HandoffError> {
        let steps: [(&'static str, Step); 3] = [
            ("lock", |h, p| h.call("lock", p)),
            ("checkpoint", |h, p| h.call("checkpoint", p)),
            ("checkpoint (confirm)", |h, p| match h.state(p) {
                Some(CudaState::Checkpointed) => Ok(()),
                other => Err(Error::Unexpected(format!(
                    "it reads {other:?}, not checkpointed"
                ))),
            }),
        ];
        self.steps(pids, &steps, true)
    }

    /// Runs `steps` over `pids` in order; at a failure, rolls back when asked.
    fn steps(
        &self,
        pids: &[u32],
        steps: &[(&'static str, Step)],
        roll_back: bool,
    ) -> Result<(), HandoffError> {
        for &(name, step) in steps {
            if let Err((pid, e)) = self.each(pids, step) {
                return Err(HandoffError {
                    step: name,
                    pid,
                    message: e.to_string(),
                    not_rolled_back: if roll_back {
                        self.roll_back(pids)
                    } else {
                        Vec::new()
                    },
                });
            }
        }
        Ok(())
    }

    /// Puts every process back by the state it reads now: checkpointed ones restored and
    /// unlocked, locked ones unlocked. Returns what could not be put back.
    pub fn roll_back(&self, pids: &[u32]) -> Vec<String> {
        let mut failed = Vec::new();
        for &pid in pids {
            let actions: &[&'static str] = match self.state(pid) {
                Some(CudaState::Checkpointed) => &["restore", "unlock"],
                Some(CudaState::Locked) => &["unlock"],
                _ => &[],
            };
            for action in actions {
                if let Err(e) = self.call(action, pid) {
                    failed.push(format!("{action} of {pid}: {e}"));
                    break;
                }
            }
        }
        failed
    }

    /// Moves every process of `pids` back onto the GPU and lets it run: after the gVisor
    /// checkpoint of a source that keeps running, and in each fork or resumed sandbox.
    pub fn restore(&self, pids: &[u32]) -> Result<(), HandoffError> {
        let steps: [(&'static str, Step); 2] = [
            ("restore", |h, p| h.call("restore", p)),
            ("unlock", |h, p| h.call("unlock", p)),
        ];
        self.steps(pids, &steps, false)
    }
}

/// One step of the handoff for one process.
type Step = fn(&Handoff<'_>, u32) -> Result<(), Error>;

#[cfg(test)]
mod tests {
    use std::{collections::HashMap, sync::Mutex};

    use super::*;

    /// The stand-in's state machine, in memory: pids 1.. are CUDA processes; `fail` makes one
    /// action of one pid fail.
    struct Fake {
        states: Mutex<HashMap<u32, CudaState>>,
        calls: Mutex<Vec<String>>,
        fail: Option<(&'static str, u32)>,
    }

    impl Fake {
        fn new(pids: &[u32], fail: Option<(&'static str, u32)>) -> Self {
            Fake {
                states: Mutex::new(pids.iter().map(|p| (*p, CudaState::Running)).collect()),
                calls: Mutex::new(Vec::new()),
                fail,
            }
        }
        fn calls(&self) -> Vec<String> {
            self.calls.lock().unwrap().clone()
        }
        fn state(&self, pid: u32) -> Option<CudaState> {
            self.states.lock().unwrap().get(&pid).copied()
        }
    }

    impl CudaTool for Fake {
        fn run(&self, args: &[String], _timeout: Duration) -> Result<String, Error> {
            let pid: u32 = args[args.iter().position(|a| a == "--pid").unwrap() + 1]
                .parse()
                .unwrap();
            let mut states = self.states.lock().unwrap();
            let Some(state) = states.get(&pid).copied() else {
                return Err(Error::Unexpected(format!(
                    "process {pid} is not a CUDA process"
                )));
            };
            if args[0] == "--get-state" {
                return Ok(format!("{state:?}\n").to_lowercase());
            }
            let action = args[1].as_str();
            self.calls.lock().unwrap().push(format!("{action} {pid}"));
            if self.fail.is_some_and(|(a, p)| a == action && p == pid) {
                return Err(Error::Unexpected(format!("{action} failed")));
            }
            use CudaState::*;
            let next = match (action, state) {
                ("lock", Running) => Locked,
                ("checkpoint", Locked) => Checkpointed,
                ("restore", Checkpointed) => Locked,
                ("unlock", Locked) => Running,
                _ => {
                    return Err(Error::Unexpected(format!(
                        "{action} of a {state:?} process"
                    )))
                }
            };
            states.insert(pid, next);
            Ok(String::new())
        }
    }

    fn opts(parallel: bool) -> GpuOptions {
        GpuOptions {
            parallel,
            ..GpuOptions::default()
        }
    }

    #[test]
    fn checkpoint_locks_then_moves_then_confirms_each_and_restore_undoes_it() {
        let fake = Fake::new(&[7, 9], None);
        let o = opts(false);
        let h = Handoff::new(&fake, &o);
        assert_eq!(h.cuda_processes(&[1, 7, 8, 9]), [7, 9]);
        h.checkpoint(&[7, 9]).unwrap();
        assert_eq!(
            fake.calls(),
            ["lock 7", "lock 9", "checkpoint 7", "checkpoint 9"]
        );
        assert_eq!(fake.state(9), Some(CudaState::Checkpointed));
        h.restore(&[7, 9]).unwrap();
        assert_eq!(fake.state(7), Some(CudaState::Running));
        assert_eq!(
            fake.calls()[4..],
            ["restore 7", "restore 9", "unlock 7", "unlock 9"]
        );
    }

    #[test]
    fn a_failure_at_each_step_leaves_every_process_running() {
        for parallel in [false, true] {
            for fail in [("lock", 9), ("checkpoint", 7), ("checkpoint", 9)] {
                let fake = Fake::new(&[7, 9], Some(fail));
                let o = opts(parallel);
                let err = Handoff::new(&fake, &o).checkpoint(&[7, 9]).unwrap_err();
                assert_eq!((err.step, err.pid), (fail.0, fail.1), "{err}");
                assert!(err.not_rolled_back.is_empty(), "{err}");
                for pid in [7, 9] {
                    assert_eq!(fake.state(pid), Some(CudaState::Running), "{fail:?} {pid}");
                }
            }
        }
    }

    #[test]
    fn a_failed_roll_back_is_reported() {
        // The checkpoint of 9 fails, then so does the unlock that would put it back.
        struct Stuck(Fake);
        impl CudaTool for Stuck {
            fn run(&self, args: &[String], t: Duration) -> Result<String, Error> {
                if args[..2] == ["--action".to_string(), "unlock".into()] {
                    return Err(Error::Unexpected("driver busy".into()));
                }
                self.0.run(args, t)
            }
        }
        let stuck = Stuck(Fake::new(&[9], Some(("checkpoint", 9))));
        let o = opts(false);
        let err = Handoff::new(&stuck, &o).checkpoint(&[9]).unwrap_err();
        assert!(
            err.to_string()
                .contains("could not put back: unlock of 9: driver busy"),
            "{err}"
        );
    }

    #[test]
    fn lock_carries_the_timeout_in_milliseconds() {
        let fake = Fake::new(&[3], None);
        let o = GpuOptions {
            lock_timeout_secs: 4,
            ..GpuOptions::default()
        };
        struct Spy<'a>(&'a Fake, Mutex<Vec<Vec<String>>>);
        impl CudaTool for Spy<'_> {
            fn run(&self, args: &[String], t: Duration) -> Result<String, Error> {
                self.1.lock().unwrap().push(args.to_vec());
                self.0.run(args, t)
            }
        }
        let spy = Spy(&fake, Mutex::new(Vec::new()));
        Handoff::new(&spy, &o).checkpoint(&[3]).unwrap();
        let lock = spy.1.lock().unwrap()[0].clone();
        assert_eq!(
            lock,
            ["--action", "lock", "--pid", "3", "--timeout", "4000"]
        );
    }
}
