//! Cases added by mutation round 16 (2026-12-06), whose mutants imitate
//! bugs that real kernels shipped with and their projects fixed (the
//! reports are listed in docs/conformance.md, "Round 16"). One class got
//! past every earlier case: more rows (lines, outputs, ids) than a GPU
//! grid's second dimension holds, 65,535. A kernel that launches one block
//! row per line there, or clamps its launch to that many work-groups
//! (PaddlePaddle/Paddle#43722: cumsum silently wrong past it), leaves the
//! rest unwritten or unread; every earlier case had at most a few thousand
//! lines (the realistic ones are long, not many). Here 65,600 lines of 2
//! elements for `cumsum`, `softmax`, `log_softmax`, the reductions,
//! `embedding` and `cross_entropy`, each in f32 (and i64 for `cumsum`): the count of lines
//! is what matters, not the dtype, and each case is small (131,200
//! elements).
//!
//! These cases are not bases of derived layouts (they come after the
//! derived cases and rounds 13's to 15's, before the realistic ones).

use polychip_host::{DType, ReduceOp};

use super::basic::softmax_case;
use super::data_1_4::cumsum_case;
use super::elementwise::reduce_case;
use super::nn::log_softmax_case;
use super::training::{cross_entropy_call, embedding_call};
use super::{input, output};
use crate::case::{Case, Layout, Resize};
use crate::tolerance::Tolerance;

const C: Layout = Layout::Contiguous;

/// More lines than a grid's second dimension holds (65,535 blocks).
const LINES: usize = 65_600;

/// A family of cases by their count of lines (`p[0]`).
type Build = fn(DType, &[usize]) -> Case;

/// The round's cases of operator `op` in `dtype` (none for most operators):
/// one of 65,600 lines, in f32 (and i64 for `cumsum`).
pub(super) fn cases(op: &str, dtype: DType) -> Vec<Case> {
    let build: Build = match op {
        "cumsum" if matches!(dtype, DType::F32 | DType::I64) => cumsum_lines,
        _ if dtype != DType::F32 => return Vec::new(),
        "softmax" => |d, p| softmax_rows(false, d, p),
        "log_softmax" => |d, p| softmax_rows(true, d, p),
        "sum" => |d, p| reduce_lines(ReduceOp::Sum, d, p),
        "mean" => |d, p| reduce_lines(ReduceOp::Mean, d, p),
        "max" => |d, p| reduce_lines(ReduceOp::Max, d, p),
        "argmax" => |d, p| reduce_lines(ReduceOp::Argmax, d, p),
        "embedding" => embedding_ids,
        "cross_entropy" => cross_entropy_rows,
        _ => return Vec::new(),
    };
    // Sized, so that the shrinker can report the smallest count of lines
    // that still fails (and the suite's check of small cases skips them).
    let mut case = build(dtype, &[LINES]);
    case.resize = Some(Resize {
        build,
        params: vec![LINES],
    });
    vec![case]
}

/// Small integers, so that every sum is exact; distinct along a line of 2
/// (so the maximum and its index are one element).
fn line_values(lines: usize) -> Vec<f64> {
    (0..2 * lines)
        .map(|k| ((k * 7) % 11) as f64 - 5.0)
        .collect()
}

/// `cumsum` along dim 1 of `[lines, 2]` (PaddlePaddle/Paddle#43722).
fn cumsum_lines(dtype: DType, p: &[usize]) -> Case {
    let lines = p[0];
    cumsum_case(
        dtype,
        format!("[{lines}, 2] dim 1: more lines than 65,535"),
        input("input", dtype, &[lines, 2], line_values(lines), C),
        1,
        Tolerance::EXACT,
    )
}

/// `softmax` (`log` false) or `log_softmax` of `[lines, 2]`.
fn softmax_rows(log: bool, dtype: DType, p: &[usize]) -> Case {
    let lines = p[0];
    let (label, shape, x) = (
        format!("[{lines}, 2]: more rows than 65,535"),
        [lines, 2],
        line_values(lines),
    );
    if log {
        log_softmax_case(dtype, label, &shape, x, [C, C], 2)
    } else {
        softmax_case(dtype, label, &shape, x, C)
    }
}

/// `sum`, `mean`, `max` or `argmax` along dim 1 of `[lines, 2]`: one
/// output per line.
fn reduce_lines(op: ReduceOp, dtype: DType, p: &[usize]) -> Case {
    let lines = p[0];
    reduce_case(
        op,
        dtype,
        format!("[{lines}, 2] dim 1: more outputs than 65,535"),
        &[lines, 2],
        line_values(lines),
        1,
        false,
        C,
    )
}

/// `embedding` of `lines` ids from a `[7, 2]` table.
fn embedding_ids(dtype: DType, p: &[usize]) -> Case {
    let (lines, vocab, h) = (p[0], 7, 2);
    let table: Vec<f64> = (0..vocab * h).map(|k| k as f64 - 6.5).collect();
    let idx: Vec<f64> = (0..lines).map(|k| ((k * 3) % vocab) as f64).collect();
    embedding_call(
        dtype,
        format!("{lines} i64 ids from [{vocab}, {h}]: more rows than 65,535"),
        [
            input("weight", dtype, &[vocab, h], table, C),
            input("indices", DType::I64, &[lines], idx, C),
            output("out", dtype, &[lines, h], C),
        ],
    )
}

/// `cross_entropy` of `[lines, 2]` whose loss sits in the rows past 65,535
/// (1000 each; about 1e-13 before them; the last row when there are
/// fewer): a kernel that drops those rows' losses brings the mean from
/// about 1 to about 0.
fn cross_entropy_rows(dtype: DType, p: &[usize]) -> Case {
    let lines = p[0];
    // The rows that hold the loss, at the end.
    let tail = lines.saturating_sub(65_535).max(1);
    let loud = |r: usize| r + tail >= lines;
    let logits: Vec<f64> = (0..lines)
        .flat_map(|r| {
            if loud(r) {
                [0.0, -1000.0]
            } else {
                [0.0, -30.0]
            }
        })
        .collect();
    let targets: Vec<f64> = (0..lines)
        .map(|r| if loud(r) { 1.0 } else { 0.0 })
        .collect();
    cross_entropy_call(
        dtype,
        format!("[{lines}, 2] i64: more rows than 65,535, the loss in the last {tail}"),
        [
            input("logits", dtype, &[lines, 2], logits, C),
            input("targets", DType::I64, &[lines], targets, C),
            output("loss", DType::F32, &[], C),
        ],
        -100,
        0,
    )
}
