//! Cases added by mutation round 16 (2026-12-06), whose mutants imitate
//! bugs that real kernels shipped with and their projects fixed (the
//! reports are listed in docs/conformance.md, "Round 16"). One class got
//! past every earlier case: more rows (lines, outputs, ids) than a GPU
//! grid's second dimension holds, 65,535. A kernel that launches one block
//! row per line there, or clamps its launch to that many work-groups
//! (PaddlePaddle/Paddle#43722: cumsum silently wrong past it), leaves the
//! rest unwritten or unread; every earlier case had at most a few thousand
//! lines (the realistic ones are long, not many). Here 65,600 lines of 2
//! elements for `cumsum`, `softmax`, the reductions, `embedding` and
//! `cross_entropy`, each in f32 (and i64 for `cumsum`): the count of lines
//! is what matters, not the dtype, and each case is small (131,200
//! elements).
//!
//! These cases are not bases of derived layouts (they come after the
//! derived cases and rounds 13's to 15's, before the realistic ones).

use polychip_host::{DType, ReduceOp};

use super::basic::softmax_case;
use super::data_1_4::cumsum_case;
use super::elementwise::reduce_case;
use super::training::{cross_entropy_call, embedding_call};
use super::{input, output};
use crate::case::{Case, Layout};
use crate::tolerance::Tolerance;

const C: Layout = Layout::Contiguous;

/// The round's cases of operator `op` in `dtype` (none for most operators).
pub(super) fn cases(op: &str, dtype: DType) -> Vec<Case> {
    match op {
        "cumsum" => cumsum_many_lines(dtype),
        "softmax" => softmax_many_rows(dtype),
        "sum" => reduce_many_lines(ReduceOp::Sum, dtype),
        "mean" => reduce_many_lines(ReduceOp::Mean, dtype),
        "max" => reduce_many_lines(ReduceOp::Max, dtype),
        "argmax" => reduce_many_lines(ReduceOp::Argmax, dtype),
        "embedding" => embedding_many_ids(dtype),
        "cross_entropy" => cross_entropy_many_rows(dtype),
        _ => Vec::new(),
    }
}

/// `cumsum` along dim 1 of `[65_600, 2]`: more lines than a GPU grid's
/// second dimension holds (65,535); a kernel that launches one block row
/// per line in that dimension leaves the rest unwritten
/// (PaddlePaddle/Paddle#43722). f32 and i64 only (the lines' count is
/// what matters, not the dtype). Values small integers, so every sum is
/// exact.
fn cumsum_many_lines(dtype: DType) -> Vec<Case> {
    if !matches!(dtype, DType::F32 | DType::I64) {
        return Vec::new();
    }
    vec![cumsum_case(
        dtype,
        format!("[{LINES}, 2] dim 1: more lines than 65,535"),
        input("input", dtype, &[LINES, 2], line_values(), C),
        1,
        Tolerance::EXACT,
    )]
}

/// More lines than a grid's second dimension holds (65,535 blocks).
const LINES: usize = 65_600;

/// Small integers, so that every sum is exact; distinct along a line of 2
/// (so the maximum and its index are one element).
fn line_values() -> Vec<f64> {
    (0..2 * LINES)
        .map(|k| ((k * 7) % 11) as f64 - 5.0)
        .collect()
}

/// `softmax` of `[65_600, 2]`: a kernel that launches one block row per
/// row in a grid's second dimension leaves the rows past 65,535 unwritten.
/// f32 only (the count of rows is what matters).
fn softmax_many_rows(dtype: DType) -> Vec<Case> {
    if dtype != DType::F32 {
        return Vec::new();
    }
    vec![softmax_case(
        dtype,
        format!("[{LINES}, 2]: more rows than 65,535"),
        &[LINES, 2],
        line_values(),
        C,
    )]
}

/// `sum`, `mean`, `max` and `argmax` along dim 1 of `[65_600, 2]`: 65,600
/// outputs, past the rows of a grid's second dimension. f32 only.
fn reduce_many_lines(op: ReduceOp, dtype: DType) -> Vec<Case> {
    if dtype != DType::F32 {
        return Vec::new();
    }
    vec![reduce_case(
        op,
        dtype,
        format!("[{LINES}, 2] dim 1: more outputs than 65,535"),
        &[LINES, 2],
        line_values(),
        1,
        false,
        C,
    )]
}

/// `embedding` of 65,600 ids from a `[7, 2]` table: a kernel with one block
/// row per id in a grid's second dimension leaves the rows past 65,535
/// unwritten. f32 only.
fn embedding_many_ids(dtype: DType) -> Vec<Case> {
    if dtype != DType::F32 {
        return Vec::new();
    }
    let (vocab, h) = (7, 2);
    let table: Vec<f64> = (0..vocab * h).map(|k| k as f64 - 6.5).collect();
    let idx: Vec<f64> = (0..LINES).map(|k| ((k * 3) % vocab) as f64).collect();
    vec![embedding_call(
        dtype,
        format!("{LINES} i64 ids from [{vocab}, {h}]: more rows than 65,535"),
        [
            input("weight", dtype, &[vocab, h], table, C),
            input("indices", DType::I64, &[LINES], idx, C),
            output("out", dtype, &[LINES, h], C),
        ],
    )]
}

/// `cross_entropy` of `[65_600, 2]` whose loss sits in the last 65 rows
/// (1000 each; about 1e-13 before them): a kernel with one work-group per
/// row in a grid's second dimension, or launched over at most 65,535 of
/// them, drops those rows' losses and the mean falls from about 1 to 0.
/// f32 only.
fn cross_entropy_many_rows(dtype: DType) -> Vec<Case> {
    if dtype != DType::F32 {
        return Vec::new();
    }
    let tail = LINES - 65_535;
    let logits: Vec<f64> = (0..LINES)
        .flat_map(|r| {
            if r < LINES - tail {
                [0.0, -30.0]
            } else {
                [0.0, -1000.0]
            }
        })
        .collect();
    let targets: Vec<f64> = (0..LINES)
        .map(|r| if r < LINES - tail { 0.0 } else { 1.0 })
        .collect();
    vec![cross_entropy_call(
        dtype,
        format!("[{LINES}, 2] i64: more rows than 65,535, the loss in the last {tail}"),
        [
            input("logits", dtype, &[LINES, 2], logits, C),
            input("targets", DType::I64, &[LINES], targets, C),
            output("loss", DType::F32, &[], C),
        ],
        -100,
        0,
    )]
}
