//! Cases added by mutation round 13 (2026-12-06): shapes whose two
//! readings a kernel can confuse, each of which let a realistic bug in
//! Ferrite, Cobalt or OpenCL pass every earlier case.
//!
//! - Square shapes where a kernel picks an axis by comparing extents: a
//!   linear bias added per row when the output has as many rows as
//!   columns, a norm's weight or bias per row, and a norm backward's
//!   parameter gradients summed along the rows when the input has as many
//!   rows as features (`[8, 8]`), and the backward of softmax and
//!   log_softmax summing down a column when there are as many rows as
//!   classes. Every earlier linear, norm and softmax-backward case had rows
//!   != columns.
//! - Square operands of matmul, both transposed, and a square linear
//!   weight: a kernel that infers a transpose from the operands' shapes
//!   skipped it, every earlier transposed operand being oblong.
//! - Batched matmul with beta neither 0 nor 1: beta applied once per call
//!   instead of once per matrix (only the first batch scaled, later ones
//!   accumulated with beta 1, or beta applied twice) passed, the one
//!   batched plan with beta having beta 1.
//! - `a` broadcast along an extent-1 dim against a full `b` (a column, a
//!   row, a middle dim of the same rank): a kernel that swaps its
//!   operands so that the broadcast one is second (sub and div reversed,
//!   add's alpha on the wrong operand) passed, no earlier case broadcasting
//!   `a` along its last dim.
//!
//! These cases are not bases of derived layouts (they come after the
//! derived cases and before the realistic ones).

use polychip_host::{BinaryOp, DType, MatmulOptions};

use super::nn::{layer_norm_backward_case, layer_norm_case, rms_norm_case, softmax_backward_case};
use super::{Rng, case, inout, input, numel, output, shape_label};
use crate::case::{Case, Layout};
use crate::reference::{self, Dense};
use crate::tolerance::{Bias, Tolerance};
use crate::values::round_to;

const C: Layout = Layout::Contiguous;

/// The round's cases of operator `op` in `dtype` (none for most operators).
pub(super) fn cases(op: &str, dtype: DType) -> Vec<Case> {
    match op {
        "add" => binary(BinaryOp::Add, dtype),
        "sub" => binary(BinaryOp::Sub, dtype),
        "mul" => binary(BinaryOp::Mul, dtype),
        "div" => binary(BinaryOp::Div, dtype),
        "matmul" => matmul(dtype),
        "linear" => linear(dtype),
        "rms_norm" | "layer_norm" | "rms_norm_backward" | "layer_norm_backward" => {
            square_norm(op, dtype)
        }
        "softmax_backward" => square_softmax_backward("softmax_backward", false, dtype),
        "log_softmax_backward" => square_softmax_backward("log_softmax_backward", true, dtype),
        _ => Vec::new(),
    }
}

/// The seed of the round's cases of `op` (apart from the operator's own).
fn rng(op: &str, dtype: DType) -> Rng {
    Rng::for_case(&format!("{op} round 13"), dtype)
}

/// `a` broadcast along an extent-1 dim of the same rank against a full `b`.
fn binary(op: BinaryOp, dtype: DType) -> Vec<Case> {
    // Floating dtypes only: an integer dtype's add has no fractional alpha,
    // and these values and tolerances are a float's.
    if !matches!(dtype, DType::F32 | DType::F16 | DType::BF16 | DType::F64) {
        return Vec::new();
    }
    let name = op.name();
    let mut rng = rng(name, dtype);
    let alpha = if matches!(op, BinaryOp::Add | BinaryOp::Sub) {
        0.5
    } else {
        1.0
    };
    let pairs: [(&[usize], &[usize]); 3] = [
        (&[5, 1], &[5, 6]),
        (&[1, 6], &[5, 6]),
        (&[2, 1, 4], &[2, 3, 4]),
    ];
    pairs
        .into_iter()
        .map(|(a_shape, b_shape)| {
            let out_shape = reference::broadcast_shapes(a_shape, b_shape).expect("they broadcast");
            let a = rng.values(dtype, numel(a_shape), -4.0, 4.0);
            let b: Vec<f64> = rng
                .values(dtype, numel(b_shape), 0.25, 4.0)
                .into_iter()
                .map(|v| if rng.below(2) == 0 { v } else { -v })
                .collect();
            case(
                name,
                dtype,
                format!(
                    "a {} broadcast against b {}",
                    shape_label(a_shape, C),
                    shape_label(b_shape, C)
                ),
                vec![
                    input("a", dtype, a_shape, a, C),
                    input("b", dtype, b_shape, b, C),
                    output("out", dtype, &out_shape, C),
                ],
                // As the operator's own cases: one correctly rounded
                // operation (alpha is 0.5 or 1), rounded once more.
                Tolerance::computed(1.0).with_bias(Bias::Always),
                move |exec, t| exec.binary(op, &t[0], &t[1], &t[2], alpha),
                move |d| {
                    let r = match op {
                        BinaryOp::Add => reference::add(&d[0], &d[1], alpha),
                        BinaryOp::Sub => reference::sub(&d[0], &d[1], alpha),
                        BinaryOp::Mul => reference::mul(&d[0], &d[1], alpha),
                        BinaryOp::Div => reference::div(&d[0], &d[1], alpha),
                    };
                    Ok(vec![r?])
                },
            )
        })
        .collect()
}

/// (batch, m, k, n, both operands transposed, alpha, beta).
type MatmulPlan = (&'static [usize], usize, usize, usize, bool, f64, f64);

/// Two products whose readings a kernel can confuse: a batch of three
/// accumulating into `out` with beta 0.5 and alpha 1.5 (each matrix of
/// `out` scaled by beta exactly once), and square operands both
/// transposed (`[5, 5]^T @ [5, 5]^T`: a kernel that infers a transpose from
/// the shapes, as already fitting `[M, K]` and `[K, N]`, skips it).
fn matmul(dtype: DType) -> Vec<Case> {
    let mut rng = rng("matmul", dtype);
    let plans: [MatmulPlan; 2] = [
        (&[3], 4, 6, 5, false, 1.5, 0.5),
        (&[], 5, 5, 5, true, 1.0, 0.0),
    ];
    plans
        .into_iter()
        .map(|(batch, m, k, n, t, alpha, beta)| {
            let a_shape: Vec<usize> = batch.iter().copied().chain([m, k]).collect();
            let b_shape: Vec<usize> = batch.iter().copied().chain([k, n]).collect();
            let out_shape: Vec<usize> = batch.iter().copied().chain([m, n]).collect();
            let a = rng.values(dtype, numel(&a_shape), -2.0, 2.0);
            let b = rng.values(dtype, numel(&b_shape), -2.0, 2.0);
            let out = if beta == 0.0 {
                output("out", dtype, &out_shape, C)
            } else {
                let values = rng.values(dtype, numel(&out_shape), -1.0, 1.0);
                inout("out", dtype, &out_shape, values, C)
            };
            let options = MatmulOptions {
                transpose_a: t,
                transpose_b: t,
                alpha,
                beta,
            };
            let label = if beta != 0.0 {
                format!(
                    "a {a_shape:?} b {b_shape:?} alpha {alpha} beta {beta}, every batch accumulating"
                )
            } else {
                format!("a {a_shape:?} b {b_shape:?} ta {t} tb {t}, square operands transposed")
            };
            case(
                "matmul",
                dtype,
                label,
                vec![
                    input("a", dtype, &a_shape, a, C),
                    input("b", dtype, &b_shape, b, C),
                    out,
                ],
                // As the operator's own cases: a dot product over K, then
                // alpha and beta * out, rounded once.
                Tolerance::accumulated(0.0, k + 2),
                move |exec, t| exec.matmul(&t[0], &t[1], &t[2], options),
                move |d| Ok(vec![reference::matmul(&d[0], &d[1], &d[2], t, t, alpha, beta)?]),
            )
        })
        .collect()
}

/// Linear layers whose shapes a kernel can misread: as many rows as output
/// features (`[6, 16]` by a `[6, 16]` weight: the bias belongs to the
/// columns), and a square weight (`[8, 8]`: read as `[K, N]` it is its own
/// transpose's shape).
fn linear(dtype: DType) -> Vec<Case> {
    let mut rng = rng("linear", dtype);
    [(6, 16, 6), (4, 8, 8)]
        .into_iter()
        .map(|(m, k, n)| {
            let x = rng.values(dtype, m * k, -2.0, 2.0);
            let w = rng.values(dtype, n * k, -1.0, 1.0);
            let b = rng.values(dtype, n, -1.0, 1.0);
            let what = if m == n {
                "as many rows as output features"
            } else {
                "a square weight"
            };
            case(
                "linear",
                dtype,
                format!("[{m}, {k}] N {n} bias, {what}"),
                vec![
                    input("input", dtype, &[m, k], x, C),
                    input("weight", dtype, &[n, k], w, C),
                    input("bias", dtype, &[n], b, C),
                    output("out", dtype, &[m, n], C),
                ],
                // As the operator's own cases: a dot product over K and the
                // bias.
                Tolerance::accumulated(0.0, k + 1),
                |exec, t| exec.linear(&t[0], &t[1], Some(&t[2]), &t[3]),
                |d| Ok(vec![reference::linear(&d[0], &d[1], Some(&d[2]))?]),
            )
        })
        .collect()
}

/// A norm, forward or backward, over `[8, 8]`: as many rows as features.
fn square_norm(op: &str, dtype: DType) -> Vec<Case> {
    let mut rng = rng(op, dtype);
    let shape: &[usize] = &[8, 8];
    let (h, n) = (8, 64);
    let label = String::from("[8, 8], as many rows as features");
    let x = rng.values(dtype, n, -2.0, 2.0);
    let w = rng.values(dtype, h, 0.5, 1.5);
    let b = rng.values(dtype, h, -0.5, 0.5);
    let g = rng.values(dtype, n, -1.0, 1.0);
    let layouts = (C, C, C);
    vec![match op {
        "rms_norm" => rms_norm_case(dtype, label, shape, x, w, 1e-6, layouts),
        "layer_norm" => layer_norm_case(dtype, label, shape, x, w, b, 1e-5, layouts),
        "layer_norm_backward" => {
            layer_norm_backward_case(dtype, label, shape, layouts, 1e-5, [x, w, b, g])
        }
        _ => rms_norm_backward_case(dtype, label, shape, x, w, g),
    }]
}

/// The backward of softmax or log_softmax over `[8, 8]` (as many rows as
/// classes): the row's `sum(g y)` (or `sum(g)`) is a sum along the row.
fn square_softmax_backward(op: &'static str, log: bool, dtype: DType) -> Vec<Case> {
    let mut rng = rng(op, dtype);
    let shape: &[usize] = &[8, 8];
    let logits = Dense::new(shape, rng.values(DType::F64, 64, -4.0, 4.0));
    let forward = if log {
        reference::log_softmax(&logits)
    } else {
        reference::softmax(&logits)
    }
    .expect("row-wise shapes are valid");
    let y: Vec<f64> = forward.data.iter().map(|&v| round_to(dtype, v)).collect();
    let g = rng.values(dtype, 64, -1.0, 1.0);
    let label = String::from("[8, 8], as many rows as classes");
    vec![softmax_backward_case(
        op, log, dtype, label, shape, y, g, [C; 3],
    )]
}

/// An `rms_norm_backward` case with the `inv_rms` a forward pass with eps
/// 1e-6 saved (as the operator's own cases).
fn rms_norm_backward_case(
    dtype: DType,
    label: String,
    shape: &[usize],
    x: Vec<f64>,
    w: Vec<f64>,
    g: Vec<f64>,
) -> Case {
    let h = *shape.last().expect("rank >= 1");
    let stats = &shape[..shape.len() - 1];
    let rows = numel(stats);
    let (_, inv_rms) = reference::rms_norm(
        &Dense::new(shape, x.clone()),
        &Dense::new(&[h], w.clone()),
        1e-6,
    )
    .expect("valid shapes");
    let inv_rms: Vec<f64> = inv_rms
        .data
        .iter()
        .map(|&v| round_to(DType::F32, v))
        .collect();
    case(
        "rms_norm_backward",
        dtype,
        label,
        vec![
            input("grad_out", dtype, shape, g, C),
            input("input", dtype, shape, x, C),
            input("weight", dtype, &[h], w, C),
            input("inv_rms", DType::F32, stats, inv_rms, C),
            output("grad_input", dtype, shape, C),
            output("grad_weight", dtype, &[h], C),
        ],
        // As the operator's own cases: grad_input sums over the row,
        // grad_weight over the rows.
        Tolerance::accumulated(8.0, h + rows),
        |exec, t| exec.rms_norm_backward(&t[0], &t[1], &t[2], &t[3], &t[4], &t[5]),
        |d| {
            let (gi, gw) = reference::rms_norm_backward(&d[0], &d[1], &d[2], &d[3])?;
            Ok(vec![gi, gw])
        },
    )
}
