//! A sandbox's life through containerd: run, exit statuses, output and stdin, logging
//! binaries, exec, capabilities, kill, pause and resume, pids, metrics, update, events, OOM.

use super::*;

// ---- run, exit statuses, output -------------------------------------------------------------

pub fn run_rm_echo(e: &Env) -> TestResult {
    let out = e.run_rm("echo", &[], &["echo", "hi"]);
    ensure!(out.code == 0 && out.stdout == "hi\n", "got {out:?}");
    e.assert_clean("echo")
}

pub fn exit_code_is_exact(e: &Env) -> TestResult {
    let out = e.run_rm("exit7", &[], &["sh", "-c", "exit 7"]);
    ensure!(out.code == 7, "exit 7 gave {out:?}");
    let out = e.run_rm("selfkill", &[], &["sh", "-c", "kill -9 $$"]);
    ensure!(out.code == 137, "a SIGKILLed init gave {out:?}");
    Ok(())
}

pub fn kill_gives_128_plus_signal(e: &Env) -> TestResult {
    let fg = e.background(&[
        "run",
        "--rm",
        "--runtime",
        RUNTIME,
        IMAGE,
        "killed",
        "sleep",
        "1000",
    ]);
    e.wait_status("killed", "RUNNING", Duration::from_secs(20))?;
    let out = e.ctr(&["task", "kill", "-s", "SIGKILL", "killed"]);
    ensure!(out.code == 0, "kill: {out:?}");
    let out = fg.finish();
    ensure!(out.code == 137, "ctr run of a SIGKILLed task gave {out:?}");
    e.assert_clean("killed")
}

pub fn wait_returns_status_and_exit_time(e: &Env) -> TestResult {
    let before = SystemTime::now();
    e.run_detached("waited", &["sh", "-c", "sleep 0.5; exit 5"])?;
    let (status, at) = e.api().wait("waited", "").map_err(Failed::from)?;
    let after = SystemTime::now();
    e.remove("waited");
    ensure!(status == 5, "Wait gave status {status}");
    ensure!(
        at >= before && at <= after,
        "exit time {at:?} outside [{before:?}, {after:?}]"
    );
    Ok(())
}

pub fn output_is_never_lost(e: &Env) -> TestResult {
    let out = e.run_rm("seq", &[], &["sh", "-c", "seq 1 100000"]);
    ensure!(out.code == 0, "seq: {}", out.stderr);
    let lines: Vec<&str> = out.stdout.lines().collect();
    ensure!(lines.len() == 100000, "got {} lines", lines.len());
    ensure!(
        lines.last() == Some(&"100000"),
        "last line {:?}",
        lines.last()
    );
    let out = e.run_rm("stderr", &[], &["sh", "-c", "echo to-err >&2; echo to-out"]);
    ensure!(
        out.stdout == "to-out\n" && out.stderr.contains("to-err"),
        "got {out:?}"
    );
    Ok(())
}

pub fn stdin_reaches_the_process_and_close_io_ends_it(e: &Env) -> TestResult {
    let out = e.c.ctr_with_input(
        [
            "run",
            "--rm",
            "--runtime",
            RUNTIME,
            IMAGE,
            "stdin",
            "sh",
            "-c",
            "cat; echo done",
        ],
        b"hello through stdin\n",
    );
    ensure!(out.code == 0, "{out:?}");
    ensure!(
        out.stdout == "hello through stdin\ndone\n",
        "got {:?}",
        out.stdout
    );
    Ok(())
}

pub fn binary_log_uri_feeds_a_logging_binary(e: &Env) -> TestResult {
    // containerd's logging-binary protocol: stdout on fd 3, stderr on fd 4, ready on fd 5.
    let dir = e.c.dir().join("binlog");
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let script = dir.join("logger.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\n\
         cat <&3 5>&- > \"$2/out\" &\n\
         cat <&4 5>&- > \"$2/err\" &\n\
         echo \"$CONTAINER_NAMESPACE/$CONTAINER_ID\" > \"$2/who\"\n\
         exec 5>&-\n\
         wait\n",
    )
    .map_err(|e| e.to_string())?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| e.to_string())?;
    let uri = format!("binary://{}?dir={}", script.display(), dir.display());
    let out = e.ctr(&[
        "run",
        "-d",
        "--log-uri",
        &uri,
        "--runtime",
        RUNTIME,
        IMAGE,
        "binlog",
        "sh",
        "-c",
        "echo out-line; echo err-line >&2",
    ]);
    ensure!(out.code == 0, "run with a logging binary: {out:?}");
    e.wait_status("binlog", "STOPPED", Duration::from_secs(20))?;
    e.remove("binlog");
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(10);
    while read("err").is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    ensure!(
        read("out") == "out-line\n",
        "logged stdout: {:?}",
        read("out")
    );
    ensure!(
        read("err") == "err-line\n",
        "logged stderr: {:?}",
        read("err")
    );
    ensure!(
        read("who").trim() == format!("{}/binlog", e.c.namespace),
        "env: {:?}",
        read("who")
    );
    e.assert_clean("binlog")
}

// ---- exec ------------------------------------------------------------------------------------

pub fn exec_has_its_own_status_and_output(e: &Env) -> TestResult {
    e.run_detached("execs", &["sleep", "1000"])?;
    let result = (|| {
        let out = e.ctr(&[
            "task",
            "exec",
            "--exec-id",
            "e1",
            "execs",
            "sh",
            "-c",
            "echo from-exec; exit 3",
        ]);
        ensure!(
            out.code == 3 && out.stdout == "from-exec\n",
            "exec gave {out:?}"
        );
        let fg = e.background(&["task", "exec", "--exec-id", "e2", "execs", "sleep", "1000"]);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let out = e.ctr(&["task", "kill", "--exec-id", "e2", "-s", "SIGKILL", "execs"]);
            if out.code == 0 {
                break;
            }
            ensure!(Instant::now() < deadline, "could not kill exec e2: {out:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
        let out = fg.finish();
        ensure!(out.code == 137, "SIGKILLed exec gave {out:?}");
        ensure!(
            e.task_status("execs").as_deref() == Some("RUNNING"),
            "init must survive its execs"
        );
        let out = e.ctr(&["task", "exec", "--exec-id", "e3", "execs", "/nonexistent"]);
        ensure!(
            out.code != 0 && out.stderr.contains("nonexistent"),
            "bad exec gave {out:?}"
        );
        Ok(())
    })();
    e.remove("execs");
    result?;
    e.assert_clean("execs")
}

pub fn non_root_processes_get_no_effective_capabilities(e: &Env) -> TestResult {
    e.run_detached("caps", &["sleep", "60"])?;
    let eff = |user: Option<&str>| {
        let mut args = vec!["task", "exec", "--exec-id", "capeff"];
        if let Some(u) = user {
            args.extend_from_slice(&["--user", u]);
        }
        args.extend_from_slice(&["caps", "grep", "CapEff", "/proc/self/status"]);
        e.ctr(&args)
    };
    let root = eff(None);
    let user = eff(Some("1000"));
    e.remove("caps");
    // As under runc: a non-root process keeps only its ambient capabilities after execve.
    ensure!(
        root.code == 0 && !root.stdout.contains("0000000000000000"),
        "root should keep capabilities: {root:?}"
    );
    ensure!(
        user.code == 0 && user.stdout.trim_end().ends_with("0000000000000000"),
        "uid 1000 must have none effective: {user:?}"
    );
    e.assert_clean("caps")
}

pub fn kill_all_stops_every_process(e: &Env) -> TestResult {
    e.run_detached("killall", &["sh", "-c", "sleep 1000 & sleep 1000 & wait"])?;
    let out = e.ctr(&["task", "kill", "-a", "-s", "SIGKILL", "killall"]);
    ensure!(out.code == 0, "kill -a: {out:?}");
    e.wait_status("killall", "STOPPED", Duration::from_secs(20))?;
    let out = e.ctr(&["task", "kill", "-s", "SIGKILL", "killall"]);
    ensure!(
        out.code != 0 && out.stderr.contains("already finished"),
        "kill of a stopped task: {out:?}"
    );
    e.remove("killall");
    e.assert_clean("killall")
}

// ---- pause, resume, ps, metrics, update ----------------------------------------------------

pub fn pause_resume_and_pids(e: &Env) -> TestResult {
    e.run_detached(
        "paused",
        &[
            "sh",
            "-c",
            "while true; do date +%s%N > /tmp/t; sleep 0.1; done",
        ],
    )?;
    let result = (|| {
        let ps = e.ctr(&["task", "ps", "paused"]);
        ensure!(ps.code == 0 && ps.stdout.lines().count() >= 2, "ps: {ps:?}");
        ensure!(
            ps.stdout
                .lines()
                .any(|l| l.split_whitespace().next() == Some("1")),
            "pid 1 in ps: {ps:?}"
        );
        let out = e.ctr(&["task", "pause", "paused"]);
        ensure!(out.code == 0, "pause: {out:?}");
        ensure!(
            e.task_status("paused").as_deref() == Some("PAUSED"),
            "not PAUSED"
        );
        let out = e.ctr(&["task", "pause", "paused"]);
        ensure!(out.code != 0, "pausing twice must fail");
        let out = e.ctr(&["task", "resume", "paused"]);
        ensure!(out.code == 0, "resume: {out:?}");
        ensure!(
            e.task_status("paused").as_deref() == Some("RUNNING"),
            "not RUNNING after resume"
        );
        let out = e.ctr(&[
            "task",
            "exec",
            "--exec-id",
            "after",
            "paused",
            "cat",
            "/tmp/t",
        ]);
        ensure!(out.code == 0, "exec after resume: {out:?}");
        Ok(())
    })();
    e.remove("paused");
    result
}

pub fn metrics_report_sandbox_usage(e: &Env) -> TestResult {
    e.run_detached("metrics", &["sh", "-c", "sleep 1000 & sleep 1000"])?;
    std::thread::sleep(Duration::from_millis(300));
    let out = e.ctr(&["task", "metrics", "metrics"]);
    e.remove("metrics");
    ensure!(out.code == 0, "metrics: {out:?}");
    let value = |name: &str| -> Option<u64> {
        out.stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    ensure!(
        value("memory.usage_in_bytes").unwrap_or(0) > 0,
        "memory usage: {}",
        out.stdout
    );
    ensure!(
        value("cpuacct.usage").unwrap_or(0) > 0,
        "cpu usage: {}",
        out.stdout
    );
    ensure!(
        value("pids.current").unwrap_or(0) >= 2,
        "pids: {}",
        out.stdout
    );
    Ok(())
}

pub fn update_changes_the_sandbox_limits(e: &Env) -> TestResult {
    e.run_detached("updated", &["sleep", "1000"])?;
    let result = (|| {
        let pid = e.task_pid("updated").ok_or("no pid")?;
        let cgroup =
            std::fs::read_to_string(format!("/proc/{pid}/cgroup")).map_err(|e| e.to_string())?;
        let rel = cgroup
            .lines()
            .find_map(|l| l.split_once(":memory:").map(|(_, p)| p.to_string()))
            .ok_or("no memory cgroup")?;
        let limit_file = PathBuf::from("/sys/fs/cgroup/memory")
            .join(rel.trim_start_matches('/'))
            .join("memory.limit_in_bytes");
        let limit = 300 * 1024 * 1024u64;
        e.api()
            .update_resources("updated", &serde_json::json!({"memory": {"limit": limit}}))
            .map_err(Failed::from)?;
        let now = std::fs::read_to_string(&limit_file).map_err(|e| e.to_string())?;
        ensure!(
            now.trim() == limit.to_string(),
            "{} reads {now}",
            limit_file.display()
        );
        Ok(())
    })();
    e.remove("updated");
    result
}

// ---- events ------------------------------------------------------------------------------------

pub fn events_cover_the_lifecycle(e: &Env) -> TestResult {
    let (steps, text) = e.capture_events(|| {
        e.run_detached("evented", &["sleep", "1000"])?;
        let out = e.ctr(&["task", "exec", "--exec-id", "ev1", "evented", "true"]);
        ensure!(out.code == 0, "exec: {out:?}");
        ensure!(e.ctr(&["task", "pause", "evented"]).code == 0, "pause");
        ensure!(e.ctr(&["task", "resume", "evented"]).code == 0, "resume");
        e.remove("evented");
        Ok(())
    });
    steps?;
    let mine: Vec<&str> = text.lines().filter(|l| l.contains("\"evented\"")).collect();
    for topic in [
        "/tasks/create",
        "/tasks/start",
        "/tasks/exec-added",
        "/tasks/exec-started",
        "/tasks/exit",
        "/tasks/paused",
        "/tasks/resumed",
        "/tasks/delete",
    ] {
        ensure!(
            mine.iter().any(|l| l.contains(topic)),
            "no {topic} event in:\n{}",
            mine.join("\n")
        );
    }
    let order: Vec<usize> = ["/tasks/create", "/tasks/start", "/tasks/delete"]
        .iter()
        .map(|t| mine.iter().position(|l| l.contains(t)).unwrap())
        .collect();
    ensure!(
        order.windows(2).all(|w| w[0] < w[1]),
        "events out of order:\n{}",
        mine.join("\n")
    );
    Ok(())
}

pub fn oom_is_reported(e: &Env) -> TestResult {
    // 64 MiB limit, 256 MiB written to the sandbox's in-memory /dev/shm.
    let (out, text) = e.capture_events(|| {
        e.run_rm(
            "oom",
            &["--memory-limit", "67108864"],
            &[
                "sh",
                "-c",
                "dd if=/dev/zero of=/dev/shm/fill bs=1M count=256; sleep 5",
            ],
        )
    });
    ensure!(
        out.code == 137,
        "an OOM-killed sandbox exits 137, got {out:?}"
    );
    ensure!(
        text.lines()
            .any(|l| l.contains("/tasks/oom") && l.contains("\"oom\"")),
        "no /tasks/oom event:\n{text}"
    );
    e.assert_clean("oom")
}
