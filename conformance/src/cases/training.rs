//! Cases of the ABI 1.1 operators a training step needs around the layers:
//! linear, embedding and its backward, cross-entropy and its backward,
//! AdamW and scaling.
//!
//! Index tensors are `Dense` tensors of integers in the case (i32 in some
//! cases, i64 in others) and become [`Indices`] inside the reference
//! closures. An index out of range must be refused.

use polychip_host::{AdamwOptions, DType};

use super::{FLOATS3, OpInfo, Rng, case, inout, input, numel, output, shape_label, specials};
use crate::case::{Case, Layout};
use crate::reference::{self, Dense, Indices};
use crate::tolerance::Tolerance;

const C: Layout = Layout::Contiguous;
const T: Layout = Layout::Transposed;
const S: Layout = Layout::Strided;

pub(super) fn ops() -> Vec<OpInfo> {
    vec![
        OpInfo {
            name: "linear",
            dtypes: FLOATS3,
            cases: linear_cases,
        },
        OpInfo {
            name: "embedding",
            dtypes: FLOATS3,
            cases: embedding_cases,
        },
        OpInfo {
            name: "embedding_backward",
            dtypes: FLOATS3,
            cases: embedding_backward_cases,
        },
        OpInfo {
            name: "cross_entropy",
            dtypes: FLOATS3,
            cases: cross_entropy_cases,
        },
        OpInfo {
            name: "cross_entropy_backward",
            dtypes: FLOATS3,
            cases: cross_entropy_backward_cases,
        },
        OpInfo {
            name: "adamw",
            dtypes: FLOATS3,
            cases: adamw_cases,
        },
        OpInfo {
            name: "scale",
            dtypes: FLOATS3,
            cases: scale_cases,
        },
    ]
}

/// The integer values of an index tensor as the reference takes them.
fn indices(d: &Dense) -> Indices {
    Indices::new(&d.shape, d.data.iter().map(|&v| v as i64).collect())
}

/// ` name layout` for every tensor that is not contiguous.
fn layouts(layouts: &[(&str, Layout)]) -> String {
    let mut s = String::new();
    for (name, layout) in layouts {
        if *layout != C {
            s.push_str(&format!(" {name} {layout}"));
        }
    }
    s
}

/// The most times one index occurs in `idx`.
fn max_repeats(idx: &[f64]) -> usize {
    let mut sorted: Vec<i64> = idx.iter().map(|&v| v as i64).collect();
    sorted.sort_unstable();
    sorted
        .chunk_by(|a, b| a == b)
        .map(<[i64]>::len)
        .max()
        .unwrap_or(0)
}

// ---------------------------------------------------------------------------
// Linear.

/// `(input shape, N, bias, layouts of input, weight, bias, out)`.
type LinearPlan = (&'static [usize], usize, bool, [Layout; 4]);

const LINEAR_PLANS: [LinearPlan; 11] = [
    (&[4, 16], 8, true, [C; 4]),
    (&[4, 16], 8, false, [C; 4]),
    (&[2, 3, 24], 5, true, [C; 4]),
    (&[5, 1], 7, true, [C; 4]),
    (&[4, 300], 6, false, [C; 4]),
    (&[4, 300], 6, true, [C, T, C, C]),
    (&[16], 4, true, [C; 4]),
    (&[1, 1, 8], 1, true, [C; 4]),
    (&[6, 12], 10, true, [T, C, C, C]),
    (&[6, 12], 10, true, [C, T, S, C]),
    (&[3, 20], 9, false, [S, S, C, S]),
];

fn linear_cases(dtype: DType) -> Vec<Case> {
    let mut rng = Rng::for_case("linear", dtype);
    let mut cases = Vec::new();
    for (in_shape, n, has_bias, [l_in, l_w, l_b, l_out]) in LINEAR_PLANS {
        let k = *in_shape.last().expect("rank >= 1");
        let mut out_shape = in_shape[..in_shape.len() - 1].to_vec();
        out_shape.push(n);
        let x = rng.values(dtype, numel(in_shape), -2.0, 2.0);
        let w = rng.values(dtype, n * k, -1.0, 1.0);
        let mut tensors = vec![
            input("input", dtype, in_shape, x, l_in),
            input("weight", dtype, &[n, k], w, l_w),
        ];
        if has_bias {
            tensors.push(input(
                "bias",
                dtype,
                &[n],
                rng.values(dtype, n, -1.0, 1.0),
                l_b,
            ));
        }
        tensors.push(output("out", dtype, &out_shape, l_out));
        let bias_label = if has_bias { "bias" } else { "no bias" };
        let mut parts = vec![("input", l_in), ("weight", l_w), ("out", l_out)];
        if has_bias {
            parts.push(("bias", l_b));
        }
        let label = format!(
            "{} N {n} {bias_label}{}",
            shape_label(in_shape, C),
            layouts(&parts)
        );
        cases.push(case(
            "linear",
            dtype,
            label,
            tensors,
            // A dot product over K, the bias, the final rounding.
            Tolerance::sum(4.0, k),
            move |exec, t| {
                if has_bias {
                    exec.linear(&t[0], &t[1], Some(&t[2]), &t[3])
                } else {
                    exec.linear(&t[0], &t[1], None, &t[2])
                }
            },
            move |d| {
                let bias = if has_bias { Some(&d[2]) } else { None };
                Ok(vec![reference::linear(&d[0], &d[1], bias)?])
            },
        ));
    }
    cases
}

// ---------------------------------------------------------------------------
// Embedding.

/// One embedding case: table `[V, H]`, indices of `shape` and dtype, and
/// the layouts of (table, indices, rows).
struct EmbeddingPlan {
    label: String,
    vocab: usize,
    h: usize,
    idx_shape: Vec<usize>,
    idx_dtype: DType,
    idx: Vec<f64>,
    layouts: [Layout; 3],
}

/// The plans shared by `embedding` and `embedding_backward`: repeated
/// indices, both index dtypes, a 0-d and an empty index tensor, every layout,
/// and indices out of range (which must be refused).
fn embedding_plans(rng: &mut Rng) -> Vec<EmbeddingPlan> {
    let mut plans = Vec::new();
    let mut plan = |label: &str,
                    (vocab, h): (usize, usize),
                    shape: &[usize],
                    idx_dtype: DType,
                    idx: Vec<i64>,
                    layouts: [Layout; 3]| {
        assert_eq!(idx.len(), numel(shape));
        let label = format!(
            "{label} V {vocab} H {h} indices {} {idx_dtype}{}",
            shape_label(shape, C),
            self::layouts(&[
                ("table", layouts[0]),
                ("indices", layouts[1]),
                ("rows", layouts[2])
            ])
        );
        plans.push(EmbeddingPlan {
            label,
            vocab,
            h,
            idx_shape: shape.to_vec(),
            idx_dtype,
            idx: idx.into_iter().map(|i| i as f64).collect(),
            layouts,
        });
    };
    let mut random =
        |n: usize, vocab: usize| -> Vec<i64> { (0..n).map(|_| rng.below(vocab) as i64).collect() };
    plan(
        "repeated",
        (10, 8),
        &[2, 3],
        DType::I64,
        vec![3, 7, 3, 0, 9, 3],
        [C; 3],
    );
    plan("random", (50, 16), &[7], DType::I32, random(7, 50), [C; 3]);
    plan(
        "many repeats",
        (5, 6),
        &[4, 6],
        DType::I32,
        random(24, 5),
        [C; 3],
    );
    plan(
        "one hot row",
        (7, 4),
        &[12],
        DType::I64,
        vec![2; 12],
        [C; 3],
    );
    plan("scalar", (6, 4), &[], DType::I64, vec![5], [C; 3]);
    plan("empty", (6, 4), &[0], DType::I32, vec![], [C; 3]);
    plan(
        "long table",
        (1000, 1),
        &[20],
        DType::I64,
        random(20, 1000),
        [C; 3],
    );
    plan(
        "random",
        (12, 6),
        &[4],
        DType::I64,
        random(4, 12),
        [T, C, C],
    );
    plan(
        "random",
        (9, 5),
        &[3, 2],
        DType::I32,
        random(6, 9),
        [S, S, S],
    );
    plan(
        "random",
        (8, 7),
        &[2, 5],
        DType::I64,
        random(10, 8),
        [C, T, T],
    );
    plan(
        "index out of range",
        (10, 4),
        &[3],
        DType::I64,
        vec![1, 10, 2],
        [C; 3],
    );
    plan(
        "negative index out of range",
        (10, 4),
        &[2, 2],
        DType::I32,
        vec![0, 4, -1, 2],
        [C; 3],
    );
    plans
}

fn embedding_cases(dtype: DType) -> Vec<Case> {
    let mut rng = Rng::for_case("embedding", dtype);
    let mut cases = Vec::new();
    let mut push = |p: EmbeddingPlan, table: Vec<f64>| {
        let mut out_shape = p.idx_shape.clone();
        out_shape.push(p.h);
        cases.push(case(
            "embedding",
            dtype,
            p.label,
            vec![
                input("weight", dtype, &[p.vocab, p.h], table, p.layouts[0]),
                input("indices", p.idx_dtype, &p.idx_shape, p.idx, p.layouts[1]),
                output("out", dtype, &out_shape, p.layouts[2]),
            ],
            // A copy: the bits must match.
            Tolerance::EXACT,
            |exec, t| exec.embedding(&t[0], &t[1], &t[2]),
            |d| Ok(vec![reference::embedding(&d[0], &indices(&d[1]))?]),
        ));
    };
    for p in embedding_plans(&mut rng) {
        let table = rng.values(dtype, p.vocab * p.h, -2.0, 2.0);
        push(p, table);
    }
    // Rows of NaN, infinities, signed zeros and subnormals are copied bit for bit.
    let s = specials(dtype);
    let (vocab, h) = (3, s.len());
    let table: Vec<f64> = (0..vocab * h).map(|i| s[(i + i / h) % h]).collect();
    let idx = vec![2.0, 0.0, 1.0, 2.0];
    push(
        EmbeddingPlan {
            label: "special values".into(),
            vocab,
            h,
            idx_shape: vec![4],
            idx_dtype: DType::I64,
            idx,
            layouts: [C; 3],
        },
        table,
    );
    cases
}

fn embedding_backward_cases(dtype: DType) -> Vec<Case> {
    let mut rng = Rng::for_case("embedding_backward", dtype);
    let mut cases = Vec::new();
    for p in embedding_plans(&mut rng) {
        let mut rows_shape = p.idx_shape.clone();
        rows_shape.push(p.h);
        let g = rng.values(dtype, numel(&rows_shape), -1.0, 1.0);
        // Accumulates into a gradient that is not zero.
        let prev = rng.values(dtype, p.vocab * p.h, -1.0, 1.0);
        let r = max_repeats(&p.idx);
        cases.push(case(
            "embedding_backward",
            dtype,
            p.label,
            vec![
                input("grad_out", dtype, &rows_shape, g, p.layouts[2]),
                input("indices", p.idx_dtype, &p.idx_shape, p.idx, p.layouts[1]),
                inout("grad_weight", dtype, &[p.vocab, p.h], prev, p.layouts[0]),
            ],
            // A row receives up to `r` updates. The operator accumulates in
            // at least f32 *per update*: a plugin may store the row in the
            // dtype after each one (atomic adds on f16/bf16, for example),
            // which is one rounding of the dtype per update, hence k = r + 1
            // rather than 2; the n = r term covers the f32 additions of a
            // plugin that sums in f32 and stores once.
            Tolerance::sum((r + 1) as f64, r),
            |exec, t| exec.embedding_backward(&t[0], &t[1], &t[2]),
            |d| {
                Ok(vec![reference::embedding_backward(
                    &d[0],
                    &indices(&d[1]),
                    &d[2],
                )?])
            },
        ));
    }
    cases
}

// ---------------------------------------------------------------------------
// Cross-entropy.

/// One cross-entropy case: logits `[N, C]` and targets `[N]`.
struct CrossEntropyPlan {
    label: String,
    logits: Vec<f64>,
    n: usize,
    c: usize,
    targets: Vec<f64>,
    idx_dtype: DType,
    ignore_index: i64,
    /// Layouts of logits (and grad_logits) and targets.
    layouts: [Layout; 2],
    /// Extra accumulation terms for logits far from 0 (see where it is set).
    extra: usize,
}

/// The plans shared by the forward and backward operators.
fn cross_entropy_plans(rng: &mut Rng, dtype: DType) -> Vec<CrossEntropyPlan> {
    let mut plans = Vec::new();
    let mut plan = |rng: &mut Rng,
                    label: &str,
                    (n, c): (usize, usize),
                    idx_dtype: DType,
                    ignore_index: i64,
                    targets: Option<Vec<i64>>,
                    lay: [Layout; 2],
                    offset: f64| {
        let targets = targets.unwrap_or_else(|| (0..n).map(|_| rng.below(c) as i64).collect());
        let logits = rng.values(dtype, n * c, offset - 4.0, offset + 4.0);
        let mut name = format!("{label} [{n}, {c}] {idx_dtype}");
        if ignore_index != -100 {
            name.push_str(&format!(" ignore_index {ignore_index}"));
        }
        name.push_str(&layouts(&[("logits", lay[0]), ("targets", lay[1])]));
        plans.push(CrossEntropyPlan {
            label: name,
            logits,
            n,
            c,
            targets: targets.into_iter().map(|t| t as f64).collect(),
            idx_dtype,
            ignore_index,
            layouts: lay,
            // A log-sum-exp of logits near `offset` is rounded at that
            // magnitude in f32: |offset| u(f32) more per row, i.e. about
            // |offset| / 2 more terms of accumulation against a loss of a
            // few units.
            extra: (offset.abs() / 2.0) as usize,
        });
    };
    plan(rng, "random", (8, 10), DType::I64, -100, None, [C; 2], 0.0);
    plan(rng, "random", (8, 10), DType::I32, -100, None, [C; 2], 0.0);
    plan(
        rng,
        "single class",
        (3, 1),
        DType::I64,
        -100,
        Some(vec![0; 3]),
        [C; 2],
        0.0,
    );
    plan(
        rng,
        "single row",
        (1, 17),
        DType::I32,
        -100,
        Some(vec![16]),
        [C; 2],
        0.0,
    );
    plan(
        rng,
        "long rows",
        (16, 1000),
        DType::I32,
        -100,
        None,
        [C; 2],
        0.0,
    );
    let t = vec![4, -100, 0, 49, -100, 7];
    plan(
        rng,
        "ignored rows",
        (6, 50),
        DType::I64,
        -100,
        Some(t),
        [C; 2],
        0.0,
    );
    let t = vec![3, 1, 3, 0, 6, 3, 2];
    plan(
        rng,
        "ignored rows",
        (7, 7),
        DType::I32,
        3,
        Some(t),
        [C; 2],
        0.0,
    );
    let t = vec![-1, 2, -1, 0];
    plan(
        rng,
        "ignored rows",
        (4, 5),
        DType::I64,
        -1,
        Some(t),
        [C; 2],
        0.0,
    );
    plan(
        rng,
        "all rows ignored",
        (4, 6),
        DType::I64,
        -100,
        Some(vec![-100; 4]),
        [C; 2],
        0.0,
    );
    plan(rng, "random", (12, 9), DType::I64, -100, None, [T, C], 0.0);
    plan(rng, "random", (10, 6), DType::I32, -100, None, [S, S], 0.0);
    plan(
        rng,
        "logits near 100",
        (4, 16),
        DType::I64,
        -100,
        None,
        [C; 2],
        100.0,
    );
    let t = vec![1, 5, 0];
    plan(
        rng,
        "target out of range",
        (3, 5),
        DType::I64,
        -100,
        Some(t),
        [C; 2],
        0.0,
    );
    let t = vec![1, -1, 0];
    plan(
        rng,
        "negative target out of range",
        (3, 5),
        DType::I32,
        -100,
        Some(t),
        [C; 2],
        0.0,
    );
    plans
}

fn cross_entropy_cases(dtype: DType) -> Vec<Case> {
    let mut rng = Rng::for_case("cross_entropy", dtype);
    cross_entropy_plans(&mut rng, dtype)
        .into_iter()
        .map(|p| {
            let ignore = p.ignore_index;
            case(
                "cross_entropy",
                dtype,
                p.label,
                vec![
                    input("logits", dtype, &[p.n, p.c], p.logits, p.layouts[0]),
                    input("targets", p.idx_dtype, &[p.n], p.targets, p.layouts[1]),
                    output("loss", DType::F32, &[], C),
                ],
                // A log-sum-exp over C per row, a mean over N rows.
                Tolerance::sum(8.0, p.c + p.n + p.extra),
                move |exec, t| exec.cross_entropy(&t[0], &t[1], &t[2], ignore),
                move |d| {
                    Ok(vec![reference::cross_entropy(
                        &d[0],
                        &indices(&d[1]),
                        ignore,
                    )?])
                },
            )
        })
        .collect()
}

fn cross_entropy_backward_cases(dtype: DType) -> Vec<Case> {
    let mut rng = Rng::for_case("cross_entropy_backward", dtype);
    let plans = cross_entropy_plans(&mut rng, dtype);
    let mut cases = Vec::new();
    for (i, p) in plans.into_iter().enumerate() {
        // The usual 1, and another gradient of the loss now and then.
        let grad_loss = if i % 3 == 2 { -0.375 } else { 1.0 };
        let ignore = p.ignore_index;
        let label = if grad_loss == 1.0 {
            p.label
        } else {
            format!("{} grad_loss {grad_loss}", p.label)
        };
        cases.push(case(
            "cross_entropy_backward",
            dtype,
            label,
            vec![
                input("logits", dtype, &[p.n, p.c], p.logits, p.layouts[0]),
                input("targets", p.idx_dtype, &[p.n], p.targets, p.layouts[1]),
                output("grad_logits", dtype, &[p.n, p.c], p.layouts[0]),
            ],
            // A softmax over C per row (the count of rows is exact).
            Tolerance::sum(8.0, p.c + p.extra),
            move |exec, t| exec.cross_entropy_backward(&t[0], &t[1], &t[2], grad_loss, ignore),
            move |d| {
                Ok(vec![reference::cross_entropy_backward(
                    &d[0],
                    &indices(&d[1]),
                    grad_loss,
                    ignore,
                )?])
            },
        ));
    }
    cases
}

// ---------------------------------------------------------------------------
// AdamW.

fn adamw_cases(dtype: DType) -> Vec<Case> {
    let mut rng = Rng::for_case("adamw", dtype);
    let mut cases = Vec::new();
    // The hyper-parameters arrive as f64, and a plugin may round them to
    // f32 before use ("computed in at least f32"). 1 - beta2 then carries a
    // relative error of u(f32) / (1 - beta2), about 200 u(f32) for 0.999,
    // which shows in exp_avg_sq when its old value is small next to
    // (1 - beta2) g^2. So beta2 = 0.999 comes with a second moment of the
    // size of g^2 (as after a few steps), and the first step from zero
    // moments uses beta2 = 0.95 (common for large models), whose 1 - beta2
    // is within a few u(f32) in f32.
    // (shape, layouts of param, grad, moments, step, lr, beta2,
    // weight decay, zero moments)
    type Plan = (&'static [usize], [Layout; 3], i64, f64, f64, f64, bool);
    let plans: [Plan; 9] = [
        (&[64], [C; 3], 1, 1e-3, 0.95, 0.0, true),
        (&[64], [C; 3], 1, 1e-3, 0.95, 0.1, true),
        (&[8, 16], [C; 3], 10, 1e-3, 0.999, 0.0, false),
        (&[8, 16], [C; 3], 10, 1e-3, 0.999, 0.1, false),
        (&[3, 5, 7], [C; 3], 1, 1e-2, 0.999, 0.1, false),
        (&[1], [C; 3], 10, 1e-2, 0.95, 0.1, false),
        (&[12, 10], [T, S, C], 10, 1e-3, 0.999, 0.1, false),
        (&[6, 9], [S, C, T], 1, 1e-3, 0.95, 0.0, true),
        (&[4, 4], [C; 3], 0, 1e-3, 0.999, 0.0, false),
    ];
    for (shape, [l_p, l_g, l_m], step, lr, beta2, weight_decay, zero) in plans {
        let n = numel(shape);
        let p = rng.values(dtype, n, -1.0, 1.0);
        let mut g = rng.values(dtype, n, -1.0, 1.0);
        let (m, v) = if zero {
            // A zero gradient leaves zero moments and no update.
            g[0] = 0.0;
            (vec![0.0; n], vec![0.0; n])
        } else {
            (
                rng.values(DType::F32, n, -0.3, 0.3),
                rng.values(DType::F32, n, 0.25, 1.0),
            )
        };
        let h = AdamwOptions {
            lr,
            beta1: 0.9,
            beta2,
            eps: 1e-8,
            weight_decay,
            step,
        };
        let moments = if zero { "zero moments" } else { "moments" };
        let label = format!(
            "{} step {step} lr {lr} beta2 {beta2} weight decay {weight_decay} {moments}{}",
            shape_label(shape, C),
            layouts(&[("param", l_p), ("grad", l_g), ("moments", l_m)])
        );
        cases.push(case(
            "adamw",
            dtype,
            label,
            vec![
                inout("param", dtype, shape, p, l_p),
                input("grad", dtype, shape, g, l_g),
                inout("exp_avg", DType::F32, shape, m, l_m),
                inout("exp_avg_sq", DType::F32, shape, v, l_m),
            ],
            // A dozen operations per element, none accumulating.
            Tolerance::ulps(16.0),
            move |exec, t| exec.adamw(&t[0], &t[1], &t[2], &t[3], &h),
            move |d| {
                let (p, m, v) = reference::adamw(
                    &d[0],
                    &d[1],
                    &d[2],
                    &d[3],
                    h.lr,
                    h.beta1,
                    h.beta2,
                    h.eps,
                    h.weight_decay,
                    h.step,
                )?;
                Ok(vec![p, m, v])
            },
        ));
    }
    cases
}

// ---------------------------------------------------------------------------
// Scale.

fn scale_cases(dtype: DType) -> Vec<Case> {
    let mut rng = Rng::for_case("scale", dtype);
    let mut cases = Vec::new();
    let mut push = |label: String, shape: &[usize], x: Vec<f64>, layout: Layout, alpha: f64| {
        cases.push(case(
            "scale",
            dtype,
            label,
            vec![inout("tensor", dtype, shape, x, layout)],
            // One product, rounded once; and alpha rounded to f32 (or the
            // dtype) first by a plugin that does so.
            Tolerance::ulps(2.0),
            move |exec, t| exec.scale(&t[0], alpha),
            move |d| Ok(vec![reference::scale(&d[0], alpha)?]),
        ));
    };
    let plans: [(&[usize], Layout, f64); 8] = [
        (&[5], C, 0.5),
        (&[4, 6], T, -3.0),
        (&[3, 8], S, 0.5),
        (&[2, 3, 4], C, -3.0),
        (&[], C, -3.0),
        (&[0, 3], C, 0.5),
        (&[100, 100], C, 0.3),
        (&[7, 5], S, 1.0 / 7.0),
    ];
    for (shape, layout, alpha) in plans {
        let x = rng.values(dtype, numel(shape), -4.0, 4.0);
        let label = format!("{} alpha {alpha}", shape_label(shape, layout));
        push(label, shape, x, layout, alpha);
    }
    // IEEE products: NaN stays NaN, infinities keep or flip their sign, the
    // largest value overflows by 3, the smallest subnormal halves to 0.
    let s = specials(dtype);
    for alpha in [0.5, -3.0] {
        push(
            format!("special values alpha {alpha}"),
            &[s.len()],
            s.clone(),
            C,
            alpha,
        );
    }
    cases
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::case::{Role, TensorSpec};

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
                "linear",
                "embedding",
                "embedding_backward",
                "cross_entropy",
                "cross_entropy_backward",
                "adamw",
                "scale",
            ]
        );
        for info in ops() {
            let (a, b) = ((info.cases)(DType::F16), (info.cases)(DType::F16));
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
    fn index_cases_cover_both_index_dtypes_and_the_special_losses() {
        for cases in [
            embedding_cases(DType::F32),
            embedding_backward_cases(DType::F32),
            cross_entropy_cases(DType::F32),
            cross_entropy_backward_cases(DType::F32),
        ] {
            let index_dtypes: HashSet<DType> = cases
                .iter()
                .flat_map(|c| c.tensors.iter().map(|t| t.dtype))
                .filter(|d| matches!(d, DType::I32 | DType::I64))
                .collect();
            assert_eq!(index_dtypes.len(), 2);
        }
        let ce = cross_entropy_cases(DType::BF16);
        let all_ignored = ce
            .iter()
            .find(|c| c.label.starts_with("all rows ignored"))
            .unwrap();
        let dense: Vec<Dense> = all_ignored.tensors.iter().map(TensorSpec::dense).collect();
        assert!((all_ignored.reference)(&dense).unwrap()[0].data[0].is_nan());
        assert_eq!(max_repeats(&[3.0, 7.0, 3.0, 0.0, 3.0]), 3);
        assert_eq!(max_repeats(&[]), 0);
    }
}
