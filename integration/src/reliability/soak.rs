//! The soak: `cycles` times run a sandbox, snapshot it, fork the snapshot, suspend and resume
//! the fork, then delete them and their snapshots. Every `every` cycles it snapshots a
//! long-lived sandbox (whose shim lives through the whole soak) and deletes that snapshot,
//! timing it, and samples that shim's and containerd's RSS and open fds, containerd's
//! content store, the snapshot store and containerd's whole directory: flat at the end, or a
//! leak.

use std::time::Instant;

use serde_json::{json, Value};

use super::{fds, secs, Node};
use crate::bench::via_ctr::rss;
use crate::containerd::bytes_under;

/// Snapshots the long-lived sandbox and deletes the snapshot: how long the snapshot took.
fn snapshot_base(n: &Node, base: &str) -> Result<u64, String> {
    let t = Instant::now();
    let kept = n.chalkctl_json(&["snapshot", "create", "--id", base])?;
    let took = t.elapsed().as_millis() as u64;
    let kept = kept["id"].as_str().unwrap_or_default().to_string();
    let out = n.chalkctl(&["snapshot", "delete", "--snapshot-id", &kept]);
    if out.code != 0 {
        return Err(format!("snapshot delete {kept}: {}", out.stderr.trim()));
    }
    Ok(took)
}

fn log_bytes(n: &Node) -> u64 {
    std::fs::metadata(n.c.dir().join("containerd.log")).map_or(0, |m| m.len())
}

/// One sample: what grows if something leaks.
fn sample(n: &Node, cycle: usize, base: &str, base_snapshot_ms: u64) -> Value {
    let shim = n.shim_pid(base);
    let containerd = n.containerd_pid();
    // This containerd's runsc processes (their --root is below its directory).
    let here = n.c.dir().display().to_string();
    let runsc = crate::procs::processes()
        .into_iter()
        .filter(|(_, a)| {
            a.iter().any(|x| x.contains("runsc")) && a.iter().any(|x| x.contains(&here))
        })
        .count();
    json!({
        "cycle": cycle,
        "shim_rss": shim.and_then(rss),
        "shim_fds": shim.and_then(fds),
        "containerd_rss": containerd.and_then(rss),
        "containerd_fds": containerd.and_then(fds),
        "content_bytes": bytes_under(&n.c.content_blobs()),
        "store_bytes": bytes_under(&n.c.snapshot_store()),
        // The test's containerd logs at debug level into its directory: counted apart.
        "disk_bytes": bytes_under(n.c.dir()).saturating_sub(log_bytes(n)),
        "log_bytes": log_bytes(n),
        "runsc_processes": runsc,
        "unpacked_checkpoints": n.c.unpacked_checkpoints().len(),
        "base_snapshot_ms": base_snapshot_ms,
    })
}

/// The ids of a soak: the same every cycle (a leftover shows as a clash), the cell's own
/// (two cells may soak at once on one host).
fn ids() -> [String; 3] {
    let cell = std::env::var("CHALK_CELL").unwrap_or_default();
    let cell = if cell.is_empty() { "x".into() } else { cell };
    ["run", "fork", "base"].map(|k| format!("soak-{cell}-{k}"))
}

/// One cycle.
fn cycle(n: &Node) -> Result<(), String> {
    let [src, fork, _] = ids();
    let (src, fork) = (src.as_str(), fork.as_str());
    n.run(src)?;
    n.counts_to(src, 2)?;
    let snap = n.chalkctl_json(&["snapshot", "create", "--id", src])?;
    let snap = snap["id"].as_str().unwrap_or_default().to_string();
    n.chalkctl_json(&["fork", "--snapshot-id", &snap, "--fork-id", fork])?;
    n.chalkctl_json(&["suspend", "--id", fork])?;
    n.chalkctl_json(&["resume", "--id", fork])?;
    n.counts_to(fork, 3)?;
    n.remove(fork)?;
    n.remove(src)
}

/// Runs the soak: its result line (with the samples, and how each measure moved).
pub fn run(n: &Node, cycles: usize, every: usize) -> Value {
    let started = Instant::now();
    let ids = ids();
    let base = ids[2].as_str();
    let mut samples = Vec::new();
    let mut failure = None;
    let mut done = 0;
    let mut slowest = 0.0f64;
    match n.run(base).and_then(|()| n.counts_to(base, 2).map(drop)) {
        Err(e) => failure = Some(e),
        Ok(()) => {
            samples.push(sample(n, 0, base, 0));
            for i in 1..=cycles {
                let t = Instant::now();
                if let Err(e) = cycle(n) {
                    failure = Some(format!("cycle {i}: {e}"));
                    break;
                }
                slowest = slowest.max(t.elapsed().as_secs_f64());
                done = i;
                if i % every.max(1) == 0 || i == cycles {
                    let took = match snapshot_base(n, base) {
                        Ok(ms) => ms,
                        Err(e) => {
                            failure = Some(format!("the long-lived sandbox at cycle {i}: {e}"));
                            break;
                        }
                    };
                    samples.push(sample(n, i, base, took));
                    eprintln!(
                        "soak: {i} of {cycles} cycles, {:.0} s",
                        secs(started.elapsed())
                    );
                }
            }
        }
    }
    let base_ok = n.count(base).is_some();
    let _ = n.remove(base);
    let left = n.leftovers(&ids);
    let growth = growth(&samples);
    // The long-lived sandbox's snapshot time is runsc's (the 2022 build's grows with the
    // processes a sandbox has ever run): shown, not judged.
    let leaks: Vec<String> = growth
        .iter()
        .filter(|(k, g)| g.leak && k != "base_snapshot_ms")
        .map(|(k, g)| format!("{k} grew from {} to {}", g.first, g.last))
        .collect();
    let passed = failure.is_none() && base_ok && left.is_empty() && leaks.is_empty();
    let failure = failure
        .or_else(|| (!base_ok).then(|| "the long-lived sandbox stopped answering".into()))
        .or_else(|| (!left.is_empty()).then(|| format!("left behind: {left:?}")))
        .or_else(|| (!leaks.is_empty()).then(|| leaks.join("; ")));
    json!({
        "case": "soak",
        "cell": std::env::var("CHALK_CELL").unwrap_or_default(),
        "passed": passed,
        "seconds": secs(started.elapsed()),
        "cycles": done,
        "seconds_per_cycle": if done > 0 { started.elapsed().as_secs_f64() / done as f64 } else { 0.0 },
        "slowest_cycle_seconds": slowest,
        "notes": growth.iter().map(|(k, g)| g.describe(k)).collect::<Vec<_>>(),
        "failure": failure,
        "samples": samples,
    })
}

/// How one measure moved over the soak.
#[derive(Debug, PartialEq)]
pub struct Growth {
    pub first: u64,
    pub last: u64,
    pub max: u64,
    /// Grew past what warming up explains: the second half's mean well above the first's
    /// (10% and a floor) and the last sample above the first by as much.
    pub leak: bool,
}

impl Growth {
    fn describe(&self, what: &str) -> String {
        format!(
            "{what}: {} at the start, {} at the end (max {}){}",
            self.first,
            self.last,
            self.max,
            match (self.leak, what) {
                (true, "base_snapshot_ms") => ": grows (runsc's; not judged)",
                (true, _) => ": GROWS",
                _ => ": flat",
            }
        )
    }
}

/// Floors below which a change is noise, per measure.
fn floor(measure: &str) -> u64 {
    match measure {
        m if m.ends_with("_fds") || m == "runsc_processes" || m == "unpacked_checkpoints" => 2,
        "shim_rss" | "containerd_rss" => 8 << 20,
        // A snapshot of the long-lived sandbox taking a second longer is not noise.
        "base_snapshot_ms" => 1000,
        _ => 16 << 20,
    }
}

/// Each measure's growth over `samples` (taken after the first cycle: the start is warm-up).
pub fn growth(samples: &[Value]) -> Vec<(String, Growth)> {
    let measures = [
        "shim_rss",
        "shim_fds",
        "containerd_rss",
        "containerd_fds",
        "content_bytes",
        "store_bytes",
        "disk_bytes",
        "runsc_processes",
        "unpacked_checkpoints",
        "base_snapshot_ms",
    ];
    let warm: Vec<&Value> = samples.iter().skip(1).collect();
    measures
        .iter()
        .filter_map(|m| {
            let values: Vec<u64> = warm.iter().filter_map(|s| s[*m].as_u64()).collect();
            let (first, last) = (*values.first()?, *values.last()?);
            let max = values.iter().copied().max().unwrap_or(0);
            let half = values.len() / 2;
            let mean = |v: &[u64]| v.iter().sum::<u64>() as f64 / v.len().max(1) as f64;
            let (early, late) = (mean(&values[..half.max(1)]), mean(&values[half..]));
            let slack = (early * 0.1).max(floor(m) as f64);
            let leak =
                values.len() >= 3 && late > early + slack && last as f64 > first as f64 + slack;
            Some((
                m.to_string(),
                Growth {
                    first,
                    last,
                    max,
                    leak,
                },
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples(key: &str, values: &[u64]) -> Vec<Value> {
        std::iter::once(json!({key: 999_999_999u64}))
            .chain(values.iter().map(|v| json!({ key: v })))
            .collect()
    }

    #[test]
    fn a_flat_measure_is_not_a_leak_and_warm_up_is_ignored() {
        let g = growth(&samples("shim_fds", &[20, 21, 20, 22, 21, 20]));
        assert_eq!(g.len(), 1);
        assert!(!g[0].1.leak, "{:?}", g[0]);
        assert_eq!((g[0].1.first, g[0].1.last, g[0].1.max), (20, 20, 22));
    }

    #[test]
    fn steady_growth_is_a_leak_and_noise_is_not() {
        let fds = growth(&samples("shim_fds", &[20, 24, 28, 32, 36, 40]));
        assert!(fds[0].1.leak);
        let mb = 1 << 20;
        let rss = growth(&samples(
            "shim_rss",
            &[30 * mb, 31 * mb, 33 * mb, 32 * mb, 34 * mb],
        ));
        assert!(!rss[0].1.leak, "a few MB of allocator noise: {:?}", rss[0]);
        let rss = growth(&samples(
            "shim_rss",
            &[30 * mb, 45 * mb, 60 * mb, 75 * mb, 90 * mb],
        ));
        assert!(rss[0].1.leak);
    }

    #[test]
    fn too_few_samples_prove_nothing() {
        assert!(!growth(&samples("shim_fds", &[1, 100]))[0].1.leak);
        assert!(growth(&samples("other", &[1, 2, 3])).is_empty());
    }
}
