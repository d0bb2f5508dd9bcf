//! Helpers shared by the reference's tests: a tiny deterministic PRNG,
//! closeness checks and central finite differences.

#![allow(dead_code)]

use polychip_conformance::reference::Dense;

/// xorshift64*: deterministic, good enough for test inputs.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        let unit = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        lo + (hi - lo) * unit
    }

    /// A tensor of uniform values in `[lo, hi)`.
    pub fn dense(&mut self, shape: &[usize], lo: f64, hi: f64) -> Dense {
        Dense::from_fn(shape, |_| self.uniform(lo, hi))
    }

    /// An integer in `[0, n)`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// `<a, b>` over all elements.
pub fn inner(a: &Dense, b: &Dense) -> f64 {
    assert_eq!(a.shape, b.shape);
    a.data.iter().zip(&b.data).map(|(x, y)| x * y).sum()
}

/// Asserts that `actual` and `expected` have one shape and agree within
/// `atol + rtol * |expected|` element by element (NaN matches NaN).
pub fn assert_close(actual: &Dense, expected: &Dense, rtol: f64, atol: f64, what: &str) {
    assert_eq!(actual.shape, expected.shape, "{what}: shapes");
    for (i, (&a, &e)) in actual.data.iter().zip(&expected.data).enumerate() {
        let ok = (a.is_nan() && e.is_nan()) || a == e || (a - e).abs() <= atol + rtol * e.abs();
        assert!(ok, "{what}: element {i}: got {a}, expected {e}");
    }
}

/// Asserts `actual == expected` elementwise within `tol`.
pub fn assert_values(actual: &Dense, shape: &[usize], expected: &[f64], tol: f64, what: &str) {
    assert_close(
        actual,
        &Dense::new(shape, expected.to_vec()),
        0.0,
        tol,
        what,
    );
}

/// Central finite differences of a scalar function at `x`, step `h`.
pub fn numeric_grad(x: &Dense, h: f64, f: impl Fn(&Dense) -> f64) -> Dense {
    let mut grad = Dense::zeros(&x.shape);
    for i in 0..x.numel() {
        let mut plus = x.clone();
        plus.data[i] += h;
        let mut minus = x.clone();
        minus.data[i] -= h;
        grad.data[i] = (f(&plus) - f(&minus)) / (2.0 * h);
    }
    grad
}

/// Checks an analytic gradient against finite differences (h = 1e-6).
pub fn check_grad(analytic: &Dense, x: &Dense, what: &str, f: impl Fn(&Dense) -> f64) {
    let numeric = numeric_grad(x, 1e-6, f);
    assert_close(analytic, &numeric, 1e-6, 1e-7, what);
}
