//! Error codes as a Rust enum, and the error type a Rust plugin returns.

use std::fmt;

use crate::abi::{self, PolychipErrorCode};
use crate::check::ArgError;

/// The closed set of ABI error codes. The numbers are fixed forever.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// See [`abi::POLYCHIP_ERROR_INVALID_ARGUMENT`].
    InvalidArgument,
    /// See [`abi::POLYCHIP_ERROR_OUT_OF_MEMORY`].
    OutOfMemory,
    /// See [`abi::POLYCHIP_ERROR_UNIMPLEMENTED`].
    Unimplemented,
    /// See [`abi::POLYCHIP_ERROR_INTERNAL`]; also every code a reader does not know.
    Internal,
    /// See [`abi::POLYCHIP_ERROR_VERSION_MISMATCH`].
    VersionMismatch,
    /// See [`abi::POLYCHIP_ERROR_SHAPE_MISMATCH`].
    ShapeMismatch,
    /// See [`abi::POLYCHIP_ERROR_DTYPE_MISMATCH`].
    DTypeMismatch,
    /// See [`abi::POLYCHIP_ERROR_DEVICE_LOST`].
    DeviceLost,
    /// See [`abi::POLYCHIP_ERROR_PANIC`].
    Panic,
}

impl ErrorCode {
    /// The ABI number.
    pub const fn to_raw(self) -> PolychipErrorCode {
        match self {
            ErrorCode::InvalidArgument => abi::POLYCHIP_ERROR_INVALID_ARGUMENT,
            ErrorCode::OutOfMemory => abi::POLYCHIP_ERROR_OUT_OF_MEMORY,
            ErrorCode::Unimplemented => abi::POLYCHIP_ERROR_UNIMPLEMENTED,
            ErrorCode::Internal => abi::POLYCHIP_ERROR_INTERNAL,
            ErrorCode::VersionMismatch => abi::POLYCHIP_ERROR_VERSION_MISMATCH,
            ErrorCode::ShapeMismatch => abi::POLYCHIP_ERROR_SHAPE_MISMATCH,
            ErrorCode::DTypeMismatch => abi::POLYCHIP_ERROR_DTYPE_MISMATCH,
            ErrorCode::DeviceLost => abi::POLYCHIP_ERROR_DEVICE_LOST,
            ErrorCode::Panic => abi::POLYCHIP_ERROR_PANIC,
        }
    }

    /// Decodes an ABI number; unknown numbers (from a newer peer) are `Internal`.
    pub const fn from_raw(raw: PolychipErrorCode) -> ErrorCode {
        match raw {
            abi::POLYCHIP_ERROR_INVALID_ARGUMENT => ErrorCode::InvalidArgument,
            abi::POLYCHIP_ERROR_OUT_OF_MEMORY => ErrorCode::OutOfMemory,
            abi::POLYCHIP_ERROR_UNIMPLEMENTED => ErrorCode::Unimplemented,
            abi::POLYCHIP_ERROR_VERSION_MISMATCH => ErrorCode::VersionMismatch,
            abi::POLYCHIP_ERROR_SHAPE_MISMATCH => ErrorCode::ShapeMismatch,
            abi::POLYCHIP_ERROR_DTYPE_MISMATCH => ErrorCode::DTypeMismatch,
            abi::POLYCHIP_ERROR_DEVICE_LOST => ErrorCode::DeviceLost,
            abi::POLYCHIP_ERROR_PANIC => ErrorCode::Panic,
            _ => ErrorCode::Internal,
        }
    }

    /// A short lowercase name for messages.
    pub const fn name(self) -> &'static str {
        match self {
            ErrorCode::InvalidArgument => "invalid argument",
            ErrorCode::OutOfMemory => "out of memory",
            ErrorCode::Unimplemented => "unimplemented",
            ErrorCode::Internal => "internal error",
            ErrorCode::VersionMismatch => "version mismatch",
            ErrorCode::ShapeMismatch => "shape mismatch",
            ErrorCode::DTypeMismatch => "dtype mismatch",
            ErrorCode::DeviceLost => "device lost",
            ErrorCode::Panic => "panic",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An error a Rust plugin returns; the SDK turns it into an ABI error object.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    /// The ABI code.
    pub code: ErrorCode,
    /// A sentence naming what is wrong.
    pub message: String,
}

impl Error {
    /// An error with a code and a message.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Error {
        Error {
            code,
            message: message.into(),
        }
    }

    /// `InvalidArgument`.
    pub fn invalid(message: impl Into<String>) -> Error {
        Error::new(ErrorCode::InvalidArgument, message)
    }

    /// `Unimplemented`.
    pub fn unimplemented(message: impl Into<String>) -> Error {
        Error::new(ErrorCode::Unimplemented, message)
    }

    /// `OutOfMemory`.
    pub fn out_of_memory(message: impl Into<String>) -> Error {
        Error::new(ErrorCode::OutOfMemory, message)
    }

    /// `Internal`.
    pub fn internal(message: impl Into<String>) -> Error {
        Error::new(ErrorCode::Internal, message)
    }
}

impl From<ArgError> for Error {
    fn from(e: ArgError) -> Error {
        Error::new(e.code(), e.to_string())
    }
}

/// The result type of every [`crate::Plugin`] method.
pub type Result<T, E = Error> = std::result::Result<T, E>;
