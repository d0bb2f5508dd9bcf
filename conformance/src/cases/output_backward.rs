//! Cases of ABI 1.2's backward operators computed from an activation's
//! output `y`: `sigmoid_backward` (`g y (1 - y)`) and `tanh_backward`
//! (`g (1 - y^2)`).

use polychip_host::{DType, Op, OutputBackwardOp};

use super::{Rng, case, every_pair, input, numel, output, shape_label, specials};
use crate::case::{Case, Layout};
use crate::reference;
use crate::tolerance::Tolerance;

/// The case generator of each operator of this family.
pub(super) fn cases(op: Op) -> Option<fn(DType) -> Vec<Case>> {
    Some(
        match OutputBackwardOp::ALL.into_iter().find(|o| o.op() == op)? {
            OutputBackwardOp::SigmoidBackward => {
                |d| output_backward(OutputBackwardOp::SigmoidBackward, d)
            }
            OutputBackwardOp::TanhBackward => {
                |d| output_backward(OutputBackwardOp::TanhBackward, d)
            }
        },
    )
}

const SHAPES: [(&[usize], Layout); 6] = [
    (&[], Layout::Contiguous),
    (&[9], Layout::Contiguous),
    (&[3, 5], Layout::Transposed),
    (&[4, 6], Layout::Strided),
    (&[0, 3], Layout::Contiguous),
    (&[2, 3, 67], Layout::Contiguous),
];

/// The reference of `op`.
pub(super) fn reference(
    op: OutputBackwardOp,
    d: &[reference::Dense],
) -> Result<Vec<reference::Dense>, reference::RefError> {
    Ok(vec![match op {
        OutputBackwardOp::SigmoidBackward => reference::sigmoid_backward(&d[0], &d[1]),
        OutputBackwardOp::TanhBackward => reference::tanh_backward(&d[0], &d[1]),
    }?])
}

/// The error model: `g (y (1 - y))` or `g ((1 - y) (1 + y))` in f32, each
/// factor within an ULP or two of f32 relative to itself (`1 - y` is exact
/// near `y = 1`, and computing `1 - y^2` as a product does not cancel), and
/// rounded once to the output dtype.
pub(super) fn tolerance() -> Tolerance {
    Tolerance::computed(8.0)
}

/// The range of the activation's outputs.
pub(super) fn range(op: OutputBackwardOp) -> (f64, f64) {
    match op {
        OutputBackwardOp::SigmoidBackward => (0.0, 1.0),
        OutputBackwardOp::TanhBackward => (-1.0, 1.0),
    }
}

fn output_backward(op: OutputBackwardOp, dtype: DType) -> Vec<Case> {
    let mut rng = Rng::for_case(op.name(), dtype);
    let (lo, hi) = range(op);
    let mut cases = Vec::new();
    for (i, (shape, layout)) in SHAPES.into_iter().enumerate() {
        let g = rng.values(dtype, numel(shape), -2.0, 2.0);
        let mut y = rng.values(dtype, numel(shape), lo, hi);
        if i == 1 {
            // The ends of the range, where the factor is 0, and the values
            // next to them, where `1 - y^2` computed literally cancels.
            let below_one = 1.0 - crate::values::ulp(dtype, 0.75);
            for (v, &edge) in y
                .iter_mut()
                .zip(&[lo, hi, -0.0, 0.5, below_one, -below_one, 1.0, -1.0, 0.0])
            {
                *v = edge;
            }
        }
        cases.push(case(
            op.name(),
            dtype,
            shape_label(shape, layout),
            vec![
                input("grad_out", dtype, shape, g, Layout::Contiguous),
                input("output", dtype, shape, y, layout),
                output("grad_in", dtype, shape, Layout::Contiguous),
            ],
            tolerance(),
            move |exec, t| exec.output_backward(op, &t[0], &t[1], &t[2]),
            move |d| reference(op, d),
        ));
    }
    // Every pair of special values (grad_out, output): the ABI's formulas
    // taken literally in IEEE arithmetic (an infinite gradient times a zero
    // factor is NaN; infinite outputs, outside the range, are taken as they
    // are). Not the largest finite outputs: the ABI leaves a factor that
    // overflows f32 (`|y|` above about 1.8e19) unspecified.
    let s: Vec<f64> = specials(dtype)
        .into_iter()
        .filter(|v| !(v.is_finite() && v.abs() > 2.0))
        .collect();
    let n = s.len();
    let (g, y) = every_pair(&s);
    cases.push(case(
        op.name(),
        dtype,
        "special values",
        vec![
            input("grad_out", dtype, &[n * n], g, Layout::Contiguous),
            input("output", dtype, &[n * n], y, Layout::Contiguous),
            output("grad_in", dtype, &[n * n], Layout::Contiguous),
        ],
        tolerance(),
        move |exec, t| exec.output_backward(op, &t[0], &t[1], &t[2]),
        move |d| reference(op, d),
    ));
    cases
}
