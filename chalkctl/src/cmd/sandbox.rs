//! `chalkctl run`, `rm`, `wait` and `expire`: a sandbox made, removed, waited on, expired.

use super::prelude::*;

pub fn run(cli: &Cli, command: &Command) -> Result<Value> {
    let (mut client, table, progress) = start(cli)?;
    match command {
        Command::Expire { id, action } => {
            let outcome = expire::expire(&mut client, id, action, &progress)?;
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
            net,
            publish,
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
            let mut labels = HashMap::from([(
                chalk_labels::STDIO_LABEL.to_string(),
                "chalkctl".to_string(),
            )]);
            if let Some(n) = &name.name {
                labels.insert(chalk_labels::NAME_LABEL.to_string(), n.clone());
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
                network: net.clone(),
                ports: publish.clone(),
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
            let labels = client.container(id).map(|c| c.labels).unwrap_or_default();
            let address = labels.get(chalk_labels::ADDRESS_LABEL).cloned();
            let no_network = labels.get(chalk_labels::NO_NETWORK_LABEL).cloned();
            if table {
                let at = address
                    .as_ref()
                    .map(|a| format!(" at {a}"))
                    .unwrap_or_default();
                println!("{id} running (pid {pid}){at} in {}", progress.elapsed());
                if let Some(why) = &no_network {
                    eprintln!("chalkctl: {id} has loopback only: {why}");
                }
            }
            Ok(
                json!({"id": id, "status": "running", "pid": pid, "address": address,
                      "no_network_because": no_network,
                      "elapsed_ms": progress.elapsed_ms()}),
            )
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
            let status = wait::wait(&client, id, until, *timeout)?;
            let why = status
                .and_then(|_| client.container(id).ok())
                .and_then(|c| c.labels.get(chalk_labels::ENDED_BECAUSE).cloned());
            if table {
                match status {
                    Some(s) => println!("{s}"),
                    None => println!("{id} running"),
                }
                if let Some(why) = &why {
                    eprintln!("chalkctl: {id} was ended by chalk-shim: {why}");
                }
            }
            Ok(json!({"id": id, "exit_status": status, "ended_because": why}))
        }
        _ => unreachable!("main dispatches only this group's commands here"),
    }
}
