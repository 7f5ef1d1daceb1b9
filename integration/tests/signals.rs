//! The README's long-running programs end on SIGTERM (a service manager, `timeout`, `kill`) and
//! SIGHUP (a closed terminal) as on Ctrl-C (SIGINT to the terminal's whole group): with their
//! sandboxes, chalk-web and containerd gone, nothing mounted and their directory removed, and
//! by that signal. Each runs in a process group of its own, as a terminal's job does, against
//! the real containerd and runsc (`CHALK_CONTAINERD`, `CHALK_RUNSC` as for the e2e suite).
//! `scripts/demo`, `scripts/web-demo` and `scripts/k8s-node` exec these programs, so a signal
//! to the script is a signal to the program; the k8s node (peers of its own) stops through the
//! same harness parts.

use std::{
    io::{BufRead, BufReader},
    os::unix::process::{CommandExt, ExitStatusExt},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use chalk_integration::{procs, web::Page};

type Result<T = ()> = std::result::Result<T, String>;

/// A program under test, its output lines arriving on a channel.
struct Program {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Program {
    fn start(bin: &str, args: &[&str]) -> Result<Self> {
        let mut child = Command::new(bin)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .map_err(|e| format!("start {bin}: {e}"))?;
        let (tx, lines) = mpsc::channel();
        for out in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(|l| l.ok()) {
                    let _ = tx.send(line);
                }
            });
        }
        Ok(Program {
            child,
            lines,
            seen: Vec::new(),
        })
    }

    /// The first line (from now on) that `pick` turns into something, within `timeout`.
    fn wait_for<T>(&mut self, timeout: Duration, pick: impl Fn(&str) -> Option<T>) -> Result<T> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let got = pick(&line);
                    self.seen.push(line);
                    if let Some(got) = got {
                        return Ok(got);
                    }
                }
                Err(_) => {
                    return Err(format!(
                        "not seen within {timeout:?}; its output:\n{}",
                        self.seen.join("\n")
                    ))
                }
            }
        }
    }

    /// Sends `sig` to the program alone, or to its whole group (a terminal's Ctrl-C).
    fn signal(&self, sig: i32, group: bool) {
        let pid = self.child.id() as i32;
        // SAFETY: kill(2) on our own child, or its process group (led by it).
        unsafe { libc::kill(if group { -pid } else { pid }, sig) };
    }

    /// Waits (up to two minutes) for it to end, and checks it ended by `sig`.
    fn ended_by(&mut self, sig: i32) -> Result<Duration> {
        let started = Instant::now();
        let deadline = started + Duration::from_secs(120);
        loop {
            if let Some(status) = self.child.try_wait().map_err(|e| e.to_string())? {
                while let Ok(line) = self.lines.try_recv() {
                    self.seen.push(line);
                }
                if status.signal() != Some(sig) {
                    return Err(format!(
                        "ended with {status}, not by signal {sig}; its output:\n{}",
                        self.seen.join("\n")
                    ));
                }
                return Ok(started.elapsed());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "still running two minutes after signal {sig}; its output:\n{}",
                    self.seen.join("\n")
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.signal(libc::SIGKILL, true);
            let _ = self.child.wait();
        }
    }
}

/// What runs with `dir` (a private containerd's) in its command line: containerd, its shims,
/// runsc's sandboxes and gofers, chalk-web.
fn running_under(dir: &Path) -> Vec<String> {
    let mine = dir.display().to_string();
    procs::processes()
        .into_iter()
        .filter(|(_, argv)| argv.iter().any(|a| a.contains(&mine)))
        .map(|(pid, argv)| format!("{pid}: {}", argv.join(" ")))
        .collect()
}

fn sandboxes_under(dir: &Path) -> usize {
    running_under(dir)
        .iter()
        .filter(|p| p.contains("runsc") && p.contains(" boot"))
        .count()
}

/// Nothing left: no process of it, no mount below it, the directory gone.
fn nothing_left(dir: &Path) -> Result {
    let procs = running_under(dir);
    if !procs.is_empty() {
        let shown: Vec<String> = procs
            .iter()
            .take(12)
            .map(|p| p.chars().take(200).collect())
            .collect();
        return Err(format!(
            "{} still running, among them:\n{}",
            procs.len(),
            shown.join("\n")
        ));
    }
    let prefix = dir.display().to_string();
    let mounts: Vec<String> = std::fs::read_to_string("/proc/self/mounts")
        .unwrap_or_default()
        .lines()
        .filter(|l| {
            l.split_whitespace()
                .nth(1)
                .is_some_and(|t| t.starts_with(&prefix))
        })
        .map(String::from)
        .collect();
    if !mounts.is_empty() {
        return Err(format!("still mounted:\n{}", mounts.join("\n")));
    }
    if dir.exists() {
        return Err(format!("{} is still there", dir.display()));
    }
    Ok(())
}

/// Waits until `cond` holds (up to `timeout`).
fn until(timeout: Duration, what: &str, cond: impl Fn() -> bool) -> Result {
    let deadline = Instant::now() + timeout;
    while !cond() {
        if Instant::now() > deadline {
            return Err(format!("{what}: not within {timeout:?}"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// chalk-web-demo serving, with one sandbox launched from its page: its URL and containerd's
/// directory.
fn web_demo_with_a_sandbox() -> Result<(Program, PathBuf)> {
    let mut p = Program::start(
        env!("CARGO_BIN_EXE_chalk-web-demo"),
        &["--listen", "127.0.0.1:0"],
    )?;
    let url = p.wait_for(Duration::from_secs(90), |l| {
        l.strip_prefix("The demo pages are at ").map(String::from)
    })?;
    let dir = p.wait_for(Duration::from_secs(10), |l| {
        let rest = l.strip_prefix("(containerd under ")?;
        Some(PathBuf::from(rest.split(", ").next()?))
    })?;
    Page::open(&url)?.launch()?;
    until(Duration::from_secs(30), "the page's sandbox runs", || {
        sandboxes_under(&dir) > 0
    })?;
    Ok((p, dir))
}

fn stops_clean(p: &mut Program, dir: &Path, sig: i32, group: bool, what: &str) -> Result {
    p.signal(sig, group);
    let took = p.ended_by(sig)?;
    nothing_left(dir)?;
    println!("{what}: ended in {took:.1?} with nothing left");
    Ok(())
}

#[test]
fn web_demo_ended_by_sigterm_leaves_nothing_running() -> Result {
    let (mut p, dir) = web_demo_with_a_sandbox()?;
    stops_clean(&mut p, &dir, libc::SIGTERM, false, "web demo, SIGTERM")
}

#[test]
fn web_demo_ended_by_sighup_leaves_nothing_running() -> Result {
    let (mut p, dir) = web_demo_with_a_sandbox()?;
    stops_clean(&mut p, &dir, libc::SIGHUP, false, "web demo, SIGHUP")
}

#[test]
fn web_demo_ended_by_ctrl_c_leaves_nothing_running() -> Result {
    let (mut p, dir) = web_demo_with_a_sandbox()?;
    stops_clean(&mut p, &dir, libc::SIGINT, true, "web demo, Ctrl-C")
}

#[test]
fn demo_ended_by_sigterm_mid_run_leaves_nothing_running() -> Result {
    let mut p = Program::start(env!("CARGO_BIN_EXE_chalk-demo"), &[])?;
    let dir = p.wait_for(Duration::from_secs(90), |l| {
        let socket = l.strip_prefix("containerd socket: ")?;
        Some(Path::new(socket).parent()?.to_path_buf())
    })?;
    // Mid-run: a step with a sandbox running.
    p.wait_for(Duration::from_secs(120), |l| {
        l.starts_with("== a long-running sandbox").then_some(())
    })?;
    until(Duration::from_secs(30), "the demo's sandbox runs", || {
        sandboxes_under(&dir) > 0
    })?;
    stops_clean(&mut p, &dir, libc::SIGTERM, false, "demo, SIGTERM")
}

#[test]
fn reliability_load_ended_by_sighup_leaves_nothing_running() -> Result {
    let out = tempfile::tempdir().map_err(|e| e.to_string())?;
    let results = out.path().join("load.jsonl");
    let mut p = Program::start(
        env!("CARGO_BIN_EXE_chalk-reliability"),
        &["load", "--out", results.to_str().unwrap()],
    )?;
    let pid = p.child.id();
    // Its containerd (a child whose --config lies in the private directory), mid-load.
    until(Duration::from_secs(150), "the load's sandboxes run", || {
        containerd_dir_of(pid).is_some_and(|d| sandboxes_under(&d) > 0)
    })?;
    let dir = containerd_dir_of(pid).ok_or("the load's containerd is gone")?;
    stops_clean(
        &mut p,
        &dir,
        libc::SIGHUP,
        false,
        "reliability load, SIGHUP",
    )
}

/// The directory of the containerd that `pid` started (its `--config` file's).
fn containerd_dir_of(pid: u32) -> Option<PathBuf> {
    procs::processes().into_iter().find_map(|(p, argv)| {
        let parent = std::fs::read_to_string(format!("/proc/{p}/stat")).ok()?;
        let ppid: u32 = parent[parent.rfind(')')? + 1..]
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()?;
        if ppid != pid || !argv.first()?.ends_with("containerd") {
            return None;
        }
        let config = argv.iter().skip_while(|a| *a != "--config").nth(1)?;
        Some(Path::new(config).parent()?.to_path_buf())
    })
}
