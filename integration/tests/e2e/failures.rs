//! What goes wrong is said and leaves nothing: bad processes, specs, options and runsc
//! binaries; runsc's own logs; a shim that dies, and one left without containerd.

use super::*;

// ---- failures and cleanup -----------------------------------------------------------------------

pub fn bad_process_fails_with_reason_and_leaves_nothing(e: &Env) -> TestResult {
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

pub fn bad_spec_fails_at_create_with_runscs_reason(e: &Env) -> TestResult {
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

pub fn missing_or_broken_runsc_is_a_clear_error(e: &Env) -> TestResult {
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

pub fn bad_options_are_named(e: &Env) -> TestResult {
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

pub fn runsc_debug_log_when_asked(e: &Env) -> TestResult {
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

pub fn shim_logs_reach_containerd(e: &Env) -> TestResult {
    let out = e.run_rm("logged", &[], &["true"]);
    ensure!(out.code == 0, "{out:?}");
    // The shim's lines reach containerd's log through a pipe: a moment later, under load.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !e.c.log().contains("create logged") {
        ensure!(
            std::time::Instant::now() < deadline,
            "containerd's log has no shim line for the create"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

pub fn dead_shim_is_cleaned_up(e: &Env) -> TestResult {
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
pub fn a_shim_without_containerd_stays_idle(_e: &Env) -> TestResult {
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

pub(crate) fn find_shim(id: &str) -> Option<i32> {
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
