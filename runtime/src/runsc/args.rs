//! Every runsc command line is built here and nowhere else. Pure: no I/O, unit-tested.

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
};

/// Flags that go before the subcommand on every call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GlobalArgs {
    /// runsc's state directory (`--root`).
    pub root: PathBuf,
    /// `--key=value` flags from the runtime options' `[runsc_config]`.
    pub flags: Vec<String>,
}

impl GlobalArgs {
    /// The value of global flag `--name=value`, the last one if set twice.
    pub fn flag_value(&self, name: &str) -> Option<&str> {
        self.flags
            .iter()
            .filter_map(|f| {
                f.trim_start_matches('-')
                    .strip_prefix(name)?
                    .strip_prefix('=')
            })
            .next_back()
    }

    /// The root filesystem overlay flag in effect (what keeps root filesystem writes in
    /// sandbox memory, where a checkpoint captures them).
    pub fn overlay(&self) -> Option<&str> {
        self.flags
            .iter()
            .rfind(|f| {
                let name = f.trim_start_matches('-');
                name == "overlay" || name.starts_with("overlay=") || name.starts_with("overlay2=")
            })
            .map(String::as_str)
    }

    /// Whether the sandbox's root filesystem writes stay in its own memory, so that nothing it
    /// does reaches the host's root directory (`--overlay`, `--overlay2=root:memory|self`).
    pub fn root_writes_in_sandbox(&self) -> bool {
        match self.overlay().map(|f| f.trim_start_matches('-')) {
            Some("overlay" | "overlay=true") => true,
            Some(f) => f
                .strip_prefix("overlay2=")
                .and_then(|v| v.split_once(':'))
                .is_some_and(|(mounts, medium)| {
                    matches!(mounts, "root" | "all") && matches!(medium, "memory" | "self")
                }),
            None => false,
        }
    }

    /// runsc's platform (`default` when runsc picks its own).
    pub fn platform(&self) -> &str {
        self.flag_value("platform").unwrap_or("default")
    }

    /// The sandbox's network (`sandbox`, runsc's default, when not set).
    pub fn network(&self) -> &str {
        self.flag_value("network").unwrap_or("sandbox")
    }
}

/// One runsc operation with its arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op<'a> {
    Create {
        id: &'a str,
        bundle: &'a Path,
        pid_file: &'a Path,
        console_socket: Option<&'a Path>,
    },
    Start {
        id: &'a str,
    },
    /// Blocks until the container's init exits; prints `{"id":..,"exitStatus":N}`.
    Wait {
        id: &'a str,
    },
    State {
        id: &'a str,
    },
    Kill {
        id: &'a str,
        signal: u32,
        all: bool,
        /// A process of the sandbox (its root pid namespace) instead of the container's init.
        pid: Option<i32>,
        /// A process group of the sandbox (runsc builds whose `kill` has `--pgid`).
        pgid: Option<i32>,
    },
    Delete {
        id: &'a str,
        force: bool,
    },
    /// Runs in the foreground: runsc exits with the process's status (128+signal if killed).
    Exec {
        id: &'a str,
        process_spec: &'a Path,
        internal_pid_file: &'a Path,
        console_socket: Option<&'a Path>,
    },
    /// The container's processes: their pids as JSON, or runsc's table (with PPID, and PGID
    /// on newer builds).
    Ps {
        id: &'a str,
        table: bool,
    },
    Pause {
        id: &'a str,
    },
    Resume {
        id: &'a str,
    },
    Stats {
        id: &'a str,
    },
    Update {
        id: &'a str,
        resources: &'a Path,
    },
    /// Writes the sandbox's state into `image_path` (a fresh directory).
    Checkpoint {
        id: &'a str,
        image_path: &'a Path,
        leave_running: bool,
        /// Flags of this checkpoint only (runsc's own cuda-checkpoint handoff).
        extra: &'a [String],
    },
    /// Creates sandbox `id` from a checkpoint, detached, like Create but already running.
    Restore {
        id: &'a str,
        bundle: &'a Path,
        image_path: &'a Path,
        pid_file: &'a Path,
        console_socket: Option<&'a Path>,
        memory: MemoryLoad,
    },
    /// Blocks until a background restore has loaded everything.
    WaitRestore {
        id: &'a str,
    },
}

/// How a restore loads the checkpoint's memory.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryLoad {
    /// `--background`: running once kernel state is loaded, memory loading behind it.
    pub background: bool,
    /// `--share-pages`: private memory maps the pages file copy-on-write, shared with the
    /// image's other restores until written.
    pub share_pages: bool,
}

impl Op<'_> {
    /// The subcommand name, also used in logs and error messages.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Create { .. } => "create",
            Op::Start { .. } => "start",
            Op::Wait { .. } => "wait",
            Op::State { .. } => "state",
            Op::Kill { .. } => "kill",
            Op::Delete { .. } => "delete",
            Op::Exec { .. } => "exec",
            Op::Ps { .. } => "ps",
            Op::Pause { .. } => "pause",
            Op::Resume { .. } => "resume",
            Op::Stats { .. } => "events",
            Op::Update { .. } => "update",
            Op::Checkpoint { .. } => "checkpoint",
            Op::Restore { .. } => "restore",
            Op::WaitRestore { .. } => "wait",
        }
    }

    pub fn id(&self) -> &str {
        match self {
            Op::Create { id, .. }
            | Op::Start { id }
            | Op::Wait { id }
            | Op::State { id }
            | Op::Kill { id, .. }
            | Op::Delete { id, .. }
            | Op::Exec { id, .. }
            | Op::Ps { id, .. }
            | Op::Pause { id }
            | Op::Resume { id }
            | Op::Stats { id }
            | Op::Update { id, .. }
            | Op::Checkpoint { id, .. }
            | Op::Restore { id, .. }
            | Op::WaitRestore { id } => id,
        }
    }
}

/// The full argv (without the binary) for `op`, with runsc's own log going to `log_file` as
/// JSON so that a failure's reason can be read back.
pub fn argv(global: &GlobalArgs, log_file: &Path, op: &Op) -> Vec<OsString> {
    let mut a: Vec<OsString> = vec![
        "--root".into(),
        global.root.clone().into(),
        "--log".into(),
        log_file.into(),
        "--log-format=json".into(),
    ];
    a.extend(global.flags.iter().map(OsString::from));
    a.push(op.name().into());
    let console = |a: &mut Vec<OsString>, socket: &Option<&Path>| {
        if let Some(s) = socket {
            a.push("--console-socket".into());
            a.push(s.into());
        }
    };
    match op {
        Op::Create {
            bundle,
            pid_file,
            console_socket,
            ..
        } => {
            a.extend(["--bundle".into(), bundle.into()]);
            a.extend(["--pid-file".into(), pid_file.into()]);
            console(&mut a, console_socket);
        }
        Op::Kill { all, pid, pgid, .. } => {
            if *all {
                a.push("--all".into());
            }
            if let Some(pid) = pid {
                a.push(format!("--pid={pid}").into());
            }
            if let Some(pgid) = pgid {
                a.push(format!("--pgid={pgid}").into());
            }
        }
        Op::Delete { force, .. } => {
            if *force {
                a.push("--force".into());
            }
        }
        Op::Exec {
            process_spec,
            internal_pid_file,
            console_socket,
            ..
        } => {
            a.extend(["--process".into(), process_spec.into()]);
            a.extend(["--internal-pid-file".into(), internal_pid_file.into()]);
            console(&mut a, console_socket);
        }
        Op::Checkpoint {
            image_path,
            leave_running,
            extra,
            ..
        } => {
            a.extend(["--image-path".into(), image_path.into()]);
            if *leave_running {
                a.push("--leave-running".into());
            }
            a.extend(extra.iter().map(Into::into));
        }
        Op::Restore {
            bundle,
            image_path,
            pid_file,
            console_socket,
            memory,
            ..
        } => {
            a.extend(["--bundle".into(), bundle.into()]);
            a.extend(["--image-path".into(), image_path.into()]);
            a.extend(["--pid-file".into(), pid_file.into()]);
            a.push("--detach".into());
            if memory.background {
                a.push("--background".into());
            }
            if memory.share_pages {
                a.push("--share-pages".into());
            }
            console(&mut a, console_socket);
        }
        Op::WaitRestore { .. } => a.push("--restore".into()),
        Op::Ps { table: false, .. } => a.push("--format=json".into()),
        Op::Ps { table: true, .. } => {}
        Op::Stats { .. } => a.push("--stats".into()),
        Op::Update { resources, .. } => a.extend(["--resources".into(), resources.into()]),
        Op::Start { .. }
        | Op::Wait { .. }
        | Op::State { .. }
        | Op::Pause { .. }
        | Op::Resume { .. } => {}
    }
    // Go's flag parser stops at the first positional argument: the id goes last but for kill.
    a.push(op.id().into());
    if let Op::Kill { signal, .. } = op {
        a.push(signal.to_string().into());
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    fn global() -> GlobalArgs {
        GlobalArgs {
            root: "/run/chalk/default".into(),
            flags: vec!["--platform=ptrace".into(), "--network=none".into()],
        }
    }

    fn render(op: Op) -> String {
        argv(&global(), Path::new("/b/log.json"), &op)
            .iter()
            .map(|s| s.to_str().unwrap())
            .collect::<Vec<_>>()
            .join(" ")
    }

    const G: &str =
        "--root /run/chalk/default --log /b/log.json --log-format=json --platform=ptrace --network=none";

    #[test]
    fn checkpoint_and_restore() {
        assert_eq!(
            render(Op::Checkpoint {
                id: "c1",
                image_path: Path::new("/ck"),
                leave_running: true,
                extra: &["--cuda-checkpoint-path=/usr/bin/cuda-checkpoint".into()],
            }),
            format!(
                "{G} checkpoint --image-path /ck --leave-running \
                 --cuda-checkpoint-path=/usr/bin/cuda-checkpoint c1"
            )
        );
        assert_eq!(
            render(Op::Checkpoint {
                id: "c1",
                image_path: Path::new("/ck"),
                leave_running: false,
                extra: &[],
            }),
            format!("{G} checkpoint --image-path /ck c1")
        );
        assert_eq!(
            render(Op::Restore {
                id: "c2",
                bundle: Path::new("/b"),
                image_path: Path::new("/ck"),
                pid_file: Path::new("/b/init.pid"),
                console_socket: Some(Path::new("/s")),
                memory: MemoryLoad::default(),
            }),
            format!(
                "{G} restore --bundle /b --image-path /ck --pid-file /b/init.pid --detach \
                 --console-socket /s c2"
            )
        );
        assert_eq!(
            render(Op::Restore {
                id: "c2",
                bundle: Path::new("/b"),
                image_path: Path::new("/ck"),
                pid_file: Path::new("/b/init.pid"),
                console_socket: None,
                memory: MemoryLoad {
                    background: true,
                    share_pages: false,
                },
            }),
            format!(
                "{G} restore --bundle /b --image-path /ck --pid-file /b/init.pid --detach \
                 --background c2"
            )
        );
        assert_eq!(
            render(Op::Restore {
                id: "c2",
                bundle: Path::new("/b"),
                image_path: Path::new("/ck"),
                pid_file: Path::new("/b/init.pid"),
                console_socket: None,
                memory: MemoryLoad {
                    background: true,
                    share_pages: true,
                },
            }),
            format!(
                "{G} restore --bundle /b --image-path /ck --pid-file /b/init.pid --detach \
                 --background --share-pages c2"
            )
        );
        assert_eq!(
            render(Op::WaitRestore { id: "c2" }),
            format!("{G} wait --restore c2")
        );
    }

    #[test]
    fn create_with_and_without_console() {
        assert_eq!(
            render(Op::Create {
                id: "c1",
                bundle: Path::new("/b"),
                pid_file: Path::new("/b/init.pid"),
                console_socket: None
            }),
            format!("{G} create --bundle /b --pid-file /b/init.pid c1")
        );
        assert_eq!(
            render(Op::Create {
                id: "c1",
                bundle: Path::new("/b"),
                pid_file: Path::new("/b/init.pid"),
                console_socket: Some(Path::new("/tmp/s.sock"))
            }),
            format!(
                "{G} create --bundle /b --pid-file /b/init.pid --console-socket /tmp/s.sock c1"
            )
        );
    }

    #[test]
    fn kill_puts_flags_before_id_and_signal_last() {
        assert_eq!(
            render(Op::Kill {
                id: "c1",
                signal: 9,
                all: false,
                pid: None,
                pgid: None
            }),
            format!("{G} kill c1 9")
        );
        assert_eq!(
            render(Op::Kill {
                id: "c1",
                signal: 15,
                all: true,
                pid: None,
                pgid: None
            }),
            format!("{G} kill --all c1 15")
        );
        assert_eq!(
            render(Op::Kill {
                id: "c1",
                signal: 2,
                all: false,
                pid: Some(7),
                pgid: None
            }),
            format!("{G} kill --pid=7 c1 2")
        );
        assert_eq!(
            render(Op::Kill {
                id: "c1",
                signal: 2,
                all: false,
                pid: None,
                pgid: Some(9)
            }),
            format!("{G} kill --pgid=9 c1 2")
        );
    }

    #[test]
    fn flag_readers_take_the_last_value() {
        let g = GlobalArgs {
            root: "/r".into(),
            flags: vec![
                "--network=sandbox".into(),
                "--overlay".into(),
                "--network=none".into(),
                "--overlay2=root:memory".into(),
            ],
        };
        assert_eq!(g.network(), "none");
        assert_eq!(g.platform(), "default");
        assert_eq!(g.overlay(), Some("--overlay2=root:memory"));
        assert_eq!(global().platform(), "ptrace");
    }

    #[test]
    fn root_writes_stay_in_the_sandbox_only_under_a_memory_overlay() {
        let with = |f: &[&str]| GlobalArgs {
            root: "/r".into(),
            flags: f.iter().map(|s| s.to_string()).collect(),
        };
        for yes in [
            &["--overlay"][..],
            &["--overlay2=root:memory"],
            &["--overlay2=all:self"],
            &["--overlay2=none", "--overlay2=root:self"],
        ] {
            assert!(with(yes).root_writes_in_sandbox(), "{yes:?}");
        }
        for no in [
            &[][..],
            &["--overlay=false"],
            &["--overlay2=none"],
            &["--overlay2=root:/host/dir"],
            &["--overlay2=root:memory", "--overlay2=none"],
        ] {
            assert!(!with(no).root_writes_in_sandbox(), "{no:?}");
        }
    }

    #[test]
    fn other_ops() {
        assert_eq!(render(Op::Start { id: "c" }), format!("{G} start c"));
        assert_eq!(render(Op::Wait { id: "c" }), format!("{G} wait c"));
        assert_eq!(render(Op::State { id: "c" }), format!("{G} state c"));
        assert_eq!(
            render(Op::Delete {
                id: "c",
                force: true
            }),
            format!("{G} delete --force c")
        );
        assert_eq!(
            render(Op::Ps {
                id: "c",
                table: false
            }),
            format!("{G} ps --format=json c")
        );
        assert_eq!(
            render(Op::Ps {
                id: "c",
                table: true
            }),
            format!("{G} ps c")
        );
        assert_eq!(render(Op::Pause { id: "c" }), format!("{G} pause c"));
        assert_eq!(render(Op::Resume { id: "c" }), format!("{G} resume c"));
        assert_eq!(
            render(Op::Stats { id: "c" }),
            format!("{G} events --stats c")
        );
        assert_eq!(
            render(Op::Update {
                id: "c",
                resources: Path::new("/b/r.json")
            }),
            format!("{G} update --resources /b/r.json c")
        );
        assert_eq!(
            render(Op::Exec {
                id: "c",
                process_spec: Path::new("/b/exec-e1.json"),
                internal_pid_file: Path::new("/b/exec-e1.pid"),
                console_socket: None
            }),
            format!("{G} exec --process /b/exec-e1.json --internal-pid-file /b/exec-e1.pid c")
        );
    }
}
