//! The main job of the README: starts a private containerd with chalk-shim registered, imports a
//! busybox image built on the spot, and runs gVisor sandboxes through containerd's own `ctr`:
//! lifecycle, then snapshot, fork, suspend and resume of a running sandbox with chalkctl, and a
//! fork of a fork in its fork tree.

use std::{process::ExitCode, time::Instant};

use chalk_integration::{containerd::IMAGE, procs::processes, Containerd, RUNTIME};

fn step(title: &str) {
    println!("\n== {title}");
}

fn main() -> ExitCode {
    // SIGINT, SIGTERM and SIGHUP all end it as Ctrl-C would, with nothing left running.
    chalk_integration::stop::install();
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("demo failed: {e}");
            ExitCode::FAILURE
        }
    }
}

fn check(out: &chalk_integration::CtrOutput, what: &str) -> Result<(), String> {
    if out.code != 0 {
        return Err(format!(
            "{what}: exit {}: {}{}",
            out.code, out.stdout, out.stderr
        ));
    }
    Ok(())
}

/// `ctr run MODE` (`--rm` or `-d`) of a shell command in a new sandbox.
fn run_sh(c: &Containerd, mode: &str, id: &str, script: &str) -> chalk_integration::CtrOutput {
    c.ctr([
        "run",
        mode,
        "--runtime",
        RUNTIME,
        IMAGE,
        id,
        "sh",
        "-c",
        script,
    ])
}

fn run_rm(c: &Containerd, id: &str, script: &str) -> chalk_integration::CtrOutput {
    run_sh(c, "--rm", id, script)
}

fn run_detached(c: &Containerd, id: &str, script: &str) -> Result<(), String> {
    check(&run_sh(c, "-d", id, script), "run -d")
}

fn count(c: &Containerd, id: &str) -> Result<String, String> {
    let out = c.ctr(["task", "exec", "--exec-id", "peek", id, "cat", "/tmp/count"]);
    check(&out, "exec")?;
    Ok(out.stdout.trim().to_string())
}

/// chalkctl against the demo's containerd; prints its progress and returns its output.
fn chalkctl(c: &Containerd, args: &[&str]) -> Result<String, String> {
    let out = c
        .chalkctl_command()
        .map_err(|e| e.to_string())?
        .args(args)
        .output()
        .map_err(|e| format!("run chalkctl: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        return Err(format!(
            "chalkctl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    // Its progress lines, timed, before its result.
    print!("{}", String::from_utf8_lossy(&out.stderr));
    Ok(text)
}

/// Runs chalkctl, printing the command line, its output and how long it took.
fn show(c: &Containerd, args: &[&str]) -> Result<String, String> {
    step(&format!("chalkctl {}", args.join(" ")));
    let t = Instant::now();
    let out = chalkctl(c, args)?;
    print!("{out}");
    println!("(took {:.2?})", t.elapsed());
    Ok(out)
}

/// The sandboxes' runsc processes, counted from /proc.
fn runsc_processes(id: &str) -> usize {
    processes()
        .into_iter()
        .filter(|(_, args)| {
            args.iter().any(|a| a.contains("runsc")) && args.iter().any(|a| a == id)
        })
        .count()
}

/// Snapshot, fork, suspend and resume of the running counter, with chalkctl.
fn snapshots(c: &Containerd) -> Result<(), String> {
    let sh = |id: &str, script: &str| {
        let out = c.ctr(["task", "exec", "--exec-id", "demo", id, "sh", "-c", script]);
        check(&out, "exec").map(|_| out.stdout.trim().to_string())
    };
    sh("demo-counter", "echo hello > /workspace/notes.txt")?;
    println!("\nwrote /workspace/notes.txt in demo-counter");
    let id = show(
        c,
        &[
            "snapshot",
            "create",
            "--id",
            "demo-counter",
            "--label",
            "demo=yes",
        ],
    )?;
    let id = id.trim().to_string();
    println!("demo-counter keeps counting: {}", count(c, "demo-counter")?);

    show(
        c,
        &[
            "fork",
            "--snapshot-id",
            &id,
            "--fork-id",
            "demo-fork",
            "--count",
            "2",
        ],
    )?;
    for fork in ["demo-fork-1", "demo-fork-2"] {
        println!(
            "{fork}: counter {}, notes: {}",
            count(c, fork)?,
            sh(fork, "cat /workspace/notes.txt")?
        );
    }
    sh("demo-fork-1", "echo only-here > /workspace/mine")?;
    println!(
        "wrote /workspace/mine in demo-fork-1; demo-fork-2 sees: {:?}; the source counts on: {}",
        sh("demo-fork-2", "cat /workspace/mine 2>/dev/null || true")?,
        count(c, "demo-counter")?
    );

    let before = count(c, "demo-counter")?;
    show(c, &["suspend", "--id", "demo-counter"])?;
    println!(
        "runsc processes of demo-counter while suspended: {}",
        runsc_processes("demo-counter")
    );
    show(c, &["resume", "--id", "demo-counter"])?;
    println!(
        "demo-counter: suspended at {before}, counting on: {}",
        count(c, "demo-counter")?
    );

    // A fork of a fork, in one call each (snapshot, fork, the snapshot deleted).
    show(
        c,
        &[
            "fork",
            "--id",
            "demo-fork-1",
            "--fork-id",
            "demo-grandchild",
        ],
    )?;
    println!(
        "demo-grandchild: counter {}, its parent's file: {}",
        count(c, "demo-grandchild")?,
        sh("demo-grandchild", "cat /workspace/mine")?
    );
    show(c, &["tree"])?;

    show(c, &["snapshot", "list"])?;
    show(c, &["list"])?;
    Ok(())
}

fn run() -> Result<(), String> {
    step("starting a private containerd");
    let c = Containerd::start().map_err(|e| e.to_string())?;
    println!("containerd socket: {}", c.socket().display());
    c.import_busybox().map_err(|e| e.to_string())?;
    println!("imported {IMAGE} (built from the host's static busybox)");

    step(&format!(
        "ctr run --rm --runtime {RUNTIME} {IMAGE} demo-hello ..."
    ));
    let t = Instant::now();
    let out = run_rm(
        &c,
        "demo-hello",
        "echo hello from a gVisor sandbox; uname -sr; dmesg | head -n 2",
    );
    check(&out, "run")?;
    print!("{}", out.stdout);
    println!("(took {:.2?})", t.elapsed());

    step("exit codes are exact: sh -c 'exit 7'");
    let out = run_rm(&c, "demo-exit", "exit 7");
    println!("ctr exited with {}", out.code);

    step("a long-running sandbox: exec, ps, pause/resume, metrics, kill");
    run_detached(
        &c,
        "demo-counter",
        "i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.2; done",
    )?;
    std::thread::sleep(std::time::Duration::from_millis(800));
    let out = c.ctr([
        "task",
        "exec",
        "--exec-id",
        "peek",
        "demo-counter",
        "cat",
        "/tmp/count",
    ]);
    check(&out, "exec")?;
    println!("counter inside the sandbox: {}", out.stdout.trim());
    let out = c.ctr(["task", "ps", "demo-counter"]);
    print!("{}", out.stdout);
    check(&c.ctr(["task", "pause", "demo-counter"]), "pause")?;
    print!("{}", c.ctr(["task", "ls"]).stdout);
    check(&c.ctr(["task", "resume", "demo-counter"]), "resume")?;
    print!("{}", c.ctr(["task", "metrics", "demo-counter"]).stdout);

    snapshots(&c)?;

    let sandboxes = [
        "demo-counter",
        "demo-fork-1",
        "demo-fork-2",
        "demo-grandchild",
    ];
    for id in sandboxes {
        check(&c.ctr(["task", "kill", "-s", "SIGKILL", id]), "kill")?;
    }
    std::thread::sleep(std::time::Duration::from_millis(500));
    print!("{}", c.ctr(["task", "ls"]).stdout);
    for id in sandboxes {
        check(&c.ctr(["task", "delete", id]), "task delete")?;
        check(&c.ctr(["containers", "rm", id]), "container rm")?;
    }

    if std::env::args().any(|a| a == "--keep") {
        step("--keep: containerd stays up until you press Enter; try for example");
        println!(
            "ctr --address {} --namespace {} run --rm -t --runtime {RUNTIME} {IMAGE} shell sh",
            c.socket().display(),
            c.namespace
        );
        let mut line = String::new();
        let _ = std::io::stdin().read_line(&mut line);
    }
    step("done: containerd stops and its temp dir is removed");
    Ok(())
}
