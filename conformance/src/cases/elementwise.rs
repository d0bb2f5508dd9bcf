//! Cases of the ABI 1.1 elementwise operators (unary math, activations and
//! their backward operators, SwiGLU) and reductions.

use polychip_host::{ActivationBackwardOp, DType, Op, ReduceOp, UnaryOp};

use super::{Rng, case, every_pair, input, numel, output, shape_label, specials};
use crate::case::{Case, Layout};
use crate::reference::{self, Dense};
use crate::tolerance::{Bias, Tolerance};

/// The case generator of each operator of this family.
pub(super) fn cases(op: Op) -> Option<fn(DType) -> Vec<Case>> {
    if let Some(unary) = UnaryOp::ALL.into_iter().find(|u| u.op() == op) {
        return Some(unary_cases(unary));
    }
    if let Some(act) = ActivationBackwardOp::ALL.into_iter().find(|a| a.op() == op) {
        return Some(activation_cases(act));
    }
    if let Some(reduce) = ReduceOp::ALL.into_iter().find(|r| r.op() == op) {
        return Some(reduce_cases(reduce));
    }
    Some(match op {
        Op::PowScalar => pow_scalar,
        Op::Swiglu => swiglu,
        Op::SwigluBackward => swiglu_backward,
        Op::SumSquares => sum_squares,
        _ => return None,
    })
}

const SHAPES: [(&[usize], Layout); 7] = [
    (&[], Layout::Contiguous),
    (&[7], Layout::Contiguous),
    (&[3, 5], Layout::Transposed),
    (&[4, 6], Layout::Strided),
    (&[0, 3], Layout::Contiguous),
    (&[2, 3, 67], Layout::Contiguous),
    // Nine dimensions, past a kernel's fixed arrays of eight.
    (&[2, 1, 2, 3, 1, 2, 2, 1, 3], Layout::Transposed),
];

fn unary_reference(op: UnaryOp, x: &Dense) -> Result<Dense, reference::RefError> {
    match op {
        UnaryOp::Neg => reference::neg(x),
        UnaryOp::Exp => reference::exp(x),
        UnaryOp::Log => reference::log(x),
        UnaryOp::Sqrt => reference::sqrt(x),
        UnaryOp::Rsqrt => reference::rsqrt(x),
        UnaryOp::Tanh => reference::tanh(x),
        UnaryOp::Relu => reference::relu(x),
        UnaryOp::Silu => reference::silu(x),
        UnaryOp::Gelu => reference::gelu(x),
        UnaryOp::GeluErf => reference::gelu_erf(x),
        UnaryOp::Sigmoid => reference::sigmoid(x),
        UnaryOp::Sin => reference::sin(x),
        UnaryOp::Cos => reference::cos(x),
    }
}

fn unary_cases(op: UnaryOp) -> fn(DType) -> Vec<Case> {
    match op {
        UnaryOp::Neg => |d| unary(UnaryOp::Neg, d),
        UnaryOp::Exp => |d| unary(UnaryOp::Exp, d),
        UnaryOp::Log => |d| unary(UnaryOp::Log, d),
        UnaryOp::Sqrt => |d| unary(UnaryOp::Sqrt, d),
        UnaryOp::Rsqrt => |d| unary(UnaryOp::Rsqrt, d),
        UnaryOp::Tanh => |d| unary(UnaryOp::Tanh, d),
        UnaryOp::Relu => |d| unary(UnaryOp::Relu, d),
        UnaryOp::Silu => |d| unary(UnaryOp::Silu, d),
        UnaryOp::Gelu => |d| unary(UnaryOp::Gelu, d),
        UnaryOp::GeluErf => |d| unary(UnaryOp::GeluErf, d),
        UnaryOp::Sigmoid => |d| unary(UnaryOp::Sigmoid, d),
        UnaryOp::Sin => |d| unary(UnaryOp::Sin, d),
        UnaryOp::Cos => |d| unary(UnaryOp::Cos, d),
    }
}

fn unary(op: UnaryOp, dtype: DType) -> Vec<Case> {
    let mut rng = Rng::for_case(op.name(), dtype);
    let (lo, hi) = match op {
        UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Rsqrt => (0.01, 10.0),
        UnaryOp::Exp => (-10.0, 10.0),
        UnaryOp::Sin | UnaryOp::Cos => (-10.0, 10.0),
        _ => (-4.0, 4.0),
    };
    let tolerance = unary_tolerance(op);
    let mut cases = Vec::new();
    for (shape, layout) in SHAPES {
        let x = rng.values(dtype, numel(shape), lo, hi);
        cases.push(unary_case(
            op,
            dtype,
            shape_label(shape, layout),
            shape,
            x,
            layout,
            tolerance,
        ));
    }
    // IEEE edge cases where the operator defines them (silu and gelu at
    // ±inf are left undefined by the ABI).
    if !matches!(op, UnaryOp::Silu | UnaryOp::Gelu) {
        let s = specials(dtype);
        cases.push(unary_case(
            op,
            dtype,
            "NaN, ±inf, ±0, max, subnormals".into(),
            &[s.len()],
            s,
            Layout::Contiguous,
            tolerance,
        ));
    }
    if op == UnaryOp::Exp {
        cases.push(subnormal_results(op, dtype));
        // Inputs up to ln(max) (round 7: a fast exp that clamped its input
        // to 88 passed, nothing above 10 being tested).
        let top = match dtype {
            DType::F16 => 65504f64.ln(),
            DType::F64 => f64::MAX.ln(),
            _ => f64::from(f32::MAX).ln(),
        };
        let x: Vec<f64> = (0..24)
            .map(|j| crate::values::round_to(dtype, top - 8.0 + 8.0 * f64::from(j) / 23.0))
            .collect();
        cases.push(unary_case(
            UnaryOp::Exp,
            dtype,
            "results up to the overflow threshold".into(),
            &[x.len()],
            x,
            Layout::Contiguous,
            unary_tolerance(UnaryOp::Exp),
        ));
    }
    if matches!(op, UnaryOp::GeluErf | UnaryOp::Sigmoid) {
        cases.extend(gelu_erf_sigmoid_tails(op, dtype));
    }
    if op == UnaryOp::Sigmoid {
        // The ABI: sigmoid of a large negative x is "a tiny positive
        // number, not 0 while it is representable". Below -87 that is
        // e^x in the subnormal range, which the tail above stops short of
        // (mutation round 12: `1 / (1 + e^-x)` in f32, whose e^-x overflows
        // below -88.7, gave 0 there and passed).
        cases.push(subnormal_results(op, dtype));
    }
    if matches!(op, UnaryOp::Sin | UnaryOp::Cos) {
        cases.extend(super::data_1_3::trig_extra(op, dtype));
    }
    if op == UnaryOp::Silu {
        for (label, x, tolerance) in tails(dtype) {
            let n = x.len();
            cases.push(unary_case(
                op,
                dtype,
                label.into(),
                &[n],
                x,
                Layout::Contiguous,
                tolerance,
            ));
        }
    }
    cases
}

/// The negative tails of `gelu_erf` (`x Phi(x)`, about `-phi(x)`: from -5
/// to -12, results down to 1e-32; in f16 from -3 to -5.3, down to its
/// subnormals) and `sigmoid` (about `e^x`: from -20 to -87, down to 1e-38;
/// in f16 from -9 to -16, down past its smallest subnormal), where a kernel
/// computing `1 + erf` (which cancels), or `1 / (1 + e^-x)` with an
/// overflowing `e^-x`, or flushing subnormal results, fails; and the
/// inputs beyond, down to the lowest finite value, whose results round to
/// 0 (never NaN: an unguarded `inf / inf` or `inf * 0` shows). The
/// condition number is about `x^2` for `gelu_erf` and `|x|` for `sigmoid`,
/// times u(f32) (a kernel rounds `x / sqrt 2` or `e^x`'s reduced argument).
fn gelu_erf_sigmoid_tails(op: UnaryOp, dtype: DType) -> Vec<Case> {
    let (hi, lo) = match (op, dtype) {
        (UnaryOp::GeluErf, DType::F16) => (-3.0, -5.3),
        (UnaryOp::GeluErf, _) => (-5.0, -12.0),
        (_, DType::F16) => (-9.0, -16.0),
        _ => (-20.0, -87.0),
    };
    let n = 24;
    let x: Vec<f64> = (0..n)
        .map(|j| crate::values::round_to(dtype, hi + (lo - hi) * j as f64 / (n - 1) as f64))
        .collect();
    let condition = if op == UnaryOp::GeluErf { lo * lo } else { -lo };
    vec![
        unary_case(
            op,
            dtype,
            format!("negative tail from {hi} to {lo}"),
            &[n],
            x,
            Layout::Contiguous,
            Tolerance::computed(16.0 + 2.0 * condition),
        ),
        unary_case(
            op,
            dtype,
            BEYOND_TAIL.into(),
            &[beyond_tail(dtype).len()],
            beyond_tail(dtype),
            Layout::Contiguous,
            Tolerance::computed(16.0),
        ),
    ]
}

/// The label of the cases of [`negative_tail`].
const NEGATIVE_TAIL: &str = "large negative inputs: tiny results, in the subnormal range in f16";

/// `n` inputs spread over the tail where `x sigmoid(x)` (silu, swiglu and
/// their gradients, about `x e^x`) is tiny but not 0: in f16 from -9 to
/// -21, results from the smallest normal f16 down past the smallest
/// subnormal; in the other dtypes from -20 to -87, results down to 1e-36
/// (normal: a kernel that computes `x / (1 + exp(-x))` in f32 overflows
/// `exp` below -88.7, so lower inputs would make their own result
/// undefined). A kernel that flushes subnormal results to zero, or cuts
/// the tail off early (`0 for x < -16`), fails; no other case reaches it
/// (the activations' inputs stop at -5).
fn negative_tail(dtype: DType, n: usize) -> Vec<f64> {
    let (hi, lo) = if dtype == DType::F16 {
        (-9.0, -21.0)
    } else {
        (-20.0, -87.0)
    };
    (0..n)
        .map(|j| crate::values::round_to(dtype, hi + (lo - hi) * j as f64 / (n - 1) as f64))
        .collect()
}

/// The label of the cases of [`beyond_tail`].
const BEYOND_TAIL: &str =
    "inputs from -110 to the lowest finite value: results that round to 0 in every dtype";

/// Inputs below the tail of [`negative_tail`], down to the dtype's lowest
/// finite value, where `x sigmoid(x)` and its derivative are below half
/// the smallest f32 subnormal: each result is 0 (of either sign). A kernel
/// whose `exp(-x)` overflows unguarded on the way (`x e^x (...)` of an
/// `exp(-x)` of inf, or `inf / inf`) returns NaN instead.
fn beyond_tail(dtype: DType) -> Vec<f64> {
    let lowest = -specials(dtype)[5];
    [
        -110.0, -200.0, -500.0, -709.0, -710.0, -745.0, -800.0, -1e4, -6e4, -1e6, -1e30,
    ]
    .into_iter()
    .filter(|&x| x > lowest)
    .chain([lowest])
    .map(|x| crate::values::round_to(dtype, x))
    .collect()
}

/// The two tails, each with its label and tolerance (relative to the
/// element: in the second, 0 itself).
fn tails(dtype: DType) -> [(&'static str, Vec<f64>, Tolerance); 2] {
    let near = negative_tail(dtype, 24);
    let tolerance = Tolerance::computed(negative_tail_rel(&near));
    [
        (NEGATIVE_TAIL, near, tolerance),
        (BEYOND_TAIL, beyond_tail(dtype), Tolerance::computed(16.0)),
    ]
}

/// The relative error of an f32 `x sigmoid(x)` (or its derivative) in the
/// tail: its condition number `|1 + x (1 - s)|`, about `|x|`, times u(f32)
/// (a kernel rounds `exp`'s reduced argument), and a few roundings.
fn negative_tail_rel(x: &[f64]) -> f64 {
    16.0 + 2.0 * x.iter().fold(0.0f64, |m, v| m.max(v.abs())).ceil()
}

/// exp of inputs from `ln(smallest subnormal)` up to `ln(smallest normal)`
/// in `dtype`: results in the subnormal range, which a kernel that flushes
/// them to zero (flush-to-zero, fast math) gets wrong and no other case
/// reaches (exp's cases stop at -10). The condition number |x| of exp is
/// large here (about 100 in f32, 745 in f64), and the kernel rounds its
/// reduced argument: it is charged relative to the element, which for a
/// subnormal result is a small fraction of its ULP.
///
/// Also `sigmoid`'s, which is `e^x (1 - e^x + ...)`, `e^x` to every
/// precision there: the same inputs, the same condition number.
fn subnormal_results(op: UnaryOp, dtype: DType) -> Case {
    let tiny = crate::values::ulp(dtype, 0.0);
    let normal = match dtype {
        DType::F64 => f64::MIN_POSITIVE,
        DType::F16 => 2f64.powi(-14),
        _ => f64::from(f32::MIN_POSITIVE),
    };
    let (lo, hi) = (tiny.ln() + 0.5, normal.ln());
    let x: Vec<f64> = (0..16)
        .map(|j| crate::values::round_to(dtype, lo + (hi - lo) * f64::from(j) / 16.0))
        .collect();
    let tolerance = Tolerance::computed(16.0 + 2.0 * tiny.ln().abs().ceil());
    unary_case(
        op,
        dtype,
        "results in the subnormal range".into(),
        &[x.len()],
        x,
        Layout::Contiguous,
        tolerance,
    )
}

/// The error model of an activation's backward.
pub(super) fn activation_backward_tolerance(op: ActivationBackwardOp) -> Tolerance {
    if op == ActivationBackwardOp::ReluBackward {
        // A select: exactly `grad_out` or zero, of either sign.
        Tolerance::EXACT.any_zero_sign()
    } else {
        Tolerance::accumulated(16.0, 8).with_bias(Bias::LowPrecision)
    }
}

/// The error model of a unary operator (see the comments).
pub(super) fn unary_tolerance(op: UnaryOp) -> Tolerance {
    // Computed in f32 (f64 for f64) and rounded once to the output dtype:
    // half an ULP of the output plus the f32 function's own error relative
    // to the element, a few u(f32) and the function's condition number
    // |x f'(x) / f(x)| times u(f32) (a kernel rounds its reduced argument,
    // x log2(e) for exp, in f32). In bf16 and f16 that is "correctly rounded
    // from an accurate f32 value"; only f32 and f64 outputs may show the
    // f32 algorithm's own error, so only bf16 and f16 are tested for bias.
    match op {
        UnaryOp::Neg | UnaryOp::Relu => Tolerance::EXACT,
        // IEEE square root is correctly rounded in every format.
        UnaryOp::Sqrt => Tolerance::computed(1.0).with_bias(Bias::Always),
        // Two correctly rounded operations.
        UnaryOp::Rsqrt => Tolerance::computed(2.0),
        // |x| <= 10.
        UnaryOp::Exp => Tolerance::computed(16.0),
        UnaryOp::Log | UnaryOp::Tanh | UnaryOp::Silu => Tolerance::computed(8.0),
        // x Phi(x): its condition number |1 + x phi(x) / Phi(x)| is at
        // most 1 + x^2 + 1 on [-4, 4] (about x^2 in the negative tail),
        // times u(f32) for a kernel that rounds x / sqrt(2), plus erfc's
        // own few ULPs.
        UnaryOp::GeluErf => Tolerance::computed(48.0),
        // 1 / (1 + e^-x): condition number |x| (1 - s) <= 4 on [-4, 4].
        UnaryOp::Sigmoid => Tolerance::computed(8.0),
        // ABI 1.3: exact argument reduction, within about 1 ULP.
        UnaryOp::Sin | UnaryOp::Cos => super::data_1_3::trig_tolerance(),
        // x sigmoid(2u) with u = c (x + a x^3): the sigmoid's condition
        // number 2|u| (1 - s) is at most 11 on [-4, 4]. The spec's formula
        // 0.5 x (1 + tanh(u)), evaluated literally in f32, cancels for x
        // below about -3 and errs by u(f32) |x| there: an absolute error
        // of u(f32) relative to the tensor's scale (n = 1).
        UnaryOp::Gelu => Tolerance::accumulated(32.0, 1).with_bias(Bias::LowPrecision),
    }
}

pub(super) fn unary_case(
    op: UnaryOp,
    dtype: DType,
    label: String,
    shape: &[usize],
    x: Vec<f64>,
    layout: Layout,
    tolerance: Tolerance,
) -> Case {
    case(
        op.name(),
        dtype,
        label,
        vec![
            input("input", dtype, shape, x, layout),
            output("out", dtype, shape, Layout::Contiguous),
        ],
        tolerance,
        move |exec, t| exec.unary(op, &t[0], &t[1]),
        move |d| Ok(vec![unary_reference(op, &d[0])?]),
    )
}

fn pow_scalar(dtype: DType) -> Vec<Case> {
    let mut rng = Rng::for_case("pow_scalar", dtype);
    let mut cases = Vec::new();
    // The last two give fractional exponents negative bases (NaN): a pow
    // computed as exp2(e log2 |x|), the sign fixed up for integer
    // exponents only, returns a number there.
    for (exponent, lo) in [
        (2.0, -3.0),
        (3.0, -3.0),
        (-1.0, 0.1),
        (0.5, 0.0),
        (0.0, -3.0),
        (1.7, 0.01),
        (-0.5, -3.0),
        (1.7, -3.0),
    ] {
        let mut x = rng.values(dtype, 40, lo, 3.0);
        if exponent == 0.0 {
            x.extend([f64::NAN, 0.0, f64::INFINITY]);
        }
        let layout = if exponent == 3.0 || exponent == 0.5 {
            Layout::Strided
        } else {
            Layout::Contiguous
        };
        let n = x.len();
        cases.push(case(
            "pow_scalar",
            dtype,
            format!(
                "exponent {exponent} [{n}] {layout}{}",
                if lo < 0.0 && f64::fract(exponent) != 0.0 {
                    " negative bases"
                } else {
                    ""
                }
            ),
            vec![
                input("input", dtype, &[n], x, layout),
                output("out", dtype, &[n], Layout::Contiguous),
            ],
            // exp(e log x) in f32: the condition number |e log x| (up to
            // |e| ln 100 here) times u(f32), and a few roundings.
            Tolerance::computed(8.0 + 2.0 * f64::abs(exponent) * 100f64.ln()),
            move |exec, t| exec.pow_scalar(&t[0], &t[1], exponent),
            move |d| Ok(vec![reference::pow_scalar(&d[0], exponent)?]),
        ));
    }
    // An output of four dims, permuted (rows not evenly spaced, the last
    // two dims compact), from a permuted and from a transposed input: an
    // elementwise kernel that handles one- or two-dimensional views only,
    // or judges a view compact by its inner dims, misreads them.
    let shape = [2, 3, 4, 5];
    for layout in [Layout::Permuted, Layout::Transposed] {
        let x = rng.values(dtype, numel(&shape), -3.0, 3.0);
        cases.push(case(
            "pow_scalar",
            dtype,
            format!(
                "exponent 3 {} input, permuted out",
                shape_label(&shape, layout)
            ),
            vec![
                input("input", dtype, &shape, x, layout),
                output("out", dtype, &shape, Layout::Permuted),
            ],
            // As the exponent 3 above.
            Tolerance::computed(8.0 + 6.0 * 100f64.ln()),
            |exec, t| exec.pow_scalar(&t[0], &t[1], 3.0),
            |d| Ok(vec![reference::pow_scalar(&d[0], 3.0)?]),
        ));
    }
    // C pow's special values at the exponents kernels special-case
    // (mutation round 12: exponent 0.5 taken as sqrt passed, though
    // pow(-0, 0.5) is +0 and pow(-inf, 0.5) +inf where sqrt gives -0 and
    // NaN; likewise rsqrt for -0.5, a reciprocal or a product for the
    // integers): the signs of zeros and infinities, odd and even
    // exponents of negative bases, overflow and underflow at the ends.
    let mut x = specials(dtype);
    x.extend([2.0, -2.0, 3.0, -3.0, 0.25]);
    for exponent in [0.5, -0.5, 2.0, 3.0, -1.0, -2.0, 1.0, 0.25, 1.7, -1.7] {
        let x = x.clone();
        let n = x.len();
        cases.push(case(
            "pow_scalar",
            dtype,
            format!("exponent {exponent} special values"),
            vec![
                input("input", dtype, &[n], x, Layout::Contiguous),
                output("out", dtype, &[n], Layout::Contiguous),
            ],
            // As above; the special values themselves are exact.
            Tolerance::computed(8.0 + 2.0 * f64::abs(exponent) * 100f64.ln()),
            move |exec, t| exec.pow_scalar(&t[0], &t[1], exponent),
            move |d| Ok(vec![reference::pow_scalar(&d[0], exponent)?]),
        ));
    }
    cases
}

fn activation_cases(op: ActivationBackwardOp) -> fn(DType) -> Vec<Case> {
    match op {
        ActivationBackwardOp::ReluBackward => {
            |d| activation_backward(ActivationBackwardOp::ReluBackward, d)
        }
        ActivationBackwardOp::SiluBackward => {
            |d| activation_backward(ActivationBackwardOp::SiluBackward, d)
        }
        ActivationBackwardOp::GeluBackward => {
            |d| activation_backward(ActivationBackwardOp::GeluBackward, d)
        }
        ActivationBackwardOp::GeluErfBackward => {
            |d| activation_backward(ActivationBackwardOp::GeluErfBackward, d)
        }
    }
}

fn activation_backward(op: ActivationBackwardOp, dtype: DType) -> Vec<Case> {
    let mut rng = Rng::for_case(op.name(), dtype);
    let mut cases = Vec::new();
    for (i, (shape, layout)) in SHAPES.into_iter().enumerate() {
        let g = rng.values(dtype, numel(shape), -2.0, 2.0);
        let mut x = rng.values(dtype, numel(shape), -5.0, 5.0);
        if i == 1 {
            // The kinks: inputs exactly 0 and -0, and the smallest values
            // either side (the derivative at 0 is defined by the ABI).
            let tiny = crate::values::ulp(dtype, 0.0);
            for (v, &edge) in x.iter_mut().zip(&[0.0, -0.0, tiny, -tiny, 0.0, -0.0]) {
                *v = edge;
            }
        }
        cases.push(case(
            op.name(),
            dtype,
            shape_label(shape, layout),
            vec![
                input("grad_out", dtype, shape, g, Layout::Contiguous),
                input("input", dtype, shape, x, layout),
                output("grad_in", dtype, shape, Layout::Contiguous),
            ],
            // The derivatives s (1 + x (1 - s)) and its gelu analogue are
            // zero near x = -1.28 (silu) and x = -0.75 (gelu), where terms
            // of the size of |g x| (x up to 5) cancel: f32 errors relative
            // to the element, and a few u(f32) of those terms relative to
            // the tensor's scale.
            activation_backward_tolerance(op),
            move |exec, t| exec.activation_backward(op, &t[0], &t[1], &t[2]),
            move |d| {
                let r = match op {
                    ActivationBackwardOp::ReluBackward => reference::relu_backward(&d[0], &d[1]),
                    ActivationBackwardOp::SiluBackward => reference::silu_backward(&d[0], &d[1]),
                    ActivationBackwardOp::GeluBackward => reference::gelu_backward(&d[0], &d[1]),
                    ActivationBackwardOp::GeluErfBackward => {
                        reference::gelu_erf_backward(&d[0], &d[1])
                    }
                };
                Ok(vec![r?])
            },
        ));
    }
    if op == ActivationBackwardOp::ReluBackward {
        // Every pair of special values (grad_out, input): the ABI's select
        // gives 0 wherever input <= 0, even for an infinite or NaN
        // grad_out, and passes grad_out where input is NaN (mutation round
        // 9: `x > 0 ? g : 0`, which gives 0 there, passed every case).
        let s = specials(dtype);
        let n = s.len();
        let (g, x) = every_pair(&s);
        cases.push(case(
            op.name(),
            dtype,
            "special values",
            vec![
                input("grad_out", dtype, &[n * n], g, Layout::Contiguous),
                input("input", dtype, &[n * n], x, Layout::Contiguous),
                output("grad_in", dtype, &[n * n], Layout::Contiguous),
            ],
            activation_backward_tolerance(op),
            move |exec, t| exec.activation_backward(op, &t[0], &t[1], &t[2]),
            |d| Ok(vec![reference::relu_backward(&d[0], &d[1])?]),
        ));
    }
    if op == ActivationBackwardOp::GeluErfBackward {
        // Every special input (the ABI defines them all: NaN at ±inf, where
        // `x phi(x)` is `inf * 0`; 1 at the largest values, 0 at the
        // lowest, 0.5 at ±0 and the subnormals), and inputs far out where
        // x^2 overflows f32 (x phi(x) must stay 0, not `x * e^-inf` of
        // an overflowed square turned NaN).
        let mut x = specials(dtype);
        if dtype != DType::F16 {
            x.extend(
                [1e10, -1e10, 1e20, -1e20, 3e38, -3e38].map(|v| crate::values::round_to(dtype, v)),
            );
        } else {
            x.extend([300.0, -300.0, 6e4, -6e4]);
        }
        let n = x.len();
        let g = rng.values(dtype, n, 0.5, 2.0);
        cases.push(case(
            op.name(),
            dtype,
            "special and huge inputs",
            vec![
                input("grad_out", dtype, &[n], g, Layout::Contiguous),
                input("input", dtype, &[n], x, Layout::Contiguous),
                output("grad_in", dtype, &[n], Layout::Contiguous),
            ],
            Tolerance::computed(16.0),
            move |exec, t| exec.activation_backward(op, &t[0], &t[1], &t[2]),
            |d| Ok(vec![reference::gelu_erf_backward(&d[0], &d[1])?]),
        ));
    }
    if op == ActivationBackwardOp::GeluBackward && dtype != DType::F16 {
        // Far past where the derivative is 1 or 0: x^2 overflows f32 from
        // 1.8e19 on (a kernel's `s + 2 x s (1 - s) u'` became 0 * inf, NaN).
        let x = vec![1e10, -1e10, 1e13, -1e13, 1e20, -1e20, 3e38, -3e38];
        let n = x.len();
        cases.push(case(
            op.name(),
            dtype,
            "inputs from 1e10 to 3e38",
            vec![
                input("grad_out", dtype, &[n], vec![1.0; n], Layout::Contiguous),
                input("input", dtype, &[n], x, Layout::Contiguous),
                output("grad_in", dtype, &[n], Layout::Contiguous),
            ],
            Tolerance::computed(16.0),
            move |exec, t| exec.activation_backward(op, &t[0], &t[1], &t[2]),
            |d| Ok(vec![reference::gelu_backward(&d[0], &d[1])?]),
        ));
    }
    if op == ActivationBackwardOp::SiluBackward {
        // The gradient g e^x (1 + x) of the tails (see `tails`).
        for (label, x, tolerance) in tails(dtype) {
            let n = x.len();
            let g = rng.values(dtype, n, 0.5, 2.0);
            cases.push(case(
                op.name(),
                dtype,
                label,
                vec![
                    input("grad_out", dtype, &[n], g, Layout::Contiguous),
                    input("input", dtype, &[n], x, Layout::Contiguous),
                    output("grad_in", dtype, &[n], Layout::Contiguous),
                ],
                tolerance,
                move |exec, t| exec.activation_backward(op, &t[0], &t[1], &t[2]),
                |d| Ok(vec![reference::silu_backward(&d[0], &d[1])?]),
            ));
        }
    }
    cases
}

fn swiglu(dtype: DType) -> Vec<Case> {
    let mut rng = Rng::for_case("swiglu", dtype);
    let mut cases: Vec<Case> = SHAPES
        .iter()
        .map(|&(shape, layout)| {
            let gate = rng.values(dtype, numel(shape), -5.0, 5.0);
            let up = rng.values(dtype, numel(shape), -2.0, 2.0);
            case(
                "swiglu",
                dtype,
                shape_label(shape, layout),
                vec![
                    input("gate", dtype, shape, gate, layout),
                    input("up", dtype, shape, up, Layout::Contiguous),
                    output("out", dtype, shape, Layout::Contiguous),
                ],
                // silu(gate) * up in f32: no cancellation.
                Tolerance::computed(16.0),
                |exec, t| exec.swiglu(&t[0], &t[1], &t[2]),
                |d| Ok(vec![reference::swiglu(&d[0], &d[1])?]),
            )
        })
        .collect();
    // silu of a gate in the tails (see `tails`).
    for (label, gate, tolerance) in tails(dtype) {
        let n = gate.len();
        let up = rng.values(dtype, n, 0.5, 2.0);
        cases.push(case(
            "swiglu",
            dtype,
            label,
            vec![
                input("gate", dtype, &[n], gate, Layout::Contiguous),
                input("up", dtype, &[n], up, Layout::Contiguous),
                output("out", dtype, &[n], Layout::Contiguous),
            ],
            tolerance,
            |exec, t| exec.swiglu(&t[0], &t[1], &t[2]),
            |d| Ok(vec![reference::swiglu(&d[0], &d[1])?]),
        ));
    }
    cases
}

fn swiglu_backward(dtype: DType) -> Vec<Case> {
    let mut rng = Rng::for_case("swiglu_backward", dtype);
    let mut cases: Vec<Case> = SHAPES
        .iter()
        .map(|&(shape, layout)| {
            let n = numel(shape);
            let (gate, up, g) = (
                rng.values(dtype, n, -5.0, 5.0),
                rng.values(dtype, n, -2.0, 2.0),
                rng.values(dtype, n, -2.0, 2.0),
            );
            case(
                "swiglu_backward",
                dtype,
                shape_label(shape, layout),
                vec![
                    input("gate", dtype, shape, gate, layout),
                    input("up", dtype, shape, up, Layout::Contiguous),
                    input("grad_out", dtype, shape, g, Layout::Contiguous),
                    output("grad_gate", dtype, shape, Layout::Contiguous),
                    output("grad_up", dtype, shape, Layout::Contiguous),
                ],
                // silu(gate) g and up g silu'(gate), which cancels as in
                // silu_backward.
                Tolerance::accumulated(16.0, 8).with_bias(Bias::LowPrecision),
                |exec, t| exec.swiglu_backward(&t[0], &t[1], &t[2], &t[3], &t[4]),
                |d| {
                    let (gg, gu) = reference::swiglu_backward(&d[0], &d[1], &d[2])?;
                    Ok(vec![gg, gu])
                },
            )
        })
        .collect();
    // A gate in the tails (see `tails`): both gradients are tiny, or 0.
    for (label, gate, tolerance) in tails(dtype) {
        let n = gate.len();
        let (up, g) = (
            rng.values(dtype, n, 0.5, 2.0),
            rng.values(dtype, n, 0.5, 2.0),
        );
        cases.push(case(
            "swiglu_backward",
            dtype,
            label,
            vec![
                input("gate", dtype, &[n], gate, Layout::Contiguous),
                input("up", dtype, &[n], up, Layout::Contiguous),
                input("grad_out", dtype, &[n], g, Layout::Contiguous),
                output("grad_gate", dtype, &[n], Layout::Contiguous),
                output("grad_up", dtype, &[n], Layout::Contiguous),
            ],
            tolerance,
            |exec, t| exec.swiglu_backward(&t[0], &t[1], &t[2], &t[3], &t[4]),
            |d| {
                let (gg, gu) = reference::swiglu_backward(&d[0], &d[1], &d[2])?;
                Ok(vec![gg, gu])
            },
        ));
    }
    cases
}

fn reduce_cases(op: ReduceOp) -> fn(DType) -> Vec<Case> {
    match op {
        ReduceOp::Sum => |d| reduce(ReduceOp::Sum, d),
        ReduceOp::Mean => |d| reduce(ReduceOp::Mean, d),
        ReduceOp::Max => |d| reduce(ReduceOp::Max, d),
        ReduceOp::Argmax => |d| reduce(ReduceOp::Argmax, d),
    }
}

fn reduce(op: ReduceOp, dtype: DType) -> Vec<Case> {
    let mut rng = Rng::for_case(op.name(), dtype);
    let mut cases = Vec::new();
    // The last plan reduces a contiguous last dimension whose extent is
    // neither a multiple of a vector width (4 to 32 lanes) nor below one:
    // a vectorised kernel's remainder loop runs there and nowhere else.
    // Negative dims other than -1 (-2, -3) count from the end too: a kernel
    // that takes any negative dim for the last fails them.
    // The last two reduce a non-last dim into more than 64 outputs over a
    // lane of 100 (round 7: a column kernel that skipped its last partial
    // block of outputs, or kept its accumulators across blocks, and an
    // OpenCL work-group path that read a strided lane as contiguous,
    // passed every smaller case).
    // The two after them reduce a dim of extent 1 in a view that is not
    // compact (mutation round 10: a kernel that takes such a reduction for
    // a copy of the input in memory order passed every case, each extent-1
    // reduction being of a compact input).
    let plans: [(&[usize], i32, bool, Layout); 16] = [
        (&[3, 5, 7], -2, true, Layout::Contiguous),
        (&[2, 3, 4], -3, false, Layout::Transposed),
        (&[3, 5, 7], 0, false, Layout::Contiguous),
        (&[3, 5, 7], 1, true, Layout::Contiguous),
        (&[3, 5, 7], -1, false, Layout::Strided),
        (&[6, 9], 0, true, Layout::Transposed),
        (&[1000], 0, false, Layout::Contiguous),
        (&[4, 3000], -1, false, Layout::Contiguous),
        (&[1, 1], 1, false, Layout::Contiguous),
        (&[4, 0], 1, false, Layout::Contiguous),
        (&[0, 4], 1, true, Layout::Contiguous),
        (&[5, 37], -1, false, Layout::Contiguous),
        (&[100, 130], 0, false, Layout::Contiguous),
        (&[2, 100, 70], 1, true, Layout::Contiguous),
        (&[3, 5, 1], 2, false, Layout::Permuted),
        (&[6, 1], 1, true, Layout::Strided),
    ];
    for (shape, dim, keepdim, layout) in plans {
        // Small integers make ties, which argmax must break by first index.
        let x = if op == ReduceOp::Argmax && shape.len() == 3 {
            (0..numel(shape)).map(|_| rng.below(5) as f64).collect()
        } else {
            rng.values(dtype, numel(shape), -4.0, 4.0)
        };
        let d = if dim < 0 {
            shape.len() - dim.unsigned_abs() as usize
        } else {
            dim as usize
        };
        let refuse = if op == ReduceOp::Argmax && shape[d] == 0 {
            ", an empty dimension: must be refused"
        } else {
            ""
        };
        let label = format!(
            "{} dim {dim} keepdim {keepdim}{refuse}",
            shape_label(shape, layout)
        );
        cases.push(reduce_case(
            op, dtype, label, shape, x, dim, keepdim, layout,
        ));
    }
    if matches!(op, ReduceOp::Max | ReduceOp::Argmax | ReduceOp::Sum) {
        let x = vec![
            1.0,
            f64::NAN,
            3.0,
            2.0,
            f64::INFINITY,
            1.0,
            -1.0,
            f64::NEG_INFINITY,
            -2.0,
        ];
        // Along rows, and along columns (dim 0), which kernels reduce on
        // a path of their own.
        for (label, dim) in [
            ("NaN and infinities in rows", 1),
            ("NaN and infinities in columns", 0),
        ] {
            cases.push(reduce_case(
                op,
                dtype,
                label.into(),
                &[3, 3],
                x.clone(),
                dim,
                false,
                Layout::Contiguous,
            ));
        }
    }
    if matches!(op, ReduceOp::Max | ReduceOp::Argmax) {
        // +inf before a NaN in a row or column (the case above has every
        // NaN first): a scan that stops at +inf, as nothing can beat it,
        // misses the NaN after it (mutation round 9). Rows and columns
        // each have an infinity before, and one after, their NaN.
        let (inf, nan) = (f64::INFINITY, f64::NAN);
        let x = vec![
            inf, 1.0, nan, 2.0, //
            3.0, inf, 0.0, nan, //
            nan, 2.0, inf, 1.0, //
            1.0, nan, 5.0, inf,
        ];
        for (label, dim) in [
            ("+inf before NaN in rows", 1),
            ("+inf before NaN in columns", 0),
        ] {
            cases.push(reduce_case(
                op,
                dtype,
                label.into(),
                &[4, 4],
                x.clone(),
                dim,
                false,
                Layout::Contiguous,
            ));
        }
        // A row of -inf only (a fully masked row: argmax 0, max -inf),
        // and rows whose maximum is the lowest finite value.
        let (inf, low) = (f64::NEG_INFINITY, -specials(dtype)[5]);
        let x = vec![inf, inf, inf, inf, low, low, low, low, inf];
        cases.push(reduce_case(
            op,
            dtype,
            "rows of -inf and of the lowest finite value".into(),
            &[3, 3],
            x,
            1,
            false,
            Layout::Contiguous,
        ));
    }
    if matches!(op, ReduceOp::Max | ReduceOp::Argmax) {
        // A NaN past the first 512 elements of a row of 600, and in a
        // column past the first 64 of 130 (over 70 rows): a kernel that
        // combines the maxima of its blocks, its work-items or its blocks
        // of outputs with a comparison (or fmax), or whose work-items skip
        // a NaN after their first element (a row of 600 over a work-group
        // of up to 256 gives each two or three), drops a NaN that is not
        // in the first one (mutation round 10: every NaN before sat in a
        // row or column of 3 or 4). Row 1 holds two NaNs (argmax: the
        // first) and an +inf before them.
        let mut x = rng.values(dtype, 2 * 600, -4.0, 4.0);
        x[560] = f64::NAN;
        (x[600 + 10], x[600 + 70], x[600 + 580]) = (f64::INFINITY, f64::NAN, f64::NAN);
        cases.push(reduce_case(
            op,
            dtype,
            "a NaN past the first 512 of a row of 600".into(),
            &[2, 600],
            x,
            1,
            false,
            Layout::Contiguous,
        ));
        let mut x = rng.values(dtype, 70 * 130, -4.0, 4.0);
        x[50 * 130 + 100] = f64::NAN;
        x[66 * 130 + 5] = f64::NAN;
        (x[3 * 130 + 120], x[69 * 130 + 120]) = (f64::INFINITY, f64::NAN);
        cases.push(reduce_case(
            op,
            dtype,
            "NaNs in columns past the first 64 of 130".into(),
            &[70, 130],
            x,
            0,
            false,
            Layout::Contiguous,
        ));
    }
    if matches!(op, ReduceOp::Max | ReduceOp::Argmax | ReduceOp::Sum) {
        // Rows of 61, whose maximum sits past the middle of a 16-, 32- or
        // 64-wide vector loop's remainder (13, 29 and 61 elements) in rows
        // 0 and 1 and before it in row 2: a remainder finished by one
        // half-width vector (8 of 16 lanes) and no scalar loop drops it
        // (mutation round 11: every row before left a remainder of at most
        // 8 of a 16-lane loop, 37 leaving 5).
        let mut x = rng.values(dtype, 3 * 61, -4.0, 4.0);
        (x[60], x[61 + 58], x[122 + 52]) = (6.0, 7.0, 5.0);
        cases.push(reduce_case(
            op,
            dtype,
            "rows of 61, the maximum in the vector remainder".into(),
            &[3, 61],
            x,
            1,
            false,
            Layout::Contiguous,
        ));
    }
    if op == ReduceOp::Argmax {
        // -0 and +0 are equal: a tie, which argmax breaks by the first
        // index whichever zero comes first (a comparison that ranks +0
        // above -0 does not), in rows of 100, long enough for a
        // work-group's tree of partial results.
        let mut x = vec![-1.0; 2 * 100];
        (x[3], x[70]) = (-0.0, 0.0);
        (x[100 + 5], x[100 + 90]) = (0.0, -0.0);
        cases.push(reduce_case(
            op,
            dtype,
            "rows whose maximum is -0 and +0 tied".into(),
            &[2, 100],
            x,
            1,
            false,
            Layout::Contiguous,
        ));
    }
    cases
}

#[allow(clippy::too_many_arguments)]
pub(super) fn reduce_case(
    op: ReduceOp,
    dtype: DType,
    label: String,
    shape: &[usize],
    x: Vec<f64>,
    dim: i32,
    keepdim: bool,
    layout: Layout,
) -> Case {
    let d = if dim < 0 {
        (dim + shape.len() as i32) as usize
    } else {
        dim as usize
    };
    let mut out_shape = shape.to_vec();
    if keepdim {
        out_shape[d] = 1;
    } else {
        out_shape.remove(d);
    }
    let n = shape[d];
    let (out_dtype, tolerance) = match op {
        // Accumulated in f32 and rounded once; the mean's division is one
        // more rounding.
        ReduceOp::Sum => (dtype, Tolerance::accumulated(0.0, n)),
        ReduceOp::Mean => (dtype, Tolerance::accumulated(2.0, n)),
        ReduceOp::Max => (dtype, Tolerance::EXACT),
        ReduceOp::Argmax => (DType::I64, Tolerance::EXACT),
    };
    case(
        op.name(),
        dtype,
        label,
        vec![
            input("input", dtype, shape, x, layout),
            output("out", out_dtype, &out_shape, Layout::Contiguous),
        ],
        tolerance,
        move |exec, t| exec.reduce(op, &t[0], &t[1], dim, keepdim),
        move |dense| {
            let dim = i64::from(dim);
            Ok(vec![match op {
                ReduceOp::Sum => reference::sum(&dense[0], dim, keepdim)?,
                ReduceOp::Mean => reference::mean(&dense[0], dim, keepdim)?,
                ReduceOp::Max => reference::max(&dense[0], dim, keepdim)?,
                ReduceOp::Argmax => {
                    let i = reference::argmax(&dense[0], dim, keepdim)?;
                    Dense {
                        shape: i.shape,
                        data: i.data.into_iter().map(|v| v as f64).collect(),
                    }
                }
            }])
        },
    )
}

fn sum_squares(dtype: DType) -> Vec<Case> {
    let mut rng = Rng::for_case("sum_squares", dtype);
    // The row slice cannot be walked as one run of memory (the gapped
    // view can, in memory order).
    let shapes: [(&[usize], Layout); 8] = [
        (&[], Layout::Contiguous),
        (&[7], Layout::Contiguous),
        (&[33, 65], Layout::Transposed),
        (&[16, 9], Layout::Strided),
        (&[5, 11], Layout::RowSlice),
        (&[4096], Layout::Contiguous),
        (&[0], Layout::Contiguous),
        // Rows not evenly spaced (the first two dims swapped in memory),
        // which a kernel that walks [..., last] as [rows, last] with one row
        // stride misses, reading outside the view.
        (&[3, 4, 5], Layout::Permuted),
    ];
    let mut plans: Vec<(String, Vec<usize>, Vec<f64>, Layout)> = shapes
        .iter()
        .map(|&(shape, layout)| {
            let x = rng.values(dtype, numel(shape), -3.0, 3.0);
            (shape_label(shape, layout), shape.to_vec(), x, layout)
        })
        .collect();
    // A gradient norm must show an overflow (mutation round 9: a norm
    // scaled by the largest |x|, as LAPACK's nrm2 avoids overflow, gave
    // inf / inf = NaN for an infinity and skipped a NaN): an infinity of
    // either sign gives +inf, a NaN among infinities gives NaN, and
    // finite squares past f32's range give +inf (f32, bf16 and f64 only:
    // f16's largest square is 4.3e9).
    let (inf, nan) = (f64::INFINITY, f64::NAN);
    let mut specials = vec![
        ("an infinity", vec![1.5, -2.0, inf, 0.5, 3.0, -inf, 1.0]),
        ("a NaN among infinities", vec![inf, 2.0, nan, -inf, 1.0]),
    ];
    if dtype != DType::F16 {
        specials.push(("squares past f32's range", vec![2e19, -3e19, 1.0, 2.5e19]));
    }
    for (label, x) in specials {
        let n = x.len();
        plans.push((format!("[{n}] {label}"), vec![n], x, Layout::Contiguous));
    }
    plans
        .into_iter()
        .map(|(label, shape, x, layout)| {
            let n = numel(&shape);
            case(
                "sum_squares",
                dtype,
                label,
                vec![
                    input("input", dtype, &shape, x, layout),
                    output("out", DType::F32, &[], Layout::Contiguous),
                ],
                // Positive terms accumulated in f32 (f64 for f64 inputs, whose
                // output is still f32).
                Tolerance::accumulated(0.0, n),
                |exec, t| exec.sum_squares(&t[0], &t[1]),
                |d| Ok(vec![reference::sum_squares(&d[0])?]),
            )
        })
        .collect()
}
