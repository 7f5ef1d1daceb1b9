//! chalkctl: the whole life of chalk sandboxes over containerd's API, with `ctr`'s conventions
//! (`--address`/`CONTAINERD_ADDRESS`, `--namespace`/`CONTAINERD_NAMESPACE`). This file only
//! dispatches: the commands are in cmd/, their definition in cli.rs, the work in chalk-client.

mod cli;
mod cmd;
mod print;

use std::process::ExitCode;

use chalk_client::{stdio::tty, Result};
use clap::Parser;
use cli::{Cli, Command, Output};
use serde_json::Value;

fn main() -> ExitCode {
    let cli = Cli::parse();
    if matches!(cli.command, Command::Exec { .. } | Command::Attach { .. }) {
        // Before containerd's client starts its threads: the session takes these itself.
        tty::block_session_signals();
    }
    match cmd::session::run(&cli) {
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

/// Runs a command that returns a record: it prints tables itself and returns the JSON form.
fn run(cli: &Cli) -> Result<Value> {
    match &cli.command {
        Command::Snapshot(_) => cmd::snapshot::run(cli, &cli.command),
        Command::Fork { .. } | Command::Tree { .. } => cmd::fork::run(cli, &cli.command),
        Command::Run { .. }
        | Command::Rm { .. }
        | Command::Wait { .. }
        | Command::Expire { .. } => cmd::sandbox::run(cli, &cli.command),
        Command::List { .. } | Command::Get { .. } => cmd::inspect::run(cli, &cli.command),
        Command::Suspend { .. } | Command::Resume { .. } => cmd::suspend::run(cli, &cli.command),
        Command::Keep { .. }
        | Command::ServeLazy
        | Command::Completions { .. }
        | Command::Man
        | Command::Exec { .. }
        | Command::Attach { .. }
        | Command::Logs { .. } => Err("handled by cmd::session".into()),
    }
}
