//! Element types understood by the kernels, their sizes, and which of them
//! are floating point (the only ones arithmetic kernels accept).

/// The element type of a [`View`](crate::View).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// IEEE binary16.
    F16,
    /// bfloat16 (the top half of a binary32).
    BF16,
    /// IEEE binary64.
    F64,
    /// Signed 32-bit integer.
    I32,
    /// Signed 64-bit integer.
    I64,
    /// Unsigned byte.
    U8,
    /// One byte holding 0 or 1.
    Bool,
}

impl DType {
    /// Size of one element in bytes (also its alignment).
    pub fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::F64 | DType::I64 => 8,
            DType::U8 | DType::Bool => 1,
        }
    }

    /// Whether the type is one of the floating-point types
    /// (`F32`, `F16`, `BF16`, `F64`).
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16 | DType::F64)
    }
}
