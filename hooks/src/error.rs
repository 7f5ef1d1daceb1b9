//! What goes wrong running hooks and cuda-checkpoint, with its cause.

use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A hook or an annotation that cannot be used; the message names it and what to change.
    #[error("{0}")]
    Invalid(String),
    /// A file or process operation of the host failed.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// A killed command did not go.
    #[error("a command outlived its kill by {0:?}")]
    Unkillable(Duration),
    /// The shim could not run the command inside the sandbox.
    #[error(transparent)]
    Sandbox(Box<dyn std::error::Error + Send + Sync>),
    /// cuda-checkpoint reports a state the step did not lead to.
    #[error("{0}")]
    Unexpected(String),
    /// The command ran and did not succeed: how it ended and what it printed.
    #[error("{how}: {output}")]
    Unsuccessful { how: String, output: String },
}

impl Error {
    /// An I/O failure of `what`.
    pub fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
        let what = what.into();
        move |source| Error::Io { what, source }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
