//! End-to-end tests: a private containerd (Debian's, or `CHALK_CONTAINERD`), the real runsc and
//! the chalk shim, driven through containerd's own `ctr` and gRPC API. Nothing is faked.

use std::{
    io::Read,
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use chalk_integration::{api::Api, containerd::IMAGE, Containerd, CtrOutput, RUNTIME};
use libtest_mimic::{Arguments, Failed, Trial};

type TestResult = Result<(), Failed>;

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(Failed::from(format!($($fmt)+)));
        }
    };
}

struct Env {
    c: Containerd,
}

/// A `ctr` running in the background (a foreground `ctr run` or `ctr task exec`).
struct Background(Child);

impl Background {
    fn finish(self) -> CtrOutput {
        self.0.wait_with_output().expect("wait ctr").into()
    }
}

impl Env {
    fn ctr(&self, args: &[&str]) -> CtrOutput {
        self.c.ctr(args)
    }

    fn run_rm(&self, id: &str, extra: &[&str], cmd: &[&str]) -> CtrOutput {
        let mut args = vec!["run", "--rm", "--runtime", RUNTIME];
        args.extend_from_slice(extra);
        args.extend_from_slice(&[IMAGE, id]);
        args.extend_from_slice(cmd);
        self.ctr(&args)
    }

    fn run_detached(&self, id: &str, cmd: &[&str]) -> TestResult {
        let mut args = vec!["run", "-d", "--runtime", RUNTIME, IMAGE, id];
        args.extend_from_slice(cmd);
        let out = self.ctr(&args);
        ensure!(
            out.code == 0,
            "ctr run -d {id}: {} {}",
            out.stdout,
            out.stderr
        );
        Ok(())
    }

    fn background(&self, args: &[&str]) -> Background {
        let child = self
            .c
            .ctr_command()
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn ctr");
        Background(child)
    }

    /// The task's status column from `ctr task ls`, e.g. RUNNING.
    fn task_status(&self, id: &str) -> Option<String> {
        self.ctr(&["task", "ls"])
            .stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(id))
            .and_then(|l| l.split_whitespace().nth(2).map(String::from))
    }

    fn wait_status(&self, id: &str, want: &str, timeout: Duration) -> TestResult {
        let deadline = Instant::now() + timeout;
        loop {
            let status = self.task_status(id);
            if status.as_deref() == Some(want) {
                return Ok(());
            }
            ensure!(
                Instant::now() < deadline,
                "task {id} is {status:?}, not {want} after {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn task_pid(&self, id: &str) -> Option<i32> {
        self.ctr(&["task", "ls"])
            .stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(id))
            .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
    }

    /// Kills, deletes the task and removes the container; errors ignored (best effort).
    fn remove(&self, id: &str) {
        if self.task_status(id).is_some() {
            self.ctr(&["task", "kill", "-a", "-s", "SIGKILL", id]);
            let _ = self.wait_status(id, "STOPPED", Duration::from_secs(10));
            self.ctr(&["task", "delete", id]);
        }
        self.ctr(&["containers", "rm", id]);
    }

    fn bundle(&self, id: &str) -> PathBuf {
        self.c
            .dir()
            .join("state/io.containerd.runtime.v2.task")
            .join(&self.c.namespace)
            .join(id)
    }

    /// Checks that no trace of container `id` is left: no runsc process, runsc state, mount,
    /// bundle or network namespace.
    fn assert_clean(&self, id: &str) -> TestResult {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let leftovers = self.leftovers(id);
            if leftovers.is_empty() {
                return Ok(());
            }
            ensure!(Instant::now() < deadline, "{id} left behind: {leftovers:?}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn leftovers(&self, id: &str) -> Vec<String> {
        let mut found = Vec::new();
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
                continue;
            };
            let args: Vec<String> = cmdline
                .split(|b| *b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            let is_runsc = args.iter().any(|a| a.contains("runsc"));
            if is_runsc && args.iter().any(|a| a == id) {
                found.push(format!(
                    "process {}: {}",
                    entry.file_name().to_string_lossy(),
                    args.join(" ")
                ));
            }
        }
        let root = self.c.runsc_root();
        for entry in std::fs::read_dir(&root).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.contains(id) {
                found.push(format!("runsc state {name}"));
            }
        }
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        let here = self.c.dir().display().to_string();
        let mine = |l: &&str| l.contains(&here) || l.contains("/run/chalk");
        for m in mounts
            .lines()
            .filter(mine)
            .filter(|l| l.contains(&format!("/{id}/")) || l.contains(&format!("-{id} ")))
        {
            found.push(format!("mount {m}"));
        }
        if self.bundle(id).exists() {
            found.push(format!("bundle {}", self.bundle(id).display()));
        }
        found
    }

    /// Writes a runtime options file: this containerd's own with `extra` after it.
    fn options_with(&self, name: &str, extra: &str) -> Result<PathBuf, Failed> {
        let base = std::fs::read_to_string(self.c.options_path()).map_err(|e| e.to_string())?;
        Ok(self.options_file(name, &format!("{base}\n{extra}")))
    }

    /// `ctr run -d` of `cmd` as `id` with the runtime options file `options`.
    fn run_detached_with(&self, id: &str, options: &std::path::Path, cmd: &[&str]) -> TestResult {
        let path = options.display().to_string();
        let mut args = vec![
            "run",
            "-d",
            "--runtime",
            RUNTIME,
            "--runtime-config-path",
            &path,
        ];
        args.extend_from_slice(&[IMAGE, id]);
        args.extend_from_slice(cmd);
        let out = self.ctr(&args);
        ensure!(out.code == 0, "ctr run -d {id}: {out:?}");
        Ok(())
    }

    /// Writes a runtime options file and returns its path.
    fn options_file(&self, name: &str, text: &str) -> PathBuf {
        let path = self.c.dir().join(name);
        std::fs::write(&path, text).expect("write options");
        path
    }

    /// Runs `f` while `ctr events` listens; returns what `f` returned and the events seen.
    fn capture_events<T>(&self, f: impl FnOnce() -> T) -> (T, String) {
        let mut events = self.background(&["events"]);
        std::thread::sleep(Duration::from_millis(300));
        let result = f();
        std::thread::sleep(Duration::from_millis(500));
        let _ = events.0.kill();
        let mut text = String::new();
        if let Some(mut stdout) = events.0.stdout.take() {
            let _ = stdout.read_to_string(&mut text);
        }
        let _ = events.0.wait();
        (result, text)
    }

    fn api(&self) -> Api {
        Api::connect(&self.c.socket(), &self.c.namespace).expect("connect to containerd")
    }
}

// ---- run, exit statuses, output -------------------------------------------------------------

fn run_rm_echo(e: &Env) -> TestResult {
    let out = e.run_rm("echo", &[], &["echo", "hi"]);
    ensure!(out.code == 0 && out.stdout == "hi\n", "got {out:?}");
    e.assert_clean("echo")
}

fn exit_code_is_exact(e: &Env) -> TestResult {
    let out = e.run_rm("exit7", &[], &["sh", "-c", "exit 7"]);
    ensure!(out.code == 7, "exit 7 gave {out:?}");
    let out = e.run_rm("selfkill", &[], &["sh", "-c", "kill -9 $$"]);
    ensure!(out.code == 137, "a SIGKILLed init gave {out:?}");
    Ok(())
}

fn kill_gives_128_plus_signal(e: &Env) -> TestResult {
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

fn wait_returns_status_and_exit_time(e: &Env) -> TestResult {
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

fn output_is_never_lost(e: &Env) -> TestResult {
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

fn stdin_reaches_the_process_and_close_io_ends_it(e: &Env) -> TestResult {
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

fn binary_log_uri_feeds_a_logging_binary(e: &Env) -> TestResult {
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

/// nerdctl (`CHALK_NERDCTL`) against the same containerd: attached, and detached with its
/// logging binary (`binary://`) and `nerdctl logs`.
fn nerdctl_runs_sandboxes(e: &Env) -> TestResult {
    let nerdctl = std::env::var("CHALK_NERDCTL").map_err(|_| "CHALK_NERDCTL is not set")?;
    let data_root = e.c.dir().join("nerdctl");
    let run = |args: &[&str]| -> CtrOutput {
        Command::new(&nerdctl)
            .arg("--address")
            .arg(e.c.socket())
            .args(["--namespace", &e.c.namespace, "--data-root"])
            .arg(&data_root)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run nerdctl")
            .into()
    };
    let out = run(&[
        "run",
        "--rm",
        "--net",
        "none",
        "--runtime",
        RUNTIME,
        IMAGE,
        "echo",
        "hello from nerdctl",
    ]);
    ensure!(
        out.code == 0 && out.stdout == "hello from nerdctl\n",
        "nerdctl run --rm: {out:?}"
    );

    let out = run(&[
        "run",
        "-d",
        "--name",
        "nerd",
        "--net",
        "none",
        "--runtime",
        RUNTIME,
        IMAGE,
        "sh",
        "-c",
        "echo to-log; echo to-err >&2; sleep 1000",
    ]);
    ensure!(out.code == 0, "nerdctl run -d: {out:?}");
    let id = out.stdout.trim().to_string();
    let deadline = Instant::now() + Duration::from_secs(20);
    let logs = loop {
        let logs = run(&["logs", "nerd"]);
        if logs.stdout.contains("to-log") && logs.stderr.contains("to-err")
            || Instant::now() > deadline
        {
            break logs;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let removed = run(&["rm", "-f", "nerd"]);
    ensure!(
        logs.stdout == "to-log\n" && logs.stderr == "to-err\n",
        "nerdctl logs: {logs:?}"
    );
    ensure!(removed.code == 0, "nerdctl rm -f: {removed:?}");
    e.assert_clean(&id)
}

// ---- exec ------------------------------------------------------------------------------------

fn exec_has_its_own_status_and_output(e: &Env) -> TestResult {
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

fn non_root_processes_get_no_effective_capabilities(e: &Env) -> TestResult {
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

fn kill_all_stops_every_process(e: &Env) -> TestResult {
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

fn pause_resume_and_pids(e: &Env) -> TestResult {
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

fn metrics_report_sandbox_usage(e: &Env) -> TestResult {
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

fn update_changes_the_sandbox_limits(e: &Env) -> TestResult {
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

// ---- TTY ---------------------------------------------------------------------------------------

/// Shell that prints `size=ROWS COLS` once the terminal has a size: ctr sends ResizePty only
/// after the process started (ctr 1.6 puts no consoleSize in the spec), so the first instants
/// may see no size (busybox's stty then prints nothing useful), with runc as with runsc.
const PRINT_SIZE: &str = "i=0; until s=$(stty size 2>/dev/null) && [ \"${s#[1-9]}\" != \"$s\" ]; \
                          do i=$((i+1)); [ $i -gt 100 ] && break; sleep 0.1; done; echo size=$s";

/// Runs a ctr command under `script`, which gives it a pseudo-terminal of 45 rows, 123 columns.
fn under_terminal(e: &Env, ctr_args: &str) -> CtrOutput {
    let ctr = format!(
        "ctr --address {} --namespace {}",
        e.c.socket().display(),
        e.c.namespace
    );
    let ctr = match std::env::var("CHALK_CTR") {
        Ok(p) if !p.is_empty() => ctr.replacen("ctr", &p, 1),
        _ => ctr,
    };
    let mut child = Command::new("script")
        .args([
            "-qefc",
            &format!("stty cols 123 rows 45; {ctr} {ctr_args}"),
            "/dev/null",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run script");
    // script ends the session at end-of-file on its stdin, which /dev/null gives at once: a
    // slow start could then lose the command's output. The pipe stays open until it is done.
    let stdin = child.stdin.take();
    let out = child.wait_with_output().expect("wait for script");
    drop(stdin);
    out.into()
}

fn tty_and_resize(e: &Env) -> TestResult {
    let out = under_terminal(
        e,
        &format!(
            "run --rm -t --runtime {RUNTIME} {IMAGE} tty sh -c 'test -t 0 && test -t 1 && echo is-a-tty; {PRINT_SIZE}'"
        ),
    );
    ensure!(out.code == 0, "tty run: {out:?}");
    ensure!(
        out.stdout.contains("is-a-tty"),
        "stdin/stdout are not a terminal: {:?}",
        out.stdout
    );
    ensure!(
        out.stdout.contains("size=45 123"),
        "ResizePty did not reach the sandbox: {:?}; shim said: {:?}",
        out.stdout,
        e.c.log()
            .lines()
            .filter(|l| l.contains("terminal of tty"))
            .collect::<Vec<_>>()
    );

    // ResizePty on a running process reaches the sandbox's terminal.
    let out = under_terminal(
        e,
        &format!(
            "run -d -t --runtime {RUNTIME} {IMAGE} ttyresize sh -c \
             'while ! test -e /tmp/go; do sleep 0.1; done; stty size > /tmp/size; sleep 1000'"
        ),
    );
    ensure!(out.code == 0, "run -d -t: {out:?}");
    let resized = e
        .api()
        .resize_pty("ttyresize", "", 77, 33)
        .map_err(Failed::from);
    let out = e.ctr(&[
        "task",
        "exec",
        "--exec-id",
        "go",
        "ttyresize",
        "sh",
        "-c",
        "touch /tmp/go; while ! test -s /tmp/size; do sleep 0.1; done; cat /tmp/size",
    ]);
    e.remove("ttyresize");
    resized?;
    ensure!(
        out.stdout.trim() == "33 77",
        "size after ResizePty: {out:?}"
    );

    e.run_detached("ttyexec", &["sleep", "1000"])?;
    let out = under_terminal(
        e,
        &format!("task exec -t --exec-id t1 ttyexec sh -c '{PRINT_SIZE}; exit 4'"),
    );
    e.remove("ttyexec");
    ensure!(out.code == 4, "tty exec status: {out:?}");
    ensure!(
        out.stdout.contains("size=45 123"),
        "exec tty size: {:?}",
        out.stdout
    );
    e.assert_clean("tty")
}

// ---- events ------------------------------------------------------------------------------------

fn events_cover_the_lifecycle(e: &Env) -> TestResult {
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

fn oom_is_reported(e: &Env) -> TestResult {
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

// ---- failures and cleanup -----------------------------------------------------------------------

fn bad_process_fails_with_reason_and_leaves_nothing(e: &Env) -> TestResult {
    let out = e.run_rm("badproc", &[], &["/does/not/exist"]);
    ensure!(out.code != 0, "a missing binary must fail: {out:?}");
    ensure!(
        out.stderr.contains("/does/not/exist"),
        "error should name the binary: {}",
        out.stderr
    );
    // ctr deletes the failed task itself; if it is still listed it must read stopped.
    if e.task_status("badproc").is_some() {
        e.wait_status("badproc", "STOPPED", Duration::from_secs(10))?;
        let del = e.ctr(&["task", "delete", "badproc"]);
        ensure!(del.code == 0, "task delete: {del:?}");
    }
    e.ctr(&["containers", "rm", "badproc"]);
    e.assert_clean("badproc")
}

fn bad_spec_fails_at_create_with_runscs_reason(e: &Env) -> TestResult {
    let spec = e.ctr(&["oci", "spec"]);
    ensure!(spec.code == 0, "ctr oci spec: {spec:?}");
    let mut spec: serde_json::Value =
        serde_json::from_str(&spec.stdout).map_err(|e| e.to_string())?;
    spec["process"]["args"] = serde_json::json!(["true"]);
    spec["process"]["capabilities"]["bounding"] = serde_json::json!(["CAP_BOGUS"]);
    // A root filesystem holding the executable, so that runsc is the one to object.
    let root = e.c.dir().join("bad-spec-root");
    std::fs::create_dir_all(root.join("bin")).map_err(|e| e.to_string())?;
    std::fs::copy(
        chalk_integration::containerd::program("CHALK_BUSYBOX", "/bin/busybox"),
        root.join("bin/true"),
    )
    .map_err(|e| e.to_string())?;
    spec["root"]["path"] = root.display().to_string().into();
    let path = e.c.dir().join("bad-spec.json");
    std::fs::write(&path, spec.to_string()).map_err(|e| e.to_string())?;
    let out = e.ctr(&[
        "run",
        "--rm",
        "--runtime",
        RUNTIME,
        "--config",
        path.to_str().unwrap(),
        "badspec",
    ]);
    e.ctr(&["containers", "rm", "badspec"]);
    ensure!(out.code != 0, "a bad spec must fail: {out:?}");
    // runsc's own reason comes through: the 2022 build names the capability, current ones
    // stop at "creating loader: getting root credentials".
    ensure!(
        out.stderr
            .contains("runsc create badspec: exited with status")
            && out.stderr.contains("creating loader"),
        "error should say runsc create failed and why: {}",
        out.stderr
    );
    e.assert_clean("badspec")
}

fn missing_or_broken_runsc_is_a_clear_error(e: &Env) -> TestResult {
    // A path that does not exist, and a binary that is not runsc (fails when run).
    for (id, binary) in [
        ("norunsc", "/nonexistent/runsc"),
        ("badrunsc", "/bin/false"),
    ] {
        let opts = e.options_file(
            &format!("{id}.toml"),
            &format!(
                "binary_name = \"{binary}\"\nroot = \"{}\"\n",
                e.c.dir().join("runsc").display()
            ),
        );
        let out = e.run_rm(
            id,
            &["--runtime-config-path", opts.to_str().unwrap()],
            &["true"],
        );
        e.ctr(&["containers", "rm", id]);
        ensure!(out.code != 0, "{binary} must fail: {out:?}");
        ensure!(
            out.stderr.contains(binary) && out.stderr.contains("binary_name"),
            "error should name the binary and the option: {}",
            out.stderr
        );
        e.assert_clean(id)?;
    }
    Ok(())
}

fn bad_options_are_named(e: &Env) -> TestResult {
    for (name, text, needle) in [
        ("unknown-key.toml", "bogus_key = 1\n", "bogus_key"),
        (
            "unknown-flag.toml",
            "[runsc_config]\nno-such-flag = \"x\"\n",
            "no-such-flag",
        ),
        ("bad-value.toml", "log_level = \"loud\"\n", "loud"),
    ] {
        let opts = e.options_file(name, text);
        let id = format!("badopt-{}", name.trim_end_matches(".toml"));
        let out = e.run_rm(
            &id,
            &["--runtime-config-path", opts.to_str().unwrap()],
            &["true"],
        );
        e.ctr(&["containers", "rm", &id]);
        ensure!(
            out.code != 0 && out.stderr.contains(needle),
            "{name}: {out:?}"
        );
        e.assert_clean(&id)?;
    }
    Ok(())
}

fn runsc_debug_log_when_asked(e: &Env) -> TestResult {
    let logs = e.c.dir().join("runsc-logs");
    let opts = e.options_file(
        "debug.toml",
        &format!(
            "root = \"{}\"\n[runsc_config]\nplatform = \"ptrace\"\nnetwork = \"none\"\ndebug = true\ndebug-log = \"{}/%ID%/\"\n",
            e.c.dir().join("runsc").display(),
            logs.display()
        ),
    );
    let out = e.run_rm(
        "debuglog",
        &["--runtime-config-path", opts.to_str().unwrap()],
        &["echo", "x"],
    );
    ensure!(out.code == 0 && out.stdout == "x\n", "{out:?}");
    let files = std::fs::read_dir(logs.join("debuglog"))
        .map(|d| d.count())
        .unwrap_or(0);
    ensure!(files > 0, "no runsc debug logs under {}", logs.display());
    Ok(())
}

fn shim_logs_reach_containerd(e: &Env) -> TestResult {
    let out = e.run_rm("logged", &[], &["true"]);
    ensure!(out.code == 0, "{out:?}");
    std::thread::sleep(Duration::from_millis(300));
    ensure!(
        e.c.log().contains("create logged"),
        "containerd's log has no shim line for the create"
    );
    Ok(())
}

fn dead_shim_is_cleaned_up(e: &Env) -> TestResult {
    e.run_detached("orphan", &["sleep", "1000"])?;
    let shim = find_shim("orphan").ok_or("no shim process for orphan")?;
    // SAFETY: kill(2) of the shim we just found.
    unsafe { libc::kill(shim, libc::SIGKILL) };
    // containerd notices, runs `containerd-shim-chalk-v1 delete`, which removes the sandbox.
    e.wait_status("orphan", "STOPPED", Duration::from_secs(30))
        .or_else(|_| {
            ensure!(
                e.task_status("orphan").is_none(),
                "task neither stopped nor gone"
            );
            Ok(())
        })?;
    e.ctr(&["task", "delete", "orphan"]);
    e.ctr(&["containers", "rm", "orphan"]);
    e.assert_clean("orphan")
}

/// A shim whose containerd is gone waits quietly for it (the crate's SIGPIPE handling once
/// made it spin a core when it wrote to containerd's closed log pipe).
fn a_shim_without_containerd_stays_idle(_e: &Env) -> TestResult {
    let mut c = Containerd::start().map_err(|e| e.to_string())?;
    c.import_busybox().map_err(|e| e.to_string())?;
    let out = c.ctr([
        "run",
        "-d",
        "--runtime",
        RUNTIME,
        IMAGE,
        "lonely",
        "sleep",
        "2",
    ]);
    ensure!(out.code == 0, "ctr run: {out:?}");
    let shim = find_shim("lonely").ok_or("no shim for lonely")?;
    c.kill_daemon();
    // The process exits with nobody to tell: the shim's writes to containerd now fail.
    std::thread::sleep(Duration::from_secs(4));
    let ticks = |pid: i32| -> u64 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let after_comm = stat.rsplit(')').next().unwrap_or_default();
        let f: Vec<&str> = after_comm.split_whitespace().collect();
        f.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
            + f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
    };
    let before = ticks(shim);
    std::thread::sleep(Duration::from_secs(2));
    let used = ticks(shim) - before;
    // SAFETY: kill(2) of the shim found above, which containerd can no longer stop.
    unsafe { libc::kill(shim, libc::SIGKILL) };
    ensure!(
        used < 20,
        "the shim used {used} clock ticks of CPU in 2 s without containerd"
    );
    Ok(())
}

fn find_shim(id: &str) -> Option<i32> {
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let args: Vec<String> = cmdline
                .split(|b| *b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            let is_shim = args.first()?.ends_with("containerd-shim-chalk-v1");
            let has_id = args.windows(2).any(|w| w[0] == "-id" && w[1] == id);
            (is_shim && has_id).then(|| entry.file_name().to_str()?.parse().ok())?
        })
}

#[path = "e2e/snapshots.rs"]
mod snapshots;

#[path = "e2e/chalkctl.rs"]
mod chalkctl;

#[path = "e2e/hooks.rs"]
mod hooks;

#[path = "e2e/gpu.rs"]
mod gpu;

#[path = "e2e/install.rs"]
mod install;

#[path = "e2e/forktree.rs"]
mod forktree;

#[path = "e2e/terminal.rs"]
mod terminal;

fn main() {
    let args = Arguments::from_args();
    let c = Containerd::start().unwrap_or_else(|e| panic!("cannot start containerd: {e}"));
    c.import_busybox()
        .unwrap_or_else(|e| panic!("cannot import the busybox image: {e}"));
    let env = Arc::new(Env { c });

    type Case = fn(&Env) -> TestResult;
    let cases: &[(&str, Case)] = &[
        ("run_rm_echo", run_rm_echo),
        ("exit_code_is_exact", exit_code_is_exact),
        ("kill_gives_128_plus_signal", kill_gives_128_plus_signal),
        (
            "wait_returns_status_and_exit_time",
            wait_returns_status_and_exit_time,
        ),
        ("output_is_never_lost", output_is_never_lost),
        (
            "stdin_reaches_the_process_and_close_io_ends_it",
            stdin_reaches_the_process_and_close_io_ends_it,
        ),
        (
            "binary_log_uri_feeds_a_logging_binary",
            binary_log_uri_feeds_a_logging_binary,
        ),
        (
            "exec_has_its_own_status_and_output",
            exec_has_its_own_status_and_output,
        ),
        (
            "non_root_processes_get_no_effective_capabilities",
            non_root_processes_get_no_effective_capabilities,
        ),
        ("kill_all_stops_every_process", kill_all_stops_every_process),
        ("pause_resume_and_pids", pause_resume_and_pids),
        ("metrics_report_sandbox_usage", metrics_report_sandbox_usage),
        (
            "update_changes_the_sandbox_limits",
            update_changes_the_sandbox_limits,
        ),
        ("tty_and_resize", tty_and_resize),
        ("events_cover_the_lifecycle", events_cover_the_lifecycle),
        ("oom_is_reported", oom_is_reported),
        (
            "bad_process_fails_with_reason_and_leaves_nothing",
            bad_process_fails_with_reason_and_leaves_nothing,
        ),
        (
            "bad_spec_fails_at_create_with_runscs_reason",
            bad_spec_fails_at_create_with_runscs_reason,
        ),
        (
            "missing_or_broken_runsc_is_a_clear_error",
            missing_or_broken_runsc_is_a_clear_error,
        ),
        ("bad_options_are_named", bad_options_are_named),
        ("runsc_debug_log_when_asked", runsc_debug_log_when_asked),
        ("shim_logs_reach_containerd", shim_logs_reach_containerd),
        ("dead_shim_is_cleaned_up", dead_shim_is_cleaned_up),
        (
            "a_shim_without_containerd_stays_idle",
            a_shim_without_containerd_stays_idle,
        ),
        (
            "snapshot_keeps_the_source_and_forks_continue",
            snapshots::snapshot_keeps_the_source_and_forks_continue,
        ),
        (
            "suspend_releases_the_sandbox_and_resume_continues",
            snapshots::suspend_releases_the_sandbox_and_resume_continues,
        ),
        (
            "tampered_snapshots_are_refused",
            snapshots::tampered_snapshots_are_refused,
        ),
        (
            "restore_is_pinned_to_the_image_digest",
            snapshots::restore_is_pinned_to_the_image_digest,
        ),
        (
            "failed_checkpoint_leaves_the_source_running",
            snapshots::failed_checkpoint_leaves_the_source_running,
        ),
        (
            "failed_snapshot_never_costs_the_source",
            snapshots::failed_snapshot_never_costs_the_source,
        ),
        (
            "fork_tree_four_levels_deep",
            forktree::fork_tree_four_levels_deep,
        ),
        (
            "lifetime_destroys_or_suspends_and_forks_inherit_it",
            forktree::lifetime_destroys_or_suspends_and_forks_inherit_it,
        ),
        (
            "lifetime_survives_a_containerd_restart",
            forktree::lifetime_survives_a_containerd_restart,
        ),
        (
            "fork_count_is_pooled_and_leaves_nothing_behind",
            forktree::fork_count_is_pooled_and_leaves_nothing_behind,
        ),
        (
            "defaults_work_without_an_options_file",
            forktree::defaults_work_without_an_options_file,
        ),
        (
            "terminal_signals_size_and_settings_survive_a_restore",
            terminal::terminal_signals_size_and_settings_survive_a_restore,
        ),
        (
            "a_snapshot_does_not_cut_ctrs_terminal",
            terminal::a_snapshot_does_not_cut_ctrs_terminal,
        ),
        (
            "chalkctl_snapshot_registry",
            chalkctl::chalkctl_snapshot_registry,
        ),
        (
            "chalkctl_suspend_and_resume",
            chalkctl::chalkctl_suspend_and_resume,
        ),
        (
            "chalkctl_refuses_what_it_cannot_fork",
            chalkctl::chalkctl_refuses_what_it_cannot_fork,
        ),
        (
            "hooks_run_around_a_snapshot_and_in_each_fork",
            hooks::hooks_run_around_a_snapshot_and_in_each_fork,
        ),
        (
            "failing_hooks_abort_the_checkpoint_or_fail_the_restore",
            hooks::failing_hooks_abort_the_checkpoint_or_fail_the_restore,
        ),
        (
            "fork_identity_example_gives_each_fork_its_own",
            hooks::fork_identity_example_gives_each_fork_its_own,
        ),
        (
            "installer_registers_the_runtime_and_uninstalls_exactly",
            install::installer_registers_the_runtime_and_uninstalls_exactly,
        ),
        (
            "debian_package_installs_and_purges",
            install::debian_package_installs_and_purges,
        ),
        (
            "node_installer_image_installs_onto_the_host_root",
            install::node_installer_image_installs_onto_the_host_root,
        ),
        (
            "gpu_standin_handoff_around_snapshot_fork_and_resume",
            gpu::gpu_standin_handoff_around_snapshot_fork_and_resume,
        ),
        (
            "gpu_standin_failures_leave_every_process_running",
            gpu::gpu_standin_failures_leave_every_process_running,
        ),
    ];
    // Tests of an optional peer are listed as ignored, never passed, when it is absent.
    let optional: &[(&str, &str, Case)] = &[(
        "nerdctl_runs_sandboxes",
        "CHALK_NERDCTL",
        nerdctl_runs_sandboxes,
    )];
    let mut trials: Vec<Trial> = cases
        .iter()
        .map(|&(name, case)| {
            let env = env.clone();
            Trial::test(name, move || case(&env))
        })
        .collect();
    for &(name, var, case) in optional {
        let env = env.clone();
        let absent = std::env::var_os(var).is_none_or(|v| v.is_empty());
        trials.push(Trial::test(name, move || case(&env)).with_ignored_flag(absent));
    }
    let conclusion = libtest_mimic::run(&args, trials);
    // Whatever the tests did, no restore may leave its unpacked checkpoint (the sandbox's
    // memory) in containerd's temporary directory.
    let left = env.c.unpacked_checkpoints();
    drop(env);
    if !left.is_empty() && !args.list {
        eprintln!("containerd's temporary directory keeps unpacked checkpoints: {left:?}");
        std::process::exit(101);
    }
    conclusion.exit();
}
