//! Embedding lookup and its backward. Indices are read and range-checked
//! before anything is written. The forward copies rows (any strides, in
//! parallel for large outputs). The backward groups the updates by index
//! (a stable sort, so the order within a group is the input order), sums
//! each group in `f32` on top of the existing gradient row and rounds once;
//! groups touch disjoint rows, so they run in parallel without conflicts.

use crate::convert::load_f32;
use crate::error::{KernelError, bail};
use crate::index::read_indices;
use crate::map::check_float;
use crate::parallel::{SyncPtr, for_each_range};
use crate::rows::{Line, Rows};
use crate::view::View;

/// Checks `[V, H]` against `[indices..., H]` and returns `(V, H)`.
fn check_table(
    kernel: &str,
    table: &View,
    rows: &View,
    idx: &View,
) -> Result<(usize, usize), KernelError> {
    let &[v, h] = table.shape else {
        bail!("{kernel}: table must be [V, H], got {:?}", table.shape);
    };
    let ok = rows.dtype == table.dtype
        && rows.shape.len() == idx.shape.len() + 1
        && rows.shape[..idx.shape.len()] == *idx.shape
        && rows.shape.last() == Some(&h);
    if !ok {
        bail!(
            "{kernel}: rows {:?} {:?} do not match indices {:?} and table {:?} {:?}",
            rows.dtype,
            rows.shape,
            idx.shape,
            table.dtype,
            table.shape
        );
    }
    Ok((v as usize, h as usize))
}

/// `out[i..., :] = weight[indices[i...], :]`. `weight` is `[V, H]` of any
/// float dtype, `indices` `i32`/`i64` of any shape with values in `0..V`
/// (else an error, before anything is written), `out` `[indices..., H]`.
///
/// # Safety
/// Every element addressed by each view must be valid memory of its dtype;
/// `out` must not overlap the inputs or itself.
pub unsafe fn embedding(weight: &View, indices: &View, out: &View) -> Result<(), KernelError> {
    let k = "embedding";
    weight.validate(k, "weight")?;
    out.validate(k, "out")?;
    if !weight.dtype.is_float() {
        bail!("{k}: weight must be floating, got {:?}", weight.dtype);
    }
    let (v, h) = check_table(k, weight, out, indices)?;
    // SAFETY: `indices` is a valid index view.
    let idx = unsafe { read_indices(k, indices, v, None)? };
    let rows = Rows::new(indices.shape, [out]);
    let (size, wbase) = (weight.dtype.size(), SyncPtr::new(weight.ptr));
    let (ws, os) = (
        weight.strides[1] as isize,
        out.strides[out.strides.len() - 1] as isize,
    );
    let wrow = weight.strides[0] as isize * size as isize;
    rows.for_ranges(h, |start, len| {
        for (r, &i) in idx.iter().enumerate().skip(start).take(len) {
            let [dst] = rows.ptrs(r);
            let src = wbase.get().wrapping_offset(i as isize * wrow);
            // SAFETY: row `i < V` of the table and row `r` of `out`; distinct
            // ranges write distinct rows.
            unsafe {
                match size {
                    2 => copy_line::<u16>(src, ws, dst, os, h),
                    4 => copy_line::<u32>(src, ws, dst, os, h),
                    _ => copy_line::<u64>(src, ws, dst, os, h),
                }
            }
        }
    });
    Ok(())
}

/// Copies `n` elements of `T` between strided lines.
///
/// # Safety
/// Both lines must be valid and must not overlap.
#[inline(always)]
unsafe fn copy_line<T: Copy>(src: *const u8, ss: isize, dst: *mut u8, ds: isize, n: usize) {
    let (s, d) = (src as *const T, dst as *mut T);
    // SAFETY: forwarded from this function's contract.
    unsafe {
        if ss == 1 && ds == 1 {
            std::ptr::copy_nonoverlapping(s, d, n);
        } else {
            for i in 0..n as isize {
                *d.offset(i * ds) = *s.offset(i * ss);
            }
        }
    }
}

/// `grad_weight[indices[i...], :] += grad_out[i..., :]`, accumulating into
/// `grad_weight` (`[V, H]`, `f32`/`f16`/`bf16`); repeated indices add up in
/// `f32` and each touched row is rounded once. Index errors are reported
/// before anything is written.
///
/// # Safety
/// Every element addressed by each view must be valid memory of its dtype;
/// `grad_weight` must not overlap the inputs or itself.
pub unsafe fn embedding_backward(
    grad_out: &View,
    indices: &View,
    grad_weight: &View,
) -> Result<(), KernelError> {
    let k = "embedding_backward";
    check_float(k, "grad_out", grad_out)?;
    check_float(k, "grad_weight", grad_weight)?;
    let (v, h) = check_table(k, grad_weight, grad_out, indices)?;
    // SAFETY: `indices` is a valid index view.
    let idx = unsafe { read_indices(k, indices, v, None)? };
    let mut order: Vec<usize> = (0..idx.len()).collect();
    order.sort_by_key(|&r| idx[r]);
    let mut starts: Vec<usize> = (0..order.len())
        .filter(|&j| j == 0 || idx[order[j]] != idx[order[j - 1]])
        .collect();
    let groups = starts.len();
    starts.push(order.len());
    let rows = Rows::new(indices.shape, [grad_out]);
    let (dt, gbase) = (grad_weight.dtype, SyncPtr::new(grad_weight.ptr));
    let gs = grad_weight.strides;
    let gline = |i: i64| Line {
        dt,
        p: gbase
            .get()
            .wrapping_offset(i as isize * gs[0] as isize * dt.size() as isize),
        stride: gs[1] as isize,
        len: h,
    };
    let os = grad_out.strides[grad_out.strides.len() - 1] as isize;
    let gdt = grad_out.dtype;
    let per_group = h * (order.len() / groups.max(1)).max(1);
    for_each_range(groups, per_group, |first, count| {
        let (mut acc, mut row) = (vec![0f32; h], vec![0f32; h]);
        for gi in first..first + count {
            let members = &order[starts[gi]..starts[gi + 1]];
            let dst = gline(idx[members[0]]);
            // SAFETY: row `idx < V` of `grad_weight`, owned by this group
            // alone; rows of `grad_out` are valid inputs.
            unsafe {
                load_f32(dt, dst.p, dst.stride, &mut acc);
                for &r in members {
                    let [src] = rows.ptrs(r);
                    load_f32(gdt, src, os, &mut row);
                    add_row(&mut acc, &row);
                }
                dst.write(&acc);
            }
        }
    });
    Ok(())
}

/// `acc += row`.
#[inline(always)]
fn add_row(acc: &mut [f32], row: &[f32]) {
    for (a, &r) in acc.iter_mut().zip(row) {
        *a += r;
    }
}
