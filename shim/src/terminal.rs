//! Terminal signals in a restored sandbox, delivered by the shim (runsc attaches no terminal
//! to a restored sandbox, so the signals a terminal raises go nowhere: see
//! `chalk_runtime::terminal`). The foreground job comes from runsc's process table, or, where
//! runsc cannot list the container's processes (a fork on the 2022 build keeps its source's
//! container id inside), from the sandbox's own /proc through `sh`.

use std::{
    sync::{Arc, Weak},
    time::{Duration, Instant},
};

use chalk_hooks::{Exec, Place};
use chalk_runtime::terminal::{foreground, parse_proc_stat, parse_ps_table, SignalTarget};

use crate::{container::Container, hooks::ContainerExec, io::TerminalSignals};

/// How long the in-sandbox helper may take.
const HELPER_TIMEOUT: Duration = Duration::from_secs(5);

/// What the terminal of restored sandbox `c` calls with each signal its keys raise; each is
/// delivered on a thread of its own, so typing never waits for runsc.
pub fn signals_for(c: &Arc<Container>) -> TerminalSignals {
    let weak: Weak<Container> = Arc::downgrade(c);
    Arc::new(move |sig| {
        let weak = weak.clone();
        std::thread::spawn(move || {
            if let Some(c) = weak.upgrade() {
                deliver(&c, sig);
            }
        });
    })
}

/// Sends `sig` to the foreground job of `c`'s terminal.
pub fn deliver(c: &Container, sig: i32) {
    let started = Instant::now();
    let table = c
        .runsc
        .ps_table(&c.id)
        .map(|t| parse_ps_table(&t))
        .unwrap_or_default();
    let outcome = if table.is_empty() {
        through_the_sandbox(c, sig)
    } else {
        through_runsc(c, sig, foreground(&table, &[]))
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

fn through_runsc(
    c: &Container,
    sig: i32,
    target: Option<SignalTarget>,
) -> Result<SignalTarget, String> {
    let target = target.ok_or("the sandbox lists no process")?;
    match &target {
        SignalTarget::Group(g) if c.features.kill_has_pgid() => c
            .runsc
            .kill_group(&c.id, sig as u32, *g)
            .map_err(|e| e.to_string())?,
        // A table with groups comes only from runsc builds that can signal them.
        SignalTarget::Group(g) => return Err(format!("this runsc cannot signal group {g}")),
        SignalTarget::Processes(pids) => {
            for pid in pids {
                c.runsc
                    .kill(&c.id, sig as u32, false, Some(*pid))
                    .map_err(|e| e.to_string())?;
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
        let out = exec.exec(Place::Sandbox, &argv, &[], HELPER_TIMEOUT)?;
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
