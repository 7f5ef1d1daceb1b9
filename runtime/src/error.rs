use std::path::PathBuf;

/// Errors of the runtime library. Each says what failed and, where it helps, what to do.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid {kind} {value:?}: {reason}")]
    InvalidId {
        kind: &'static str,
        value: String,
        reason: &'static str,
    },

    #[error("runtime options {source_name}: {message}")]
    Options {
        source_name: String,
        message: String,
    },

    #[error("runsc {op} {id}: exited with status {status}: {message}")]
    Runsc {
        op: &'static str,
        id: String,
        status: i32,
        message: String,
    },

    #[error("cannot run runsc binary {binary:?}: {source} (install gVisor's runsc or set binary_name in the runtime options)")]
    RunscMissing {
        binary: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("runsc binary {binary:?} does not work: `{args}` exited with status {status}: {output} (check binary_name in the runtime options)")]
    RunscBroken {
        binary: PathBuf,
        args: String,
        status: i32,
        output: String,
    },

    #[error("cannot {op} process {id}: it is {from}")]
    InvalidState {
        op: &'static str,
        id: String,
        from: crate::state::Status,
    },

    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },

    #[error("executable {name:?} not found in the container's root filesystem{searched}: fix the process args or the image")]
    ExecutableNotFound { name: String, searched: String },

    #[error("snapshot {dir:?}: {message}")]
    Snapshot { dir: PathBuf, message: String },

    #[error("snapshot store {root:?}: {message}")]
    Store { root: PathBuf, message: String },

    #[error("cannot parse {what}: {message}")]
    Parse { what: String, message: String },
}

impl Error {
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            what: what.into(),
            source,
        }
    }

    pub fn parse(what: impl Into<String>, message: impl ToString) -> Self {
        Error::Parse {
            what: what.into(),
            message: message.to_string(),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
