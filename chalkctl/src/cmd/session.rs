//! The commands whose outcome is an exit status or a stream rather than a record: `exec`,
//! `attach`, `logs`, `keep`, `completions` and `man`.

use super::prelude::*;
use clap::CommandFactory;

/// The commands whose outcome is an exit status or a stream rather than a record: their exit
/// code (None for the other commands).
pub fn run(cli: &Cli) -> Result<Option<u8>> {
    let code = |status: u32| u8::try_from(status).unwrap_or(255);
    match &cli.command {
        Command::ServeLazy => {
            chalk_client::remote::lazy::serve::main()?;
            Ok(Some(0))
        }
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
