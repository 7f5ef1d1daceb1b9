//! nerdctl (built by scripts/peers) runs sandboxes of this runtime.

use super::*;

/// nerdctl (`CHALK_NERDCTL`) against the same containerd: attached, and detached with its
/// logging binary (`binary://`) and `nerdctl logs`.
pub fn nerdctl_runs_sandboxes(e: &Env) -> TestResult {
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
