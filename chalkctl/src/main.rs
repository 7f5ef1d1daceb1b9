//! chalkctl: snapshots of chalk sandboxes over containerd's API, with `ctr`'s conventions
//! (`--address`/`CONTAINERD_ADDRESS`, `--namespace`/`CONTAINERD_NAMESPACE`).

use std::process::ExitCode;

use chalkctl::{
    client::Client,
    fork,
    progress::Progress,
    registry::{self, Filter, Status},
    remote::{self, hosts, moves, pull, push},
    run, sandboxes, snapshots, tree, Error, Result,
};
use clap::{Parser, Subcommand, ValueEnum};
use serde_json::{json, Value};

#[derive(Parser)]
#[command(
    name = "chalkctl",
    version,
    about = "Snapshots of chalk-shim sandboxes on containerd"
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
    /// Start a sandbox of this runtime (no stdio): to try things with.
    Run {
        image: String,
        id: String,
        /// The snapshotter the image is unpacked for.
        #[arg(long, default_value = "overlayfs")]
        snapshotter: String,
        #[command(flatten)]
        lifetime: LifetimeArgs,
        /// The command, replacing the image's (after --).
        #[arg(last = true)]
        cmd: Vec<String>,
    },
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
        /// checkpoint (follow it with `snapshot get`).
        #[arg(long)]
        no_wait: bool,
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
    match run(&cli) {
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
    }
}

/// Runs the command; prints tables itself and returns the JSON form.
fn run(cli: &Cli) -> Result<Value> {
    let mut client = Client::connect(&cli.address, &cli.namespace)?;
    if let Some(path) = cli.config.as_ref().filter(|p| !p.as_os_str().is_empty()) {
        client.set_config(path.clone());
    }
    let table = cli.output == Output::Table;
    let progress = Progress::new(table);
    match &cli.command {
        Command::Snapshot(SnapshotCommand::Create {
            id,
            labels,
            no_wait: true,
        }) => {
            let begun = snapshots::begin(&mut client, id, labels.clone(), Status::Pending)?;
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
        Command::Snapshot(SnapshotCommand::Create { id, labels, .. }) => {
            let snap = snapshots::create(&mut client, id, labels.clone(), false, &progress)?;
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
        } => {
            let opts = fork::ForkOptions {
                lifetime: lifetime.lifetime.clone(),
                on_timeout: lifetime.on_timeout.clone(),
                force: *force,
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
            lifetime,
            cmd,
        } => {
            let pid = progress.during(&format!("starting {id}"), || {
                run::run(
                    &mut client,
                    image,
                    id,
                    snapshotter,
                    (lifetime.lifetime.as_deref(), lifetime.on_timeout.as_deref()),
                    cmd,
                )
            })?;
            if table {
                println!("{id} running (pid {pid}) in {}", progress.elapsed());
            }
            Ok(json!({"id": id, "status": "running", "pid": pid,
                      "elapsed_ms": progress.elapsed_ms()}))
        }
        Command::List { all } => {
            let sandboxes = sandboxes::list(&client, *all)?;
            if table {
                println!(
                    "{:<32} {:<10} {:<8} {:<10} {:<24} IMAGE",
                    "SANDBOX", "STATUS", "PID", "SNAPSHOTS", "PARENT"
                );
                for s in &sandboxes {
                    println!(
                        "{:<32} {:<10} {:<8} {:<10} {:<24} {}",
                        s["id"].as_str().unwrap_or_default(),
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
            let s = sandboxes::get(&client, id)?;
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
            let (snapshot, pid, pulled) = moves::resume_from(
                &mut client,
                &registry.access(),
                id,
                from.as_deref(),
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
