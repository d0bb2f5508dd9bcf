//! Cases of the ABI 1.1 layer operators: softmax's relatives, RMSNorm,
//! LayerNorm, rotary embeddings and attention, forward and backward.
//!
//! The backward operators get inputs that the forward pass could have
//! produced: the reference forward of random inputs, rounded to the dtype the
//! plugin would have stored them in (the case dtype for outputs, f32 for
//! statistics), so that the saved tensors are consistent with the others.

use polychip_host::DType;

use super::{FLOATS3, OpInfo, Rng, case, input, numel, output, shape_label};
use crate::case::{Case, Layout, TensorSpec};
use crate::reference::{self, Dense};
use crate::tolerance::Tolerance;
use crate::values::round_to;

const C: Layout = Layout::Contiguous;
const T: Layout = Layout::Transposed;
const S: Layout = Layout::Strided;

pub(super) fn ops() -> Vec<OpInfo> {
    vec![
        OpInfo {
            name: "softmax_backward",
            dtypes: FLOATS3,
            cases: softmax_backward_cases,
        },
        OpInfo {
            name: "log_softmax",
            dtypes: FLOATS3,
            cases: log_softmax_cases,
        },
        OpInfo {
            name: "log_softmax_backward",
            dtypes: FLOATS3,
            cases: log_softmax_backward_cases,
        },
        OpInfo {
            name: "rms_norm",
            dtypes: FLOATS3,
            cases: rms_norm_cases,
        },
        OpInfo {
            name: "rms_norm_backward",
            dtypes: FLOATS3,
            cases: rms_norm_backward_cases,
        },
        OpInfo {
            name: "layer_norm",
            dtypes: FLOATS3,
            cases: layer_norm_cases,
        },
        OpInfo {
            name: "layer_norm_backward",
            dtypes: FLOATS3,
            cases: layer_norm_backward_cases,
        },
        OpInfo {
            name: "rope",
            dtypes: FLOATS3,
            cases: rope_cases,
        },
        OpInfo {
            name: "rope_backward",
            dtypes: FLOATS3,
            cases: rope_backward_cases,
        },
        OpInfo {
            name: "attention",
            dtypes: FLOATS3,
            cases: attention_cases,
        },
        OpInfo {
            name: "attention_backward",
            dtypes: FLOATS3,
            cases: attention_backward_cases,
        },
    ]
}

/// `[3, 7] out transposed grad_in strided`: the shape, then every tensor
/// that is not contiguous.
fn label(shape: &[usize], layouts: &[(&str, Layout)]) -> String {
    let mut s = shape_label(shape, C);
    for (name, layout) in layouts {
        if *layout != C {
            s.push_str(&format!(" {name} {layout}"));
        }
    }
    s
}

/// The values of `d` rounded to `dtype`, as a plugin would have stored them.
fn stored(dtype: DType, d: &Dense) -> Vec<f64> {
    d.data.iter().map(|&v| round_to(dtype, v)).collect()
}

/// The last extent (the row length of the row-wise operators).
fn last(shape: &[usize]) -> usize {
    shape.last().copied().unwrap_or(1)
}

/// The number of rows (product of the leading extents).
fn rows(shape: &[usize]) -> usize {
    numel(&shape[..shape.len().saturating_sub(1)])
}

// ---------------------------------------------------------------------------
// Softmax's relatives.

/// Row-wise shapes with the layouts of (first input, second input, output).
const ROW_PLANS: [(&[usize], Layout, Layout, Layout); 8] = [
    (&[5], C, C, C),
    (&[1, 1], C, C, C),
    (&[3, 7], T, C, C),
    (&[2, 3, 17], C, C, C),
    (&[4, 1000], C, C, C),
    (&[6, 9], C, S, S),
    (&[5, 12], S, T, T),
    (&[0, 8], C, C, C),
];

/// `softmax_backward` or `log_softmax_backward` (`log`), whose `out` is the
/// forward output of random logits, rounded to the dtype.
fn softmax_family_backward(op: &'static str, log: bool, dtype: DType) -> Vec<Case> {
    let mut rng = Rng::for_case(op, dtype);
    let forward = |x: &Dense| {
        let y = if log {
            reference::log_softmax(x)
        } else {
            reference::softmax(x)
        };
        y.expect("row-wise shapes are valid")
    };
    let mut cases = Vec::new();
    let mut push =
        |label: String, shape: &[usize], logits: Vec<f64>, g: Vec<f64>, l: [Layout; 3]| {
            let y = stored(dtype, &forward(&Dense::new(shape, logits)));
            let n = last(shape);
            cases.push(case(
                op,
                dtype,
                label,
                vec![
                    input("out", dtype, shape, y, l[0]),
                    input("grad_out", dtype, shape, g, l[1]),
                    output("grad_in", dtype, shape, l[2]),
                ],
                // A dot product (or sum) over the row, then a few roundings.
                Tolerance::sum(8.0, n),
                move |exec, t| exec.softmax_backward(log, &t[0], &t[1], &t[2]),
                move |d| {
                    let r = if log {
                        reference::log_softmax_backward(&d[0], &d[1])
                    } else {
                        reference::softmax_backward(&d[0], &d[1])
                    };
                    Ok(vec![r?])
                },
            ));
        };
    for (shape, l0, l1, l2) in ROW_PLANS {
        let n = numel(shape);
        let logits = rng.values(DType::F64, n, -4.0, 4.0);
        let g = rng.values(dtype, n, -1.0, 1.0);
        let name = label(shape, &[("out", l0), ("grad_out", l1), ("grad_in", l2)]);
        push(name, shape, logits, g, [l0, l1, l2]);
    }
    // Masked logits: probability 0 (log-probability -inf), whose gradient
    // is 0 (softmax) or grad_out itself (log_softmax).
    let shape = [4, 6];
    let mut logits = rng.values(DType::F64, 24, -4.0, 4.0);
    for i in [1, 4, 7, 8, 15, 23] {
        logits[i] = f64::NEG_INFINITY;
    }
    let g = rng.values(dtype, 24, -1.0, 1.0);
    push("masked logits (-inf)".into(), &shape, logits, g, [C; 3]);
    cases
}

fn softmax_backward_cases(dtype: DType) -> Vec<Case> {
    softmax_family_backward("softmax_backward", false, dtype)
}

fn log_softmax_backward_cases(dtype: DType) -> Vec<Case> {
    softmax_family_backward("log_softmax_backward", true, dtype)
}

fn log_softmax_cases(dtype: DType) -> Vec<Case> {
    let mut rng = Rng::for_case("log_softmax", dtype);
    let mut cases = Vec::new();
    let mut push = |label: String, shape: &[usize], x: Vec<f64>, l: [Layout; 2], n: usize| {
        cases.push(case(
            "log_softmax",
            dtype,
            label,
            vec![
                input("input", dtype, shape, x, l[0]),
                output("out", dtype, shape, l[1]),
            ],
            Tolerance::sum(8.0, n),
            |exec, t| exec.log_softmax(&t[0], &t[1]),
            |d| Ok(vec![reference::log_softmax(&d[0])?]),
        ));
    };
    for (shape, l0, _, l2) in ROW_PLANS {
        let x = rng.values(dtype, numel(shape), -8.0, 8.0);
        let name = label(shape, &[("input", l0), ("out", l2)]);
        push(name, shape, x, [l0, l2], last(shape));
    }
    // Logits near 1000 overflow exp unless the row maximum is subtracted; a
    // -inf logit has log-probability -inf; a row of -inf is NaN. The result
    // of a logit near 1000 is only known to an ULP of 1000 in f32 (the
    // problem's condition number is |x| / |out|), so a backward-stable f32
    // kernel such as `x - (max + log(sum))` is off by up to 1000 u(f32):
    // 500 more terms of accumulation.
    let inf = f64::NEG_INFINITY;
    let x = vec![
        1000.0, 1002.0, 1004.0, 996.0, //
        inf, 0.0, 1.0, 2.0, //
        inf, inf, inf, inf,
    ];
    push(
        "large logits, -inf, an all -inf row".into(),
        &[3, 4],
        x,
        [C, C],
        4 + 500,
    );
    cases
}

// ---------------------------------------------------------------------------
// RMSNorm and LayerNorm.

/// Normalisation shapes with the layouts of (input, parameters, outputs).
const NORM_PLANS: [(&[usize], Layout, Layout, Layout); 9] = [
    (&[64], C, C, C),
    (&[3, 1], C, C, C),
    (&[1, 1, 16], C, C, C),
    (&[4, 32], T, C, C),
    (&[2, 3, 48], C, C, C),
    (&[4, 1000], C, C, C),
    (&[5, 24], S, S, C),
    (&[6, 20], C, C, S),
    (&[0, 8], C, C, C),
];

/// The label of a normalisation case; `backward` names the tensors that
/// share each layout in the backward operators.
fn norm_label(shape: &[usize], l: (Layout, Layout, Layout), backward: bool) -> String {
    let names = if backward {
        ["input and grad_out", "weight and statistics", "gradients"]
    } else {
        ["input", "params", "outputs"]
    };
    label(shape, &[(names[0], l.0), (names[1], l.1), (names[2], l.2)])
}

fn rms_norm_case(
    dtype: DType,
    label: String,
    shape: &[usize],
    x: Vec<f64>,
    w: Vec<f64>,
    eps: f64,
    l: (Layout, Layout, Layout),
) -> Case {
    let h = last(shape);
    let stats = &shape[..shape.len() - 1];
    case(
        "rms_norm",
        dtype,
        label,
        vec![
            input("input", dtype, shape, x, l.0),
            input("weight", dtype, &[h], w, l.1),
            output("out", dtype, shape, l.2),
            output("inv_rms", DType::F32, stats, l.2),
        ],
        Tolerance::sum(8.0, h),
        move |exec, t| exec.rms_norm(&t[0], &t[1], &t[2], &t[3], eps),
        move |d| {
            let (out, inv_rms) = reference::rms_norm(&d[0], &d[1], eps)?;
            Ok(vec![out, inv_rms])
        },
    )
}

fn rms_norm_cases(dtype: DType) -> Vec<Case> {
    let mut rng = Rng::for_case("rms_norm", dtype);
    let mut cases = Vec::new();
    for (shape, l0, l1, l2) in NORM_PLANS {
        let x = rng.values(dtype, numel(shape), -2.0, 2.0);
        let w = rng.values(dtype, last(shape), 0.5, 1.5);
        let name = norm_label(shape, (l0, l1, l2), false);
        cases.push(rms_norm_case(dtype, name, shape, x, w, 1e-6, (l0, l1, l2)));
    }
    // eps must be used: a large one changes every value; a row of zeros
    // has inv_rms = 1 / sqrt(eps) and an output of zeros.
    let shape = [4, 16];
    let mut x = rng.values(dtype, 64, -0.5, 0.5);
    x[16..32].fill(0.0);
    let w = rng.values(dtype, 16, -1.5, 1.5);
    cases.push(rms_norm_case(
        dtype,
        "[4, 16] eps 0.1, a row of zeros".into(),
        &shape,
        x.clone(),
        w.clone(),
        0.1,
        (C, C, C),
    ));
    cases.push(rms_norm_case(
        dtype,
        "[4, 16] eps 1e-6, a row of zeros".into(),
        &shape,
        x,
        w,
        1e-6,
        (C, C, C),
    ));
    cases
}

fn rms_norm_backward_cases(dtype: DType) -> Vec<Case> {
    let mut rng = Rng::for_case("rms_norm_backward", dtype);
    let mut cases = Vec::new();
    for (shape, l0, l1, l2) in NORM_PLANS {
        let (h, n) = (last(shape), numel(shape));
        let stats = &shape[..shape.len() - 1];
        // With H = 1 the gradient is r g w (1 - x^2 r^2) = r^3 g w eps: for
        // a small eps it cancels to almost nothing, and any f32 kernel is
        // off by about u(f32) |r g w| there, far more than the result (an
        // ill-conditioned case, not a tolerance matter). The statistics of
        // a forward pass with eps 1 keep it well-conditioned.
        let eps = if h == 1 { 1.0 } else { 1e-6 };
        let mut name = norm_label(shape, (l0, l1, l2), true);
        if h == 1 {
            name.push_str(" eps 1");
        }
        let x = rng.values(dtype, n, -2.0, 2.0);
        let w = rng.values(dtype, h, 0.5, 1.5);
        let g = rng.values(dtype, n, -1.0, 1.0);
        let (_, inv_rms) = reference::rms_norm(
            &Dense::new(shape, x.clone()),
            &Dense::new(&[h], w.clone()),
            eps,
        )
        .expect("valid shapes");
        cases.push(case(
            "rms_norm_backward",
            dtype,
            name,
            vec![
                input("grad_out", dtype, shape, g, l0),
                input("input", dtype, shape, x, l0),
                input("weight", dtype, &[h], w, l1),
                input(
                    "inv_rms",
                    DType::F32,
                    stats,
                    stored(DType::F32, &inv_rms),
                    l1,
                ),
                output("grad_input", dtype, shape, l2),
                output("grad_weight", dtype, &[h], l2),
            ],
            // grad_input sums over the row, grad_weight over the rows.
            Tolerance::sum(8.0, h + rows(shape)),
            |exec, t| exec.rms_norm_backward(&t[0], &t[1], &t[2], &t[3], &t[4], &t[5]),
            |d| {
                let (gi, gw) = reference::rms_norm_backward(&d[0], &d[1], &d[2], &d[3])?;
                Ok(vec![gi, gw])
            },
        ));
    }
    cases
}

#[allow(clippy::too_many_arguments)]
fn layer_norm_case(
    dtype: DType,
    label: String,
    shape: &[usize],
    x: Vec<f64>,
    w: Vec<f64>,
    b: Vec<f64>,
    eps: f64,
    l: (Layout, Layout, Layout),
) -> Case {
    let h = last(shape);
    let stats = &shape[..shape.len() - 1];
    // A row's mean is known to within about h u(f32) |mean| after an f32
    // sum (half an ULP of |mean| at best), and every output moves by that
    // error times rstd: subtracting the mean has the condition number
    // |mean| rstd, which multiplies the accumulation (1 for rows centred
    // on 0, about 2 for the usual cases here, hundreds for rows far from 0).
    let xr: Vec<f64> = x.iter().map(|&v| round_to(dtype, v)).collect();
    let (_, mean, rstd) = reference::layer_norm(
        &Dense::new(shape, xr),
        &Dense::new(&[h], w.clone()),
        &Dense::new(&[h], b.clone()),
        eps,
    )
    .expect("valid shapes");
    let cond = mean
        .data
        .iter()
        .zip(&rstd.data)
        .map(|(m, r)| (m * r).abs())
        .fold(0.0, f64::max);
    case(
        "layer_norm",
        dtype,
        label,
        vec![
            input("input", dtype, shape, x, l.0),
            input("weight", dtype, &[h], w, l.1),
            input("bias", dtype, &[h], b, l.1),
            output("out", dtype, shape, l.2),
            output("mean", DType::F32, stats, l.2),
            output("rstd", DType::F32, stats, l.2),
        ],
        Tolerance::sum(8.0, h * (1 + cond.ceil() as usize)),
        move |exec, t| exec.layer_norm(&t[0], &t[1], &t[2], &t[3], &t[4], &t[5], eps),
        move |d| {
            let (out, mean, rstd) = reference::layer_norm(&d[0], &d[1], &d[2], eps)?;
            Ok(vec![out, mean, rstd])
        },
    )
}

fn layer_norm_cases(dtype: DType) -> Vec<Case> {
    let mut rng = Rng::for_case("layer_norm", dtype);
    let mut cases = Vec::new();
    for (shape, l0, l1, l2) in NORM_PLANS {
        let h = last(shape);
        // Rows with a mean of about 1, not 0, so that the mean matters.
        let x = rng.values(dtype, numel(shape), -1.0, 3.0);
        let w = rng.values(dtype, h, 0.5, 1.5);
        let b = rng.values(dtype, h, -0.5, 0.5);
        let name = norm_label(shape, (l0, l1, l2), false);
        cases.push(layer_norm_case(
            dtype,
            name,
            shape,
            x,
            w,
            b,
            1e-5,
            (l0, l1, l2),
        ));
    }
    // Rows with a mean of 100 and a standard deviation of 0.3, where the
    // tolerance above grows with the condition number (about 350): the
    // variance computed as E[x^2] - E[x]^2 in f32 still fails, its error of
    // a few u(f32) E[x^2] = 1e4 u(f32) being a few percent of the variance,
    // while two passes or Welford's method are well within it.
    let x: Vec<f64> = rng.values(DType::F64, 8 * 64, 99.5, 100.5);
    let w = rng.values(dtype, 64, 0.5, 1.5);
    let b = rng.values(dtype, 64, -0.5, 0.5);
    cases.push(layer_norm_case(
        dtype,
        "[8, 64] rows with mean 100".into(),
        &[8, 64],
        x,
        w,
        b,
        1e-5,
        (C, C, C),
    ));
    // eps must be used.
    let x = rng.values(dtype, 48, -0.1, 0.1);
    let w = rng.values(dtype, 16, 0.5, 1.5);
    let b = rng.values(dtype, 16, -0.5, 0.5);
    cases.push(layer_norm_case(
        dtype,
        "[3, 16] eps 0.01".into(),
        &[3, 16],
        x,
        w,
        b,
        0.01,
        (C, C, C),
    ));
    cases
}

fn layer_norm_backward_cases(dtype: DType) -> Vec<Case> {
    let mut rng = Rng::for_case("layer_norm_backward", dtype);
    let mut cases = Vec::new();
    let eps = 1e-5;
    for (shape, l0, l1, l2) in NORM_PLANS {
        let (h, n) = (last(shape), numel(shape));
        let stats = &shape[..shape.len() - 1];
        let x = rng.values(dtype, n, -1.0, 3.0);
        let w = rng.values(dtype, h, 0.5, 1.5);
        let b = rng.values(dtype, h, -0.5, 0.5);
        let g = rng.values(dtype, n, -1.0, 1.0);
        let (_, mean, rstd) = reference::layer_norm(
            &Dense::new(shape, x.clone()),
            &Dense::new(&[h], w.clone()),
            &Dense::new(&[h], b),
            eps,
        )
        .expect("valid shapes");
        cases.push(case(
            "layer_norm_backward",
            dtype,
            norm_label(shape, (l0, l1, l2), true),
            vec![
                input("grad_out", dtype, shape, g, l0),
                input("input", dtype, shape, x, l0),
                input("weight", dtype, &[h], w, l1),
                input("mean", DType::F32, stats, stored(DType::F32, &mean), l1),
                input("rstd", DType::F32, stats, stored(DType::F32, &rstd), l1),
                output("grad_input", dtype, shape, l2),
                output("grad_weight", dtype, &[h], l2),
                output("grad_bias", dtype, &[h], l2),
            ],
            // grad_input sums over the row, grad_weight and grad_bias over
            // the rows.
            Tolerance::sum(8.0, h + rows(shape)),
            |exec, t| {
                exec.layer_norm_backward(&t[0], &t[1], &t[2], &t[3], &t[4], &t[5], &t[6], &t[7])
            },
            |d| {
                let (gi, gw, gb) =
                    reference::layer_norm_backward(&d[0], &d[1], &d[2], &d[3], &d[4])?;
                Ok(vec![gi, gw, gb])
            },
        ));
    }
    cases
}

// ---------------------------------------------------------------------------
// Rotary embeddings.

/// `[batch, seq, heads, D]`, interleaved pairs, the first position, and the
/// layouts of (input, cos/sin tables, out).
const ROPE_PLANS: [([usize; 4], bool, usize, Layout, Layout, Layout); 8] = [
    ([1, 8, 2, 16], false, 0, C, C, C),
    ([2, 5, 3, 8], true, 0, C, C, C),
    ([1, 1, 1, 2], false, 3, C, C, C),
    ([1, 6, 4, 32], false, 10, T, C, C),
    ([2, 4, 2, 12], true, 7, S, C, S),
    ([1, 7, 3, 16], true, 0, C, T, T),
    ([1, 9, 2, 10], false, 0, C, S, C),
    ([1, 16, 8, 32], false, 4000, C, C, C),
];

/// The `cos` and `sin` tables `[seq, D/2]` of positions `first..first+seq`
/// with the usual frequencies `10000^(-2j/D)`.
fn rope_tables(seq: usize, d: usize, first: usize) -> (Vec<f64>, Vec<f64>) {
    let half = d / 2;
    let angle = |i: usize| {
        let (pos, j) = (first + i / half, i % half);
        pos as f64 * 10000f64.powf(-2.0 * j as f64 / d as f64)
    };
    let n = seq * half;
    (
        (0..n).map(|i| angle(i).cos()).collect(),
        (0..n).map(|i| angle(i).sin()).collect(),
    )
}

fn rope_family(op: &'static str, backward: bool, dtype: DType) -> Vec<Case> {
    let mut rng = Rng::for_case(op, dtype);
    let mut cases = Vec::new();
    for (shape, interleaved, first, l_in, l_tab, l_out) in ROPE_PLANS {
        let [_, seq, _, d] = shape;
        let (cos, sin) = rope_tables(seq, d, first);
        let x = rng.values(dtype, numel(&shape), -2.0, 2.0);
        let pairs = if interleaved {
            "interleaved"
        } else {
            "half-split"
        };
        let mut name = format!("{} {pairs}", shape_label(&shape, C));
        if first > 0 {
            name.push_str(&format!(" from position {first}"));
        }
        for (tensor, layout) in [("input", l_in), ("tables", l_tab), ("out", l_out)] {
            if layout != C {
                name.push_str(&format!(" {tensor} {layout}"));
            }
        }
        cases.push(case(
            op,
            dtype,
            name,
            vec![
                input("input", dtype, &shape, x, l_in),
                input("cos", DType::F32, &[seq, d / 2], cos, l_tab),
                input("sin", DType::F32, &[seq, d / 2], sin, l_tab),
                output("out", dtype, &shape, l_out),
            ],
            // Two products and a sum per element (the tables are exact f32).
            Tolerance::ulps(4.0),
            move |exec, t| exec.rope(backward, &t[0], &t[1], &t[2], &t[3], interleaved),
            move |d| {
                let r = if backward {
                    reference::rope_backward(&d[0], &d[1], &d[2], interleaved)
                } else {
                    reference::rope(&d[0], &d[1], &d[2], interleaved)
                };
                Ok(vec![r?])
            },
        ));
    }
    cases
}

fn rope_cases(dtype: DType) -> Vec<Case> {
    rope_family("rope", false, dtype)
}

fn rope_backward_cases(dtype: DType) -> Vec<Case> {
    rope_family("rope_backward", true, dtype)
}

// ---------------------------------------------------------------------------
// Attention.

/// One attention shape: `q [b, hq, sq, d]`, `k`, `v [b, hkv, skv, d]`.
#[derive(Debug, Clone, Copy)]
struct AttentionPlan {
    label: &'static str,
    b: usize,
    hq: usize,
    hkv: usize,
    sq: usize,
    skv: usize,
    d: usize,
    causal: bool,
    /// Layouts of q, k, v and of the outputs.
    layouts: [Layout; 4],
    /// Small integers in q (6 to 9) and k (15 to 17) with `scale = 1/8`:
    /// scores of 96 to 160 (exp overflows f32 unless the row maximum is
    /// subtracted) that differ by a few units between keys, so that the
    /// softmax is neither uniform nor one-hot. The scores are exact in any
    /// kernel that accumulates in f32: random scores of that size would
    /// carry rounding errors of about 100 u(f32) each, which the softmax
    /// turns into relative errors of its weights far above the tolerance.
    /// (A one-hot softmax would make the gradients cancel to almost nothing
    /// against the intermediate terms, an ill-conditioned case.)
    large_scores: bool,
}

const fn plan(
    label: &'static str,
    [b, hq, hkv, sq, skv, d]: [usize; 6],
    causal: bool,
    layouts: [Layout; 4],
) -> AttentionPlan {
    AttentionPlan {
        label,
        b,
        hq,
        hkv,
        sq,
        skv,
        d,
        causal,
        layouts,
        large_scores: false,
    }
}

const ATTENTION_PLANS: [AttentionPlan; 12] = [
    plan("[1, 2, 8, 16]", [1, 2, 2, 8, 8, 16], false, [C; 4]),
    plan("causal [2, 2, 16, 32]", [2, 2, 2, 16, 16, 32], true, [C; 4]),
    plan(
        "causal seq_q 8 < seq_kv 16 gqa 4/2",
        [1, 4, 2, 8, 16, 16],
        true,
        [C; 4],
    ),
    plan(
        "seq_q 12 seq_kv 20 gqa 8/1",
        [1, 8, 1, 12, 20, 8],
        false,
        [C; 4],
    ),
    plan(
        "causal seq_q 12 > seq_kv 5 gqa 2/1 (7 queries see no key)",
        [1, 2, 1, 12, 5, 16],
        true,
        [C; 4],
    ),
    plan(
        "causal decoding seq_q 1 seq_kv 48",
        [2, 2, 2, 1, 48, 32],
        true,
        [C; 4],
    ),
    plan("seq_kv 1", [1, 2, 2, 5, 1, 8], false, [C; 4]),
    plan(
        "single query and key, head_dim 2",
        [1, 1, 1, 1, 1, 2],
        true,
        [C; 4],
    ),
    plan(
        "[1, 2, 10, 16] q transposed k strided",
        [1, 2, 2, 10, 10, 16],
        false,
        [T, S, C, C],
    ),
    plan(
        "causal seq_q 7 seq_kv 9 v transposed outputs strided",
        [1, 2, 2, 7, 9, 8],
        true,
        [C, C, T, S],
    ),
    AttentionPlan {
        large_scores: true,
        ..plan("large scores", [1, 2, 2, 6, 6, 8], false, [C; 4])
    },
    AttentionPlan {
        large_scores: true,
        ..plan("causal large scores", [2, 2, 1, 8, 8, 8], true, [C; 4])
    },
];

impl AttentionPlan {
    fn shapes(&self) -> ([usize; 4], [usize; 4]) {
        (
            [self.b, self.hq, self.sq, self.d],
            [self.b, self.hkv, self.skv, self.d],
        )
    }

    fn scale(&self) -> f64 {
        if self.large_scores {
            0.125
        } else {
            1.0 / (self.d as f64).sqrt()
        }
    }

    /// Random q, k, v.
    fn qkv(&self, rng: &mut Rng, dtype: DType) -> [Vec<f64>; 3] {
        let (qs, ks) = self.shapes();
        let (nq, nk) = (numel(&qs), numel(&ks));
        if self.large_scores {
            let q = (0..nq).map(|_| 6.0 + rng.below(4) as f64).collect();
            let k = (0..nk).map(|_| 15.0 + rng.below(3) as f64).collect();
            [q, k, rng.values(dtype, nk, -1.0, 1.0)]
        } else {
            [
                rng.values(dtype, nq, -1.0, 1.0),
                rng.values(dtype, nk, -1.0, 1.0),
                rng.values(dtype, nk, -1.0, 1.0),
            ]
        }
    }

    fn inputs(&self, dtype: DType, qkv: [Vec<f64>; 3]) -> Vec<TensorSpec> {
        let (qs, ks) = self.shapes();
        let [q, k, v] = qkv;
        vec![
            input("q", dtype, &qs, q, self.layouts[0]),
            input("k", dtype, &ks, k, self.layouts[1]),
            input("v", dtype, &ks, v, self.layouts[2]),
        ]
    }
}

fn attention_cases(dtype: DType) -> Vec<Case> {
    let mut rng = Rng::for_case("attention", dtype);
    let mut cases = Vec::new();
    for p in ATTENTION_PLANS {
        let (qs, _) = p.shapes();
        let mut tensors = p.inputs(dtype, p.qkv(&mut rng, dtype));
        tensors.push(output("out", dtype, &qs, p.layouts[3]));
        tensors.push(output("lse", DType::F32, &qs[..3], p.layouts[3]));
        let (scale, causal) = (p.scale(), p.causal);
        cases.push(case(
            "attention",
            dtype,
            p.label,
            tensors,
            // Dot products over head_dim, a softmax over seq_kv, and the
            // weighted sum of seq_kv values.
            Tolerance::sum(16.0, p.skv + p.d),
            move |exec, t| exec.attention(&t[0], &t[1], &t[2], &t[3], &t[4], scale, causal),
            move |d| {
                let (out, lse) = reference::attention(&d[0], &d[1], &d[2], scale, causal)?;
                Ok(vec![out, lse])
            },
        ));
    }
    cases
}

fn attention_backward_cases(dtype: DType) -> Vec<Case> {
    let mut rng = Rng::for_case("attention_backward", dtype);
    let mut cases = Vec::new();
    // Every plan, and the first once more with the saved out transposed
    // and grad_out strided.
    let mut plans: Vec<(AttentionPlan, String, [Layout; 2])> = ATTENTION_PLANS
        .iter()
        .map(|p| (*p, p.label.to_string(), [C, C]))
        .collect();
    let first = ATTENTION_PLANS[0];
    plans.push((
        first,
        format!("{} saved out transposed grad_out strided", first.label),
        [T, S],
    ));
    for (p, name, [l_out, l_grad]) in plans {
        let (qs, ks) = p.shapes();
        let qkv = p.qkv(&mut rng, dtype);
        let (scale, causal) = (p.scale(), p.causal);
        let (out, lse) = reference::attention(
            &Dense::new(&qs, qkv[0].clone()),
            &Dense::new(&ks, qkv[1].clone()),
            &Dense::new(&ks, qkv[2].clone()),
            scale,
            causal,
        )
        .expect("valid shapes");
        let g = rng.values(dtype, numel(&qs), -1.0, 1.0);
        // grad_q sums over seq_kv; grad_k and grad_v over the seq_q queries
        // of every query head of a group; each term is a dot product over
        // head_dim.
        let mut n = p.skv + p.sq * (p.hq / p.hkv) + p.d;
        if p.large_scores {
            // grad_q = scale sum_j dS_ij k_j with sum_j dS_ij = 0 and k about
            // 16 + (-1, 0 or 1): the common 16 cancels, leaving the f32
            // rounding errors of terms 16 times the size of the result.
            n *= 16;
        }
        let mut tensors = p.inputs(dtype, qkv);
        tensors.extend([
            input("out", dtype, &qs, stored(dtype, &out), l_out),
            input("lse", DType::F32, &qs[..3], stored(DType::F32, &lse), l_out),
            input("grad_out", dtype, &qs, g, l_grad),
            output("grad_q", dtype, &qs, p.layouts[3]),
            output("grad_k", dtype, &ks, p.layouts[3]),
            output("grad_v", dtype, &ks, p.layouts[3]),
        ]);
        cases.push(case(
            "attention_backward",
            dtype,
            name,
            tensors,
            Tolerance::sum(32.0, n),
            move |exec, t| {
                exec.attention_backward(
                    &t[0], &t[1], &t[2], &t[3], &t[4], &t[5], &t[6], &t[7], &t[8], scale, causal,
                )
            },
            move |d| {
                let (gq, gk, gv) = reference::attention_backward(
                    &d[0], &d[1], &d[2], &d[3], &d[4], &d[5], scale, causal,
                )?;
                Ok(vec![gq, gk, gv])
            },
        ));
    }
    cases
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::case::Role;

    /// Cases whose reference must fail (the plugin must refuse them).
    fn refused(label: &str) -> bool {
        label.contains("out of range") || label.contains("step 0")
    }

    #[test]
    fn every_case_is_well_formed_and_its_reference_runs() {
        for info in ops() {
            for &dtype in info.dtypes {
                let cases = (info.cases)(dtype);
                assert!(!cases.is_empty(), "{} {dtype}: no cases", info.name);
                let mut labels = HashSet::new();
                for c in &cases {
                    assert_eq!((c.op, c.dtype), (info.name, dtype), "{c:?}");
                    assert!(labels.insert(c.label.clone()), "{c:?}: duplicate label");
                    for t in &c.tensors {
                        assert_eq!(t.values.len(), numel(&t.shape), "{c:?} {}", t.name);
                        assert!(numel(&t.shape) <= 20_000, "{c:?} {} is too large", t.name);
                    }
                    let dense: Vec<Dense> = c.tensors.iter().map(TensorSpec::dense).collect();
                    match (c.reference)(&dense) {
                        Ok(out) => {
                            assert!(!refused(&c.label), "{c:?}: the reference accepts it");
                            let written: Vec<&TensorSpec> =
                                c.tensors.iter().filter(|t| t.role != Role::Input).collect();
                            assert_eq!(out.len(), written.len(), "{c:?}");
                            for (o, t) in out.iter().zip(written) {
                                assert_eq!(o.shape, t.shape, "{c:?} {}", t.name);
                            }
                        }
                        Err(e) => assert!(refused(&c.label), "{c:?}: {e}"),
                    }
                }
            }
        }
    }

    #[test]
    fn every_op_has_transposed_and_strided_tensors() {
        for info in ops() {
            let cases = (info.cases)(DType::F32);
            for layout in [Layout::Transposed, Layout::Strided] {
                let found = cases
                    .iter()
                    .flat_map(|c| &c.tensors)
                    .any(|t| t.layout == layout);
                assert!(found, "{}: no {layout} tensor", info.name);
            }
        }
    }

    #[test]
    fn ops_are_in_op_table_order_and_cases_are_deterministic() {
        let names: Vec<&str> = ops().iter().map(|o| o.name).collect();
        assert_eq!(
            names,
            [
                "softmax_backward",
                "log_softmax",
                "log_softmax_backward",
                "rms_norm",
                "rms_norm_backward",
                "layer_norm",
                "layer_norm_backward",
                "rope",
                "rope_backward",
                "attention",
                "attention_backward",
            ]
        );
        for info in ops() {
            let (a, b) = ((info.cases)(DType::BF16), (info.cases)(DType::BF16));
            for (x, y) in a.iter().zip(&b) {
                let values = |c: &Case| -> Vec<Vec<u64>> {
                    c.tensors
                        .iter()
                        .map(|t| t.values.iter().map(|v| v.to_bits()).collect())
                        .collect()
                };
                assert_eq!((&x.label, values(x)), (&y.label, values(y)));
            }
        }
    }

    #[test]
    fn attention_cases_stay_small_and_cover_queries_that_see_no_key() {
        for p in ATTENTION_PLANS {
            assert!(p.sq <= 48 && p.skv <= 48 && p.d <= 32, "{}", p.label);
        }
        let c = attention_cases(DType::F32);
        let hidden = c
            .iter()
            .find(|c| c.label.contains("see no key"))
            .expect("the case");
        let dense: Vec<Dense> = hidden.tensors.iter().map(TensorSpec::dense).collect();
        let out = (hidden.reference)(&dense).unwrap();
        assert!(out[1].data.contains(&f64::NEG_INFINITY));
        // Scores of the large-score cases overflow exp in f32.
        let big = c
            .iter()
            .find(|c| c.label == "large scores")
            .expect("the case");
        let dense: Vec<Dense> = big.tensors.iter().map(TensorSpec::dense).collect();
        let lse = &(big.reference)(&dense).unwrap()[1];
        assert!(lse.data.iter().any(|&l| l > 89.0), "{lse:?}");
    }
}
