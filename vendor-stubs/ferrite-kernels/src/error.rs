//! The single error type of the crate: a message describing why a kernel
//! refused its arguments. Kernels never panic on bad input; they return this.

use std::fmt;

/// Why a kernel refused to run (bad dtype, mismatched shapes, misaligned
/// pointer, ...). Nothing has been written to the output when it is returned.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelError(pub String);

impl KernelError {
    /// Builds an error from a message.
    pub fn new(msg: impl Into<String>) -> Self {
        Self(msg.into())
    }
}

impl fmt::Display for KernelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for KernelError {}

/// Returns early with a formatted [`KernelError`].
macro_rules! bail {
    ($($arg:tt)*) => {
        return Err($crate::error::KernelError(format!($($arg)*)))
    };
}
pub(crate) use bail;
