//! chalkctl's errors: containerd's answers kept with the call they answer, and chalkctl's own
//! refusals, which say what to do instead.

use containerd_client::tonic::{self, Code};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{what}: not found")]
    NotFound { what: String },
    /// containerd refused or failed a call.
    #[error("{what}: {}", .status.message())]
    Containerd {
        what: String,
        #[source]
        status: tonic::Status,
    },
    #[error(
        "cannot reach containerd at {socket}: {source} (is it running? set --address or \
         CONTAINERD_ADDRESS)"
    )]
    Unreachable {
        socket: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("invalid {what}: {why}")]
    Invalid { what: &'static str, why: String },
    /// What chalkctl will not do, and why.
    #[error("{0}")]
    Refused(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// containerd's answer `status` to the call described by `what`.
    pub fn containerd(what: impl Into<String>, status: tonic::Status) -> Self {
        let what = what.into();
        match status.code() {
            Code::NotFound => Error::NotFound { what },
            _ => Error::Containerd { what, status },
        }
    }

    pub fn parse(what: &'static str, why: impl std::fmt::Display) -> Self {
        Error::Invalid {
            what,
            why: why.to_string(),
        }
    }

    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::NotFound { .. })
    }

    pub fn is_already_exists(&self) -> bool {
        matches!(self, Error::Containerd { status, .. } if status.code() == Code::AlreadyExists)
    }
}

impl From<String> for Error {
    fn from(s: String) -> Self {
        Error::Refused(s)
    }
}

impl From<&str> for Error {
    fn from(s: &str) -> Self {
        Error::Refused(s.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn containerds_not_found_reads_as_not_found() {
        let e = Error::containerd("sandbox web", tonic::Status::not_found("no such container"));
        assert!(e.is_not_found());
        assert_eq!(e.to_string(), "sandbox web: not found");
        let e = Error::containerd("create image x", tonic::Status::already_exists("exists"));
        assert_eq!(e.to_string(), "create image x: exists");
        assert!(
            std::error::Error::source(&e).is_some(),
            "the status is kept"
        );
    }
}
