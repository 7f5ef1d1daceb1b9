//! `chalkctl exec`: a command in a running sandbox, as `ctr task exec` runs one: the init's
//! user, capabilities and limits, with its own arguments, environment and directory; its
//! output on this side's stdout and stderr (or a terminal of its own with `-t`: raw mode,
//! window size following this one's), stdin passed with `-i`, and its exit status returned.
//! SIGINT, SIGTERM and SIGHUP sent to chalkctl are passed on to the process (with `-t` on a
//! terminal, Ctrl-C is a key like any other and reaches it through its terminal).

use std::{
    fs::File,
    io::Write,
    os::unix::fs::OpenOptionsExt,
    path::Path,
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    time::Duration,
};

use serde_json::Value;

use crate::{
    containerd::spec_of,
    containerd::{Client, Stdio},
    stdio::{
        pump::pump,
        state::{self, SandboxDir},
        tty,
    },
    Error, Result,
};

#[derive(Debug, Default, Clone)]
pub struct ExecOptions {
    /// A terminal for the process.
    pub tty: bool,
    /// This side's stdin passed to the process.
    pub stdin: bool,
    /// KEY=VALUE, added to (or replacing in) the init's environment.
    pub env: Vec<String>,
    pub cwd: Option<String>,
}

/// The process spec of `cmd` run like the init whose spec is `init`.
pub fn process_spec(init: &Value, cmd: &[String], opts: &ExecOptions) -> Result<Value> {
    if cmd.is_empty() {
        return Err("give the command to run after --".into());
    }
    let mut p = init.clone();
    if !p.is_object() {
        return Err("the sandbox's spec has no process to run the command like".into());
    }
    p["args"] = cmd.into();
    p["terminal"] = opts.tty.into();
    if let Some(cwd) = &opts.cwd {
        if !cwd.starts_with('/') {
            return Err(format!("--cwd {cwd}: give an absolute path").into());
        }
        p["cwd"] = cwd.clone().into();
    }
    let mut env = chalk_runtime::spec::strings(&p["env"]);
    crate::ops::run::merge_env(&mut env, &opts.env)?;
    p["env"] = env.into();
    // The init's terminal size is not this process's.
    if let Some(o) = p.as_object_mut() {
        o.remove("consoleSize");
    }
    Ok(p)
}

/// A FIFO opened for reading without waiting for its writer.
fn open_reader(path: &Path) -> Result<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| Error::from(format!("open {}: {e}", path.display())))
}

/// Copies `from` (a FIFO opened alone) to `to` until its writer has closed it, or, once
/// the process has exited, it has been quiet a second (a child of the process may hold it).
fn copy_out(from: File, mut to: impl Write, ended: &AtomicBool) {
    pump(from, ended, Duration::from_secs(1), |data| {
        let _ = to.write_all(data).and_then(|_| to.flush());
    });
}

/// Runs `cmd` in sandbox `id`, its fifos under `dir`: the process's exit status. Call
/// [`tty::block_session_signals`] first.
pub fn exec(
    client: &Client,
    dir: &SandboxDir,
    id: &str,
    cmd: &[String],
    opts: &ExecOptions,
) -> Result<u32> {
    let container = client.container(id)?;
    match client.task_status(id)? {
        Some((s, _)) if s == "running" => {}
        Some((s, _)) => return Err(format!("sandbox {id} is {s}: exec needs it running").into()),
        None => {
            return Err(format!(
                "sandbox {id} has no task (stopped or suspended): exec needs it running"
            )
            .into())
        }
    }
    let process = process_spec(&spec_of(&container)["process"], cmd, opts)?;
    let exec_id = format!("chalkctl-exec-{}", std::process::id());
    let fifos = dir.exec(&exec_id)?;
    state::make_private(&fifos)?;
    let result = run(client, id, &exec_id, &fifos, &process, opts);
    let _ = std::fs::remove_dir_all(&fifos);
    // `exec/`, and for a sandbox chalkctl keeps nothing else of, its directory: whichever
    // are empty now.
    for up in fifos.ancestors().skip(1).take(2) {
        if std::fs::remove_dir(up).is_err() {
            break;
        }
    }
    result
}

fn run(
    client: &Client,
    id: &str,
    exec_id: &str,
    fifos: &Path,
    process: &Value,
    opts: &ExecOptions,
) -> Result<u32> {
    let (stdin, stdout, stderr) = (fifos.join("in"), fifos.join("out"), fifos.join("err"));
    state::fifo(&stdout)?;
    let out = open_reader(&stdout)?;
    let err = if opts.tty {
        None
    } else {
        state::fifo(&stderr)?;
        Some(open_reader(&stderr)?)
    };
    let input = if opts.stdin {
        state::fifo(&stdin)?;
        Some(
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_CLOEXEC)
                .open(&stdin)
                .map_err(|e| Error::from(format!("open {}: {e}", stdin.display())))?,
        )
    } else {
        None
    };
    let path = |p: &Path, on: bool| {
        if on {
            p.display().to_string()
        } else {
            String::new()
        }
    };
    let io = Stdio {
        stdin: path(&stdin, opts.stdin),
        stdout: stdout.display().to_string(),
        stderr: path(&stderr, !opts.tty),
        terminal: opts.tty,
    };
    client.exec(id, exec_id, process, &io)?;
    let started = (|| {
        if opts.tty {
            if let Some((cols, rows)) = tty::my_window_size() {
                client.resize_process(id, exec_id, cols, rows)?;
            }
        }
        client.start_process(id, exec_id)
    })();
    if let Err(e) = started {
        let _ = client.delete_process(id, exec_id);
        return Err(e);
    }
    let raw = if opts.tty {
        tty::RawMode::stdin()
    } else {
        None
    };
    let ended = AtomicBool::new(false);
    let status = std::thread::scope(|s| {
        let ended = &ended;
        let mut copies = vec![s.spawn(move || copy_out(out, std::io::stdout(), ended))];
        if let Some(err) = err {
            copies.push(s.spawn(move || copy_out(err, std::io::stderr(), ended)));
        }
        let (eof_tx, eof_rx) = mpsc::channel();
        if let Some(input) = input {
            // Not joined: a read of this side's stdin may never return.
            std::thread::spawn(move || {
                let mut input = input;
                let _ = std::io::copy(&mut std::io::stdin().lock(), &mut input);
                drop(input);
                let _ = eof_tx.send(());
            });
        }
        let (tx, rx) = mpsc::channel();
        s.spawn(move || {
            let _ = tx.send(client.wait_process(id, exec_id));
        });
        let status = loop {
            if let Ok(status) = rx.try_recv() {
                break status;
            }
            if eof_rx.try_recv().is_ok() {
                let _ = client.close_stdin(id, exec_id);
            }
            match tty::next_signal(Duration::from_millis(100)) {
                Some(nix::sys::signal::Signal::SIGWINCH) if opts.tty => {
                    if let Some((cols, rows)) = tty::my_window_size() {
                        let _ = client.resize_process(id, exec_id, cols, rows);
                    }
                }
                Some(nix::sys::signal::Signal::SIGWINCH) | None => {}
                Some(sig) => {
                    let _ = client.kill(id, exec_id, sig as i32, false);
                }
            }
        };
        ended.store(true, Ordering::SeqCst);
        for c in copies {
            let _ = c.join();
        }
        status
    });
    drop(raw);
    let _ = client.delete_process(id, exec_id);
    status
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_exec_runs_like_the_init_with_its_own_command_env_and_dir() {
        let init = json!({"user": {"uid": 1000, "gid": 1000}, "args": ["sh"], "cwd": "/",
                          "env": ["PATH=/bin", "A=1"], "terminal": true,
                          "consoleSize": {"height": 24, "width": 80},
                          "capabilities": {"bounding": ["CAP_KILL"]}});
        let opts = ExecOptions {
            tty: false,
            stdin: true,
            env: vec!["A=2".into(), "B=3".into()],
            cwd: Some("/tmp".into()),
        };
        let p = process_spec(&init, &["ls".into(), "-l".into()], &opts).unwrap();
        assert_eq!(p["args"], json!(["ls", "-l"]));
        assert_eq!(p["env"], json!(["PATH=/bin", "A=2", "B=3"]));
        assert_eq!(p["cwd"], "/tmp");
        assert_eq!(p["terminal"], false);
        assert_eq!(p["user"]["uid"], 1000);
        assert_eq!(p["capabilities"], init["capabilities"]);
        assert!(p.get("consoleSize").is_none());
        assert!(process_spec(&init, &[], &opts).is_err());
        let rel = ExecOptions {
            cwd: Some("tmp".into()),
            ..opts.clone()
        };
        assert!(process_spec(&init, &["ls".into()], &rel).is_err());
        let bad = ExecOptions {
            env: vec!["NOEQUALS".into()],
            ..opts
        };
        assert!(process_spec(&init, &["ls".into()], &bad).is_err());
    }
}
