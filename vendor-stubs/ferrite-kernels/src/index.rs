//! Reading `i32`/`i64` index tensors (embedding indices, class targets) in
//! row-major order, with every index checked against its range before any
//! kernel writes: an index out of range is an error, never a stray access.

use crate::dtype::DType;
use crate::error::{KernelError, bail};
use crate::view::View;

/// The elements of the index tensor `v` in row-major order, each checked to
/// lie in `0..bound` unless it equals `skip` (an ignore marker).
///
/// # Safety
/// Every element addressed by `v` must be valid memory of its dtype.
pub(crate) unsafe fn read_indices(
    kernel: &str,
    v: &View,
    bound: usize,
    skip: Option<i64>,
) -> Result<Vec<i64>, KernelError> {
    v.validate(kernel, "indices")?;
    if !matches!(v.dtype, DType::I32 | DType::I64) {
        bail!("{kernel}: indices must be i32 or i64, got {:?}", v.dtype);
    }
    let n = v.numel();
    let mut out = Vec::with_capacity(n);
    if n == 0 {
        return Ok(out);
    }
    let r = v.shape.len();
    let mut idx = vec![0i64; r];
    let mut off = 0isize;
    for _ in 0..n {
        let p = v.ptr.wrapping_offset(off * v.dtype.size() as isize);
        // SAFETY: `off` addresses an element of the caller's view.
        let x = unsafe {
            match v.dtype {
                DType::I32 => *(p as *const i32) as i64,
                _ => *(p as *const i64),
            }
        };
        if Some(x) != skip && (x < 0 || x as u64 >= bound as u64) {
            bail!("{kernel}: index {x} out of range 0..{bound}");
        }
        out.push(x);
        // Advance the row-major odometer.
        for d in (0..r).rev() {
            idx[d] += 1;
            off += v.strides[d] as isize;
            if idx[d] < v.shape[d] {
                break;
            }
            off -= v.shape[d] as isize * v.strides[d] as isize;
            idx[d] = 0;
        }
    }
    Ok(out)
}
