//! What a fork may change of its source: shared by the snapshot's parts (which carry it to
//! each fork) and the fork operations.

use crate::stdio::keeper::Keeping;

/// What a fork may change of its source (the rest it inherits).
#[derive(Default, Clone)]
pub struct ForkOptions {
    /// A lifetime of its own instead of the source's (`chalk.io/lifetime`).
    pub lifetime: Option<String>,
    /// What happens when it ends (`chalk.io/on-timeout`).
    pub on_timeout: Option<String>,
    /// Fork even where the host's available memory looks too small for every copy.
    pub force: bool,
    /// The forks' name (numbered when there are several).
    pub name: Option<String>,
    /// Each fork's stdio kept by a keeper of its own (chalkctl's command line); else a fork
    /// has none unless its caller gives it some (`fork_to`).
    pub keep: Option<Keeping>,
    /// Ports the fork publishes, as `-p` takes them: its source's belong to the source and
    /// are never inherited.
    pub ports: Vec<String>,
}
