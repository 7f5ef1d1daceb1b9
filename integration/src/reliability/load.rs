//! Load: 50 sandboxes at once, 16 concurrent forks of one snapshot, 8 concurrent snapshots
//! of different sandboxes. Each ends with what it left checked (nothing may stay).

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{secs, Node};

/// Runs `f` on every item, `width` at a time, in threads: each one's result in order.
fn in_parallel<T: Sync, R: Send>(items: &[T], width: usize, f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let mut out = Vec::with_capacity(items.len());
    for batch in items.chunks(width.max(1)) {
        let done: Vec<R> = std::thread::scope(|s| {
            let handles: Vec<_> = batch.iter().map(|i| s.spawn(|| f(i))).collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("worker"))
                .collect()
        });
        out.extend(done);
    }
    out
}

fn first_error(results: Vec<Result<(), String>>) -> Result<(), String> {
    let failed: Vec<String> = results.into_iter().filter_map(Result::err).collect();
    match failed.first() {
        None => Ok(()),
        Some(first) => Err(format!("{} failed; the first: {first}", failed.len())),
    }
}

/// Removes `ids`, then checks nothing of them is left.
fn clean(n: &Node, ids: &[String]) -> Result<Duration, String> {
    let started = Instant::now();
    first_error(in_parallel(ids, 8, |id| n.remove(id)))?;
    let took = started.elapsed();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left = n.leftovers(ids);
        if left.is_empty() {
            return Ok(took);
        }
        if Instant::now() > deadline {
            return Err(format!("left behind: {left:?}"));
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// One load case's result line (the shape of the e2e suite's `$CHALK_RESULTS` lines).
fn line(case: &str, started: Instant, outcome: Result<Vec<String>, String>) -> Value {
    let (passed, notes, failure) = match outcome {
        Ok(notes) => (true, notes, None),
        Err(e) => (false, Vec::new(), Some(e)),
    };
    json!({
        "case": case,
        "cell": std::env::var("CHALK_CELL").unwrap_or_default(),
        "passed": passed,
        "seconds": secs(started.elapsed()),
        "notes": notes,
        "failure": failure,
    })
}

/// 50 sandboxes started (8 at a time), every one answering, then all removed.
pub fn fifty_sandboxes(n: &Node) -> Value {
    let started = Instant::now();
    let ids: Vec<String> = (0..50).map(|i| format!("load-{i:02}")).collect();
    let outcome = (|| {
        // A counter that wakes once a second: fifty busy loops under ptrace would measure
        // two cores, not the runtime.
        let slow = "i=0; while true; do i=$((i+1)); echo $i > /tmp/c.new; \
                    mv /tmp/c.new /tmp/count; sleep 1; done";
        let run = first_error(in_parallel(&ids, 8, |id| n.run_with(id, slow)));
        let running = started.elapsed();
        let answered =
            run.and_then(|()| first_error(in_parallel(&ids, 8, |id| n.counts_to(id, 1).map(drop))));
        let answering = started.elapsed();
        let shims: u64 = ids
            .iter()
            .filter_map(|id| n.shim_pid(id))
            .filter_map(crate::bench::via_ctr::rss)
            .sum();
        let containerd = n.containerd_pid().and_then(crate::bench::via_ctr::rss);
        let cleaned = clean(n, &ids);
        answered?;
        let removed = cleaned?;
        Ok(vec![
            format!(
                "50 running in {:.1} s, all answering at {:.1} s",
                secs(running),
                secs(answering)
            ),
            format!(
                "shims' RSS {:.0} MB in all ({:.1} MB each), containerd's {:.0} MB",
                shims as f64 / 1e6,
                shims as f64 / 50e6,
                containerd.unwrap_or(0) as f64 / 1e6
            ),
            format!("all removed in {:.1} s, nothing left", secs(removed)),
        ])
    })();
    line("load_fifty_sandboxes_at_once", started, outcome)
}

/// One snapshot forked 16 times at once (16 chalkctl processes): every fork runs and counts
/// on from the snapshot.
pub fn sixteen_concurrent_forks(n: &Node) -> Value {
    let started = Instant::now();
    let src = "load-src".to_string();
    let forks: Vec<String> = (0..16).map(|i| format!("load-fork-{i:02}")).collect();
    let outcome = (|| {
        n.run(&src)?;
        n.counts_to(&src, 3)?;
        let snap = n.chalkctl_json(&["snapshot", "create", "--id", &src])?;
        let snap = snap["id"].as_str().unwrap_or_default().to_string();
        let forking = Instant::now();
        let forked = first_error(in_parallel(&forks, 16, |f| {
            n.chalkctl_json(&["fork", "--snapshot-id", &snap, "--fork-id", f])
                .map(drop)
        }));
        let took = forking.elapsed();
        let counting = forked
            .and_then(|()| first_error(in_parallel(&forks, 8, |f| n.counts_to(f, 4).map(drop))));
        let mut all = forks.clone();
        all.push(src.clone());
        let cleaned = clean(n, &all);
        counting?;
        cleaned?;
        Ok(vec![
            format!(
                "16 forks of one snapshot at once: all running in {:.1} s ({:.2} s a fork)",
                secs(took),
                took.as_secs_f64() / 16.0
            ),
            "every fork counted on from the snapshot; nothing left".into(),
        ])
    })();
    line(
        "load_sixteen_concurrent_forks_of_one_snapshot",
        started,
        outcome,
    )
}

/// 8 sandboxes snapshotted at once: every snapshot completes and opens whole.
pub fn eight_concurrent_snapshots(n: &Node) -> Value {
    let started = Instant::now();
    let ids: Vec<String> = (0..8).map(|i| format!("load-snap-{i}")).collect();
    let outcome = (|| {
        first_error(in_parallel(&ids, 8, |id| n.run(id)))?;
        first_error(in_parallel(&ids, 8, |id| n.counts_to(id, 3).map(drop)))?;
        let taking = Instant::now();
        let taken: Vec<Result<String, String>> = in_parallel(&ids, 8, |id| {
            n.chalkctl_json(&["snapshot", "create", "--id", id])
                .map(|v| v["id"].as_str().unwrap_or_default().to_string())
        });
        let took = taking.elapsed();
        let opened = first_error(
            taken
                .iter()
                .map(|t| {
                    let id = t.clone()?;
                    let got = n.chalkctl_json(&["snapshot", "get", "--snapshot-id", &id])?;
                    if got["status"] == "completed" {
                        Ok(())
                    } else {
                        Err(format!("snapshot {id} reads {}", got["status"]))
                    }
                })
                .collect(),
        );
        let still = first_error(in_parallel(&ids, 8, |id| {
            let now = n.count(id).ok_or(format!("{id} stopped answering"))?;
            n.counts_to(id, now + 1).map(drop)
        }));
        let cleaned = clean(n, &ids);
        opened?;
        still?;
        cleaned?;
        Ok(vec![
            format!(
                "8 snapshots of 8 sandboxes at once: all completed in {:.1} s",
                secs(took)
            ),
            "each opens whole; every source ran on; nothing left".into(),
        ])
    })();
    line("load_eight_concurrent_snapshots", started, outcome)
}
