//! chalkctl: the whole life of chalk sandboxes over containerd's API, with `ctr`'s conventions
//! (`--address`/`CONTAINERD_ADDRESS`, `--namespace`/`CONTAINERD_NAMESPACE`).

use std::process::ExitCode;

use std::{collections::HashMap, path::PathBuf, time::Duration};

use chalk_client::{
    attach::{self, Ended},
    client::Client,
    exec::{self, ExecOptions},
    fork, logs, names,
    progress::Progress,
    registry::{self, Filter, Status},
    remote::{self, hosts, moves, pull, push},
    remove,
    run::{self, RunOptions},
    sandboxes::{self, Until},
    snapshots,
    stdio::{
        keeper::{self, Keeping},
        state, tty,
    },
    tree, Error, Result,
};
use clap::{CommandFactory, Parser, Subcommand, ValueEnum};
use serde_json::{json, Value};

#[derive(Parser)]
#[command(
    name = "chalkctl",
    version,
    about = "chalk-shim sandboxes on containerd: run, exec, attach, logs, snapshot, fork, suspend, resume, rm"
)]
struct Cli {
    /// containerd's socket.
    #[arg(
        long,
        global = true,
        env = "CONTAINERD_ADDRESS",
        default_value = "/run/containerd/containerd.sock"
    )]
    address: String,
    /// containerd namespace.
    #[arg(
        long,
        short = 'n',
        global = true,
        env = "CONTAINERD_NAMESPACE",
        default_value = "default"
    )]
    namespace: String,
    /// Output format.
    #[arg(long, short = 'o', global = true, value_enum, default_value = "table")]
    output: Output,
    /// The shim's runtime options, for the snapshot store they name ([snapshot] store).
    #[arg(long, global = true, env = "CHALK_SHIM_CONFIG")]
    config: Option<std::path::PathBuf>,
    /// Where chalkctl keeps the stdio of the sandboxes it starts (fifos, logs, attach
    /// sockets; root only). One per containerd.
    #[arg(long, global = true, env = "CHALKCTL_STATE_DIR", default_value = state::DEFAULT_ROOT)]
    state_dir: PathBuf,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Output {
    Table,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Start a sandbox of this runtime; its output is kept (`logs`), and with --tty its
    /// terminal can be attached to (`attach`).
    Run {
        image: String,
        id: String,
        /// The snapshotter the image is unpacked for.
        #[arg(long, default_value = "overlayfs")]
        snapshotter: String,
        /// Give the init a terminal (attach to it with `chalkctl attach`).
        #[arg(long, short = 't')]
        tty: bool,
        /// KEY=VALUE added to the image's environment (repeatable).
        #[arg(long = "env", short = 'e', value_name = "KEY=VALUE")]
        env: Vec<String>,
        /// The init's working directory.
        #[arg(long, value_name = "DIR")]
        cwd: Option<String>,
        /// Memory limit: bytes, or with k, m, g (512m).
        #[arg(long, value_parser = parse_memory)]
        memory: Option<u64>,
        /// CPU limit: how many CPUs' time (1.5).
        #[arg(long, value_parser = parse_cpus)]
        cpus: Option<f64>,
        #[command(flatten)]
        name: NameArg,
        #[command(flatten)]
        lifetime: LifetimeArgs,
        /// The command, replacing the image's (after --).
        #[arg(last = true)]
        cmd: Vec<String>,
    },
    /// Run a command in a running sandbox; its exit status is chalkctl's.
    Exec {
        /// The sandbox (id or name).
        #[arg(long)]
        id: String,
        /// A terminal for the command (raw mode here; the window size follows).
        #[arg(long, short = 't')]
        tty: bool,
        /// Pass this side's stdin to the command.
        #[arg(long, short = 'i')]
        interactive: bool,
        /// KEY=VALUE added to the sandbox's environment (repeatable).
        #[arg(long = "env", short = 'e', value_name = "KEY=VALUE")]
        env: Vec<String>,
        /// The command's working directory.
        #[arg(long, value_name = "DIR")]
        cwd: Option<String>,
        /// The command (after --).
        #[arg(last = true, required = true)]
        cmd: Vec<String>,
    },
    /// This terminal on a sandbox's init (run with --tty): detach with Ctrl-P Ctrl-Q.
    Attach {
        #[arg(long)]
        id: String,
    },
    /// What a sandbox's init printed (kept for sandboxes chalkctl started, forked or resumed).
    Logs {
        #[arg(long)]
        id: String,
        /// Go on printing what it prints, until it exits or is suspended.
        #[arg(long, short = 'f')]
        follow: bool,
    },
    /// Remove sandboxes: task, container, root filesystem and chalkctl's state (never their
    /// snapshots). A running one only with --force.
    Rm {
        /// The sandboxes (repeatable; ids or names).
        #[arg(long, required = true, num_args = 1..)]
        id: Vec<String>,
        /// Stop a running sandbox first: SIGTERM, then SIGKILL after --grace.
        #[arg(long)]
        force: bool,
        /// How long a sandbox has to exit on SIGTERM (e.g. 10s).
        #[arg(long, default_value = "10s", value_parser = parse_duration)]
        grace: Duration,
    },
    /// Wait until a sandbox runs, or until its init exits (prints the exit status).
    Wait {
        #[arg(long)]
        id: String,
        #[arg(long = "for", value_enum, default_value = "exited")]
        until: UntilArg,
        /// Give up after this long (e.g. 30s); no limit by default.
        #[arg(long, value_parser = parse_duration)]
        timeout: Option<Duration>,
    },
    /// The stdio keeper of one sandbox (what run, fork and resume start).
    #[command(hide = true)]
    Keep {
        #[arg(long)]
        id: String,
        #[arg(long)]
        terminal: bool,
    },
    /// Shell completions, to stdout (bash, zsh, fish, elvish, powershell).
    Completions { shell: clap_complete::Shell },
    /// The man page (roff), to stdout.
    Man,
    /// The snapshot registry.
    #[command(subcommand)]
    Snapshot(SnapshotCommand),
    /// New running sandboxes from a snapshot (--snapshot-id), or from a running sandbox
    /// (--id: snapshotted, forked, and the snapshot deleted once the forks run), each
    /// reported on its own.
    Fork {
        /// The snapshot to fork.
        #[arg(long, required_unless_present_any = ["id", "snapshot"])]
        snapshot_id: Option<String>,
        /// The running sandbox to fork (instead of --snapshot-id).
        #[arg(long)]
        id: Option<String>,
        /// A snapshot in a registry to fork (pulled first: only what this host lacks).
        #[arg(long, value_name = "REF", conflicts_with_all = ["id", "snapshot_id"])]
        snapshot: Option<String>,
        #[command(flatten)]
        registry: RegistryArgs,
        /// The new sandbox's id (with --count N: ID-1 .. ID-N); `<source>-fork-<time>` by
        /// default.
        #[arg(long)]
        fork_id: Option<String>,
        #[arg(long, default_value_t = 1)]
        count: usize,
        #[command(flatten)]
        name: NameArg,
        /// With --id: keep the snapshot taken for the fork.
        #[arg(long)]
        keep_snapshot: bool,
        /// Fork even when the host's available memory looks too small for every copy.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        lifetime: LifetimeArgs,
    },
    /// The fork tree: every sandbox under the one it was forked from, with its status (the
    /// tree below --id only, when given).
    Tree {
        #[arg(long)]
        id: Option<String>,
    },
    /// What the shim runs when a sandbox's lifetime ends: destroy or suspend it.
    #[command(hide = true)]
    Expire {
        #[arg(long)]
        id: String,
        #[arg(long, value_parser = ["destroy", "suspend"])]
        action: String,
    },
    /// Sandboxes of this runtime with their status and snapshots (stopped ones with --all).
    List {
        #[arg(long)]
        all: bool,
    },
    /// One sandbox: status, image, and its snapshots.
    Get {
        #[arg(long)]
        id: String,
    },
    /// Checkpoint a sandbox, then release its compute; it reads `suspended`.
    Suspend {
        #[arg(long)]
        id: String,
        /// Also push the snapshot to this registry reference (repo:tag).
        #[arg(long, value_name = "REF")]
        to: Option<String>,
        /// With --to: delete the local copy once the registry has it (the node keeps only
        /// the sandbox's record).
        #[arg(long, requires = "to")]
        release: bool,
        #[command(flatten)]
        registry: RegistryArgs,
    },
    /// The same sandbox id running again from where it was suspended (on another host: give
    /// --from, the reference it was suspended to).
    Resume {
        #[arg(long)]
        id: String,
        /// Pull the snapshot from this registry reference when this host lacks it.
        #[arg(long, value_name = "REF")]
        from: Option<String>,
        #[command(flatten)]
        registry: RegistryArgs,
    },
}

/// How to reach a registry (as ctr and containerd do).
#[derive(clap::Args, Clone)]
struct RegistryArgs {
    /// containerd's registry hosts directory: <host[:port]>/hosts.toml for mirrors, CA files
    /// and skip_verify.
    #[arg(long, env = "CHALK_HOSTS_DIR", default_value = hosts::DEFAULT_DIR)]
    hosts_dir: std::path::PathBuf,
    /// Plain HTTP to a registry that hosts.toml does not describe (HTTPS otherwise).
    #[arg(long)]
    plain_http: bool,
    /// Registry credentials, user[:password] (the password is read from stdin when left
    /// out); the docker config.json's otherwise.
    #[arg(long, short = 'u', value_name = "USER[:PASSWORD]")]
    user: Option<String>,
}

impl RegistryArgs {
    fn access(&self) -> remote::Access {
        remote::Access {
            hosts_dir: self.hosts_dir.clone(),
            plain_http: self.plain_http,
            user: self.user.clone(),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum UntilArg {
    Running,
    Exited,
}

/// A name for what is made, accepted wherever its id is.
#[derive(clap::Args, Clone)]
struct NameArg {
    /// A name, accepted wherever the id is (several at once: NAME-1 .. NAME-N).
    #[arg(long)]
    name: Option<String>,
}

fn parse_memory(s: &str) -> Result<u64, String> {
    run::parse_memory(s).map_err(|e| e.to_string())
}

fn parse_cpus(s: &str) -> Result<f64, String> {
    run::parse_cpus(s).map_err(|e| e.to_string())
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    chalk_runtime::lifetime::parse_duration(s).map_err(|e| e.to_string())
}

/// A sandbox's lifetime (`run`; `fork` overrides the one its forks inherit).
#[derive(clap::Args, Clone)]
struct LifetimeArgs {
    /// How long the sandbox may run, from each start or resume (e.g. 600s, 10m, 1h30m);
    /// the `chalk.io/lifetime` annotation.
    #[arg(long, value_parser = parse_lifetime)]
    lifetime: Option<String>,
    /// What happens when the lifetime ends: destroy (the default) or suspend; the
    /// `chalk.io/on-timeout` annotation.
    #[arg(long, value_parser = ["destroy", "suspend"])]
    on_timeout: Option<String>,
}

fn parse_lifetime(s: &str) -> Result<String, String> {
    chalk_runtime::lifetime::parse_duration(s).map(|_| s.to_string())
}

#[derive(Subcommand)]
enum SnapshotCommand {
    /// Snapshot a running sandbox; it keeps running. Prints the snapshot id.
    Create {
        #[arg(long)]
        id: String,
        /// A label to attach, key=value (repeatable).
        #[arg(long = "label", value_parser = parse_label)]
        labels: Vec<(String, String)>,
        /// Return at once with the pending snapshot's name; a background chalkctl takes the
        /// checkpoint (`snapshot wait` waits for it).
        #[arg(long)]
        no_wait: bool,
        #[command(flatten)]
        name: NameArg,
    },
    /// Wait until a snapshot is completed (prints its id) or failed (its error).
    Wait {
        #[arg(long)]
        snapshot_id: String,
        /// Give up after this long (e.g. 60s); no limit by default.
        #[arg(long, value_parser = parse_duration)]
        timeout: Option<Duration>,
    },
    /// Takes the checkpoint of a pending snapshot (what --no-wait starts in the background).
    #[command(hide = true)]
    Finish {
        #[arg(long)]
        name: String,
    },
    /// Status, source, creation time, labels and the manifest's main fields.
    Get {
        #[arg(long)]
        snapshot_id: String,
    },
    /// One page of snapshots, newest first.
    List {
        #[arg(long)]
        sandbox_id: Option<String>,
        #[arg(long, value_parser = parse_status)]
        status: Option<Status>,
        #[arg(long, default_value_t = 20)]
        limit: usize,
        #[arg(long)]
        cursor: Option<String>,
    },
    /// Remove what no snapshot needs from the snapshot store: blobs of deleted snapshots,
    /// what a crashed checkpoint or restore left (run by `delete` too).
    Gc,
    /// Remove a snapshot (never its source or its forks).
    Delete {
        #[arg(long)]
        snapshot_id: String,
    },
    /// Push a snapshot to an OCI registry (with its base image when the repository lacks
    /// it); blobs the registry has are not sent again. Prints REF@digest.
    Push {
        #[arg(long)]
        snapshot_id: String,
        /// Where: host[:port]/repository[:tag].
        reference: String,
        #[command(flatten)]
        registry: RegistryArgs,
    },
    /// Pull a snapshot from an OCI registry into this host (only the blobs it lacks, each
    /// checked by digest), after checking this host can restore it. Prints its id.
    Pull {
        reference: String,
        #[command(flatten)]
        registry: RegistryArgs,
    },
}

fn parse_label(s: &str) -> Result<(String, String), String> {
    registry::parse_label(s).map_err(|e| e.to_string())
}

fn parse_status(s: &str) -> Result<Status, String> {
    Status::parse(s).map_err(|e| e.to_string())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if matches!(cli.command, Command::Exec { .. } | Command::Attach { .. }) {
        // Before containerd's client starts its threads: the session takes these itself.
        tty::block_session_signals();
    }
    match session(&cli) {
        Ok(Some(code)) => ExitCode::from(code),
        Ok(None) => match run(&cli) {
            Ok(out) => {
                if cli.output == Output::Json {
                    println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("chalkctl: {e}");
                ExitCode::FAILURE
            }
        },
        Err(e) => {
            eprintln!("chalkctl: {e}");
            ExitCode::FAILURE
        }
    }
}

fn connect(cli: &Cli) -> Result<Client> {
    let mut client = Client::connect(&cli.address, &cli.namespace)?;
    if let Some(path) = cli.config.as_ref().filter(|p| !p.as_os_str().is_empty()) {
        client.set_config(path.clone());
    }
    Ok(client)
}

/// How chalkctl starts stdio keepers.
fn keeping(cli: &Cli) -> Result<Keeping> {
    let exe =
        std::env::current_exe().map_err(|e| Error::from(format!("find chalkctl itself: {e}")))?;
    Ok(Keeping {
        exe,
        address: cli.address.clone(),
        namespace: cli.namespace.clone(),
        root: cli.state_dir.clone(),
    })
}

/// The commands whose outcome is an exit status or a stream rather than a record: their exit
/// code (None for the other commands, run by [`run`]).
fn session(cli: &Cli) -> Result<Option<u8>> {
    let code = |status: u32| u8::try_from(status).unwrap_or(255);
    match &cli.command {
        Command::Keep { id, terminal } => {
            keeper::serve(&cli.address, &cli.namespace, &cli.state_dir, id, *terminal)?;
            Ok(Some(0))
        }
        Command::Completions { shell } => {
            clap_complete::generate(
                *shell,
                &mut Cli::command(),
                "chalkctl",
                &mut std::io::stdout(),
            );
            Ok(Some(0))
        }
        Command::Man => {
            clap_mangen::Man::new(Cli::command())
                .render(&mut std::io::stdout())
                .map_err(|e| Error::from(format!("write the man page: {e}")))?;
            Ok(Some(0))
        }
        Command::Exec {
            id,
            tty,
            interactive,
            env,
            cwd,
            cmd,
        } => {
            let client = connect(cli)?;
            let id = names::resolve(&client, id)?;
            let opts = ExecOptions {
                tty: *tty,
                stdin: *interactive,
                env: env.clone(),
                cwd: cwd.clone(),
            };
            let dir = keeping(cli)?.dir(&id)?;
            let status = exec::exec(&client, &dir, &id, cmd, &opts)?;
            Ok(Some(code(status)))
        }
        Command::Attach { id } => {
            let client = connect(cli)?;
            let id = names::resolve(&client, id)?;
            let dir = keeping(cli)?.dir(&id)?;
            if tty::stdin_is_tty() {
                eprintln!("attached to {id}: detach with Ctrl-P Ctrl-Q");
            }
            match attach::attach(&client, &dir, &id)? {
                Ended::Detached => {
                    eprintln!(
                        "\r\ndetached from {id}: it runs on (chalkctl attach --id {id} comes back)"
                    );
                    Ok(Some(0))
                }
                Ended::Suspended => {
                    eprintln!("\r\n{id} was suspended (chalkctl resume --id {id} brings it back)");
                    Ok(Some(0))
                }
                Ended::Exited(status) => Ok(Some(status.map_or(0, code))),
            }
        }
        Command::Logs { id, follow } => {
            let client = connect(cli)?;
            let id = names::resolve(&client, id)?;
            let dir = keeping(cli)?.dir(&id)?;
            logs::logs(&dir, &id, *follow, &mut std::io::stdout().lock())?;
            Ok(Some(0))
        }
        _ => Ok(None),
    }
}

/// Runs the command; prints tables itself and returns the JSON form.
fn run(cli: &Cli) -> Result<Value> {
    let mut client = connect(cli)?;
    let table = cli.output == Output::Table;
    let progress = Progress::new(table);
    match &cli.command {
        Command::Snapshot(SnapshotCommand::Create {
            id,
            labels,
            no_wait: true,
            name,
        }) => {
            let id = &names::resolve(&client, id)?;
            let begun = snapshots::begin_named(
                &mut client,
                id,
                labels.clone(),
                name.name.as_deref(),
                Status::Pending,
            )?;
            spawn_finish(cli, &begun.snap.name)?;
            if table {
                println!("{} pending", begun.snap.name);
            }
            Ok(snapshots::to_json(&begun.snap))
        }
        Command::Snapshot(SnapshotCommand::Finish { name }) => {
            let begun = snapshots::pending(&client, name)?;
            let snap = snapshots::finish(&mut client, begun, false, &Progress::quiet())?;
            Ok(snapshots::to_json(&snap))
        }
        Command::Snapshot(SnapshotCommand::Create {
            id, labels, name, ..
        }) => {
            let id = &names::resolve(&client, id)?;
            let snap = snapshots::create_named(
                &mut client,
                id,
                labels.clone(),
                name.name.as_deref(),
                false,
                &progress,
            )?;
            progress.step(&format!(
                "snapshot of {id} completed in {}",
                progress.elapsed()
            ));
            if table {
                println!("{}", snap.digest);
            }
            let mut out = snapshots::to_json(&snap);
            out["elapsed_ms"] = progress.elapsed_ms().into();
            Ok(out)
        }
        Command::Snapshot(SnapshotCommand::Wait {
            snapshot_id,
            timeout,
        }) => {
            let snap = snapshots::wait(&client, snapshot_id, *timeout)?;
            if table {
                println!("{}", snap.digest);
            }
            Ok(snapshots::to_json(&snap))
        }
        Command::Snapshot(SnapshotCommand::Get { snapshot_id }) => {
            let snap = snapshots::find(&client, snapshot_id)?;
            let manifest = snapshots::manifest_summary(&client, &snap)?;
            let mut out = snapshots::to_json(&snap);
            out["manifest"] = manifest;
            if table {
                print_record(&out);
            }
            Ok(out)
        }
        Command::Snapshot(SnapshotCommand::List {
            sandbox_id,
            status,
            limit,
            cursor,
        }) => {
            let filter = Filter {
                sandbox_id: sandbox_id.clone(),
                status: *status,
            };
            let page = snapshots::list(&client, &filter, *limit, cursor.as_deref())?;
            if table {
                println!(
                    "{:<72} {:<20} {:<12} {:<25}",
                    "ID", "SANDBOX", "STATUS", "CREATED"
                );
                for s in &page.items {
                    let id = if s.digest.is_empty() { "-" } else { &s.digest };
                    println!(
                        "{id:<72} {:<20} {:<12} {:<25}",
                        s.sandbox_id,
                        s.status.as_str(),
                        s.created
                    );
                }
                if let Some(c) = &page.next_cursor {
                    println!("next page: --cursor {c}");
                }
            }
            Ok(json!({
                "items": page.items.iter().map(snapshots::to_json).collect::<Vec<_>>(),
                "next_cursor": page.next_cursor,
            }))
        }
        Command::Fork {
            snapshot_id,
            id,
            snapshot,
            registry,
            fork_id,
            count,
            keep_snapshot,
            force,
            lifetime,
            name,
        } => {
            let opts = fork::ForkOptions {
                lifetime: lifetime.lifetime.clone(),
                on_timeout: lifetime.on_timeout.clone(),
                force: *force,
                name: name.name.clone(),
                keep: Some(keeping(cli)?),
            };
            if let Some(keep) = &opts.keep {
                keeper::sweep(&client, keep);
            }
            let id = &match id {
                Some(q) => Some(names::resolve(&client, q)?),
                None => None,
            };
            let pulled = match snapshot {
                Some(reference) => Some(
                    pull::pull(&mut client, &registry.access(), reference, &progress)?
                        .snapshot
                        .digest,
                ),
                None => None,
            };
            let snapshot_id = &pulled.or(snapshot_id.clone());
            let (forks, snapshot) = match (snapshot_id, id) {
                (Some(_), Some(_)) => {
                    return Err(
                        "--id names a running sandbox to fork, --snapshot-id a snapshot \
                                to fork: give one (name the new sandbox with --fork-id)"
                            .into(),
                    )
                }
                (Some(query), None) => {
                    let forks = fork::fork(
                        &mut client,
                        query,
                        fork_id.as_deref(),
                        *count,
                        &opts,
                        &progress,
                    )?;
                    (forks, None)
                }
                (None, Some(source)) => {
                    // What would refuse the forks is found before the snapshot is taken.
                    fork::check_ids(fork_id.as_deref(), source, *count)?;
                    let snap =
                        snapshots::create(&mut client, source, Vec::new(), false, &progress)?;
                    let forks = fork::fork(
                        &mut client,
                        &snap.digest,
                        fork_id.as_deref(),
                        *count,
                        &opts,
                        &progress,
                    );
                    if !keep_snapshot {
                        // Whatever became of the forks: it holds the sandbox's memory.
                        match snapshots::delete(&client, &snap) {
                            Ok(gc) => progress.step(&format!(
                                "deleted the intermediate snapshot {} ({} freed)",
                                fork::short(&snap.digest),
                                snapshots::megabytes(gc.bytes_freed)
                            )),
                            Err(e) => eprintln!(
                                "chalkctl: the intermediate snapshot {} was kept: {e}",
                                snap.digest
                            ),
                        }
                    }
                    (forks?, Some((snap.digest, *keep_snapshot)))
                }
                (None, None) => return Err("give --snapshot-id, --snapshot REF or --id".into()),
            };
            let failed = forks.iter().filter(|f| f.pid.is_err()).count();
            if table {
                println!("{:<40} {:<10} {:<10} ERROR", "SANDBOX", "PID", "TIME");
                for f in &forks {
                    let (pid, err) = match &f.pid {
                        Ok(pid) => (pid.to_string(), String::new()),
                        Err(e) => ("-".to_string(), e.to_string()),
                    };
                    println!(
                        "{:<40} {pid:<10} {:<10} {err}",
                        f.id,
                        format!("{}ms", f.elapsed_ms)
                    );
                }
                eprintln!(
                    "{} of {} forks running, in {}",
                    forks.len() - failed,
                    forks.len(),
                    progress.elapsed()
                );
            }
            let mut out = json!({
                "forks": forks.iter().map(|f| json!({
                    "id": f.id,
                    "pid": f.pid.as_ref().ok(),
                    "error": f.pid.as_ref().err().map(ToString::to_string),
                    "elapsed_ms": f.elapsed_ms,
                })).collect::<Vec<_>>(),
                "elapsed_ms": progress.elapsed_ms(),
                "pool": fork::pool_size(*count),
            });
            if let Some((digest, kept)) = snapshot {
                out["snapshot"] = json!({"id": digest, "kept": kept});
            }
            if failed > 0 {
                if cli.output == Output::Json {
                    println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
                }
                return Err(format!("{failed} of {} forks failed", forks.len()).into());
            }
            Ok(out)
        }
        Command::Tree { id } => {
            let id = match id {
                Some(q) => Some(names::resolve(&client, q)?),
                None => None,
            };
            let forest = tree::forest(&client, id.as_deref())?;
            if table {
                for line in tree::draw(&forest) {
                    println!("{line}");
                }
            }
            Ok(json!({"tree": forest.iter().map(tree::to_json).collect::<Vec<_>>()}))
        }
        Command::Expire { id, action } => {
            let outcome = sandboxes::expire(&mut client, id, action, &progress)?;
            Ok(json!({"id": id, "action": action, "outcome": outcome}))
        }
        Command::Run {
            image,
            id,
            snapshotter,
            tty,
            env,
            cwd,
            memory,
            cpus,
            name,
            lifetime,
            cmd,
        } => {
            chalk_runtime::ids::container_id(id).map_err(|e| Error::from(e.to_string()))?;
            match client.container(id) {
                Ok(_) => {
                    return Err(format!(
                        "sandbox {id} exists already: choose another id, or remove it with \
                         chalkctl rm --id {id}"
                    )
                    .into())
                }
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e),
            }
            names::check_free(&client, std::slice::from_ref(&name.name))?;
            let mut labels =
                HashMap::from([(keeper::STDIO_LABEL.to_string(), "chalkctl".to_string())]);
            if let Some(n) = &name.name {
                labels.insert(names::NAME_LABEL.to_string(), n.clone());
            }
            let opts = RunOptions {
                tty: *tty,
                env: env.clone(),
                cwd: cwd.clone(),
                memory: *memory,
                cpus: *cpus,
                lifetime: lifetime.lifetime.clone(),
                on_timeout: lifetime.on_timeout.clone(),
                labels,
            };
            let keep = keeping(cli)?;
            keeper::sweep(&client, &keep);
            keep.clear_stale(&client, id)?;
            let size = if *tty { tty::my_window_size() } else { None };
            let pid = progress.during(&format!("starting {id}"), || {
                keeper::kept(Some(&keep), id, *tty, |io| {
                    let io = io.map(|(stdio, _)| (stdio, size));
                    run::run(&mut client, image, id, snapshotter, cmd, &opts, io)
                })
            })?;
            if table {
                println!("{id} running (pid {pid}) in {}", progress.elapsed());
            }
            Ok(json!({"id": id, "status": "running", "pid": pid,
                      "elapsed_ms": progress.elapsed_ms()}))
        }
        Command::List { all } => {
            keeper::sweep(&client, &keeping(cli)?);
            let sandboxes = sandboxes::list(&client, *all)?;
            if table {
                println!(
                    "{:<32} {:<16} {:<10} {:<8} {:<10} {:<24} IMAGE",
                    "SANDBOX", "NAME", "STATUS", "PID", "SNAPSHOTS", "PARENT"
                );
                for s in &sandboxes {
                    println!(
                        "{:<32} {:<16} {:<10} {:<8} {:<10} {:<24} {}",
                        s["id"].as_str().unwrap_or_default(),
                        plain(&s["name"]),
                        s["status"].as_str().unwrap_or_default(),
                        plain(&s["pid"]),
                        s["snapshots"].as_array().map_or(0, Vec::len),
                        plain(&s["parent_sandbox_id"]),
                        s["image"].as_str().unwrap_or_default()
                    );
                }
            }
            Ok(json!({"sandboxes": sandboxes}))
        }
        Command::Get { id } => {
            let s = sandboxes::get(&client, &names::resolve(&client, id)?)?;
            if table {
                print_record(&s);
            }
            Ok(s)
        }
        Command::Suspend {
            id,
            to: Some(to),
            release,
            registry,
        } => {
            let id = &names::resolve(&client, id)?;
            let done =
                moves::suspend_to(&mut client, &registry.access(), id, to, *release, &progress)?;
            progress.step(&format!(
                "{id} suspended to {} in {}",
                done.pushed.reference,
                progress.elapsed()
            ));
            if table {
                println!("{}", done.pushed.reference);
            }
            let mut out = snapshots::to_json(&done.snapshot);
            out["elapsed_ms"] = progress.elapsed_ms().into();
            Ok(json!({"id": id, "status": "suspended", "snapshot": out,
                      "pushed": {"reference": done.pushed.reference,
                                 "transfer": done.pushed.transfer.to_json()},
                      "released": done.released.map(|g| json!({"freed_bytes": g.bytes_freed}))}))
        }
        Command::Suspend { id, .. } => {
            let id = &names::resolve(&client, id)?;
            let snap = snapshots::create(&mut client, id, Vec::new(), true, &progress)?;
            progress.step(&format!("{id} suspended in {}", progress.elapsed()));
            if table {
                println!("{}", snap.digest);
            }
            let mut out = snapshots::to_json(&snap);
            out["elapsed_ms"] = progress.elapsed_ms().into();
            Ok(json!({"id": id, "status": "suspended", "snapshot": out}))
        }
        Command::Resume { id, from, registry } => {
            let id = &names::resolve(&client, id)?;
            let keep = keeping(cli)?;
            let (snapshot, pid, pulled) = moves::resume_from(
                &mut client,
                &registry.access(),
                id,
                from.as_deref(),
                Some(&keep),
                &progress,
            )?;
            if table {
                println!("{id} running again (pid {pid}) in {}", progress.elapsed());
            }
            Ok(
                json!({"id": id, "status": "running", "pid": pid, "snapshot": snapshot,
                      "pulled": pulled.map(|p| p.transfer.to_json()),
                      "elapsed_ms": progress.elapsed_ms()}),
            )
        }
        Command::Snapshot(SnapshotCommand::Push {
            snapshot_id,
            reference,
            registry,
        }) => {
            let pushed = push::push(
                &client,
                &registry.access(),
                snapshot_id,
                reference,
                &progress,
            )?;
            if table {
                println!("{}", pushed.reference);
            }
            Ok(json!({"id": pushed.id, "reference": pushed.reference,
                      "transfer": pushed.transfer.to_json(),
                      "elapsed_ms": progress.elapsed_ms()}))
        }
        Command::Snapshot(SnapshotCommand::Pull {
            reference,
            registry,
        }) => {
            let pulled = pull::pull(&mut client, &registry.access(), reference, &progress)?;
            if table {
                println!("{}", pulled.snapshot.digest);
            }
            let mut out = snapshots::to_json(&pulled.snapshot);
            out["transfer"] = pulled.transfer.to_json();
            out["elapsed_ms"] = progress.elapsed_ms().into();
            Ok(out)
        }
        Command::Snapshot(SnapshotCommand::Delete { snapshot_id }) => {
            let snap = snapshots::find(&client, snapshot_id)?;
            let gc = snapshots::delete(&client, &snap)?;
            if table {
                println!(
                    "deleted {} ({} freed)",
                    snap.name,
                    snapshots::megabytes(gc.bytes_freed)
                );
            }
            Ok(json!({"deleted": snapshots::to_json(&snap), "freed_bytes": gc.bytes_freed}))
        }
        Command::Rm { id, force, grace } => {
            let keep = keeping(cli)?;
            let mut removed = Vec::new();
            let mut failed = Vec::new();
            for q in id {
                let one = names::resolve(&client, q)
                    .and_then(|id| remove::remove(&client, &keep, &id, *force, *grace));
                match one {
                    Ok(r) => {
                        if table {
                            match &r.snapshot_kept {
                                Some(s) => println!(
                                    "removed {} (was suspended); its snapshot {s} remains \
                                     (chalkctl snapshot delete --snapshot-id {s} removes it)",
                                    r.id
                                ),
                                None => println!("removed {} (was {})", r.id, r.was),
                            }
                        }
                        removed.push(r.to_json());
                    }
                    Err(e) => {
                        eprintln!("chalkctl: {e}");
                        failed.push(json!({"id": q, "error": e.to_string()}));
                    }
                }
            }
            let out = json!({"removed": removed, "failed": failed});
            if !failed.is_empty() {
                if cli.output == Output::Json {
                    println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
                }
                return Err(format!("{} of {} not removed", failed.len(), id.len()).into());
            }
            Ok(out)
        }
        Command::Wait { id, until, timeout } => {
            let id = &names::resolve(&client, id)?;
            let until = match until {
                UntilArg::Running => Until::Running,
                UntilArg::Exited => Until::Exited,
            };
            let status = sandboxes::wait(&client, id, until, *timeout)?;
            if table {
                match status {
                    Some(s) => println!("{s}"),
                    None => println!("{id} running"),
                }
            }
            Ok(json!({"id": id, "exit_status": status}))
        }
        Command::Keep { .. }
        | Command::Completions { .. }
        | Command::Man
        | Command::Exec { .. }
        | Command::Attach { .. }
        | Command::Logs { .. } => Err("handled by session()".into()),
        Command::Snapshot(SnapshotCommand::Gc) => {
            let store = client.store()?;
            let gc = snapshots::collect(&client, &store)?;
            if table {
                println!(
                    "removed {} blob(s) and {} abandoned directory(ies): {} freed; the store \
                     holds {}",
                    gc.blobs_removed,
                    gc.stale_dirs,
                    snapshots::megabytes(gc.bytes_freed),
                    snapshots::megabytes(store.usage())
                );
            }
            Ok(
                json!({"blobs_removed": gc.blobs_removed, "stale_dirs": gc.stale_dirs,
                      "freed_bytes": gc.bytes_freed, "store_bytes": store.usage(),
                      "store": store.root()}),
            )
        }
    }
}

/// Starts `chalkctl snapshot finish` for record `name` in a session of its own, detached
/// from this terminal, so the checkpoint goes on after this command returns.
fn spawn_finish(cli: &Cli, name: &str) -> Result<()> {
    use std::os::unix::process::CommandExt;
    let exe =
        std::env::current_exe().map_err(|e| Error::from(format!("find chalkctl itself: {e}")))?;
    let mut cmd = std::process::Command::new(exe);
    cmd.args(["--address", &cli.address, "--namespace", &cli.namespace])
        .args(["snapshot", "finish", "--name", name]);
    if let Some(config) = &cli.config {
        cmd.arg("--config").arg(config);
    }
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    // SAFETY: setsid is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    cmd.spawn()
        .map(drop)
        .map_err(|e| Error::from(format!("start the background checkpoint of {name}: {e}")))
}

/// One record as `key value` lines: nested objects as `key.sub`, and snapshots one per line
/// (id or record name, status, created).
fn print_record(record: &Value) {
    for (key, value) in record_lines("", record) {
        println!("{key:<18} {value}");
    }
}

fn record_lines(prefix: &str, v: &Value) -> Vec<(String, String)> {
    let mut lines = Vec::new();
    for (k, v) in v.as_object().into_iter().flatten() {
        let key = format!("{prefix}{k}");
        match v {
            Value::Object(o) if o.is_empty() => lines.push((key, "-".into())),
            Value::Object(_) if k == "labels" => {
                let pairs: Vec<String> = v
                    .as_object()
                    .into_iter()
                    .flatten()
                    .map(|(k, v)| format!("{k}={}", plain(v)))
                    .collect();
                lines.push((key, pairs.join(", ")));
            }
            Value::Object(_) => lines.extend(record_lines(&format!("{key}."), v)),
            Value::Array(items) if items.iter().all(Value::is_object) => {
                if items.is_empty() {
                    lines.push((key.clone(), "-".into()));
                }
                for item in items {
                    let id = match &item["id"] {
                        Value::Null => plain(&item["name"]),
                        id => plain(id),
                    };
                    let line = format!(
                        "{id} {} {}",
                        plain(&item["status"]),
                        plain(&item["created"])
                    );
                    lines.push((key.clone(), line));
                }
            }
            _ => lines.push((key, plain(v))),
        }
    }
    lines
}

/// A JSON value as a table cell.
fn plain(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::record_lines;
    use serde_json::json;

    #[test]
    fn records_read_as_flat_lines() {
        let v = json!({
            "id": "web",
            "labels": {"a": "1", "b": "2"},
            "manifest": {"kind": "snapshot", "image": {"digest": "sha256:ab"}},
            "snapshots": [{"id": null, "name": "n", "status": "pending", "created": "t"}],
            "error": null,
        });
        let lines: Vec<String> = record_lines("", &v)
            .into_iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        assert_eq!(
            lines,
            [
                "error=-",
                "id=web",
                "labels=a=1, b=2",
                "manifest.image.digest=sha256:ab",
                "manifest.kind=snapshot",
                "snapshots=n pending t",
            ]
        );
    }
}
