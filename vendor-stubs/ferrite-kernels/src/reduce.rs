//! `reduce`: `Sum`, `Mean`, `Max` and `Argmax` over one dimension. The
//! output positions are walked by the strided planner (in parallel when the
//! total work is large); a run of outputs whose inputs are contiguous across
//! the run is reduced column-wise (vectors of outputs accumulate one input
//! row at a time), otherwise each output reduces its strided line in blocks.
//! Sums accumulate in `f64` and are rounded to the output once.

use crate::convert::{BLOCK, load_f32, store_f32};
use crate::dtype::DType;
use crate::error::{KernelError, bail};
use crate::layout::for_each_strided;
use crate::map::check_float;
use crate::rounding::f64_to_f32_odd;
use crate::shape::SmallDims;
use crate::simd::simd_dispatch;
use crate::view::View;

/// A reduction for [`reduce`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    /// Sum (0 over an empty dimension).
    Sum,
    /// Arithmetic mean (NaN over an empty dimension).
    Mean,
    /// Maximum, NaN if any element is NaN (`-inf` over an empty dimension).
    Max,
    /// Index (i64) of the first maximum, or of the first NaN; an error over
    /// an empty dimension.
    Argmax,
}

/// Reduces `input` over dimension `dim` into `out`, which has `input`'s
/// shape with `dim` removed (or kept with extent 1 when `keepdim`). A 0-d
/// input counts as one element along `dim == 0`. `Sum`, `Mean` and `Max`
/// keep the float dtype (`f32`, `f16`, `bf16`); `Argmax` writes `I64`.
///
/// # Safety
/// Every element addressed by each view must be valid memory of its dtype;
/// `out` must not overlap `input` or itself.
pub unsafe fn reduce(
    op: ReduceOp,
    input: &View,
    out: &View,
    dim: usize,
    keepdim: bool,
) -> Result<(), KernelError> {
    check_float("reduce", "input", input)?;
    out.validate("reduce", "out")?;
    let want = if op == ReduceOp::Argmax {
        DType::I64
    } else {
        input.dtype
    };
    if out.dtype != want {
        bail!(
            "reduce: {op:?} of {:?} needs out {want:?}, got {:?}",
            input.dtype,
            out.dtype
        );
    }
    let r = input.shape.len();
    if dim >= r.max(1) {
        bail!("reduce: dim {dim} out of range for shape {:?}", input.shape);
    }
    let (l, sd) = if r == 0 {
        (1, 0)
    } else {
        (input.shape[dim] as usize, input.strides[dim] as isize)
    };
    let (mut shape, mut istr, mut expect) = (SmallDims::new(), SmallDims::new(), SmallDims::new());
    for d in 0..r {
        if d != dim {
            shape.push(input.shape[d]);
            istr.push(input.strides[d]);
            expect.push(input.shape[d]);
        } else if keepdim {
            expect.push(1);
        }
    }
    if out.shape != expect.as_slice() {
        bail!(
            "reduce: out shape {:?}, expected {:?}",
            out.shape,
            expect.as_slice()
        );
    }
    if op == ReduceOp::Argmax && l == 0 {
        bail!("reduce: argmax over an empty dimension");
    }
    let mut ostr = SmallDims::new();
    for (d, &s) in out.strides.iter().enumerate() {
        if !(keepdim && r > 0 && d == dim) {
            ostr.push(s);
        }
    }
    let job = Job {
        op,
        dt: input.dtype,
        l,
        sd,
    };
    let ptrs = [out.ptr, input.ptr];
    let strides = [ostr.as_slice(), istr.as_slice()];
    let sizes = [out.dtype.size(), input.dtype.size()];
    // SAFETY: every run lies inside the caller-guaranteed views.
    unsafe {
        for_each_strided(
            shape.as_slice(),
            ptrs,
            strides,
            sizes,
            l.max(1),
            &|p, n, s| reduce_run(&job, p, n, s),
        );
    }
    Ok(())
}

/// The reduction, input dtype, reduced length and stride.
struct Job {
    op: ReduceOp,
    dt: DType,
    l: usize,
    sd: isize,
}

/// Running maximum that keeps the first NaN.
#[inline(always)]
fn better(x: f32, best: f32) -> bool {
    x > best || (x.is_nan() && !best.is_nan())
}

simd_dispatch!(unsafe fn reduce_run[](job: &Job, p: [*mut u8; 2], n: usize, s: [isize; 2]) => run_impl[]);

/// Reduces `n` outputs: output `i` at `p[0] + i * s[0]` from the line
/// starting at `p[1] + i * s[1]`.
///
/// # Safety
/// The addressed elements must be valid for the job's dtypes.
#[inline(always)]
unsafe fn run_impl(job: &Job, p: [*mut u8; 2], n: usize, s: [isize; 2]) {
    let isz = job.dt.size() as isize;
    let osz = if job.op == ReduceOp::Argmax { 8 } else { isz };
    let columns = s[1] == 1 && n > 1 && job.sd != 1;
    let mut buf = [0f32; BLOCK];
    let (mut acc, mut best, mut idx) = ([0f64; BLOCK], [0f32; BLOCK], [0i64; BLOCK]);
    let mut done = 0;
    while done < n {
        let m = if columns { BLOCK.min(n - done) } else { 1 };
        let ip = p[1].wrapping_offset(done as isize * s[1] * isz);
        let op = p[0].wrapping_offset(done as isize * s[0] * osz);
        let (acc, best, idx) = (&mut acc[..m], &mut best[..m], &mut idx[..m]);
        acc.fill(0.0);
        best.fill(f32::NEG_INFINITY);
        idx.fill(0);
        // Columns: one input row of `m` outputs per step. Line: blocks of
        // one output's line.
        let (step, count, stride) = if columns {
            (1, job.l, 1)
        } else {
            (BLOCK, job.l.div_ceil(BLOCK), job.sd)
        };
        for k in 0..count {
            let k0 = k * step;
            let len = if columns { m } else { BLOCK.min(job.l - k0) };
            let x = &mut buf[..len];
            // SAFETY: elements of the caller-guaranteed input lines.
            unsafe {
                load_f32(
                    job.dt,
                    ip.wrapping_offset(k0 as isize * job.sd * isz),
                    stride,
                    x,
                )
            };
            match (job.op, columns) {
                (ReduceOp::Sum | ReduceOp::Mean, true) => {
                    for (a, &v) in acc.iter_mut().zip(x.iter()) {
                        *a += v as f64;
                    }
                }
                (ReduceOp::Sum | ReduceOp::Mean, false) => acc[0] += line_sum(x),
                (ReduceOp::Max, true) => {
                    for (b, &v) in best.iter_mut().zip(x.iter()) {
                        *b = if v > *b || v.is_nan() { v } else { *b };
                    }
                }
                (ReduceOp::Max, false) => {
                    let v = crate::rows::max(x);
                    best[0] = if v > best[0] || v.is_nan() {
                        v
                    } else {
                        best[0]
                    };
                }
                (ReduceOp::Argmax, true) => {
                    for ((b, i), &v) in best.iter_mut().zip(idx.iter_mut()).zip(x.iter()) {
                        if better(v, *b) {
                            (*b, *i) = (v, k as i64);
                        }
                    }
                }
                (ReduceOp::Argmax, false) => {
                    for (j, &v) in x.iter().enumerate() {
                        if better(v, best[0]) {
                            (best[0], idx[0]) = (v, (k0 + j) as i64);
                        }
                    }
                }
            }
        }
        // SAFETY: outputs `done..done + m` of the caller's run.
        unsafe { finish(job, op, s[0], acc, best, idx) };
        done += m;
    }
}

/// Sum of a block in `f64`, four lanes.
#[inline(always)]
fn line_sum(x: &[f32]) -> f64 {
    let mut lanes = [0f64; 4];
    let c = x.chunks_exact(4);
    let rest = c.remainder();
    for v in c {
        for j in 0..4 {
            lanes[j] += v[j] as f64;
        }
    }
    rest.iter()
        .fold((lanes[0] + lanes[1]) + (lanes[2] + lanes[3]), |a, &v| {
            a + v as f64
        })
}

/// Writes `m` results (`acc`, `best` or `idx` per the op) with stride `so`.
///
/// # Safety
/// `op` must address `m` writable outputs with stride `so`.
#[inline(always)]
unsafe fn finish(job: &Job, op: *mut u8, so: isize, acc: &[f64], best: &mut [f32], idx: &[i64]) {
    let odd = job.dt != DType::F32;
    let round = |v: f64| if odd { f64_to_f32_odd(v) } else { v as f32 };
    // SAFETY: forwarded from this function's contract.
    unsafe {
        match job.op {
            ReduceOp::Argmax => {
                for (i, &v) in idx.iter().enumerate() {
                    *(op as *mut i64).offset(i as isize * so) = v;
                }
                return;
            }
            ReduceOp::Sum => {
                for (b, &a) in best.iter_mut().zip(acc) {
                    *b = round(a);
                }
            }
            ReduceOp::Mean => {
                for (b, &a) in best.iter_mut().zip(acc) {
                    *b = round(a / job.l as f64);
                }
            }
            ReduceOp::Max => {}
        }
        store_f32(job.dt, op, so, best);
    }
}
