//! The main job of the README: starts a private containerd with chalk-shim registered, imports a
//! busybox image built on the spot, and runs gVisor sandboxes through containerd's own `ctr`:
//! lifecycle, then snapshot, fork, suspend and resume of a running sandbox.

use std::{process::ExitCode, time::Instant};

use chalk_integration::{api::Api, containerd::IMAGE, Containerd, RUNTIME};

fn step(title: &str) {
    println!("\n== {title}");
}

fn main() -> ExitCode {
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

/// Snapshot, fork, suspend and resume of the running counter.
fn snapshots(c: &Containerd) -> Result<(), String> {
    step("snapshot: ctr container checkpoint --task demo-counter demo/counter:1");
    let t = Instant::now();
    let out = c.ctr([
        "containers",
        "checkpoint",
        "--task",
        "demo-counter",
        "demo/counter:1",
    ]);
    check(&out, "checkpoint")?;
    println!("took {:.2?}; the source keeps counting:", t.elapsed());
    println!("demo-counter: {}", count(c, "demo-counter")?);
    std::thread::sleep(std::time::Duration::from_millis(600));
    println!("demo-counter: {}", count(c, "demo-counter")?);

    step("fork: ctr container restore --live demo-forkN demo/counter:1, twice");
    for fork in ["demo-fork1", "demo-fork2"] {
        let t = Instant::now();
        check(
            &c.ctr(["containers", "restore", "--live", fork, "demo/counter:1"]),
            "restore",
        )?;
        println!(
            "{fork}: restored in {:.2?}, counting from the snapshot: {}",
            t.elapsed(),
            count(c, fork)?
        );
    }

    // A sandbox of its own: containerd 1.6 refuses a second checkpoint of a spec already in
    // its content store ("already exists"), and the forks share the counter's.
    step("suspend and resume demo-suspend (Checkpoint with exit, then Create from it)");
    run_detached(
        c,
        "demo-suspend",
        "i=100; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.2; done",
    )?;
    std::thread::sleep(std::time::Duration::from_millis(800));
    println!("demo-suspend: {}", count(c, "demo-suspend")?);
    let mut api = Api::connect(&c.socket(), &c.namespace)?;
    api.lease("demo")?;
    let t = Instant::now();
    let snapshot = api.checkpoint("demo-suspend", true)?;
    println!("suspended in {:.2?}:", t.elapsed());
    print!("{}", c.ctr(["task", "ls"]).stdout);
    check(&c.ctr(["task", "delete", "demo-suspend"]), "task delete")?;
    let t = Instant::now();
    api.create_task_from("demo-suspend", &snapshot)?;
    api.start("demo-suspend")?;
    println!(
        "resumed in {:.2?} under the same id, counting on: {}",
        t.elapsed(),
        count(c, "demo-suspend")?
    );
    api.release();
    check(&c.ctr(["images", "rm", "demo/counter:1"]), "image rm")?;
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

    let sandboxes = ["demo-counter", "demo-fork1", "demo-fork2", "demo-suspend"];
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
