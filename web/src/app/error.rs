//! What an operation refused or failed with, as the page gets it.

/// An error for the page: its HTTP status and what to do.
#[derive(Debug)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
}

impl ApiError {
    pub fn new(status: u16, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
        }
    }
}

impl From<chalk_client::Error> for ApiError {
    fn from(e: chalk_client::Error) -> Self {
        ApiError::new(500, e.to_string())
    }
}

pub(super) type ApiResult<T> = Result<T, ApiError>;
