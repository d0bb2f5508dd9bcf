//! What RMSNorm and LayerNorm share: argument checks (rows over the last
//! dimension `H`, `[H]` parameters of the input's dtype, `f32` statistics of
//! the leading shape) and the final reduction of per-chunk parameter
//! gradients into an `[H]` output.

use crate::error::{KernelError, bail};
use crate::map::{check_f32, check_float, check_shape};
use crate::rows::{Line, RowFmt};
use crate::view::View;

/// The checked geometry of a normalisation: leading shape and row length.
pub(crate) struct NormShape<'a> {
    pub(crate) lead: &'a [i64],
    pub(crate) h: usize,
}

/// Checks a normalisation's views: `rows` are `[..., H]` tensors of one
/// float dtype, `params` are `[H]` of that dtype, `stats` are `f32` with the
/// leading shape.
pub(crate) fn check<'a>(
    kernel: &str,
    rows: &[(&str, &View<'a>)],
    params: &[(&str, &View)],
    stats: &[(&str, &View)],
) -> Result<NormShape<'a>, KernelError> {
    let (_, first) = rows[0];
    for &(name, v) in rows {
        check_float(kernel, name, v)?;
        check_shape(kernel, name, v, first.shape)?;
    }
    let Some((&h, lead)) = first.shape.split_last() else {
        bail!("{kernel}: need at least one dimension");
    };
    for &(name, v) in rows.iter().chain(params) {
        if v.dtype != first.dtype {
            bail!(
                "{kernel}: {name} is {:?}, expected {:?}",
                v.dtype,
                first.dtype
            );
        }
    }
    for &(name, v) in params {
        check_float(kernel, name, v)?;
        check_shape(kernel, name, v, &[h])?;
    }
    for &(name, v) in stats {
        check_f32(kernel, name, v)?;
        check_shape(kernel, name, v, lead)?;
    }
    Ok(NormShape {
        lead,
        h: h as usize,
    })
}

/// The row of `v` (`[..., H]`) starting at `p`.
pub(crate) fn line(v: &View, p: *mut u8, h: usize) -> Line {
    RowFmt::of(v).line(p, h)
}

/// Sums per-chunk `[H]` partial gradients (in `f64`) and writes the total
/// to the `[H]` view `out`.
///
/// # Safety
/// `out` must be valid, writable memory for `H` elements of its dtype.
pub(crate) unsafe fn store_param_grad(out: &View, parts: &[Vec<f32>], h: usize) {
    let mut total = vec![0f64; h];
    for part in parts {
        for (t, &p) in total.iter_mut().zip(part) {
            *t += p as f64;
        }
    }
    let total: Vec<f32> = total.into_iter().map(|t| t as f32).collect();
    let l = line(out, out.ptr, h);
    // SAFETY: forwarded from this function's contract.
    unsafe { l.write(&total) };
}
