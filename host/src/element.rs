//! Rust element types that map to ABI dtypes, for moving data between host
//! slices and device tensors.

use half::{bf16, f16};
use polychip_plugin_sdk::DType;

/// A Rust type stored in a tensor of dtype [`Element::DTYPE`].
pub trait Element: Copy + Send + Sync + 'static {
    /// The ABI dtype.
    const DTYPE: DType;
    /// Appends the native-endian bytes of `data` to `out`.
    fn extend_bytes(data: &[Self], out: &mut Vec<u8>);
    /// Decodes native-endian bytes (`bytes.len()` is a multiple of the size).
    fn from_bytes(bytes: &[u8]) -> Vec<Self>;
}

macro_rules! numeric_element {
    ($($ty:ty => $dtype:ident),* $(,)?) => {$(
        impl Element for $ty {
            const DTYPE: DType = DType::$dtype;
            fn extend_bytes(data: &[Self], out: &mut Vec<u8>) {
                out.reserve(data.len() * size_of::<$ty>());
                for x in data {
                    out.extend_from_slice(&x.to_ne_bytes());
                }
            }
            fn from_bytes(bytes: &[u8]) -> Vec<Self> {
                bytes
                    .chunks_exact(size_of::<$ty>())
                    .map(|c| <$ty>::from_ne_bytes(c.try_into().expect("chunk size")))
                    .collect()
            }
        }
    )*};
}

numeric_element!(f32 => F32, f64 => F64, f16 => F16, bf16 => BF16, i32 => I32, i64 => I64, u8 => U8);

impl Element for bool {
    const DTYPE: DType = DType::Bool;
    fn extend_bytes(data: &[Self], out: &mut Vec<u8>) {
        out.extend(data.iter().map(|&b| u8::from(b)));
    }
    fn from_bytes(bytes: &[u8]) -> Vec<Self> {
        bytes.iter().map(|&b| b != 0).collect()
    }
}
