//! `chalkctl fork` and `chalkctl tree`: new sandboxes from a snapshot, and the fork tree.

use super::prelude::*;

pub fn run(cli: &Cli, command: &Command) -> Result<Value> {
    let (mut client, table, progress) = start(cli)?;
    match command {
        Command::Fork {
            snapshot_id,
            id,
            snapshot,
            whole,
            registry,
            fork_id,
            count,
            keep_snapshot,
            force,
            lifetime,
            name,
            publish,
        } => {
            if !publish.is_empty() && *count > 1 {
                return Err(format!(
                    "-p publishes a host port, which only one of the {count} forks could \
                     have: fork one at a time to publish"
                )
                .into());
            }
            let opts = fork::ForkOptions {
                ports: publish.clone(),
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
                    pull::pull(
                        &mut client,
                        &registry.access_lazy(*whole),
                        reference,
                        &progress,
                    )?
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
                (None, Some(source)) if !keep_snapshot => {
                    // Forked from runsc's files as soon as they are written, never sealed.
                    let forks = fork_running::fork_running(
                        &mut client,
                        source,
                        fork_id.as_deref(),
                        *count,
                        &opts,
                        &progress,
                    )?;
                    (forks, Some((None, false)))
                }
                (None, Some(source)) => {
                    // The forks start from runsc's files while the snapshot is sealed.
                    let (forks, snap) = fork_running::fork_running_keeping(
                        &mut client,
                        source,
                        fork_id.as_deref(),
                        *count,
                        &opts,
                        &progress,
                    )?;
                    (forks, Some((Some(snap.digest), true)))
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
        _ => unreachable!("main dispatches only this group's commands here"),
    }
}
