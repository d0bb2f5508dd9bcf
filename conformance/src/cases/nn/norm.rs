//! Cases of RMSNorm and LayerNorm, forward and backward.

use super::*;

/// Normalisation shapes with the layouts of (input, parameters, outputs).
/// Rows of 7 and 37 (odd, prime) catch a vectorised loop's tail: every
/// other width here is 1 or a multiple of 4. 300 rows put the backward
/// passes' parameter gradients through a column sum of several chunks of
/// rows, the last partial (round 7: an OpenCL two-stage sum that dropped
/// its last chunk passed every case of 16 rows or fewer).
const NORM_PLANS: [(&[usize], Layout, Layout, Layout); 12] = [
    (&[64], C, C, C),
    (&[3, 1], C, C, C),
    (&[1, 1, 16], C, C, C),
    (&[4, 32], T, C, C),
    (&[2, 3, 48], C, C, C),
    (&[4, 1000], C, C, C),
    (&[5, 24], S, S, C),
    (&[6, 20], C, C, S),
    (&[0, 8], C, C, C),
    (&[3, 7], C, C, C),
    (&[2, 37], S, C, S),
    (&[300, 16], C, C, C),
];

/// A normalisation whose rows (input, grad_out, out, grad_input) and
/// forward statistics are permuted, the first two dims swapped in memory
/// (the parameters, and the statistics a backward reads, compact): the rows
/// are not evenly spaced, so a kernel that walks `[..., H]` as `[rows, H]`
/// with one row stride reads and writes the wrong rows, and their last two
/// dims are compact, so one that judges a view compact by its inner dims
/// does too. (Run after the plans above, so that their values stay as they
/// were.)
const PERMUTED_PLAN: (&[usize], Layout, Layout, Layout) = (&[2, 3, 4, 37], P, C, P);

/// Rows `[4, 1, 19]` permuted (dims 0 and 1 swapped in memory, as
/// PyTorch's `permute` of a `[1, 4, 19]` tensor gives): evenly spaced rows
/// whose extent-1 dim has a stride of 76, not the compact 19. A kernel
/// that judges the leading dims compact skipping extent-1 dims, as
/// PyTorch's `is_contiguous` does, and then steps rows by the innermost
/// leading stride (the extent-1 dim's) misreads them (mutation round 10).
/// Run last in the forward passes.
const UNIT_DIM_PLAN: (&[usize], Layout, Layout, Layout) = (&[4, 1, 19], P, C, P);

/// Rows of no elements (H = 0) in the forward passes: the mean of nothing
/// is 0 / 0, so every statistic is NaN (mutation round 9: a kernel that
/// returned early for an empty weight left them unwritten). Run last, so
/// that the cases before keep their values.
const ZERO_WIDTH_PLAN: (&[usize], Layout, Layout, Layout) = (&[3, 0], C, C, C);

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

pub(crate) fn rms_norm_case(
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
        // The sum of squares (positive terms) is off by h u(f32) relative,
        // which every output of the row inherits relative to itself; then
        // the square root, the reciprocal and two products, rounded once.
        // (h is charged as the probabilistic length of `effective_length`.)
        Tolerance::computed(8.0 + Tolerance::effective_length(h)),
        move |exec, t| exec.rms_norm(&t[0], &t[1], &t[2], &t[3], eps),
        move |d| {
            let (out, inv_rms) = reference::rms_norm(&d[0], &d[1], eps)?;
            Ok(vec![out, inv_rms])
        },
    )
}

pub(super) fn rms_norm_cases(dtype: DType) -> Vec<Case> {
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
    let (shape, l0, l1, l2) = PERMUTED_PLAN;
    let x = rng.values(dtype, numel(shape), -2.0, 2.0);
    let w = rng.values(dtype, last(shape), 0.5, 1.5);
    let name = norm_label(shape, (l0, l1, l2), false);
    cases.push(rms_norm_case(dtype, name, shape, x, w, 1e-6, (l0, l1, l2)));
    let (shape, l0, l1, l2) = ZERO_WIDTH_PLAN;
    let name = norm_label(shape, (l0, l1, l2), false);
    cases.push(rms_norm_case(
        dtype,
        name,
        shape,
        vec![],
        vec![],
        1e-6,
        (l0, l1, l2),
    ));
    let (shape, l0, l1, l2) = UNIT_DIM_PLAN;
    let x = rng.values(dtype, numel(shape), -2.0, 2.0);
    let w = rng.values(dtype, last(shape), 0.5, 1.5);
    let name = norm_label(shape, (l0, l1, l2), false);
    cases.push(rms_norm_case(dtype, name, shape, x, w, 1e-6, (l0, l1, l2)));
    cases
}

pub(super) fn rms_norm_backward_cases(dtype: DType) -> Vec<Case> {
    let mut rng = Rng::for_case("rms_norm_backward", dtype);
    let mut cases = Vec::new();
    for (shape, l0, l1, l2) in NORM_PLANS.into_iter().chain([PERMUTED_PLAN]) {
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
            // grad_input sums over the row, grad_weight over the rows; both
            // cancel.
            Tolerance::accumulated(8.0, h + rows(shape)),
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
pub(crate) fn layer_norm_case(
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
        .filter(|c| c.is_finite())
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
        Tolerance::accumulated(8.0, h * (1 + cond.ceil() as usize) + 2),
        move |exec, t| exec.layer_norm(&t[0], &t[1], &t[2], &t[3], &t[4], &t[5], eps),
        move |d| {
            let (out, mean, rstd) = reference::layer_norm(&d[0], &d[1], &d[2], eps)?;
            Ok(vec![out, mean, rstd])
        },
    )
}

pub(super) fn layer_norm_cases(dtype: DType) -> Vec<Case> {
    let mut rng = Rng::for_case("layer_norm", dtype);
    let mut cases = Vec::new();
    // A plan's case: rows with a mean of about 1, not 0, so that the mean
    // matters.
    let planned = |rng: &mut Rng, (shape, l0, l1, l2): (&[usize], Layout, Layout, Layout)| {
        let h = last(shape);
        let x = rng.values(dtype, numel(shape), -1.0, 3.0);
        let w = rng.values(dtype, h, 0.5, 1.5);
        let b = rng.values(dtype, h, -0.5, 0.5);
        let name = norm_label(shape, (l0, l1, l2), false);
        layer_norm_case(dtype, name, shape, x, w, b, 1e-5, (l0, l1, l2))
    };
    for plan in NORM_PLANS {
        cases.push(planned(&mut rng, plan));
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
    cases.push(planned(&mut rng, PERMUTED_PLAN));
    cases.push(planned(&mut rng, ZERO_WIDTH_PLAN));
    // Rows of one element: x - mean is 0 only where x is finite (inf - inf
    // and NaN - NaN are NaN), so NaN and the infinities give NaN, not the
    // bias (mutation round 10: a kernel that wrote the bias for rows of one
    // passed every case).
    let inf = f64::INFINITY;
    cases.push(layer_norm_case(
        dtype,
        "rows of one element: NaN, +inf, -inf, 2".into(),
        &[4, 1],
        vec![f64::NAN, inf, -inf, 2.0],
        vec![1.5],
        vec![0.25],
        1e-5,
        (C, C, C),
    ));
    cases.push(planned(&mut rng, UNIT_DIM_PLAN));
    cases
}

pub(super) fn layer_norm_backward_cases(dtype: DType) -> Vec<Case> {
    let mut rng = Rng::for_case("layer_norm_backward", dtype);
    let mut cases = Vec::new();
    // (shape, layouts, the forward pass's eps, the inputs' range).
    let plans = NORM_PLANS
        .into_iter()
        .map(|(shape, l0, l1, l2)| (shape, (l0, l1, l2), 1e-5, (-1.0, 3.0)));
    // Rows of almost one value, whose statistics a forward pass with eps
    // 0.1 saved: a kernel that recomputes rstd with its own eps (1e-5)
    // instead of reading the saved one is off by a factor of 70.
    let saved_eps = [(&[4usize, 16][..], (C, C, C), 0.1, (1.0, 1.03))];
    let (shape, l0, l1, l2) = PERMUTED_PLAN;
    let permuted = [(shape, (l0, l1, l2), 1e-5, (-1.0, 3.0))];
    for (shape, layouts, eps, (lo, hi)) in plans.chain(saved_eps).chain(permuted) {
        let (h, n) = (last(shape), numel(shape));
        let x = rng.values(dtype, n, lo, hi);
        let w = rng.values(dtype, h, 0.5, 1.5);
        let b = rng.values(dtype, h, -0.5, 0.5);
        let g = rng.values(dtype, n, -1.0, 1.0);
        let mut label = norm_label(shape, layouts, true);
        if eps != 1e-5 {
            label.push_str(&format!(" saved with eps {eps}"));
        }
        cases.push(layer_norm_backward_case(
            dtype,
            label,
            shape,
            layouts,
            eps,
            [x, w, b, g],
        ));
    }
    // Rows of one element: xhat is 0 and grad_input is
    // rstd (g w - mean(g w)), 0 only where the gradient is finite (inf -
    // inf and NaN - NaN are NaN); grad_weight sums g xhat (inf 0 is NaN)
    // and grad_bias sums g. Mutation round 10: a kernel that wrote a zero
    // grad_input for rows of one without reading grad_out passed every
    // case, none of which had a gradient that is not finite.
    let inf = f64::INFINITY;
    let specials = [
        ("NaN, +inf, -inf, 2", vec![f64::NAN, inf, -inf, 2.0]),
        ("-inf, 2, -0.5", vec![-inf, 2.0, -0.5]),
    ];
    for (values, g) in specials {
        let rows = g.len();
        let x = rng.values(dtype, rows, -1.0, 3.0);
        cases.push(layer_norm_backward_case(
            dtype,
            format!("rows of one element, gradients {values}"),
            &[rows, 1],
            (C, C, C),
            1e-5,
            [x, vec![1.5], vec![0.25], g],
        ));
    }
    cases
}

/// A `layer_norm_backward` case of `x`, `w` and `g`, with the statistics a
/// forward pass with `eps` saved (`b` only feeds that forward pass).
pub(crate) fn layer_norm_backward_case(
    dtype: DType,
    label: String,
    shape: &[usize],
    (l0, l1, l2): (Layout, Layout, Layout),
    eps: f64,
    [x, w, b, g]: [Vec<f64>; 4],
) -> Case {
    let h = last(shape);
    let stats = &shape[..shape.len() - 1];
    let (_, mean, rstd) = reference::layer_norm(
        &Dense::new(shape, x.clone()),
        &Dense::new(&[h], w.clone()),
        &Dense::new(&[h], b),
        eps,
    )
    .expect("valid shapes");
    case(
        "layer_norm_backward",
        dtype,
        label,
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
        Tolerance::accumulated(8.0, h + rows(shape)),
        |exec, t| exec.layer_norm_backward(&t[0], &t[1], &t[2], &t[3], &t[4], &t[5], &t[6], &t[7]),
        |d| {
            let (gi, gw, gb) = reference::layer_norm_backward(&d[0], &d[1], &d[2], &d[3], &d[4])?;
            Ok(vec![gi, gw, gb])
        },
    )
}

// ---------------------------------------------------------------------------
// Rotary embeddings.
