//! What the integration tests share: the `ensure!` check, the environment every case runs
//! against (a private containerd, with the calls the cases make of it: `ctr`, chalkctl,
//! containerd's API, and the leak check that ends them), and the registration of cases as
//! libtest trials.

use std::{
    io::Read,
    path::PathBuf,
    process::{Child, Stdio},
    sync::Arc,
    time::{Duration, Instant},
};

pub use libtest_mimic::{Arguments, Failed, Trial};

use crate::{api::Api, containerd::IMAGE, Containerd, CtrOutput, RUNTIME};

pub type TestResult = Result<(), Failed>;

/// Fails the case with the message unless `cond` holds.
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err($crate::testkit::Failed::from(format!($($fmt)+)));
        }
    };
}

/// The entrypoint of every snapshot test: writes to the root filesystem and /tmp, then counts
/// in memory, saving the count where an exec can read it (renamed into place, so a reader
/// never finds it empty).
pub const COUNTER: &str = "echo hello > /workspace/notes.txt; echo tmp > /tmp/t; i=0; \
                       while true; do i=$((i+1)); echo $i > /tmp/c.new; \
                       mv /tmp/c.new /tmp/count; sleep 0.1; done";

/// Whether this cell runs a current runsc (`CHALK_RUNSC`), else Debian's 2022 build.
pub fn current_runsc() -> bool {
    std::env::var_os("CHALK_RUNSC").is_some_and(|v| !v.is_empty())
}

/// Whether this cell's runsc has `restore --share-pages` (runsc-cow: the patch in
/// packaging/gvisor): its forks map their snapshot's memory for as long as they run.
pub fn shares_pages() -> bool {
    let Some(runsc) = std::env::var_os("CHALK_RUNSC").filter(|v| !v.is_empty()) else {
        return false;
    };
    std::process::Command::new(runsc)
        .args(["help", "restore"])
        .output()
        .is_ok_and(|o| {
            let help = String::from_utf8_lossy(&o.stdout) + String::from_utf8_lossy(&o.stderr);
            chalk_runtime::runsc::Features::default()
                .with_restore_help(&help, "")
                .share_pages()
        })
}

/// Whether this cell's runsc carries packaging/gvisor's overlay patch, so that a file copied up
/// keeps its inode number (a local `git clone` works). It comes with the share-pages patch in
/// runsc-cow, and it has no flag of its own to detect.
pub fn hardlinks_keep_inodes() -> bool {
    shares_pages()
}

/// A private containerd the cases share.
pub struct Env {
    pub c: Containerd,
}

/// A `ctr` running in the background (a foreground `ctr run` or `ctr task exec`).
pub struct Background(pub Child);

impl Background {
    pub fn finish(self) -> CtrOutput {
        self.0.wait_with_output().expect("wait ctr").into()
    }
}

impl Env {
    pub fn ctr(&self, args: &[&str]) -> CtrOutput {
        self.c.ctr(args)
    }

    pub fn run_rm(&self, id: &str, extra: &[&str], cmd: &[&str]) -> CtrOutput {
        let mut args = vec!["run", "--rm", "--runtime", RUNTIME];
        args.extend_from_slice(extra);
        args.extend_from_slice(&[IMAGE, id]);
        args.extend_from_slice(cmd);
        self.ctr(&args)
    }

    pub fn run_detached(&self, id: &str, cmd: &[&str]) -> TestResult {
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

    pub fn background(&self, args: &[&str]) -> Background {
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
    pub fn task_status(&self, id: &str) -> Option<String> {
        self.ctr(&["task", "ls"])
            .stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(id))
            .and_then(|l| l.split_whitespace().nth(2).map(String::from))
    }

    pub fn wait_status(&self, id: &str, want: &str, timeout: Duration) -> TestResult {
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

    pub fn task_pid(&self, id: &str) -> Option<i32> {
        self.ctr(&["task", "ls"])
            .stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(id))
            .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
    }

    /// Kills, deletes the task and removes the container; errors ignored (best effort).
    pub fn remove(&self, id: &str) {
        if self.task_status(id).is_some() {
            self.ctr(&["task", "kill", "-a", "-s", "SIGKILL", id]);
            let _ = self.wait_status(id, "STOPPED", Duration::from_secs(10));
            self.ctr(&["task", "delete", id]);
        }
        self.ctr(&["containers", "rm", id]);
    }

    pub fn bundle(&self, id: &str) -> PathBuf {
        self.c.bundle(id)
    }

    /// Checks that no trace of container `id` is left: no runsc process, runsc state, mount,
    /// bundle or network namespace.
    pub fn assert_clean(&self, id: &str) -> TestResult {
        // containerd's cleanup of a killed shim may take a while on a loaded host.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let leftovers = self.leftovers(id);
            if leftovers.is_empty() {
                return Ok(());
            }
            ensure!(Instant::now() < deadline, "{id} left behind: {leftovers:?}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    pub fn leftovers(&self, id: &str) -> Vec<String> {
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
            // chalkctl's stdio keeper of the sandbox: `chalkctl ... keep --id ID`.
            let is_keeper = args.first().is_some_and(|a| a.ends_with("chalkctl"))
                && args.iter().any(|a| a == "keep");
            if (is_runsc || is_keeper) && args.iter().any(|a| a == id) {
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
        // What chalkctl keeps of a sandbox removed some other way is its log (until chalkctl
        // next sweeps); its fifos and socket end with its keeper.
        let kept = self.c.chalkctl_state().join(&self.c.namespace).join(id);
        for entry in std::fs::read_dir(&kept).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !matches!(name.as_str(), "log" | "log.1" | "exit" | "keeper.log") {
                found.push(format!("chalkctl state {}", entry.path().display()));
            }
        }
        if self.bundle(id).exists() {
            // What is in it says who made or kept it.
            let held: Vec<String> = std::fs::read_dir(self.bundle(id))
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            found.push(format!(
                "bundle {} holding {held:?}",
                self.bundle(id).display()
            ));
        }
        let netns =
            chalk_runtime::netns::netns_path(&self.c.dir().join("runsc"), &self.c.namespace, id);
        if netns.exists() {
            found.push(format!("network namespace {}", netns.display()));
        }
        found.extend(crate::network::leftovers(&crate::network::cni_id(
            &self.c.namespace,
            id,
        )));
        // ctr's cgroup for a task is /<namespace>/<id>, in each v1 controller or in v2's tree.
        for under in ["memory/", "pids/", "cpu/", ""] {
            let cgroup = format!("/sys/fs/cgroup/{under}{}/{id}", self.c.namespace);
            if std::path::Path::new(&cgroup).is_dir() {
                found.push(format!("cgroup {cgroup}"));
            }
        }
        found
    }

    /// Writes a runtime options file: this containerd's own with `extra` after it.
    pub fn options_with(&self, name: &str, extra: &str) -> Result<PathBuf, Failed> {
        let base = std::fs::read_to_string(self.c.options_path()).map_err(|e| e.to_string())?;
        // A table the base has already (its [snapshot] store) takes the extra keys.
        let text = match extra.strip_prefix("[snapshot]\n") {
            Some(keys) if base.contains("\n[snapshot]\n") => {
                base.replacen("\n[snapshot]\n", &format!("\n[snapshot]\n{keys}"), 1)
            }
            _ => format!("{base}\n{extra}"),
        };
        Ok(self.options_file(name, &text))
    }

    /// `ctr run -d` of `cmd` as `id` with the runtime options file `options`.
    pub fn run_detached_with(
        &self,
        id: &str,
        options: &std::path::Path,
        cmd: &[&str],
    ) -> TestResult {
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
    pub fn options_file(&self, name: &str, text: &str) -> PathBuf {
        let path = self.c.dir().join(name);
        std::fs::write(&path, text).expect("write options");
        path
    }

    /// Runs `f` while `ctr events` listens; returns what `f` returned and the events seen.
    pub fn capture_events<T>(&self, f: impl FnOnce() -> T) -> (T, String) {
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

    pub fn api(&self) -> Api {
        Api::connect(&self.c.socket(), &self.c.namespace).expect("connect to containerd")
    }

    pub fn chalkctl(&self, args: &[&str]) -> CtrOutput {
        self.c.chalkctl(args)
    }

    /// Removes `ids` and deletes `snapshots` whatever `result` was; then, if it passed,
    /// checks that nothing of `ids` is left.
    pub fn conclude(&self, result: TestResult, ids: &[&str], snapshots: &[String]) -> TestResult {
        for id in ids {
            self.remove(id);
        }
        for s in snapshots {
            self.chalkctl(&["snapshot", "delete", "--snapshot-id", s]);
        }
        result?;
        for id in ids {
            self.assert_clean(id)?;
        }
        Ok(())
    }

    /// Stored snapshot `id` (a chalkctl snapshot id: its OCI manifest's digest), read from
    /// the snapshot store: its id and manifest.
    pub fn stored_snapshot(&self, id: &str) -> Result<(String, serde_json::Value), Failed> {
        let p = self.store_blob(id);
        let bytes = std::fs::read(&p).map_err(|e| format!("{}: {e}", p.display()))?;
        let m = serde_json::from_slice(&bytes).map_err(|e| Failed::from(e.to_string()))?;
        Ok((id.to_string(), m))
    }

    /// The file of blob `digest` in the snapshot store.
    pub fn store_blob(&self, digest: &str) -> PathBuf {
        self.c
            .snapshot_store()
            .join("blobs/sha256")
            .join(digest.trim_start_matches("sha256:"))
    }

    /// `chalkctl snapshot create` of `id`: the snapshot's digest.
    pub fn snapshot_of(&self, id: &str) -> Result<String, Failed> {
        let out = self.chalkctl_json(&["snapshot", "create", "--id", id])?;
        Ok(out["id"].as_str().unwrap_or_default().to_string())
    }

    /// `chalkctl suspend` then `resume` of `id`: the digest of the snapshot it went through.
    pub fn suspend_and_resume(&self, id: &str) -> Result<String, Failed> {
        let out = self.chalkctl_json(&["suspend", "--id", id])?;
        let digest = out["snapshot"]["id"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        self.chalkctl_json(&["resume", "--id", id])?;
        Ok(digest)
    }

    pub fn chalkctl_json(&self, args: &[&str]) -> Result<serde_json::Value, Failed> {
        let mut all = vec!["--output", "json"];
        all.extend_from_slice(args);
        let out = self.chalkctl(&all);
        ensure!(out.code == 0, "chalkctl {args:?}: {out:?}");
        serde_json::from_str(&out.stdout).map_err(|e| Failed::from(format!("{e}: {out:?}")))
    }

    pub fn sh(&self, id: &str, exec_id: &str, script: &str) -> CtrOutput {
        self.ctr(&["task", "exec", "--exec-id", exec_id, id, "sh", "-c", script])
    }

    pub fn count(&self, id: &str) -> Result<u64, Failed> {
        let out = self.sh(id, "count", "cat /tmp/count");
        out.stdout
            .trim()
            .parse()
            .map_err(|_| Failed::from(format!("counter of {id}: {out:?}")))
    }

    pub fn start_counter(&self, id: &str) -> TestResult {
        self.run_detached(id, &["sh", "-c", COUNTER])?;
        // Let it write its files and count a little.
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.count(id).unwrap_or(0) < 3 {
            ensure!(Instant::now() < deadline, "{id} does not count");
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    pub fn restore_live(&self, id: &str, snapshot: &str) -> CtrOutput {
        self.ctr(&["containers", "restore", "--live", id, snapshot])
    }

    /// Waits until `id`'s counter reads at least `n`; what it reads then.
    pub fn count_reaches(&self, id: &str, n: u64) -> Result<u64, Failed> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let now = self.count(id);
            if let Ok(now) = now {
                if now >= n {
                    return Ok(now);
                }
            }
            ensure!(
                Instant::now() < deadline,
                "{id} does not count to {n}: {now:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// One case: a name and what it runs against the shared environment.
pub struct Case<E> {
    pub name: &'static str,
    pub run: fn(&E) -> TestResult,
    pub ignored: bool,
}

impl<E> Case<E> {
    pub fn new(path: &'static str, run: fn(&E) -> TestResult) -> Self {
        // `module::name` as `stringify!` writes it: the case is called by its function's name.
        let name = path.rsplit("::").next().unwrap_or(path).trim();
        Case {
            name,
            run,
            ignored: false,
        }
    }

    /// Listed as ignored (never as passed) when `skip`: what this cell cannot run.
    pub fn ignored_if(mut self, skip: bool) -> Self {
        self.ignored = skip;
        self
    }
}

/// The cases named, each registered under its function's name.
#[macro_export]
macro_rules! cases {
    ($($case:path),* $(,)?) => {
        vec![$($crate::testkit::Case::new(stringify!($case), $case)),*]
    };
}

/// Parses the command line as [`run`] will, so that a bad one ends the binary before its
/// `main` starts containerd or a registry (which an exit in `run` would leave running).
pub fn check_args() {
    let _ = Arguments::from_args();
}

/// Runs `cases` against `env` as libtest trials (with the command line's filters); then
/// `after` checks what the whole run left, and fails it with what it says.
pub fn run<E: Send + Sync + 'static>(
    env: E,
    cases: Vec<Case<E>>,
    after: impl FnOnce(&E) -> Result<(), String>,
) -> ! {
    let args = Arguments::from_args();
    let env = Arc::new(env);
    let trials = cases
        .into_iter()
        .map(|case| {
            let env = env.clone();
            let run = case.run;
            let name = case.name;
            Trial::test(name, move || recorded(name, || run(&env))).with_ignored_flag(case.ignored)
        })
        .collect();
    let listing = args.list;
    let conclusion = libtest_mimic::run(&args, trials);
    let left = if listing { Ok(()) } else { after(&env) };
    drop(env);
    if let Err(e) = left {
        eprintln!("{e}");
        std::process::exit(101);
    }
    conclusion.exit();
}

thread_local! {
    static NOTES: std::cell::RefCell<Vec<String>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Notes a measurement of the case running on this thread (a time to recover, what a fault
/// ended as): it goes into the case's line in `$CHALK_RESULTS`.
pub fn note(what: impl Into<String>) {
    let what = what.into();
    eprintln!("note: {what}");
    NOTES.with(|n| n.borrow_mut().push(what));
}

/// Runs one case and, when `$CHALK_RESULTS` names a file, appends a JSON line to it: the
/// case, its cell (`$CHALK_CELL`), whether it passed, its time, its notes and its failure.
fn recorded(name: &str, run: impl FnOnce() -> TestResult) -> TestResult {
    NOTES.with(|n| n.borrow_mut().clear());
    let started = Instant::now();
    let watchdog = watch_for_a_hang(name);
    let result = run();
    drop(watchdog);
    let Some(file) = std::env::var_os("CHALK_RESULTS").filter(|f| !f.is_empty()) else {
        return result;
    };
    let line = serde_json::json!({
        "case": name,
        "cell": std::env::var("CHALK_CELL").unwrap_or_default(),
        "passed": result.is_ok(),
        "seconds": (started.elapsed().as_secs_f64() * 10.0).round() / 10.0,
        "notes": NOTES.with(|n| n.borrow().clone()),
        "failure": result.as_ref().err().and_then(|f| f.message().map(String::from)),
    });
    let appended = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&file)
        .and_then(|mut f| std::io::Write::write_all(&mut f, format!("{line}\n").as_bytes()));
    if let Err(e) = appended {
        eprintln!(
            "results not written to {}: {e}",
            std::path::Path::new(&file).display()
        );
    }
    result
}

/// How long one case may run (`CHALK_CASE_LIMIT_SECS`, default 15 min): past it the run stops
/// naming the case, as SIGTERM stops it (`crate::stop`: the containerds torn down), rather than
/// wait for ever on a hung client and use up CI's time with no name.
fn watch_for_a_hang(name: &str) -> std::sync::mpsc::Sender<()> {
    let limit = std::env::var("CHALK_CASE_LIMIT_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(900);
    let (done, finished) = std::sync::mpsc::channel::<()>();
    let name = name.to_string();
    crate::stop::install();
    std::thread::spawn(move || {
        if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
            finished.recv_timeout(Duration::from_secs(limit))
        {
            eprintln!("case {name} has run for {limit} s: it hangs; stopping the run");
            // SAFETY: raising a signal this process handles (crate::stop).
            unsafe { libc::raise(libc::SIGTERM) };
        }
    });
    done
}

/// A tmpfs of a few MiB mounted at a directory until dropped: a disk that fills up.
pub struct SmallFs(pub PathBuf);

impl SmallFs {
    pub fn mount(dir: PathBuf, mib: u32) -> Result<Self, Failed> {
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let out = std::process::Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={mib}m,mode=0700"),
                "tmpfs",
            ])
            .arg(&dir)
            .output()
            .map_err(|e| e.to_string())?;
        ensure!(
            out.status.success(),
            "mount a tmpfs at {}: {out:?}",
            dir.display()
        );
        Ok(SmallFs(dir))
    }

    /// Makes room: the same filesystem, `mib` MiB now, what it holds kept.
    pub fn grow(&self, mib: u32) -> TestResult {
        let out = std::process::Command::new("mount")
            .args(["-o", &format!("remount,size={mib}m")])
            .arg(&self.0)
            .output()
            .map_err(|e| e.to_string())?;
        ensure!(
            out.status.success(),
            "remount {}: {out:?}",
            self.0.display()
        );
        Ok(())
    }

    pub fn is_empty(&self, sub: &str) -> bool {
        std::fs::read_dir(self.0.join(sub)).map_or(true, |mut d| d.next().is_none())
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// Waits until `chalkctl get --id id` on `c` says not found (a lifetime ended it), failing
/// once `limit` has passed since `since`.
pub fn wait_gone(c: &Containerd, id: &str, since: Instant, limit: Duration) -> TestResult {
    loop {
        let got: CtrOutput = c
            .chalkctl_command()
            .map_err(|e| e.to_string())?
            .args(["get", "--id", id])
            .output()
            .map_err(|e| e.to_string())?
            .into();
        if got.code != 0 && got.stderr.contains("not found") {
            return Ok(());
        }
        ensure!(
            since.elapsed() < limit,
            "{id} outlived its lifetime ({limit:?} after it started): {got:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
