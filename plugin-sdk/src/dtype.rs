//! The element types of ABI v1 as a Rust enum, with their DLPack encoding.

use std::fmt;

use crate::abi::{
    POLYCHIP_DTYPE_CODE_BFLOAT, POLYCHIP_DTYPE_CODE_BOOL, POLYCHIP_DTYPE_CODE_FLOAT,
    POLYCHIP_DTYPE_CODE_INT, POLYCHIP_DTYPE_CODE_UINT, PolychipDataType,
};

/// An element type supported by ABI v1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// IEEE binary16.
    F16,
    /// bfloat16: binary32's exponent with a 7-bit mantissa.
    BF16,
    /// IEEE binary64.
    F64,
    /// Two's-complement 32-bit integer.
    I32,
    /// Two's-complement 64-bit integer.
    I64,
    /// Unsigned byte.
    U8,
    /// One byte holding 0 or 1.
    Bool,
}

impl DType {
    /// Every dtype, in a fixed order.
    pub const ALL: [DType; 8] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::F64,
        DType::I32,
        DType::I64,
        DType::U8,
        DType::Bool,
    ];
    /// The floating dtypes, which every floating operator accepts.
    pub const FLOATS: [DType; 4] = [DType::F32, DType::F16, DType::BF16, DType::F64];

    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::F64 | DType::I64 => 8,
            DType::U8 | DType::Bool => 1,
        }
    }

    /// Whether this is a floating-point type.
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16 | DType::F64)
    }

    /// The short lowercase name used in messages and on the command line.
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F64 => "f64",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::U8 => "u8",
            DType::Bool => "bool",
        }
    }

    /// Parses a name as printed by [`DType::name`].
    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == name)
    }

    /// The DLPack encoding.
    pub const fn to_raw(self) -> PolychipDataType {
        let (code, bits) = match self {
            DType::F32 => (POLYCHIP_DTYPE_CODE_FLOAT, 32),
            DType::F16 => (POLYCHIP_DTYPE_CODE_FLOAT, 16),
            DType::BF16 => (POLYCHIP_DTYPE_CODE_BFLOAT, 16),
            DType::F64 => (POLYCHIP_DTYPE_CODE_FLOAT, 64),
            DType::I32 => (POLYCHIP_DTYPE_CODE_INT, 32),
            DType::I64 => (POLYCHIP_DTYPE_CODE_INT, 64),
            DType::U8 => (POLYCHIP_DTYPE_CODE_UINT, 8),
            DType::Bool => (POLYCHIP_DTYPE_CODE_BOOL, 8),
        };
        PolychipDataType {
            code,
            bits,
            lanes: 1,
        }
    }

    /// Decodes a DLPack data type; `None` for one ABI v1 does not support.
    pub const fn from_raw(raw: PolychipDataType) -> Option<DType> {
        if raw.lanes != 1 {
            return None;
        }
        match (raw.code, raw.bits) {
            (POLYCHIP_DTYPE_CODE_FLOAT, 32) => Some(DType::F32),
            (POLYCHIP_DTYPE_CODE_FLOAT, 16) => Some(DType::F16),
            (POLYCHIP_DTYPE_CODE_BFLOAT, 16) => Some(DType::BF16),
            (POLYCHIP_DTYPE_CODE_FLOAT, 64) => Some(DType::F64),
            (POLYCHIP_DTYPE_CODE_INT, 32) => Some(DType::I32),
            (POLYCHIP_DTYPE_CODE_INT, 64) => Some(DType::I64),
            (POLYCHIP_DTYPE_CODE_UINT, 8) => Some(DType::U8),
            (POLYCHIP_DTYPE_CODE_BOOL, 8) => Some(DType::Bool),
            _ => None,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_encoding_round_trips_and_sizes_match_bits() {
        for d in DType::ALL {
            assert_eq!(DType::from_raw(d.to_raw()), Some(d));
            assert_eq!(usize::from(d.to_raw().bits) / 8, d.size());
            assert_eq!(DType::from_name(d.name()), Some(d));
        }
        let vector = PolychipDataType {
            code: POLYCHIP_DTYPE_CODE_FLOAT,
            bits: 32,
            lanes: 4,
        };
        assert_eq!(DType::from_raw(vector), None);
    }
}
