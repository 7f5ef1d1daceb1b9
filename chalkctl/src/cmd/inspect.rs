//! `chalkctl list` and `chalkctl get`: the sandboxes of this runtime and one in full.

use super::prelude::*;

pub fn run(cli: &Cli, command: &Command) -> Result<Value> {
    let (client, table, _) = start(cli)?;
    match command {
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
        _ => unreachable!("main dispatches only this group's commands here"),
    }
}
