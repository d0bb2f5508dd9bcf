//! Rotary position embedding (`rope`) and its inverse (`rope_backward`, the
//! rotation by `-theta`) on `[batch, seq, heads, D]` tensors with `f32`
//! `[seq, D/2]` cos/sin tables, in both pair layouts. Each head row is
//! widened into scratch, rotated in `f32` and rounded back, so in place is
//! fine; rows run in parallel for large inputs.

use crate::error::{KernelError, bail};
use crate::map::{check_f32, check_float, check_shape};
use crate::rows::{Line, RowFmt, Rows};
use crate::simd::simd_dispatch;
use crate::view::View;

/// Rotates each pair `(a, b)` of every head of `input` by the angle of its
/// position `s` and index `j`: `(a cos - b sin, a sin + b cos)`, with
/// `sin` negated when `backward`. Pairs are `(x[2j], x[2j+1])` when
/// `interleaved`, else `(x[j], x[j + D/2])`.
///
/// # Safety
/// Every element addressed by each view must be valid memory of its dtype;
/// `out` must not overlap the inputs unless it is exactly `input`, and must
/// not overlap itself.
pub unsafe fn rope(
    input: &View,
    cos: &View,
    sin: &View,
    out: &View,
    interleaved: bool,
    backward: bool,
) -> Result<(), KernelError> {
    let k = "rope";
    check_float(k, "input", input)?;
    check_float(k, "out", out)?;
    check_f32(k, "cos", cos)?;
    check_f32(k, "sin", sin)?;
    if input.dtype != out.dtype || input.shape != out.shape {
        bail!(
            "{k}: out {:?} {:?} does not match input",
            out.dtype,
            out.shape
        );
    }
    let &[_, seq, heads, d] = input.shape else {
        bail!(
            "{k}: input must be [batch, seq, heads, D], got {:?}",
            input.shape
        );
    };
    if d % 2 != 0 {
        bail!("{k}: head dimension {d} is odd");
    }
    let half = (d / 2) as usize;
    check_shape(k, "cos", cos, &[seq, d / 2])?;
    check_shape(k, "sin", sin, &[seq, d / 2])?;
    let (seq, heads) = (seq as usize, heads as usize);
    let sign = if backward { -1.0 } else { 1.0 };
    // SAFETY: the tables are valid `[seq, D/2]` f32 views.
    let (cos, sin) = unsafe { (table(cos, seq, half, 1.0), table(sin, seq, half, sign)) };
    let job = Job {
        rows: Rows::new(&input.shape[..3], [out, input]),
        views: [out, input].map(RowFmt::of),
        cos,
        sin,
        seq,
        heads,
        half,
        interleaved,
    };
    // SAFETY: forwarded from this function's contract.
    job.rows
        .for_ranges(2 * half, |s, n| unsafe { rope_rows(&job, s, n) });
    Ok(())
}

/// A `[seq, half]` f32 table made contiguous and multiplied by `sign`.
///
/// # Safety
/// `v` must be a valid `[seq, half]` f32 view.
unsafe fn table(v: &View, seq: usize, half: usize, sign: f32) -> Vec<f32> {
    let mut t = vec![0f32; seq * half];
    for (s, row) in t.chunks_exact_mut(half.max(1)).enumerate().take(seq) {
        let p = v
            .ptr
            .wrapping_offset(s as isize * v.strides[0] as isize * 4);
        let l = Line {
            dt: v.dtype,
            p,
            stride: v.strides[1] as isize,
            len: half,
        };
        let mut scratch = Vec::new();
        // SAFETY: row `s` of the caller's table.
        let src = unsafe { l.read(&mut scratch) };
        for (d, &x) in row.iter_mut().zip(src) {
            *d = x * sign;
        }
    }
    t
}

struct Job<'a> {
    rows: Rows<'a, 2>,
    views: [RowFmt; 2],
    cos: Vec<f32>,
    sin: Vec<f32>,
    seq: usize,
    heads: usize,
    half: usize,
    interleaved: bool,
}

simd_dispatch!(unsafe fn rope_rows[](job: &Job, start: usize, len: usize) => rope_impl[]);

/// # Safety
/// As for [`rope`].
#[inline(always)]
unsafe fn rope_impl(job: &Job, start: usize, len: usize) {
    let (h2, d) = (job.half, 2 * job.half);
    let (mut xs, mut ys) = (vec![0f32; d], vec![0f32; d]);
    for r in start..start + len {
        let s = (r / job.heads) % job.seq;
        let (c, sn) = (&job.cos[s * h2..][..h2], &job.sin[s * h2..][..h2]);
        let [op, ip] = job.rows.ptrs(r);
        let (il, ol) = (job.views[1].line(ip, d), job.views[0].line(op, d));
        // SAFETY: the rows lie inside the caller's views; the input row is
        // copied before the output row is written.
        unsafe {
            crate::convert::load_f32(il.dt, il.p, il.stride, &mut xs);
        }
        if job.interleaved {
            for (j, (&c, &sn)) in c.iter().zip(sn).enumerate() {
                let (a, b) = (xs[2 * j], xs[2 * j + 1]);
                ys[2 * j] = a * c - b * sn;
                ys[2 * j + 1] = a * sn + b * c;
            }
        } else {
            let (xa, xb) = xs.split_at(h2);
            let (ya, yb) = ys.split_at_mut(h2);
            for (((ya, yb), (&a, &b)), (&c, &sn)) in ya
                .iter_mut()
                .zip(yb)
                .zip(xa.iter().zip(xb))
                .zip(c.iter().zip(sn))
            {
                *ya = a * c - b * sn;
                *yb = a * sn + b * c;
            }
        }
        // SAFETY: as above.
        unsafe { ol.write(&ys) };
    }
}
