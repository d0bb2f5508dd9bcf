//! gather and scatter_add (ABI 1.4, `kernels/indexing.cl`), and the index
//! check they share with `embedding`.
//!
//! Every tensor is used in its own strides (nothing packed: an index
//! expanded by a zero stride, PyTorch's `index_select` and `index_add`, is
//! read in place, and a strided `dst` is updated where it lies).
//!
//! Indices are checked on the device before anything is written
//! ([`check`]): one work-group finds the first index out of range and
//! writes its position and value to a status buffer, and the kernels that
//! write read it and do nothing when an index is bad. The call queues the
//! check and the kernel back to back and then waits for the status once
//! ([`refuse_bad`]), which a refused call needs anyway to answer
//! INVALID_ARGUMENT: reading the status back between the two would make a
//! good call wait for the device twice.
//!
//! `scatter_add` is deterministic without atomics (OpenCL 1.2 has none for
//! floats): each destination element adds the updates that name it to its
//! old value in index order (f32 in f64 where the device has it, f16 and
//! bf16 in f32, f64 in f64; integers wrapping) and rounds once, in one of
//! two formulations that give the same bits:
//! - the walk, for at most [`WALK_MAX_PLACES`] places `D` along `dim`: one
//!   work-item per line of the index (the positions that differ only along
//!   `dim`) reads its `K` updates once, in order, keeping each place's sum
//!   in private memory, and stores the places it met: one read per update;
//! - sorted runs, for more places: keys `(line * D + index) << 32 | k` are
//!   sorted on the device (the bitonic [`sort_keys`], which
//!   `embedding_backward` uses; one line of keys when the index is one line
//!   expanded by zero strides, as `index_add` passes it), and the first
//!   slot of each run adds the run: `O(M log^2 M)` for `M` keys, then one
//!   read per update. Past 2^32 - 2 lines times places, or 2^32 indices a
//!   line, the keys do not fit and the call is UNIMPLEMENTED.
//!
//! `POLYCHIP_OPENCL_SCATTER_ADD=sort` makes every call sort (the tests run
//! the suite that way too).

use std::sync::OnceLock;

use cl3::command_queue::enqueue_read_buffer;
use opencl3::event::Event as ClEvent;
use polychip_plugin_sdk::{DType, Error, GatherArgs, Result, ScatterAddArgs};

use crate::call::{Ctx, Operand, joint_layouts};
use crate::driver::ClResult;
use crate::program::Flavor;

/// The kernel `stem` for indices of `index`'s dtype (i32 or i64).
pub fn for_index(stem: &str, index: &Operand) -> String {
    let suffix = if index.dtype == DType::I32 {
        "i32"
    } else {
        "i64"
    };
    format!("{stem}_{suffix}")
}

/// Enqueues the check of every element of `index` against `[0, limit)`
/// into new status memory (2 i64: the first bad position, row-major, or the
/// element count when none is bad; and its value).
pub fn check(ctx: &Ctx<'_>, flavor: Flavor, index: &Operand, limit: usize) -> Result<Operand> {
    let status = ctx.scratch(DType::I64, &[2])?;
    let layout = index.layout()?;
    let wg = ctx.programs.wg;
    ctx.launch(
        flavor,
        &for_index("pc_index_check", index),
        &[wg],
        Some(&[wg]),
        |a| {
            a.mem(index.mem())?
                .value(layout)?
                .value(index.numel() as i64)?
                .value(limit as i64)?
                .mem(status.mem())?;
            Ok(())
        },
    )?;
    Ok(status)
}

/// Waits for the check [`check`] queued and refuses the call if an index
/// is out of range: `name` is the index operand, `limit` the range's end,
/// and `what` says what it indexes (for the message).
pub fn refuse_bad(
    ctx: &Ctx<'_>,
    status: &Operand,
    index: &Operand,
    name: &str,
    limit: usize,
    what: impl FnOnce() -> String,
) -> Result<()> {
    let mut found = [0i64; 2];
    // SAFETY: `found` is 16 writable bytes, and the read is blocking, so
    // it is done with them when this returns; `status` holds 2 i64.
    let event = unsafe {
        enqueue_read_buffer(
            ctx.queue.get(),
            status.mem(),
            1,
            0,
            std::mem::size_of_val(&found),
            found.as_mut_ptr().cast(),
            0,
            std::ptr::null(),
        )
    }
    .cl(&format!(
        "clEnqueueReadBuffer ({}: the index check)",
        ctx.op
    ))?;
    drop(ClEvent::new(event));
    let [first, value] = found;
    if first < index.numel() as i64 {
        return Err(Error::invalid(format!(
            "opencl: {}: element {first} (row-major) of {name} is {value}, outside [0, {limit}) \
             {}",
            ctx.op,
            what()
        )));
    }
    Ok(())
}

/// The length of the key buffer that sorts `n` keys: a power of two of at
/// least two work-groups' (what [`sort_keys`] takes).
pub fn padded_keys(ctx: &Ctx<'_>, n: usize) -> usize {
    n.next_power_of_two().max(2 * ctx.programs.wg)
}

/// Enqueues the bitonic sort of `keys` (`padded` 64-bit keys, a length
/// from [`padded_keys`], ascending as unsigned numbers).
pub fn sort_keys(ctx: &Ctx<'_>, flavor: Flavor, keys: &Operand, padded: usize) -> Result<()> {
    let wg = ctx.programs.wg;
    let block = 2 * wg;
    let sort_block = |k: usize| {
        ctx.launch(flavor, "pc_sort_block", &[padded / 2], Some(&[wg]), |a| {
            a.mem(keys.mem())?.value(k as i64)?;
            Ok(())
        })
    };
    sort_block(0)?;
    let mut k = 2 * block;
    while k <= padded {
        let mut j = k / 2;
        while j >= block {
            ctx.launch(flavor, "pc_sort_step", &[padded / 2], None, |a| {
                a.mem(keys.mem())?.value(k as i64)?.value(j as i64)?;
                Ok(())
            })?;
            j /= 2;
        }
        sort_block(k)?;
        k *= 2;
    }
    Ok(())
}

/// `strides` with dimension `dim`'s set to 0 (the index supplies that
/// coordinate).
fn without_dim(strides: &[i64], dim: usize) -> Vec<i64> {
    let mut s = strides.to_vec();
    s[dim] = 0;
    s
}

/// `gather`: one work-item per output element, any dtype (the program of
/// its element width).
pub fn gather(ctx: Ctx<'_>, args: &GatherArgs<'_>) -> Result<()> {
    let input = ctx.view("input", &args.input)?;
    let index = ctx.view("index", &args.index)?;
    let out = ctx.view("out", &args.out)?;
    let dim = args.dim;
    let n = index.numel();
    if n == 0 {
        return ctx.finish();
    }
    let limit = input.shape[dim] as usize;
    let flavor = Flavor::bits(input.dtype);
    let base = without_dim(&input.strides, dim);
    let layouts = joint_layouts(
        &index.shape,
        &[
            (input.offset, &base),
            (index.offset, &index.strides),
            (out.offset, &out.strides),
        ],
    )?;
    let status = check(&ctx, flavor, &index, limit)?;
    ctx.launch(flavor, &for_index("pc_gather", &index), &[n], None, |a| {
        a.mem(input.mem())?
            .value(layouts[0])?
            .value(input.strides[dim])?
            .value(limit as i64)?
            .mem(index.mem())?
            .value(layouts[1])?
            .mem(out.mem())?
            .value(layouts[2])?
            .value(n as i64)?
            .mem(status.mem())?;
        Ok(())
    })?;
    refuse_bad(&ctx, &status, &index, "index", limit, || {
        format!("(dimension {dim} of input of shape {:?})", input.shape)
    })?;
    ctx.finish()
}

/// The variable that makes every `scatter_add` sort (`sort`), also where
/// it would walk; for tests. Anything else is ignored with a warning.
pub const SCATTER_ADD_VAR: &str = "POLYCHIP_OPENCL_SCATTER_ADD";

/// Up to this many places along `dim`, `scatter_add` walks (keeps each
/// place's sum in private memory: `PC_WALK_PLACES` in `indexing.cl`).
const WALK_MAX_PLACES: usize = 64;

/// Whether [`SCATTER_ADD_VAR`] makes every call sort, read once.
fn always_sort() -> bool {
    static SORT: OnceLock<bool> = OnceLock::new();
    *SORT.get_or_init(|| match std::env::var(SCATTER_ADD_VAR) {
        Ok(text) if text.trim() == "sort" => true,
        Ok(text) => {
            log::warn!("opencl: {SCATTER_ADD_VAR}={text:?} is not `sort`; ignored");
            false
        }
        Err(_) => false,
    })
}

/// `scatter_add` (module docs): floating dtypes in their program, i32 and
/// i64 in the program of their width. Both formulations add each
/// element's updates in index order, so they give the same bits.
pub fn scatter_add(ctx: Ctx<'_>, args: &ScatterAddArgs<'_>) -> Result<()> {
    let dst = ctx.view("dst", &args.dst)?;
    let index = ctx.view("index", &args.index)?;
    let src = ctx.view("src", &args.src)?;
    let dim = args.dim;
    let count = index.numel();
    if count == 0 {
        return ctx.finish();
    }
    let flavor = match dst.dtype {
        DType::I32 | DType::I64 => Flavor::bits(dst.dtype),
        dtype => ctx.float(dtype)?,
    };
    let places = dst.shape[dim] as usize;
    // The lines: index's shape with dim's extent 1.
    let mut line_shape = index.shape.clone();
    let k_len = index.shape[dim] as usize;
    line_shape[dim] = 1;
    let lines = count / k_len;
    let layouts = joint_layouts(
        &line_shape,
        &[
            (dst.offset, &dst.strides),
            (index.offset, &index.strides),
            (src.offset, &src.strides),
        ],
    )?;
    // One line of indices expanded over the others (index_add's), or each
    // line its own.
    let expanded =
        (0..index.shape.len()).all(|d| d == dim || index.shape[d] == 1 || index.strides[d] == 0);
    let index_lines = if expanded { 1 } else { lines };
    // Keys (row << 32 | k) hold rows below 2^32 - 1 (~0 pads) and k below
    // 2^32.
    let fits = (index_lines as u64).saturating_mul(places as u64) < u64::from(u32::MAX)
        && k_len as u64 <= u64::from(u32::MAX);
    let walk = places <= WALK_MAX_PLACES && !(fits && always_sort());
    if !walk && !fits {
        return Err(Error::unimplemented(format!(
            "opencl: scatter_add: {index_lines} lines of indices into {places} places along \
             dimension {dim} of dst {:?}, {k_len} indices a line: past {WALK_MAX_PLACES} places \
             the sorted formulation takes at most 2^32 - 2 (lines times places) and 2^32 \
             indices a line",
            dst.shape
        )));
    }
    let status = check(&ctx, flavor, &index, places)?;
    if walk {
        ctx.launch(
            flavor,
            &for_index("pc_scatter_add", &index),
            &[lines],
            None,
            |a| {
                a.mem(dst.mem())?
                    .value(layouts[0])?
                    .value(dst.strides[dim])?
                    .value(places as i64)?
                    .mem(index.mem())?
                    .value(layouts[1])?
                    .value(index.strides[dim])?
                    .mem(src.mem())?
                    .value(layouts[2])?
                    .value(src.strides[dim])?
                    .value(k_len as i64)?
                    .value(count as i64)?
                    .mem(status.mem())?;
                Ok(())
            },
        )?;
    } else {
        let n = index_lines * k_len;
        let padded = padded_keys(&ctx, n);
        let keys = ctx.scratch(DType::I64, &[padded as i64])?;
        ctx.launch(
            flavor,
            &for_index("pc_scatter_keys", &index),
            &[padded],
            None,
            |a| {
                a.mem(index.mem())?
                    .value(layouts[1])?
                    .value(index.strides[dim])?
                    .value(k_len as i64)?
                    .value(places as i64)?
                    .value(n as i64)?
                    .mem(keys.mem())?;
                Ok(())
            },
        )?;
        sort_keys(&ctx, flavor, &keys, padded)?;
        let cols = lines / index_lines;
        ctx.launch(flavor, "pc_scatter_add_runs", &[cols, n], None, |a| {
            a.mem(dst.mem())?
                .value(layouts[0])?
                .value(dst.strides[dim])?
                .mem(src.mem())?
                .value(layouts[2])?
                .value(src.strides[dim])?
                .mem(keys.mem())?
                .value(n as i64)?
                .value(places as i64)?
                .value(cols as i64)?
                .value(count as i64)?
                .mem(status.mem())?;
            Ok(())
        })?;
    }
    refuse_bad(&ctx, &status, &index, "index", places, || {
        format!("(dimension {dim} of dst of shape {:?})", dst.shape)
    })?;
    ctx.finish()
}
