//! Cases of softmax_backward, log_softmax and log_softmax_backward.

use super::*;

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
/// One case of softmax_backward (or, with `log`, log_softmax_backward):
/// the forward output `y` and the gradient `g` of `shape`, in layouts `l`
/// (out, grad_out, grad_in).
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward_case(
    op: &'static str,
    log: bool,
    dtype: DType,
    label: String,
    shape: &[usize],
    y: Vec<f64>,
    g: Vec<f64>,
    l: [Layout; 3],
) -> Case {
    let n = last(shape);
    case(
        op,
        dtype,
        label,
        vec![
            input("out", dtype, shape, y, l[0]),
            input("grad_out", dtype, shape, g, l[1]),
            output("grad_in", dtype, shape, l[2]),
        ],
        // A dot product (or sum) over the row that cancels against
        // grad_out, computed in f32, then a few roundings.
        Tolerance::accumulated(8.0, n + 2),
        move |exec, t| {
            if log {
                exec.log_softmax_backward(&t[0], &t[1], &t[2])
            } else {
                exec.softmax_backward(&t[0], &t[1], &t[2])
            }
        },
        move |d| {
            let r = if log {
                reference::log_softmax_backward(&d[0], &d[1])
            } else {
                reference::softmax_backward(&d[0], &d[1])
            };
            Ok(vec![r?])
        },
    )
}

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
            cases.push(backward_case(op, log, dtype, label, shape, y, g, l));
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
    // out and grad_in permuted (rows not evenly spaced, the last two dims
    // compact), grad_out compact: a kernel that walks [..., N] as [rows, N]
    // with one row stride, or judges a view compact by its inner dims,
    // misreads them. (With every tensor permuted alike, a row-wise kernel
    // that takes each in memory order would be right by accident.)
    let shape = PERMUTED_ROWS;
    let logits = rng.values(DType::F64, numel(shape), -4.0, 4.0);
    let g = rng.values(dtype, numel(shape), -1.0, 1.0);
    let name = label(shape, &[("out", P), ("grad_in", P)]);
    push(name, shape, logits, g, [P, C, P]);
    // Rows of one (out 1, or log-probability 0) with gradients NaN, +inf,
    // -inf and finite: the gradient is 0 only where grad_out is finite
    // (`g - g`), NaN elsewhere (mutation round 10, as the forward's rows of
    // one).
    let logits = rng.values(DType::F64, 6, -4.0, 4.0);
    push(
        "rows of one, grad_out NaN, +inf, -inf, 0, -5, 1000".into(),
        &[6, 1],
        logits,
        crate::cases::basic::rows_of_one(dtype),
        [C; 3],
    );
    cases
}

/// The shape of the row-wise cases whose tensors are permuted.
const PERMUTED_ROWS: &[usize] = &[2, 3, 4, 19];

pub(super) fn softmax_backward_cases(dtype: DType) -> Vec<Case> {
    softmax_family_backward("softmax_backward", false, dtype)
}

pub(super) fn log_softmax_backward_cases(dtype: DType) -> Vec<Case> {
    softmax_family_backward("log_softmax_backward", true, dtype)
}

/// A `log_softmax` case of `x` (layouts of input and out), judged over
/// rows of `n` terms.
pub(crate) fn log_softmax_case(
    dtype: DType,
    label: String,
    shape: &[usize],
    x: Vec<f64>,
    l: [Layout; 2],
    n: usize,
) -> Case {
    case(
        "log_softmax",
        dtype,
        label,
        vec![
            input("input", dtype, shape, x, l[0]),
            output("out", dtype, shape, l[1]),
        ],
        // x - max - log(sum): the sum's error relative to the row's
        // log-sum-exp, which cancels against x - max.
        Tolerance::accumulated(8.0, n + 2),
        |exec, t| exec.log_softmax(&t[0], &t[1]),
        |d| Ok(vec![reference::log_softmax(&d[0])?]),
    )
}

pub(super) fn log_softmax_cases(dtype: DType) -> Vec<Case> {
    let mut rng = Rng::for_case("log_softmax", dtype);
    let mut cases = Vec::new();
    let mut push = |label: String, shape: &[usize], x: Vec<f64>, l: [Layout; 2], n: usize| {
        cases.push(log_softmax_case(dtype, label, shape, x, l, n));
    };
    for (shape, l0, _, l2) in ROW_PLANS {
        let x = rng.values(dtype, numel(shape), -8.0, 8.0);
        let name = label(shape, &[("input", l0), ("out", l2)]);
        push(name, shape, x, [l0, l2], last(shape));
    }
    // Logits near 1000 overflow exp unless the row maximum is subtracted;
    // logits near -200 underflow every exp in f32 unless it is (a running
    // maximum that starts at 0 rather than -inf); a spread of 800 makes
    // log(exp(x - max) / sum) -inf where x - max - log(sum) is -800; a
    // -inf logit has log-probability -inf; a row of -inf is NaN. The result
    // of a logit near 1000 is only known to an ULP of 1000 in f32 (the
    // problem's condition number is |x| / |out|), so a backward-stable f32
    // kernel such as `x - (max + log(sum))` is off by up to 1000 u(f32):
    // 500 more terms of accumulation.
    let inf = f64::NEG_INFINITY;
    let x = vec![
        1000.0, 1002.0, 1004.0, 996.0, //
        -200.0, -201.0, -203.0, -199.0, //
        0.0, -800.0, -3.0, -1.0, //
        inf, 0.0, 1.0, 2.0, //
        inf, inf, inf, inf,
    ];
    push(
        "large logits, large negative logits, a spread of 800, -inf, an all -inf row".into(),
        &[5, 4],
        x,
        [C, C],
        4 + 500,
    );
    push(
        "rows of one logit: NaN, +inf, -inf, 0, -5, 1000".into(),
        &[6, 1],
        crate::cases::basic::rows_of_one(dtype),
        [C, C],
        1 + 500,
    );
    push(
        "rows of 37 masked (-10000) but for the last 3".into(),
        &[4, 37],
        crate::cases::basic::tail_rows(&mut rng, dtype, 4, 37),
        [C, C],
        37 + 5000,
    );
    push(
        "rows of 61 masked (-10000) but for the last 3".into(),
        &[4, 61],
        crate::cases::basic::tail_rows(&mut rng, dtype, 4, 61),
        [C, C],
        61 + 5000,
    );
    // Masked rows (see `padded_rows`): the masked outputs near -10,000 are
    // known to an ULP of 10,000 (5,000 more terms, as above).
    let shape = crate::cases::basic::padded_rows::SHAPE;
    push(
        crate::cases::basic::padded_rows::LABEL.into(),
        &shape,
        crate::cases::basic::padded_rows::values(&mut rng, dtype),
        [C, C],
        shape[1] + 5000,
    );
    // A permuted input, a compact output (see the backward's).
    let shape = PERMUTED_ROWS;
    let x = rng.values(dtype, numel(shape), -8.0, 8.0);
    let name = label(shape, &[("input", P)]);
    push(name, shape, x, [P, C], last(shape));
    // Evenly spaced rows whose extent-1 dim has a stride that is not its
    // compact one (see the norms' `UNIT_DIM_PLAN`, mutation round 10).
    let shape: &[usize] = &[4, 1, 19];
    let x = rng.values(dtype, numel(shape), -8.0, 8.0);
    let name = label(shape, &[("input", P)]);
    push(name, shape, x, [P, C], last(shape));
    // Rows led by -inf logits (see `left_padded`).
    let shape = crate::cases::basic::left_padded::SHAPE;
    push(
        crate::cases::basic::left_padded::LABEL.into(),
        &shape,
        crate::cases::basic::left_padded::values(&mut rng, dtype),
        [C, C],
        shape[1],
    );
    cases
}

// ---------------------------------------------------------------------------
// RMSNorm and LayerNorm.
