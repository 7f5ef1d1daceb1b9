//! The benchmark behind `scripts/bench`: the same operations through this shim, through
//! containerd's runc shim driving runsc, and with runsc alone. Statistics and the report are
//! pure; the drivers spawn the real programs.

pub mod report;
pub mod runsc_alone;
pub mod stats;
pub mod via_ctr;

use std::time::{Duration, Instant};

/// Runs `f` and returns how long it took with what it returned.
pub fn timed<T, E>(f: impl FnOnce() -> Result<T, E>) -> Result<(Duration, T), E> {
    let started = Instant::now();
    let out = f()?;
    Ok((started.elapsed(), out))
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
/// this process runs and waits for itself only after two seconds, left to their waiter.
pub fn reap_orphans() {
    use std::collections::HashMap;
    // SAFETY: prctl with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    std::thread::spawn(|| {
        let mut seen: HashMap<i32, Instant> = HashMap::new();
        loop {
            // SAFETY: waitid fills a zeroed siginfo_t; WNOWAIT leaves the zombie in place.
            let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
            let rc =
                unsafe { libc::waitid(libc::P_ALL, 0, &mut info, libc::WEXITED | libc::WNOWAIT) };
            if rc != 0 {
                std::thread::sleep(Duration::from_millis(50)); // no children
                continue;
            }
            // SAFETY: waitid succeeded, so si_pid is set.
            let pid = unsafe { info.si_pid() };
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            let since = *seen.entry(pid).or_insert_with(Instant::now);
            let waited_for = WAITED_FOR.contains(&comm.trim());
            if !waited_for || since.elapsed() > Duration::from_secs(2) {
                // SAFETY: reaps one exited child by pid.
                unsafe { libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG) };
                seen.remove(&pid);
            } else {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    });
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
    let mem_kb: u64 = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!(
        "{model}, {cores} cores, {:.0} GB memory, Linux {}",
        mem_kb as f64 / 1e6,
        kernel.trim()
    )
}
