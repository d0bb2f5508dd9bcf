//! Tolerance helpers for the ABI 1.1 tests: the subnormal spacing of a
//! dtype, whole-tensor closeness, and value extraction.

use super::{Tensor, assert_close};
use ferrite_kernels::DType;

/// Spacing of the subnormals of a float dtype (absolute rounding floor).
pub fn tiny(dt: DType) -> f64 {
    match dt {
        DType::F16 => 2f64.powi(-24),
        DType::BF16 => 2f64.powi(-133),
        DType::F32 => 2f64.powi(-149),
        _ => 2f64.powi(-1074),
    }
}

/// Asserts every element of `got` (logical order) is within
/// `rel * |want| + abs` of `want`.
pub fn assert_all_close(got: &Tensor, want: &[f64], rel: f64, abs: f64, ctx: &str) {
    assert_eq!(got.numel(), want.len(), "{ctx}: element count");
    for (i, &w) in want.iter().enumerate() {
        assert_close(
            got.get(i),
            w,
            rel * w.abs() + abs,
            &format!("{ctx} elem {i}"),
        );
    }
}

/// Largest absolute value (0 for an empty slice).
pub fn max_abs(v: &[f64]) -> f64 {
    v.iter().fold(0.0, |m, x| m.max(x.abs()))
}

/// All elements in logical order.
pub fn values(t: &Tensor) -> Vec<f64> {
    (0..t.numel()).map(|i| t.get(i)).collect()
}
