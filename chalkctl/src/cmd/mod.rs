//! The commands, one module per group: each parses nothing (clap did), calls chalk-client and
//! prints. [`session`]'s commands end in an exit status or a stream; the others return the
//! record that `--output json` prints.

pub mod fork;
pub mod inspect;
pub mod sandbox;
pub mod session;
pub mod snapshot;
pub mod suspend;

/// What every command module uses.
pub mod prelude {
    pub use std::collections::HashMap;

    pub use chalk_client::{
        containerd::Client,
        ops::{
            attach::{self, Ended},
            exec::{self, ExecOptions},
            expire, fork, fork_running, logs, remove,
            run::{self, RunOptions},
            snapshot, tree,
            wait::{self, Until},
        },
        progress::{self, Progress},
        records::{
            names,
            registry::{Filter, Status},
            sandboxes, snapshots,
        },
        remote::{self, moves, pull, push},
        stdio::{
            keeper::{self, Keeping},
            tty,
        },
        Error, Result,
    };
    pub use serde_json::{json, Value};

    pub use super::{connect, keeping, start};
    pub use crate::{
        cli::{Cli, Command, Output, SnapshotCommand, UntilArg},
        print::{plain, print_record},
    };
}

use prelude::*;

pub fn connect(cli: &Cli) -> Result<Client> {
    let mut client = Client::connect(&cli.address, &cli.namespace)?;
    if let Some(path) = cli.config.as_ref().filter(|p| !p.as_os_str().is_empty()) {
        client.set_config(path.clone());
    }
    Ok(client)
}

/// How chalkctl starts stdio keepers.
pub fn keeping(cli: &Cli) -> Result<Keeping> {
    let exe =
        std::env::current_exe().map_err(|e| Error::from(format!("find chalkctl itself: {e}")))?;
    Ok(Keeping {
        exe,
        address: cli.address.clone(),
        namespace: cli.namespace.clone(),
        root: cli.state_dir.clone(),
    })
}

/// What a record command starts with: a client, whether to print tables, its progress lines.
pub fn start(cli: &Cli) -> Result<(Client, bool, Progress)> {
    let client = connect(cli)?;
    let table = cli.output == Output::Table;
    Ok((client, table, Progress::new(table)))
}
