//! The main job of the README: starts a private containerd with chalk-shim registered, imports a
//! busybox image built on the spot, and runs gVisor sandboxes through containerd's own `ctr`.

use std::{process::ExitCode, time::Instant};

use chalk_integration::{containerd::IMAGE, Containerd, RUNTIME};

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

/// `ctr run --rm` of a shell command in a new sandbox.
fn run_rm(c: &Containerd, id: &str, script: &str) -> chalk_integration::CtrOutput {
    c.ctr([
        "run",
        "--rm",
        "--runtime",
        RUNTIME,
        IMAGE,
        id,
        "sh",
        "-c",
        script,
    ])
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
    check(
        &c.ctr([
            "run",
            "-d",
            "--runtime",
            RUNTIME,
            IMAGE,
            "demo-counter",
            "sh",
            "-c",
            "i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.2; done",
        ]),
        "run -d",
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
    check(
        &c.ctr(["task", "kill", "-s", "SIGKILL", "demo-counter"]),
        "kill",
    )?;
    std::thread::sleep(std::time::Duration::from_millis(500));
    print!("{}", c.ctr(["task", "ls"]).stdout);
    check(&c.ctr(["task", "delete", "demo-counter"]), "task delete")?;
    check(&c.ctr(["containers", "rm", "demo-counter"]), "container rm")?;

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
