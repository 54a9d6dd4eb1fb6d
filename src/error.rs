//! The plugin's error type: a kind that maps onto `ncclResult_t` plus a message that names the
//! thing that was wrong. The FFI boundary logs the message (WARN) and returns the kind's code.

use std::fmt;

use crate::fabric::FabricError;
use crate::params::ParamError;

/// Which `ncclResult_t` an error becomes (NCCL's plugin README assigns the meanings).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// `ncclSystemError` (2): hardware, network or syscall failures.
    System,
    /// `ncclInternalError` (3): a plugin bug or a protocol violation.
    Internal,
    /// `ncclInvalidArgument` (4): NULL or out-of-range arguments.
    InvalidArgument,
    /// `ncclInvalidUsage` (5): user or configuration errors.
    InvalidUsage,
    /// `ncclRemoteError` (6): the peer or the remote side failed.
    Remote,
}

impl ErrorKind {
    /// The `ncclResult_t` value.
    pub const fn code(self) -> i32 {
        match self {
            ErrorKind::System => 2,
            ErrorKind::Internal => 3,
            ErrorKind::InvalidArgument => 4,
            ErrorKind::InvalidUsage => 5,
            ErrorKind::Remote => 6,
        }
    }
}

/// An error with its NCCL result kind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    /// What NCCL is told.
    pub kind: ErrorKind,
    /// What the log says.
    pub message: String,
}

impl Error {
    /// A new error.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error {
            kind,
            message: message.into(),
        }
    }
    /// `ncclSystemError`.
    pub fn system(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::System, message)
    }
    /// `ncclInternalError`.
    pub fn internal(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Internal, message)
    }
    /// `ncclInvalidArgument`.
    pub fn invalid_argument(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::InvalidArgument, message)
    }
    /// `ncclInvalidUsage`.
    pub fn invalid_usage(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::InvalidUsage, message)
    }
    /// `ncclRemoteError`.
    pub fn remote(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Remote, message)
    }
    /// Prefixes the message with context.
    pub fn context(mut self, context: impl fmt::Display) -> Error {
        self.message = format!("{context}: {}", self.message);
        self
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

impl From<FabricError> for Error {
    fn from(e: FabricError) -> Error {
        Error::system(e.to_string())
    }
}

impl From<ParamError> for Error {
    fn from(e: ParamError) -> Error {
        Error::invalid_usage(e.to_string())
    }
}

/// Result with the plugin's error.
pub type Result<T> = std::result::Result<T, Error>;
