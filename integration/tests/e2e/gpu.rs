//! GPU sandboxes with the cuda-checkpoint STAND-IN (integration/standin/cuda-checkpoint: the
//! real command line and state machine, no GPU), through real containerd and runsc: the order
//! of the handoff, roll-back on failures, the lock timeout, restore and unlock in forks and on
//! resume, and the manifest's GPU section. Only a GPU machine can show that GPU memory
//! survives: integration/gpu/.

use std::sync::OnceLock;

use chalk_integration::containerd::{CUDA_CHECKPOINT_STANDIN, GPU_STANDIN_IMAGE};

use super::*;

fn run_gpu(e: &Env, id: &str, extra: &[&str]) -> TestResult {
    import_standin_image(e)?;
    let script = workload();
    let mut args = vec![
        "run",
        "-d",
        "--runtime",
        RUNTIME,
        "--annotation",
        "chalk.io/gpu=true",
    ];
    args.extend_from_slice(extra);
    args.extend_from_slice(&[GPU_STANDIN_IMAGE, id, "sh", "-c", &script]);
    let out = e.ctr(&args);
    ensure!(out.code == 0, "run {id}: {out:?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while e
        .sh(id, "reg", &format!("ls {STATE} | grep -c '^[0-9]'"))
        .stdout
        .trim()
        != "2"
    {
        ensure!(
            Instant::now() < deadline,
            "{id} did not register its CUDA processes"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// The stand-in's pids (ascending) with their states, and its call log.
fn cuda(e: &Env, id: &str) -> (Vec<(u32, String)>, Vec<String>) {
    let states = e.sh(
        id,
        "states",
        &format!(
            "cd {STATE} && for p in $(ls | grep '^[0-9]' | sort -n); do echo $p $(cat $p); done"
        ),
    );
    let states = states
        .stdout
        .lines()
        .filter_map(|l| l.split_once(' '))
        .filter_map(|(p, s)| Some((p.parse().ok()?, s.to_string())))
        .collect();
    let calls = e.sh(id, "calls", &format!("cat {STATE}/calls.log 2>/dev/null"));
    (states, calls.stdout.lines().map(String::from).collect())
}

const STATE: &str = "/tmp/.cuda-standin";

/// Registers the shell (pid 1) and a background sleep as CUDA processes, then counts.
fn workload() -> String {
    format!(
        "mkdir -p {STATE}; echo running > {STATE}/$$; sleep 100000 & echo running > {STATE}/$!; {}",
        COUNTER
    )
}

fn import_standin_image(e: &Env) -> TestResult {
    static IMPORTED: OnceLock<Result<(), String>> = OnceLock::new();
    IMPORTED
        .get_or_init(|| {
            e.c.import_with(
                GPU_STANDIN_IMAGE,
                "cuda-standin",
                &[("bin/cuda-checkpoint", 0o755, CUDA_CHECKPOINT_STANDIN)],
            )
            .map_err(|e| e.to_string())
        })
        .clone()
        .map_err(Failed::from)
}

/// The calls of one handoff step over `pids`: e.g. `lock 1`, `lock 7`.
fn calls(actions: &[&str], pids: &[u32]) -> Vec<String> {
    actions
        .iter()
        .flat_map(|a| pids.iter().map(move |p| format!("{a} {p}")))
        .collect()
}

pub fn gpu_standin_handoff_around_snapshot_fork_and_resume(e: &Env) -> TestResult {
    let (src, fork) = ("gpu-src", "gpu-fork");
    for id in [src, fork] {
        e.remove(id);
    }
    let mut taken = Vec::new();
    let result = (|| {
        run_gpu(e, src, &[])?;
        let (states, _) = cuda(e, src);
        let pids: Vec<u32> = states.iter().map(|(p, _)| *p).collect();
        ensure!(pids.len() == 2 && pids[0] == 1, "registered: {states:?}");

        // Snapshot: lock, checkpoint (each, in order), runsc checkpoint, restore, unlock.
        let digest = e.snapshot_of(src)?;
        taken.push(digest.clone());
        let moved_out = calls(&["lock", "checkpoint"], &pids);
        let moved_back = calls(&["restore", "unlock"], &pids);
        let (states, log) = cuda(e, src);
        ensure!(
            log == [moved_out.clone(), moved_back.clone()].concat(),
            "source's calls: {log:?}"
        );
        ensure!(
            states.iter().all(|(_, s)| s == "running"),
            "source: {states:?}"
        );

        // The manifest says what was moved and with what.
        let got = e.chalkctl_json(&["snapshot", "get", "--snapshot-id", &digest])?;
        let gpu = &got["manifest"]["gpu"];
        ensure!(
            gpu["moved_pids"] == serde_json::json!(pids),
            "manifest gpu: {gpu}"
        );
        ensure!(gpu["handoff"] == "chalk", "manifest gpu: {gpu}");
        ensure!(
            gpu["cuda_checkpoint_version"]
                .as_str()
                .is_some_and(|v| v.contains("stand-in")),
            "manifest gpu: {gpu}"
        );

        // A fork starts with its processes checkpointed (as in the snapshot) and restores
        // and unlocks them before Start returns.
        e.chalkctl_json(&["fork", "--snapshot-id", &digest, "--fork-id", fork])?;
        let (states, log) = cuda(e, fork);
        ensure!(
            log == [moved_out.clone(), moved_back.clone()].concat(),
            "fork's calls: {log:?}"
        );
        ensure!(
            states.iter().all(|(_, s)| s == "running"),
            "fork: {states:?}"
        );

        // Suspend moves them out and stops; resume moves them back.
        taken.push(e.suspend_and_resume(src)?);
        let (states, log) = cuda(e, src);
        let expected = [moved_out.clone(), moved_back.clone(), moved_out, moved_back].concat();
        ensure!(log == expected, "resumed source's calls: {log:?}");
        ensure!(
            states.iter().all(|(_, s)| s == "running"),
            "resumed: {states:?}"
        );
        Ok(())
    })();
    e.conclude(result, &[src, fork], &taken)
}

pub fn gpu_standin_failures_leave_every_process_running(e: &Env) -> TestResult {
    let id = "gpu-fail";
    e.remove(id);
    let mut taken = Vec::new();
    let result = (|| {
        // A one-second lock timeout, from an options file.
        let opts = e.options_with("gpu.toml", "[gpu]\nlock_timeout_secs = 1\n")?;
        run_gpu(
            e,
            id,
            &["--runtime-config-path", opts.to_str().unwrap_or("")],
        )?;
        for (control, expect) in [
            ("fail lock", "--action lock"),
            ("fail checkpoint", "--action checkpoint"),
            ("noop checkpoint", "not checkpointed"),
            ("hang lock", "timed out after 1000 ms"),
            ("fail restore", "--action restore"),
        ] {
            e.sh(id, "ctl", &format!("echo '{control}' > {STATE}/control"));
            let started = Instant::now();
            let out = e.chalkctl(&["snapshot", "create", "--id", id]);
            ensure!(
                out.code != 0 && out.stderr.contains(expect),
                "{control}: {out:?}"
            );
            ensure!(
                started.elapsed() < Duration::from_secs(30),
                "{control}: too slow"
            );
            ensure!(
                e.task_status(id).as_deref() == Some("RUNNING"),
                "{control}: the source stopped"
            );
            let (states, log) = cuda(e, id);
            if control == "fail restore" {
                // After runsc's checkpoint nothing more can be undone: the snapshot failed,
                // the sandbox runs, and the processes read as the stand-in left them.
                ensure!(log.iter().any(|l| l.starts_with("restore")), "{log:?}");
            } else {
                ensure!(
                    states.iter().all(|(_, s)| s == "running"),
                    "{control}: not rolled back: {states:?}, calls {log:?}"
                );
            }
            e.sh(
                id,
                "clear",
                &format!("rm -f {STATE}/control {STATE}/calls.log"),
            );
        }
        let failed =
            e.chalkctl_json(&["snapshot", "list", "--sandbox-id", id, "--status", "failed"])?;
        for item in failed["items"].as_array().into_iter().flatten() {
            taken.push(item["name"].as_str().unwrap_or_default().to_string());
        }
        ensure!(taken.len() == 5, "failed snapshots: {failed}");
        Ok(())
    })();
    e.conclude(result, &[id], &taken)
}
