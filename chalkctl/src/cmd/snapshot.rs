//! `chalkctl snapshot ...`: create (now or in the background), finish, wait, get, list,
//! push, pull, delete and gc.

use super::prelude::*;

pub fn run(cli: &Cli, command: &Command) -> Result<Value> {
    if let Some(done) = without_containerd(cli, command) {
        return done;
    }
    let (mut client, table, progress) = start(cli)?;
    match command {
        Command::Snapshot(SnapshotCommand::Create {
            id,
            labels,
            no_wait: true,
            name,
        }) => {
            let id = &names::resolve(&client, id)?;
            let begun = snapshot::begin_named(
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
            let begun = snapshot::pending(&client, name)?;
            let snap = snapshot::finish(&mut client, begun, false, &Progress::quiet())?;
            Ok(snapshots::to_json(&snap))
        }
        Command::Snapshot(SnapshotCommand::Create {
            id, labels, name, ..
        }) => {
            let id = &names::resolve(&client, id)?;
            let snap = snapshot::create_named(
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
            let snap = snapshot::wait(&client, snapshot_id, *timeout)?;
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
        Command::Snapshot(SnapshotCommand::Push {
            snapshot_id,
            reference,
            registry,
            seal,
        }) => {
            let pushed = push::push(
                &client,
                &seal.apply(registry.access()),
                snapshot_id,
                reference,
                &progress,
            )?;
            if table {
                println!("{}", pushed.reference);
            }
            Ok(json!({"id": pushed.id, "reference": pushed.reference,
                      "encrypted": pushed.encrypted, "signed_with": pushed.signed_with,
                      "transfer": pushed.transfer.to_json(),
                      "elapsed_ms": progress.elapsed_ms()}))
        }
        Command::Snapshot(SnapshotCommand::Pull {
            reference,
            lazy,
            pulled_for,
            timeout,
            registry,
        }) => {
            let access = if *lazy {
                registry.access_lazy(false)
            } else {
                registry.access()
            };
            let access = remote::Access {
                pulled_for: pulled_for.clone(),
                deadline: timeout
                    .map(|s| std::time::Instant::now() + std::time::Duration::from_secs(s)),
                ..access
            };
            let pulled = pull::pull(&mut client, &access, reference, &progress)?;
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
                    progress::megabytes(gc.bytes_freed)
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
                    progress::megabytes(gc.bytes_freed),
                    progress::megabytes(store.usage())
                );
            }
            Ok(
                json!({"blobs_removed": gc.blobs_removed, "stale_dirs": gc.stale_dirs,
                      "freed_bytes": gc.bytes_freed, "store_bytes": store.usage(),
                      "store": store.root()}),
            )
        }
        _ => unreachable!("main dispatches only this group's commands here"),
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

fn keygen(table: bool, out: &std::path::Path, signing: bool) -> Result<Value> {
    if signing {
        let public = remote::sign::generate(out)?;
        if table {
            println!("{}", public.display());
        }
        return Ok(json!({"key": out, "public_key": public}));
    }
    let recipient = remote::crypt::generate(out)?;
    if table {
        println!("{recipient}");
    }
    Ok(json!({"key": out, "recipient": recipient}))
}

/// Keys, signatures and verdicts: commands that need no containerd.
fn without_containerd(cli: &Cli, command: &Command) -> Option<Result<Value>> {
    match command {
        Command::Snapshot(
            c @ (SnapshotCommand::Keygen { .. }
            | SnapshotCommand::Sign { .. }
            | SnapshotCommand::Verify { .. }),
        ) => Some(keys_and_signatures(cli, c)),
        _ => None,
    }
}

fn keys_and_signatures(cli: &Cli, command: &SnapshotCommand) -> Result<Value> {
    let table = cli.output == Output::Table;
    let progress = Progress::new(table);
    match command {
        SnapshotCommand::Keygen { out, signing } => keygen(table, out, *signing),
        SnapshotCommand::Sign {
            reference,
            key,
            registry,
        } => {
            let digest = remote::trust::sign_reference(&registry.access(), reference, key)?;
            progress.step(&format!(
                "signed {reference} ({digest}) with {}",
                key.display()
            ));
            if table {
                println!("{digest}");
            }
            Ok(json!({"reference": reference, "digest": digest, "signed_with": key}))
        }
        SnapshotCommand::Verify {
            reference,
            key,
            registry,
        } if key.is_empty() => {
            let policy = options(cli)?.trust_policy();
            let (digest, verdict) =
                remote::trust::judge_reference(&registry.access(), &policy, reference)?;
            let verdict = verdict.unwrap_or_else(|| "no policy applies: allowed".to_string());
            if table {
                println!("{reference} ({digest}): {verdict}");
            }
            Ok(json!({"reference": reference, "digest": digest, "verdict": verdict}))
        }
        SnapshotCommand::Verify {
            reference,
            key,
            registry,
        } => {
            let v = remote::trust::verify_reference(&registry.access(), reference, key)?;
            let Some(by) = &v.signed_by else {
                let why = if v.signatures == 0 {
                    "it has no signature".to_string()
                } else {
                    v.problems.join("; ")
                };
                return Err(format!("{reference} ({}) is not verified: {why}", v.digest).into());
            };
            if table {
                println!("{reference} ({}): signed by {}", v.digest, by.display());
            }
            Ok(
                json!({"reference": reference, "digest": v.digest, "signed_by": by,
                      "signatures": v.signatures}),
            )
        }
        _ => unreachable!("only key and signature commands come here"),
    }
}

/// The runtime options chalkctl reads (`--config`, else the shim's default).
fn options(cli: &Cli) -> Result<chalk_runtime::options::RuntimeOptions> {
    use chalk_runtime::options::RuntimeOptions;
    match cli.config.as_ref().filter(|p| !p.as_os_str().is_empty()) {
        Some(path) => RuntimeOptions::load(path),
        None => RuntimeOptions::load_default(),
    }
    .map_err(|e| Error::from(e.to_string()))
}
