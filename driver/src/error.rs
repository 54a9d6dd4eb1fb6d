//! The driver's error: every failure names the ABI version and the call or request involved.

use std::fmt;

use crate::abi::{result_name, NcclResult};
use crate::Version;

/// Anything that went wrong while driving the plugin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    /// `dlopen` or `dlsym` failed, or the built library was not found.
    Load(String),
    /// A plugin call returned a non-zero `ncclResult_t`.
    Nccl {
        /// ABI version driven.
        version: Version,
        /// The table slot called (`"isend"`, …).
        call: &'static str,
        /// The `ncclResult_t`.
        code: NcclResult,
        /// What the driver was doing.
        detail: String,
    },
    /// A required table slot is NULL.
    NullSlot {
        /// ABI version driven.
        version: Version,
        /// The slot.
        slot: &'static str,
    },
    /// Something did not finish before its deadline.
    Timeout(String),
    /// Bytes or sizes differ from what was sent.
    Mismatch(String),
    /// The driver refused the call before reaching the plugin (NCCL would refuse it too).
    Refused(String),
    /// The plugin broke the calling contract (e.g. a NULL listen comm after success).
    Contract(String),
    /// I/O around the test agent or a child process.
    Io(String),
}

impl Error {
    /// The `ncclResult_t` when the plugin returned one.
    pub fn code(&self) -> Option<NcclResult> {
        match self {
            Error::Nccl { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// Adds context to an error message (keeps the kind and code).
    pub fn context(self, what: impl fmt::Display) -> Error {
        match self {
            Error::Nccl {
                version,
                call,
                code,
                detail,
            } => {
                let detail = if detail.is_empty() {
                    what.to_string()
                } else {
                    format!("{what}: {detail}")
                };
                Error::Nccl {
                    version,
                    call,
                    code,
                    detail,
                }
            }
            Error::Load(m) => Error::Load(format!("{what}: {m}")),
            Error::Timeout(m) => Error::Timeout(format!("{what}: {m}")),
            Error::Mismatch(m) => Error::Mismatch(format!("{what}: {m}")),
            Error::Refused(m) => Error::Refused(format!("{what}: {m}")),
            Error::Contract(m) => Error::Contract(format!("{what}: {m}")),
            Error::Io(m) => Error::Io(format!("{what}: {m}")),
            other @ Error::NullSlot { .. } => other,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Load(m) => write!(f, "load: {m}"),
            Error::Nccl {
                version,
                call,
                code,
                detail,
            } => {
                write!(
                    f,
                    "{version} {call} returned {} ({code})",
                    result_name(*code)
                )?;
                if !detail.is_empty() {
                    write!(f, " [{detail}]")?;
                }
                Ok(())
            }
            Error::NullSlot { version, slot } => write!(f, "{version} table: `{slot}` is NULL"),
            Error::Timeout(m) => write!(f, "timeout: {m}"),
            Error::Mismatch(m) => write!(f, "mismatch: {m}"),
            Error::Refused(m) => write!(f, "refused by the driver: {m}"),
            Error::Contract(m) => write!(f, "contract violation: {m}"),
            Error::Io(m) => write!(f, "io: {m}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Error {
        Error::Io(e.to_string())
    }
}

/// The driver's result.
pub type Result<T> = std::result::Result<T, Error>;
