//! The activation operators of ABI 1.2 (`spec/ops.toml`): the exact GELU
//! and its backward, `sigmoid`, and the backward operators computed from an
//! activation's output (`sigmoid_backward`, `tanh_backward`). Each formula
//! is the one the ABI states, evaluated literally in IEEE f64, so the edges
//! follow from it: `gelu_erf(-inf)` and `gelu_erf'(±inf)` are NaN (`inf *
//! 0`), `sigmoid(-inf) = 0`, and an infinite gradient times a zero factor
//! is NaN.

use super::{Dense, RefError, expect_shape};

/// `1 / sqrt(2)`.
const FRAC_1_SQRT_2: f64 = std::f64::consts::FRAC_1_SQRT_2;
/// `1 / sqrt(2 pi)`.
const FRAC_1_SQRT_2PI: f64 = 0.398_942_280_401_432_7;

/// The standard normal CDF, `erfc(-x / sqrt 2) / 2` (accurate in the
/// negative tail, where `(1 + erf(x / sqrt 2)) / 2` cancels).
fn phi_cdf(x: f64) -> f64 {
    0.5 * libm::erfc(-x * FRAC_1_SQRT_2)
}

/// `out = x Phi(x)`.
pub fn gelu_erf(input: &Dense) -> Result<Dense, RefError> {
    Ok(input.map(|x| x * phi_cdf(x)))
}

/// `grad_in = grad_out * (Phi(x) + x phi(x))`.
pub fn gelu_erf_backward(grad_out: &Dense, input: &Dense) -> Result<Dense, RefError> {
    expect_shape("gelu_erf_backward", "grad_out", grad_out, &input.shape)?;
    let data = grad_out
        .data
        .iter()
        .zip(&input.data)
        .map(|(&g, &x)| g * (phi_cdf(x) + x * (FRAC_1_SQRT_2PI * (-0.5 * x * x).exp())))
        .collect();
    Ok(Dense::new(&input.shape, data))
}

/// `out = 1 / (1 + e^-x)`.
pub fn sigmoid(input: &Dense) -> Result<Dense, RefError> {
    Ok(input.map(|x| 1.0 / (1.0 + (-x).exp())))
}

/// `grad_in = grad_out * f(output)` over equal shapes.
fn output_backward(
    op: &'static str,
    grad_out: &Dense,
    output: &Dense,
    factor: impl Fn(f64) -> f64,
) -> Result<Dense, RefError> {
    expect_shape(op, "grad_out", grad_out, &output.shape)?;
    let data = grad_out
        .data
        .iter()
        .zip(&output.data)
        .map(|(&g, &y)| g * factor(y))
        .collect();
    Ok(Dense::new(&output.shape, data))
}

/// `grad_in = grad_out * y (1 - y)`, `y` the sigmoid's output.
pub fn sigmoid_backward(grad_out: &Dense, output: &Dense) -> Result<Dense, RefError> {
    output_backward("sigmoid_backward", grad_out, output, |y| y * (1.0 - y))
}

/// `grad_in = grad_out * (1 - y^2)`, `y` the tanh's output.
pub fn tanh_backward(grad_out: &Dense, output: &Dense) -> Result<Dense, RefError> {
    output_backward("tanh_backward", grad_out, output, |y| 1.0 - y * y)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(f: fn(&Dense) -> Result<Dense, RefError>, x: f64) -> f64 {
        f(&Dense::new(&[1], vec![x])).unwrap().data[0]
    }

    #[test]
    fn gelu_erf_matches_known_values_and_edges() {
        // x Phi(x) at 1: Phi(1) = 0.841344746068543.
        assert!((one(gelu_erf, 1.0) - 0.841_344_746_068_543).abs() < 1e-15);
        // The tail keeps its relative accuracy: Phi(-10) = 7.619853024160527e-24.
        let tail = one(gelu_erf, -10.0);
        assert!(
            (tail / -7.619_853_024_160_527e-23 - 1.0).abs() < 1e-13,
            "{tail}"
        );
        assert!(one(gelu_erf, f64::NEG_INFINITY).is_nan());
        assert_eq!(one(gelu_erf, f64::INFINITY), f64::INFINITY);
        let g = |x: f64| {
            gelu_erf_backward(&Dense::new(&[1], vec![1.0]), &Dense::new(&[1], vec![x]))
                .unwrap()
                .data[0]
        };
        assert_eq!(g(0.0), 0.5);
        assert!(g(f64::INFINITY).is_nan() && g(f64::NEG_INFINITY).is_nan());
        // The derivative is d/dx of x Phi(x): a central difference agrees.
        for x in [-3.0, -0.75, 0.3, 2.0] {
            let h = 1e-6;
            let fd = (one(gelu_erf, x + h) - one(gelu_erf, x - h)) / (2.0 * h);
            assert!((fd - g(x)).abs() < 1e-8, "{x}: {fd} vs {}", g(x));
        }
    }

    #[test]
    fn sigmoid_and_output_backward_edges() {
        assert_eq!(one(sigmoid, 0.0), 0.5);
        assert_eq!(one(sigmoid, f64::NEG_INFINITY), 0.0);
        assert_eq!(one(sigmoid, f64::INFINITY), 1.0);
        let b = |f: fn(&Dense, &Dense) -> Result<Dense, RefError>, g: f64, y: f64| {
            f(&Dense::new(&[1], vec![g]), &Dense::new(&[1], vec![y]))
                .unwrap()
                .data[0]
        };
        assert_eq!(b(sigmoid_backward, 2.0, 0.5), 0.5);
        assert!(b(sigmoid_backward, f64::INFINITY, 1.0).is_nan());
        assert_eq!(b(tanh_backward, 2.0, 0.5), 1.5);
        assert!(b(tanh_backward, f64::INFINITY, -1.0).is_nan());
    }
}
