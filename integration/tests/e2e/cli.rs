//! chalkctl covers a sandbox's whole life: run (with a terminal, env, directory and limits),
//! attach and detach, exec (status, streams, stdin, a terminal), logs, wait, names, rm. The
//! interactive parts run in a real terminal (tmux) and go through containerd and runsc.

use chalk_integration::tmux::Tmux;

use super::*;

const LONG: Duration = Duration::from_secs(20);

/// A chalkctl command line in a terminal.
fn terminal(e: &Env, name: &str, args: &[&str], size: (u32, u32)) -> Result<Tmux, Failed> {
    let mut argv = e.c.chalkctl_argv().map_err(|e| e.to_string())?;
    argv.extend(args.iter().map(|a| a.to_string()));
    Ok(Tmux::start(name, &argv, size.0, size.1)?)
}

/// With `CHALK_SESSION_LOG` set, what a step showed is appended there (the closing note's
/// transcript of a session).
fn show(step: &str, text: &str) {
    if let Some(path) = std::env::var_os("CHALK_SESSION_LOG") {
        use std::io::Write;
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = writeln!(f, "## {step}\n{}\n", text.trim_end());
        }
    }
}

fn show_screen(step: &str, t: &Tmux) {
    if std::env::var_os("CHALK_SESSION_LOG").is_some() {
        show(step, &t.screen().unwrap_or_default());
    }
}

/// Nothing of `id` is left, chalkctl's directory for it included.
fn gone(e: &Env, id: &str) -> TestResult {
    e.assert_clean(id)?;
    let kept = e.c.chalkctl_state().join(&e.c.namespace).join(id);
    ensure!(!kept.exists(), "chalkctl rm left {}", kept.display());
    Ok(())
}

fn refused(out: &CtrOutput, what: &str, says: &str) -> TestResult {
    ensure!(
        out.code != 0 && out.stderr.contains(says),
        "{what} should be refused saying {says:?}: {out:?}"
    );
    Ok(())
}

/// The closing note's session: run --tty, attach, detach, fork, attach to the fork (its window
/// size followed, Ctrl-C in it), suspend and resume the fork and attach again, logs, rm of
/// everything.
pub fn cli_terminal_session_run_attach_fork_logs_rm(e: &Env) -> TestResult {
    let (id, fork) = ("cli-tty", "cli-tty-twin");
    let ids = [id, fork];
    for i in ids {
        e.chalkctl(&["rm", "--force", "--id", i]);
        e.remove(i);
    }
    let result = (|| {
        let out = e.chalkctl(&["run", "--tty", "--name", "cli-box", IMAGE, id, "--", "sh"]);
        ensure!(out.code == 0, "run --tty: {out:?}");
        show(
            "chalkctl run --tty --name cli-box busybox cli-tty -- sh",
            &out.stdout,
        );
        let t = terminal(e, "a", &["attach", "--id", "cli-box"], (100, 30))?;
        t.wait_for("detach with Ctrl-P Ctrl-Q", LONG)?;
        t.line("echo hello-$((6*7))")?;
        t.wait_for("hello-42", LONG)?;
        t.line("stty size")?;
        t.wait_for("30 100", LONG)?;
        t.keys(&["C-p", "C-q"])?;
        t.wait_for("detached from cli-tty", LONG)?;
        t.wait_for("rc=0", LONG)?;
        show_screen(
            "chalkctl attach --id cli-box (typed, then Ctrl-P Ctrl-Q)",
            &t,
        );
        ensure!(
            e.task_status(id).as_deref() == Some("RUNNING"),
            "detaching stopped the sandbox"
        );
        drop(t);

        let out = e.chalkctl(&["fork", "--id", "cli-box", "--fork-id", fork]);
        ensure!(out.code == 0, "fork: {out:?}");
        show(
            "chalkctl fork --id cli-box --fork-id cli-tty-twin",
            &[out.stdout.as_str(), &out.stderr].concat(),
        );
        let t = terminal(e, "b", &["attach", "--id", fork], (90, 25))?;
        t.wait_for("detach with Ctrl-P Ctrl-Q", LONG)?;
        t.line("echo in-the-$((1+1))nd")?;
        t.wait_for("in-the-2nd", LONG)?;
        // The fork's terminal follows this window, and its resizes.
        t.line("stty size")?;
        t.wait_for("25 90", LONG)?;
        t.resize(120, 40)?;
        std::thread::sleep(Duration::from_millis(500));
        t.line("stty size")?;
        t.wait_for("40 120", LONG)?;
        // Ctrl-C reaches the fork's foreground job through its terminal.
        t.line("sleep 100")?;
        std::thread::sleep(Duration::from_millis(700));
        t.keys(&["C-c"])?;
        t.line("echo after-ctrl-c=$?")?;
        t.wait_for("after-ctrl-c=130", LONG)?;
        t.keys(&["C-p", "C-q"])?;
        t.wait_for("rc=0", LONG)?;
        show_screen(
            "chalkctl attach --id cli-tty-twin (resized to 120x40, Ctrl-C, detached)",
            &t,
        );
        drop(t);

        // Suspended and resumed, the fork is attached to again, and its log goes on.
        let out = e.chalkctl(&["suspend", "--id", fork]);
        ensure!(out.code == 0, "suspend: {out:?}");
        let out = e.chalkctl(&["attach", "--id", fork]);
        refused(&out, "attach to a suspended sandbox", "is suspended")?;
        let out = e.chalkctl(&["resume", "--id", fork]);
        ensure!(out.code == 0, "resume: {out:?}");
        let t = terminal(e, "c", &["attach", "--id", fork], (80, 24))?;
        t.wait_for("detach with Ctrl-P Ctrl-Q", LONG)?;
        t.line("echo resumed-$((3*3))")?;
        t.wait_for("resumed-9", LONG)?;
        // exec -t in the same terminal's size, and Ctrl-C to it.
        t.keys(&["C-p", "C-q"])?;
        t.wait_for("rc=0", LONG)?;
        drop(t);

        let logs = e.chalkctl(&["logs", "--id", "cli-box"]);
        ensure!(
            logs.code == 0 && logs.stdout.contains("hello-42"),
            "logs of the source: {logs:?}"
        );
        show("chalkctl logs --id cli-box", &logs.stdout);
        let logs = e.chalkctl(&["logs", "--id", fork]);
        show(
            "chalkctl logs --id cli-tty-twin (suspended and resumed in between)",
            &logs.stdout,
        );
        ensure!(
            logs.code == 0
                && logs.stdout.contains("in-the-2nd")
                && logs.stdout.contains("resumed-9"),
            "logs of the fork, before its suspend and after its resume: {logs:?}"
        );
        ensure!(
            !logs.stdout.contains("hello-42"),
            "the fork's log holds the source's output from before the fork: {logs:?}"
        );

        let out = e.chalkctl(&["rm", "--id", id]);
        refused(&out, "rm of a running sandbox", "--force")?;
        show("chalkctl rm --id cli-tty", &out.stderr);
        ensure!(e.task_status(id).is_some(), "a refused rm removed the task");
        let out = e.chalkctl_json(&[
            "rm", "--force", "--grace", "2s", "--id", "cli-box", "--id", fork,
        ])?;
        ensure!(
            out["removed"].as_array().map(Vec::len) == Some(2),
            "rm: {out}"
        );
        for i in ids {
            gone(e, i)?;
        }
        Ok(())
    })();
    e.conclude(result, &ids, &[])
}

/// exec: the exit status, both streams, stdin, env and directory; -t a terminal of the
/// window's size, Ctrl-C delivered; run's env, directory and limits seen inside; wait.
pub fn cli_exec_run_options_and_wait(e: &Env) -> TestResult {
    let (id, short) = ("cli-exec", "cli-short");
    let ids = [id, short];
    for i in ids {
        e.chalkctl(&["rm", "--force", "--id", i]);
        e.remove(i);
    }
    let result = (|| {
        let out = e.chalkctl(&[
            "run",
            "--env",
            "GREETING=hi",
            "--cwd",
            "/tmp",
            "--memory",
            "256m",
            "--cpus",
            "0.5",
            IMAGE,
            id,
            "--",
            "sh",
            "-c",
            "echo started; sleep 100000",
        ]);
        ensure!(out.code == 0, "run: {out:?}");
        let out = e.chalkctl(&["wait", "--id", id, "--for", "running", "--timeout", "10s"]);
        ensure!(out.code == 0, "wait --for running: {out:?}");

        let out = e.chalkctl(&[
            "exec",
            "--id",
            id,
            "--",
            "sh",
            "-c",
            "echo out; echo err >&2; exit 7",
        ]);
        ensure!(
            out.code == 7 && out.stdout == "out\n" && out.stderr == "err\n",
            "exec status and streams: {out:?}"
        );
        let out = e.chalkctl(&[
            "exec",
            "--id",
            id,
            "-e",
            "EXTRA=2",
            "--",
            "sh",
            "-c",
            "echo $GREETING$EXTRA; pwd",
        ]);
        ensure!(
            out.code == 0 && out.stdout == "hi2\n/tmp\n",
            "exec env and directory: {out:?}"
        );
        let out = e.chalkctl(&["exec", "--id", id, "--cwd", "/etc", "--", "pwd"]);
        ensure!(out.stdout == "/etc\n", "exec --cwd: {out:?}");
        let mut cmd = e.c.chalkctl_command().map_err(|e| e.to_string())?;
        let piped = cmd
            .args(["exec", "-i", "--id", id, "--", "sh", "-c", "tr a-z A-Z"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| e.to_string())?;
        {
            use std::io::Write;
            let mut stdin = piped.stdin.as_ref().ok_or("no stdin")?;
            stdin.write_all(b"piped in\n").map_err(|e| e.to_string())?;
        }
        let mut piped = piped;
        drop(piped.stdin.take());
        let got = piped.wait_with_output().map_err(|e| e.to_string())?;
        ensure!(
            got.status.success() && String::from_utf8_lossy(&got.stdout) == "PIPED IN\n",
            "exec -i: {got:?}"
        );

        // The limits are the sandbox's cgroup's (runsc puts it there).
        let cgroup = ["/sys/fs/cgroup", "/sys/fs/cgroup/memory"]
            .iter()
            .map(|root| PathBuf::from(root).join(&e.c.namespace).join(id))
            .find(|p| p.is_dir())
            .ok_or("the sandbox has no cgroup /<namespace>/<id>")?;
        let read = |f: &str| std::fs::read_to_string(cgroup.join(f)).unwrap_or_default();
        let memory = [read("memory.max"), read("memory.limit_in_bytes")].concat();
        ensure!(
            memory.trim() == "268435456",
            "memory limit in {}: {memory:?}",
            cgroup.display()
        );
        let cpu = read("cpu.max");
        let quota = if cpu.is_empty() {
            let v1 = PathBuf::from("/sys/fs/cgroup/cpu")
                .join(&e.c.namespace)
                .join(id);
            std::fs::read_to_string(v1.join("cpu.cfs_quota_us")).unwrap_or_default()
        } else {
            cpu
        };
        ensure!(quota.starts_with("50000"), "cpu quota: {quota:?}");

        // A terminal of the window's size, and Ctrl-C to what runs on it.
        let t = terminal(
            e,
            "x",
            &["exec", "-t", "-i", "--id", id, "--", "sh"],
            (70, 20),
        )?;
        t.line("stty size; [ -t 0 ] && echo on-a-$((1+2))-tty")?;
        t.wait_for("20 70", LONG)?;
        t.wait_for("on-a-3-tty", LONG)?;
        t.line("sleep 100")?;
        std::thread::sleep(Duration::from_millis(700));
        t.keys(&["C-c"])?;
        t.line("echo ctrl-c=$?; exit 5")?;
        t.wait_for("ctrl-c=130", LONG)?;
        t.wait_for("rc=5", LONG)?;
        drop(t);

        let logs = e.chalkctl(&["logs", "--id", id]);
        ensure!(
            logs.stdout == "started\n",
            "a sandbox without a terminal logs its output: {logs:?}"
        );
        let out = e.chalkctl(&["wait", "--id", id, "--timeout", "1s"]);
        refused(&out, "wait past its timeout", "still runs")?;

        let out = e.chalkctl(&[
            "run",
            IMAGE,
            short,
            "--",
            "sh",
            "-c",
            "sleep 2; echo bye; exit 3",
        ]);
        ensure!(out.code == 0, "run: {out:?}");
        let follow = e.chalkctl(&["logs", "-f", "--id", short]);
        ensure!(
            follow.stdout == "bye\n",
            "logs -f follows to the end: {follow:?}"
        );
        let out = e.chalkctl(&["wait", "--id", short]);
        ensure!(out.code == 0 && out.stdout.trim() == "3", "wait: {out:?}");
        let out = e.chalkctl(&["exec", "--id", short, "--", "true"]);
        refused(&out, "exec in a stopped sandbox", "needs it running")?;
        let out = e.chalkctl(&["rm", "--id", short]);
        ensure!(out.code == 0, "rm of a stopped sandbox: {out:?}");
        gone(e, short)?;
        let out = e.chalkctl(&["rm", "--force", "--id", id]);
        ensure!(out.code == 0, "rm --force: {out:?}");
        gone(e, id)?;
        Ok(())
    })();
    e.conclude(result, &ids, &[])
}

/// Names wherever ids go, snapshot create --no-wait and snapshot wait, and rm of a suspended
/// sandbox keeping its snapshot.
pub fn cli_names_snapshot_wait_and_rm_of_a_suspended_sandbox(e: &Env) -> TestResult {
    let (id, fork) = ("cli-named", "cli-named-fork");
    let ids = [id, fork];
    for i in ids {
        e.chalkctl(&["rm", "--force", "--id", i]);
        e.remove(i);
    }
    let mut snaps = Vec::new();
    let result = (|| {
        let out = e.chalkctl(&[
            "run", "--name", "alice", IMAGE, id, "--", "sh", "-c", COUNTER,
        ]);
        ensure!(out.code == 0, "run: {out:?}");
        let again = e.chalkctl(&["run", "--name", "alice", IMAGE, "cli-other", "--", "true"]);
        refused(&again, "a name taken", "is taken")?;
        let again = e.chalkctl(&["run", IMAGE, id, "--", "true"]);
        refused(&again, "an id taken", "exists already")?;
        let got = e.chalkctl_json(&["get", "--id", "alice"])?;
        ensure!(
            got["id"] == id && got["name"] == "alice",
            "get by name: {got}"
        );

        let out = e.chalkctl(&[
            "snapshot",
            "create",
            "--id",
            "alice",
            "--name",
            "alice-1",
            "--no-wait",
        ]);
        ensure!(
            out.code == 0 && out.stdout.contains("pending"),
            "create --no-wait: {out:?}"
        );
        let waited = e.chalkctl(&[
            "snapshot",
            "wait",
            "--snapshot-id",
            "alice-1",
            "--timeout",
            "120s",
        ]);
        ensure!(
            waited.code == 0 && waited.stdout.starts_with("sha256:"),
            "snapshot wait: {waited:?}"
        );
        snaps.push(waited.stdout.trim().to_string());
        let got = e.chalkctl_json(&["snapshot", "get", "--snapshot-id", "alice-1"])?;
        ensure!(
            got["given_name"] == "alice-1" && got["status"] == "completed",
            "{got}"
        );
        let dup = e.chalkctl(&["snapshot", "create", "--id", id, "--name", "alice-1"]);
        refused(&dup, "a snapshot name taken", "is taken")?;

        let out = e.chalkctl_json(&[
            "fork",
            "--snapshot-id",
            "alice-1",
            "--fork-id",
            fork,
            "--name",
            "bob",
        ])?;
        ensure!(
            out["forks"][0]["error"].is_null(),
            "fork by snapshot name: {out}"
        );
        let out = e.chalkctl(&["exec", "--id", "bob", "--", "cat", "/tmp/count"]);
        ensure!(
            out.code == 0 && !out.stdout.trim().is_empty(),
            "exec by name: {out:?}"
        );

        let out = e.chalkctl_json(&["suspend", "--id", "bob"])?;
        let kept = out["snapshot"]["id"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        snaps.push(kept.clone());
        let out = e.chalkctl(&["rm", "--id", "bob"]);
        ensure!(
            out.code == 0 && out.stdout.contains(&format!("its snapshot {kept} remains")),
            "rm of a suspended sandbox names its snapshot: {out:?}"
        );
        gone(e, fork)?;
        let still = e.chalkctl_json(&["snapshot", "get", "--snapshot-id", &kept])?;
        ensure!(
            still["status"] == "completed",
            "rm removed the snapshot: {still}"
        );
        let out = e.chalkctl(&["rm", "--force", "--id", "alice"]);
        ensure!(out.code == 0, "rm by name: {out:?}");
        gone(e, id)?;
        let out = e.chalkctl(&["get", "--id", "alice"]);
        ensure!(out.code != 0, "a removed name still answers: {out:?}");
        Ok(())
    })();
    e.conclude(result, &ids, &snaps)
}
