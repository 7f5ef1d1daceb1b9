//! Restored sandboxes behave like fresh ones at a terminal: Ctrl-C and the other terminal
//! signals reach the foreground job, the window size and line settings carry over, and a
//! snapshot never cuts the source's output. Through a real terminal client of containerd's
//! API (a TTY init on fifos), and through `ctr run -t` under a pseudo-terminal.

use chalk_integration::{api::Descriptor, tty::TtyTask};

use super::*;

/// A container whose init is an interactive shell on a terminal, not yet started.
fn tty_container(e: &Env, id: &str) -> TestResult {
    let out = e.ctr(&[
        "containers",
        "create",
        "-t",
        "--runtime",
        RUNTIME,
        IMAGE,
        id,
        "sh",
    ]);
    ensure!(out.code == 0, "create {id}: {out:?}");
    Ok(())
}

fn tty(
    e: &Env,
    id: &str,
    from: Option<&Descriptor>,
    size: Option<(u32, u32)>,
) -> Result<TtyTask, Failed> {
    TtyTask::start(&e.c.socket(), &e.c.namespace, id, from, size).map_err(Failed::from)
}

/// The checkpoint in chalkctl snapshot `id` (its record's index names it).
fn checkpoint_of(e: &Env, id: &str) -> Result<Descriptor, Failed> {
    let snap = e.chalkctl_json(&["snapshot", "get", "--snapshot-id", id])?;
    let index = e.c.content_blob(snap["index"].as_str().unwrap_or_default());
    let index: serde_json::Value = serde_json::from_slice(
        &std::fs::read(&index).map_err(|e| format!("{}: {e}", index.display()))?,
    )
    .map_err(|e| e.to_string())?;
    let m = index["manifests"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["mediaType"] == chalk_integration::api::CHECKPOINT_TAR)
        .ok_or("the snapshot has no checkpoint")?;
    Ok(Descriptor {
        media_type: m["mediaType"].as_str().unwrap_or_default().into(),
        digest: m["digest"].as_str().unwrap_or_default().into(),
        size: m["size"].as_i64().unwrap_or_default(),
        annotations: Default::default(),
    })
}

/// The shell's prompt.
const PROMPT: &str = "# ";

/// Types `line` and waits for `expect` in what follows.
fn say(t: &mut TtyTask, line: &str, expect: &str) -> Result<(), Failed> {
    let mark = t.mark();
    t.send(format!("{line}\n").as_bytes())?;
    t.wait_for(mark, expect, Duration::from_secs(10))?;
    Ok(())
}

/// Runs `sleep 100` in the foreground, presses Ctrl-C and checks it ended it (status 130);
/// returns how long the shell took to come back after the key.
fn ctrl_c(t: &mut TtyTask) -> Result<Duration, Failed> {
    say(t, "sleep 100", "sleep 100")?;
    std::thread::sleep(Duration::from_millis(500));
    let mark = t.mark();
    t.send(b"\x03")?;
    let took = t.wait_for(mark, PROMPT, Duration::from_secs(10))?;
    say(t, "echo rc=$?", "rc=130")?;
    Ok(took)
}

pub fn terminal_signals_size_and_settings_survive_a_restore(e: &Env) -> TestResult {
    let (src, fork) = ("term-src", "term-fork");
    for id in [src, fork] {
        e.remove(id);
    }
    let mut taken = Vec::new();
    let result = (|| {
        tty_container(e, src)?;
        let mut s = tty(e, src, None, Some((100, 30)))?;
        s.wait_for(0, PROMPT, Duration::from_secs(20))?;
        say(&mut s, "X=42; stty size", "30 100")?;
        let fresh = ctrl_c(&mut s)?;

        // A snapshot of the running shell: it goes on, output and all (the 2022 runsc's
        // snapshot replaces the sandbox), and Ctrl-C still works in it.
        let digest = e.snapshot_of(src)?;
        taken.push(digest.clone());
        say(&mut s, "echo after-$X", "after-42")?;
        ensure!(!s.output_ended(), "the snapshot cut the source's output");
        let source_after = ctrl_c(&mut s)?;

        // A fork through a terminal client that sends no size: the snapshot's size and line
        // settings, one echo per line, Ctrl-C, and SIGWINCH on a resize.
        tty_container(e, fork)?;
        let mut f = tty(e, fork, Some(&checkpoint_of(e, &digest)?), None)?;
        // The shell waits at its prompt, reading keys in raw mode: the new terminal must be
        // in raw mode too, or it echoes the line itself before the shell does.
        say(&mut f, "echo fork-$X", "fork-42")?;
        f.wait_for(0, PROMPT, Duration::from_secs(10))?;
        let echoed = f.output().matches("echo fork-$X").count();
        ensure!(
            echoed == 1,
            "the first line typed in the fork was echoed {echoed} times: {:?}",
            f.output()
        );
        say(&mut f, "stty size", "30 100")?;
        let forked = ctrl_c(&mut f)?;
        // A foreground job that waits for SIGWINCH (the words it prints are quoted apart in
        // the command line, which the shell's line editor echoes and redraws).
        say(
            &mut f,
            "sh -c 'trap \"echo got-\"\"winch; exit\" WINCH; echo wait\"\"ing; while :; do sleep 0.1; done'",
            "waiting",
        )?;
        let mark = f.mark();
        f.resize(120, 40)?;
        f.wait_for(mark, "got-winch", Duration::from_secs(10))?;
        f.wait_for(mark, PROMPT, Duration::from_secs(10))?;
        say(&mut f, "stty size", "40 120")?;
        // ^\ (SIGQUIT) too.
        say(&mut f, "sleep 100", "sleep 100")?;
        std::thread::sleep(Duration::from_millis(300));
        f.send(b"\x1c")?;
        say(&mut f, "echo quit=$?", "quit=131")?;

        // Suspended and resumed under the same id, through the terminal client: the size
        // it last had and Ctrl-C.
        let out = e.chalkctl_json(&["suspend", "--id", fork])?;
        let suspended = out["snapshot"]["id"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        taken.push(suspended.clone());
        drop(f);
        let mut r = tty(e, fork, Some(&checkpoint_of(e, &suspended)?), None)?;
        say(&mut r, "stty size; echo again-$X", "again-42")?;
        ensure!(
            r.output().contains("40 120"),
            "resumed size: {:?}",
            r.output()
        );
        let resumed = ctrl_c(&mut r)?;
        eprintln!(
            "Ctrl-C to prompt: fresh {fresh:?}, source after its snapshot {source_after:?}, \
             fork {forked:?}, resumed {resumed:?}"
        );
        Ok(())
    })();
    e.conclude(result, &[src, fork], &taken)
}

/// `ctr run -t` of a sandbox that prints after it has been snapshotted: the client keeps
/// reading (the 2022 runsc's snapshot replaces the sandbox, and its old terminal copier
/// closed the fifo), and gets the exit status.
pub fn a_snapshot_does_not_cut_ctrs_terminal(e: &Env) -> TestResult {
    let id = "term-ctr";
    e.remove(id);
    let run = format!(
        "run --rm -t --runtime {RUNTIME} {IMAGE} {id} sh -c 'echo tick-before; sleep 4; echo tick-after; exit 3'"
    );
    let result = std::thread::scope(|s| {
        let client = s.spawn(|| under_terminal(e, &run));
        let snapshot = (|| {
            e.wait_status(id, "RUNNING", Duration::from_secs(20))?;
            std::thread::sleep(Duration::from_millis(500));
            e.snapshot_of(id)
        })();
        let out = client.join().expect("the terminal client panicked");
        let digest = snapshot?;
        e.chalkctl(&["snapshot", "delete", "--snapshot-id", &digest]);
        ensure!(
            out.code == 3
                && out.stdout.contains("tick-before")
                && out.stdout.contains("tick-after"),
            "ctr run -t across a snapshot: {out:?}"
        );
        Ok(())
    });
    e.remove(id);
    result?;
    e.assert_clean(id)
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

pub fn tty_and_resize(e: &Env) -> TestResult {
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
