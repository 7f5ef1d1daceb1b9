//! The shim's one error type, and the one place errors become ttrpc status codes, so
//! containerd (and `ctr`) can tell "no such process" from "not now" from "bad request" from
//! "runsc failed". Causes are kept as sources, and in the message.

use containerd_shim::protos::ttrpc::{self, Code};

type Cause = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, thiserror::Error)]
pub enum ShimError {
    #[error("container {0} not found")]
    NoContainer(String),
    #[error("exec {exec} not found in {id}")]
    NoExec { id: String, exec: String },
    #[error("process {process} of {id} already finished")]
    Finished { id: String, process: String },
    #[error("{0}")]
    AlreadyExists(String),
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    FailedPrecondition(String),
    /// A bound was reached (named in the message).
    #[error("{0}")]
    ResourceExhausted(String),
    #[error("{0}")]
    Internal(String),
    /// Something the shim did failed: what, and why.
    #[error("{what}: {source}")]
    Failed {
        what: String,
        #[source]
        source: Cause,
    },
    #[error(transparent)]
    Runtime(#[from] chalk_runtime::Error),
    #[error("asking containerd: {0}")]
    Containerd(#[from] chalk_client::Error),
}

pub type Result<T, E = ShimError> = std::result::Result<T, E>;

impl ShimError {
    pub fn code(&self) -> Code {
        use chalk_runtime::Error as R;
        match self {
            ShimError::NoContainer(_) | ShimError::NoExec { .. } | ShimError::Finished { .. } => {
                Code::NOT_FOUND
            }
            ShimError::AlreadyExists(_) => Code::ALREADY_EXISTS,
            ShimError::InvalidArgument(_) => Code::INVALID_ARGUMENT,
            ShimError::FailedPrecondition(_) => Code::FAILED_PRECONDITION,
            ShimError::ResourceExhausted(_) => Code::RESOURCE_EXHAUSTED,
            ShimError::Internal(_) | ShimError::Failed { .. } => Code::INTERNAL,
            ShimError::Containerd(e) if e.is_not_found() => Code::NOT_FOUND,
            ShimError::Containerd(_) => Code::UNAVAILABLE,
            ShimError::Runtime(e) => match e {
                R::InvalidId { .. } | R::Options { .. } | R::ExecutableNotFound { .. } => {
                    Code::INVALID_ARGUMENT
                }
                R::InvalidState { .. } | R::Snapshot { .. } | R::Store { .. } => {
                    Code::FAILED_PRECONDITION
                }
                R::RunscMissing { .. } | R::RunscBroken { .. } => Code::FAILED_PRECONDITION,
                R::Runsc { .. } | R::Io { .. } | R::Parse { .. } => Code::INTERNAL,
            },
        }
    }

    /// `what` failed because of `cause`.
    pub fn failed(what: impl std::fmt::Display, cause: impl Into<Cause>) -> Self {
        ShimError::Failed {
            what: what.to_string(),
            source: cause.into(),
        }
    }

    pub fn no_exec(id: &str, exec: &str) -> Self {
        ShimError::NoExec {
            id: id.to_string(),
            exec: exec.to_string(),
        }
    }
}

impl From<ShimError> for ttrpc::Error {
    fn from(e: ShimError) -> Self {
        ttrpc::Error::RpcStatus(ttrpc::get_status(e.code(), e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_maps_to_its_code() {
        let cases: Vec<(ShimError, Code)> = vec![
            (ShimError::NoContainer("c".into()), Code::NOT_FOUND),
            (ShimError::no_exec("c", "e"), Code::NOT_FOUND),
            (
                ShimError::Finished {
                    id: "c".into(),
                    process: "init".into(),
                },
                Code::NOT_FOUND,
            ),
            (ShimError::AlreadyExists("x".into()), Code::ALREADY_EXISTS),
            (
                ShimError::InvalidArgument("x".into()),
                Code::INVALID_ARGUMENT,
            ),
            (
                ShimError::FailedPrecondition("x".into()),
                Code::FAILED_PRECONDITION,
            ),
            (ShimError::Internal("x".into()), Code::INTERNAL),
            (
                chalk_runtime::Error::Runsc {
                    op: "start",
                    id: "c".into(),
                    status: 1,
                    message: "boom".into(),
                }
                .into(),
                Code::INTERNAL,
            ),
            (
                chalk_runtime::Error::InvalidId {
                    kind: "container id",
                    value: "..".into(),
                    reason: "bad",
                }
                .into(),
                Code::INVALID_ARGUMENT,
            ),
            (
                chalk_client::Error::NotFound {
                    what: "image x".into(),
                }
                .into(),
                Code::NOT_FOUND,
            ),
        ];
        for (e, code) in cases {
            assert_eq!(e.code(), code, "{e}");
        }
    }

    #[test]
    fn a_failure_keeps_its_cause() {
        let e = ShimError::failed(
            "write /b/x",
            std::io::Error::from(std::io::ErrorKind::PermissionDenied),
        );
        assert!(e.to_string().starts_with("write /b/x: "), "{e}");
        assert!(std::error::Error::source(&e).is_some());
        let status: ttrpc::Error = ShimError::no_exec("c1", "e1").into();
        match status {
            ttrpc::Error::RpcStatus(s) => {
                assert_eq!(s.code(), Code::NOT_FOUND);
                assert_eq!(s.message(), "exec e1 not found in c1");
            }
            other => panic!("{other:?}"),
        }
    }
}
