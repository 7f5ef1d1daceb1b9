//! The one place errors become ttrpc status codes, so containerd (and `ctr`) can tell
//! "no such process" from "not now" from "bad request" from "runsc failed".

use containerd_shim::protos::ttrpc::{self, Code};

#[derive(Debug, thiserror::Error)]
pub enum ShimError {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    AlreadyExists(String),
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    FailedPrecondition(String),
    #[error("{0}")]
    Unimplemented(String),
    #[error("{0}")]
    Internal(String),
    #[error(transparent)]
    Runtime(#[from] chalk_runtime::Error),
}

pub type Result<T, E = ShimError> = std::result::Result<T, E>;

impl ShimError {
    pub fn code(&self) -> Code {
        use chalk_runtime::Error as R;
        match self {
            ShimError::NotFound(_) => Code::NOT_FOUND,
            ShimError::AlreadyExists(_) => Code::ALREADY_EXISTS,
            ShimError::InvalidArgument(_) => Code::INVALID_ARGUMENT,
            ShimError::FailedPrecondition(_) => Code::FAILED_PRECONDITION,
            ShimError::Unimplemented(_) => Code::UNIMPLEMENTED,
            ShimError::Internal(_) => Code::INTERNAL,
            ShimError::Runtime(e) => match e {
                R::InvalidId { .. } | R::Options { .. } | R::ExecutableNotFound { .. } => {
                    Code::INVALID_ARGUMENT
                }
                R::InvalidState { .. } | R::Snapshot { .. } => Code::FAILED_PRECONDITION,
                R::RunscMissing { .. } | R::RunscBroken { .. } => Code::FAILED_PRECONDITION,
                R::Runsc { .. } | R::Io { .. } | R::Parse { .. } => Code::INTERNAL,
            },
        }
    }

    pub fn internal(what: impl std::fmt::Display, e: impl std::fmt::Display) -> Self {
        ShimError::Internal(format!("{what}: {e}"))
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
    use chalk_runtime::{state::Status, Error as R};

    fn code_of(e: ShimError) -> Code {
        match ttrpc::Error::from(e) {
            ttrpc::Error::RpcStatus(s) => s.code(),
            other => panic!("not a status: {other:?}"),
        }
    }

    #[test]
    fn each_error_maps_to_its_code() {
        assert_eq!(code_of(ShimError::NotFound("x".into())), Code::NOT_FOUND);
        assert_eq!(
            code_of(ShimError::AlreadyExists("x".into())),
            Code::ALREADY_EXISTS
        );
        assert_eq!(
            code_of(ShimError::InvalidArgument("x".into())),
            Code::INVALID_ARGUMENT
        );
        assert_eq!(
            code_of(ShimError::FailedPrecondition("x".into())),
            Code::FAILED_PRECONDITION
        );
        assert_eq!(
            code_of(ShimError::Unimplemented("x".into())),
            Code::UNIMPLEMENTED
        );
        assert_eq!(code_of(ShimError::Internal("x".into())), Code::INTERNAL);
        let invalid = R::InvalidId {
            kind: "container id",
            value: "..".into(),
            reason: "r",
        };
        assert_eq!(code_of(invalid.into()), Code::INVALID_ARGUMENT);
        let state = R::InvalidState {
            op: "start",
            id: "c".into(),
            from: Status::Running,
        };
        assert_eq!(code_of(state.into()), Code::FAILED_PRECONDITION);
        let runsc = R::Runsc {
            op: "start",
            id: "c".into(),
            status: 1,
            message: "boom".into(),
        };
        assert_eq!(code_of(runsc.into()), Code::INTERNAL);
    }

    #[test]
    fn message_survives() {
        let runsc = R::Runsc {
            op: "create",
            id: "c".into(),
            status: 128,
            message: "bad spec".into(),
        };
        match ttrpc::Error::from(ShimError::from(runsc)) {
            ttrpc::Error::RpcStatus(s) => assert!(s.message().contains("bad spec")),
            _ => unreachable!(),
        }
    }
}
