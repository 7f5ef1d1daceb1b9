//! `chalkctl suspend` and `chalkctl resume`: a sandbox released to a snapshot, here or in a
//! registry, and brought back.

use super::prelude::*;

pub fn run(cli: &Cli, command: &Command) -> Result<Value> {
    let (mut client, table, progress) = start(cli)?;
    match command {
        Command::Suspend {
            id,
            to: Some(to),
            release,
            registry,
            seal,
        } => {
            let id = &names::resolve(&client, id)?;
            let access = seal.apply(registry.access());
            let done = moves::suspend_to(&mut client, &access, id, to, *release, &progress)?;
            keeper::wait_ended(&keeping(cli)?.dir(id)?);
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
                                 "encrypted": done.pushed.encrypted,
                                 "signed_with": done.pushed.signed_with,
                                 "transfer": done.pushed.transfer.to_json()},
                      "released": done.released.map(|g| json!({"freed_bytes": g.bytes_freed}))}))
        }
        Command::Suspend { id, .. } => {
            let id = &names::resolve(&client, id)?;
            let snap = snapshot::create(&mut client, id, Vec::new(), true, &progress)?;
            // Released: its stdio keeper ends with the task, before this returns.
            keeper::wait_ended(&keeping(cli)?.dir(id)?);
            progress.step(&format!("{id} suspended in {}", progress.elapsed()));
            if table {
                println!("{}", snap.digest);
            }
            let mut out = snapshots::to_json(&snap);
            out["elapsed_ms"] = progress.elapsed_ms().into();
            Ok(json!({"id": id, "status": "suspended", "snapshot": out}))
        }
        Command::Resume {
            id,
            from,
            whole,
            registry,
        } => {
            let id = &names::resolve(&client, id)?;
            let keep = keeping(cli)?;
            let (snapshot, pid, pulled) = moves::resume_from(
                &mut client,
                &registry.access_lazy(*whole),
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
        _ => unreachable!("main dispatches only this group's commands here"),
    }
}
