//! `linear`: `out = input @ weight^T + bias`. The leading dimensions of
//! `input` and `out` are folded into one row dimension whenever their
//! strides allow (always for contiguous tensors), so the whole product is a
//! single `matmul` (one `gemm` call reading `weight` through transposed
//! strides, no copy). The bias is broadcast into `out` first and the product
//! accumulated onto it (`beta = 1`), so `f16`/`bf16` still round once.

use crate::copy_cast::copy;
use crate::error::{KernelError, bail};
use crate::map::check_float;
use crate::matmul::matmul;
use crate::view::View;

/// `out = input @ weight^T (+ bias)`: `input` `[..., K]`, `weight`
/// `[N, K]`, `bias` `[N]`, `out` `[..., N]`, one float dtype (`f32`, `f16`
/// or `bf16`), accumulated in `f32`.
///
/// # Safety
/// Every element addressed by each view must be valid memory of its dtype;
/// `out` must not overlap the inputs or itself.
pub unsafe fn linear(
    input: &View,
    weight: &View,
    bias: Option<&View>,
    out: &View,
) -> Result<(), KernelError> {
    let k = "linear";
    check_float(k, "input", input)?;
    check_float(k, "weight", weight)?;
    check_float(k, "out", out)?;
    let dt = out.dtype;
    let &[n, kk] = weight.shape else {
        bail!("{k}: weight must be [N, K], got {:?}", weight.shape);
    };
    let r = input.shape.len();
    let ok = input.dtype == dt
        && weight.dtype == dt
        && r >= 1
        && out.shape.len() == r
        && input.shape[r - 1] == kk
        && out.shape[r - 1] == n
        && input.shape[..r - 1] == out.shape[..r - 1];
    if !ok {
        bail!(
            "{k}: input {:?} {:?}, weight {:?} {:?} and out {:?} {:?} do not match",
            input.dtype,
            input.shape,
            weight.dtype,
            weight.shape,
            out.dtype,
            out.shape
        );
    }
    if let Some(b) = bias {
        check_float(k, "bias", b)?;
        if b.dtype != dt || b.shape != [n] {
            bail!(
                "{k}: bias is {:?} {:?}, expected {dt:?} [{n}]",
                b.dtype,
                b.shape
            );
        }
        let mut bstr = vec![0i64; r];
        bstr[r - 1] = b.strides[0];
        let spread = View::new(b.ptr, dt, out.shape, &bstr);
        // SAFETY: reads the bias (broadcast) and writes `out`, which do not
        // overlap.
        unsafe { copy(&spread, out)? };
    }
    let beta = if bias.is_some() { 1.0 } else { 0.0 };
    let lead = &input.shape[..r - 1];
    let m: i64 = lead.iter().product();
    let folded = (
        fold(lead, &input.strides[..r - 1]),
        fold(lead, &out.strides[..r - 1]),
    );
    if let (Some(rs_in), Some(rs_out)) = folded {
        let (ashape, oshape) = ([m, kk], [m, n]);
        let astr = [rs_in, input.strides[r - 1]];
        let ostr = [rs_out, out.strides[r - 1]];
        let a = View::new(input.ptr, dt, &ashape, &astr);
        let o = View::new(out.ptr, dt, &oshape, &ostr);
        // SAFETY: the same memory as the caller's views, re-described.
        return unsafe { matmul(&a, weight, &o, false, true, 1.0, beta) };
    }
    // Leading dimensions that do not fold (two or more): batched matmul
    // with the weight broadcast over the batch.
    // SAFETY: forwarded from this function's contract.
    unsafe { matmul(input, weight, out, false, true, 1.0, beta) }
}

/// The single row stride of leading dimensions `shape` with `strides` when
/// they fold into one dimension (size-1 dimensions ignored), else `None`.
fn fold(shape: &[i64], strides: &[i64]) -> Option<i64> {
    let mut inner: Option<(i64, i64)> = None;
    for (&n, &s) in shape.iter().zip(strides).rev() {
        if n == 1 {
            continue;
        }
        match inner {
            None => inner = Some((n, s)),
            Some((m, t)) if s == t * m => inner = Some((n * m, t)),
            Some(_) => return None,
        }
    }
    Some(inner.map_or(0, |(_, t)| t))
}
