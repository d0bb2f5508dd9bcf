//! The planted bugs of mutation round 16: kernels that reach only the
//! first 65,535 lines of their output, as one launched with a block row
//! per line in a GPU grid's second dimension (at most 65,535 blocks) does
//! (PaddlePaddle/Paddle#43722, a cumsum silently wrong past it). The
//! correct kernel runs, and the elements of the lines past the limit get
//! back what the output held before the call: what a kernel that never
//! reaches them leaves there.
//!
//! # Safety
//! Every function here takes views that address live host memory of their
//! dtype, as the SDK checked them.
#![allow(clippy::missing_safety_doc)]

use ferrite_kernels::View;

use super::elems::addresses;

/// How many lines a grid's second dimension reaches.
pub const GRID_ROWS: usize = 65_535;

/// The elements of `out` (address and bytes) whose line, `line_of` of the
/// element's row-major index, is past [`GRID_ROWS`].
pub unsafe fn past_grid(
    out: &View<'_>,
    line_of: impl Fn(usize) -> usize,
) -> Vec<(*mut u8, Vec<u8>)> {
    let size = out.dtype.size();
    addresses(out)
        .into_iter()
        .enumerate()
        .filter(|&(p, _)| line_of(p) >= GRID_ROWS)
        // SAFETY: addresses of live elements of `size` bytes.
        .map(|(_, q)| (q, unsafe { std::slice::from_raw_parts(q, size) }.to_vec()))
        .collect()
}

/// Writes back what [`past_grid`] saved.
pub unsafe fn restore(saved: Vec<(*mut u8, Vec<u8>)>) {
    for (q, bytes) in saved {
        // SAFETY: the live elements `past_grid` read.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), q, bytes.len()) };
    }
}
