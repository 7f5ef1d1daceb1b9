//! The benchmark behind `scripts/bench`: the same operations through this shim, through
//! containerd's runc shim driving runsc, and with runsc alone. Statistics and the report are
//! pure; the drivers spawn the real programs.

pub mod cow;
pub mod network;
pub mod report;
pub mod runsc_alone;
pub mod stats;
pub mod via_ctr;

use std::time::{Duration, Instant};

/// Field `key` (with its colon, e.g. `"MemFree:"`) of `meminfo`, the text of /proc/meminfo:
/// its value in kB.
pub fn meminfo_kb(meminfo: &str, key: &str) -> Option<u64> {
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// Runs `f` and returns how long it took with what it returned.
pub fn timed<T, E>(f: impl FnOnce() -> Result<T, E>) -> Result<(Duration, T), E> {
    let started = Instant::now();
    let out = f()?;
    Ok((started.elapsed(), out))
}

/// Waits, up to `within`, until no server of a memory file runs on host `c` (a lazy pull's
/// blob is whole, or failed), so the next run starts from a quiet host.
pub fn wait_arrived(c: &crate::Containerd, snapshot: &str, within: Duration) -> Result<(), String> {
    let lazy = c.snapshot_store().join("lazy");
    let deadline = Instant::now() + within;
    while std::fs::read_dir(&lazy).is_ok_and(|d| {
        d.flatten()
            .any(|e| !e.file_name().to_string_lossy().ends_with(".lock"))
    }) {
        if Instant::now() > deadline {
            return Err(format!("the memory of {snapshot} did not arrive"));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(())
}

/// The entrypoint every benchmarked sandbox runs: a counter written to a file.
pub const COUNTER: &str = "i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.2; done";

/// The counter after writing `mb` megabytes of random data into the sandbox's memory (its
/// /tmp is in the memory-backed root overlay), then `/tmp/ready`.
pub fn filled_counter(mb: u64) -> String {
    format!(
        "dd if=/dev/urandom of=/tmp/fill bs=1048576 count={mb} iflag=fullblock 2>/dev/null; touch /tmp/ready; {COUNTER}"
    )
}

/// The programs this process starts and waits for (their `comm`).
const WAITED_FOR: [&str; 9] = [
    "ctr",
    "chalkctl",
    "runsc",
    "containerd",
    "sha256sum",
    "openssl",
    "gnuplot",
    "busybox",
    "curl",
];

/// Makes this process the subreaper of what it starts and reaps orphans promptly, as init
/// does on a normal host. `runsc delete` waits for the sandbox it killed to be reaped, and
/// the sandboxes `runsc create` starts are orphans: under a slow init (this machine's pid 1
/// reaps lazily), runsc alone would pay a second per delete that a host does not.
///
/// Orphans (runsc's sandboxes, daemonized shims) are reaped at once; zombies of the programs
/// this process runs and waits for itself only after two seconds, left to their waiter. Each
/// zombie is judged on its own: one left to its waiter never holds up the reaping of the
/// others (`waitid(P_ALL)` would keep answering with that one).
pub fn reap_orphans() {
    use std::collections::HashMap;
    // SAFETY: prctl with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    std::thread::spawn(|| {
        let mut seen: HashMap<i32, Instant> = HashMap::new();
        loop {
            let zombies = zombie_children();
            seen.retain(|pid, _| zombies.iter().any(|(z, _)| z == pid));
            for (pid, comm) in zombies {
                let since = *seen.entry(pid).or_insert_with(Instant::now);
                if !WAITED_FOR.contains(&comm.as_str()) || since.elapsed() > Duration::from_secs(2)
                {
                    // SAFETY: reaps one exited child by pid, without blocking.
                    unsafe { libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG) };
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    });
}

/// This process's children that have exited and wait to be reaped, with their `comm`.
/// Orphans are adopted by any of its threads, so every thread's children are read.
fn zombie_children() -> Vec<(i32, String)> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|list| {
            list.split_whitespace()
                .filter_map(|p| p.parse::<i32>().ok())
                .collect::<Vec<_>>()
        })
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            zombie_comm(&stat).map(|comm| (pid, comm))
        })
        .collect()
}

/// The `comm` of a `/proc/PID/stat` line whose state is zombie. The name is in parentheses
/// and may hold any character, so the state is read after the last `)`.
fn zombie_comm(stat: &str) -> Option<String> {
    let (open, close) = (stat.find('(')?, stat.rfind(')')?);
    let state = stat[close + 1..].split_whitespace().next()?;
    (state == "Z").then(|| stat[open + 1..close].to_string())
}

/// CPU model and count, memory, kernel.
pub fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|m| m.trim_start_matches([' ', '\t', ':']).to_string())
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_kb = meminfo_kb(&meminfo, "MemTotal:").unwrap_or(0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!(
        "{model}, {cores} cores, {:.0} GB memory, Linux {}",
        mem_kb as f64 / 1e6,
        kernel.trim()
    )
}

#[cfg(test)]
mod reaping_tests {
    use super::zombie_comm;

    #[test]
    fn a_zombie_is_told_from_its_stat_line_whatever_its_name() {
        assert_eq!(
            zombie_comm("41 (exe) Z 7 41 41 0 -1").as_deref(),
            Some("exe")
        );
        assert_eq!(zombie_comm("42 (a) b) Z 7 42").as_deref(), Some("a) b"));
        assert_eq!(zombie_comm("43 (runsc) S 7 43 43 0"), None);
        assert_eq!(zombie_comm("garbage"), None);
    }
}
