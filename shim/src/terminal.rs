//! Terminal signals in a restored sandbox, delivered by the shim (runsc attaches no terminal
//! to a restored sandbox, so the signals a terminal raises go nowhere: see
//! `chalk_runtime::terminal`). The foreground job comes from runsc's process table, or, where
//! runsc cannot list the container's processes (a fork on the 2022 build keeps its source's
//! container id inside), from the sandbox's own /proc through `sh`.

use std::{
    sync::{mpsc, Arc, Mutex, Weak},
    time::{Duration, Instant},
};

use chalk_hooks::{Exec, Place};
use chalk_runtime::terminal::{foreground, parse_proc_stat, parse_ps_table, ProcRow, SignalTarget};

use crate::{container::Container, io::TerminalSignals, sandbox_exec::ContainerExec};

/// How long the in-sandbox helper may take.
const HELPER_TIMEOUT: Duration = Duration::from_secs(5);

/// What the terminal of restored sandbox `c` calls with each signal its keys raise. One
/// worker per sandbox delivers them in order, each signal once per round (keys typed or
/// pasted faster than runsc answers are not a process each), never while it is checkpointed.
pub fn signals_for(c: &Arc<Container>) -> TerminalSignals {
    c.terminal_signals
        .get_or_init(|| {
            let (tx, rx) = mpsc::channel::<i32>();
            let weak: Weak<Container> = Arc::downgrade(c);
            let spawned = std::thread::Builder::new()
                .name("tty-signals".into())
                .spawn(move || {
                    while let Ok(first) = rx.recv() {
                        let mut round = vec![first];
                        while let Ok(more) = rx.try_recv() {
                            if !round.contains(&more) {
                                round.push(more);
                            }
                        }
                        let Some(c) = weak.upgrade() else { break };
                        let _gate = c.terminal_gate.lock().unwrap();
                        round.into_iter().for_each(|sig| deliver(&c, sig));
                    }
                });
            if let Err(e) = spawned {
                log::error!(
                    "container {}: terminal signals will not be delivered: {e}",
                    c.id
                );
            }
            let tx = Mutex::new(tx);
            Arc::new(move |sig| {
                let _ = tx.lock().unwrap().send(sig);
            })
        })
        .clone()
}

/// Sends `sig` to the foreground job of `c`'s terminal.
pub fn deliver(c: &Container, sig: i32) {
    let started = Instant::now();
    let table = c
        .runtime
        .ps_table(&c.id)
        .map(|t| parse_ps_table(&t))
        .unwrap_or_default();
    let outcome = if table.is_empty() {
        through_the_sandbox(c, sig)
    } else {
        through_runsc(c, sig, &table)
    };
    match outcome {
        Ok(target) => log::info!(
            "container {}: terminal signal {sig} to {target:?} in {:?}",
            c.id,
            started.elapsed()
        ),
        Err(e) => log::warn!(
            "container {}: terminal signal {sig} not delivered: {e}",
            c.id
        ),
    }
}

fn through_runsc(c: &Container, sig: i32, table: &[ProcRow]) -> Result<SignalTarget, String> {
    let target = foreground(table, &[]).ok_or("the sandbox lists no process")?;
    let kill = |pid: i32| {
        c.runtime
            .kill(&c.id, sig as u32, false, Some(pid))
            .map_err(|e| e.to_string())
    };
    match &target {
        SignalTarget::Group(g) if c.features.kill_has_pgid() => c
            .runtime
            .kill_group(&c.id, sig as u32, *g)
            .map_err(|e| e.to_string())?,
        SignalTarget::Group(g) => {
            for r in table.iter().filter(|r| r.pgid == Some(*g)) {
                kill(r.pid)?;
            }
        }
        SignalTarget::Processes(pids) => {
            for pid in pids {
                kill(*pid)?;
            }
        }
    }
    Ok(target)
}

/// Reads the process table from the sandbox's /proc and signals from inside, as the init's
/// user: needs a `sh` with `cat` and `kill` in the image (busybox, coreutils).
fn through_the_sandbox(c: &Container, sig: i32) -> Result<SignalTarget, String> {
    let exec = ContainerExec(c);
    let run = |script: &str| {
        let argv = ["/bin/sh".to_string(), "-c".into(), script.to_string()];
        let out = exec
            .exec(Place::Sandbox, &argv, &[], HELPER_TIMEOUT)
            .map_err(|e| e.to_string())?;
        if !out.success() {
            return Err(format!(
                "/bin/sh in the sandbox: {} (terminal signals after a restore need runsc with \
                 `kill --pgid`, or a shell in the image)",
                out.output.trim()
            ));
        }
        Ok(out.output)
    };
    // The helper's own pid comes last: the output keeps its end when long.
    let out = run("cat /proc/[0-9]*/stat 2>/dev/null; echo; echo self $$")?;
    let me: i32 = out
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("self ")?.trim().parse().ok())
        .ok_or("the helper did not say its pid")?;
    let rows = parse_proc_stat(&out);
    let helpers: Vec<i32> = rows
        .iter()
        .filter(|r| r.pid == me || r.ppid == me)
        .map(|r| r.pid)
        .collect();
    let target = foreground(&rows, &helpers).ok_or("the sandbox lists no process")?;
    // Plain pids: shells' `kill` builtins differ on negative ones (process groups).
    let pids: Vec<String> = match &target {
        SignalTarget::Group(g) => rows
            .iter()
            .filter(|r| r.pgid == Some(*g) && !helpers.contains(&r.pid))
            .map(|r| r.pid.to_string())
            .collect(),
        SignalTarget::Processes(pids) => pids.iter().map(i32::to_string).collect(),
    };
    run(&format!("kill -{sig} {}", pids.join(" ")))?;
    Ok(target)
}
