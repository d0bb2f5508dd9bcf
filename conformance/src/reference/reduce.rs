//! The reductions of ABI 1.1 (`spec/ops.toml`): `sum`, `mean`, `max`
//! and `argmax` over one dimension, the global `sum_squares`, and softmax's
//! relatives over the last dimension (`log_softmax` and both backward
//! operators).
//!
//! Over an empty dimension `sum` is 0, `mean` is NaN (0 / 0), `max` is
//! `-inf`, and `argmax` is an error. `max` propagates NaN; `argmax` returns
//! the first maximum, or the first NaN when there is one.

use super::{Dense, Indices, RefError, expect_rank, expect_shape, max_nan, rows_of};

/// The input seen as `[outer, n, inner]` around dimension `dim`, and the
/// output shape.
struct Reduction {
    outer: usize,
    n: usize,
    inner: usize,
    out_shape: Vec<usize>,
}

impl Reduction {
    fn new(op: &'static str, input: &Dense, dim: i64, keepdim: bool) -> Result<Self, RefError> {
        expect_rank(op, "input", input, 1)?;
        let rank = input.ndim() as i64;
        let d = if dim < 0 { dim + rank } else { dim };
        if !(0..rank).contains(&d) {
            return Err(RefError::new(
                op,
                format!("dim {dim} is out of range for shape {:?}", input.shape),
            ));
        }
        let d = d as usize;
        let mut out_shape = input.shape.clone();
        if keepdim {
            out_shape[d] = 1;
        } else {
            out_shape.remove(d);
        }
        Ok(Reduction {
            outer: input.shape[..d].iter().product(),
            n: input.shape[d],
            inner: input.shape[d + 1..].iter().product(),
            out_shape,
        })
    }

    /// The values along the reduced dimension for each output element, in
    /// output order.
    fn lanes<'a>(&'a self, input: &'a Dense) -> impl Iterator<Item = Vec<f64>> + 'a {
        (0..self.outer).flat_map(move |o| {
            (0..self.inner).map(move |i| {
                (0..self.n)
                    .map(|j| input.data[(o * self.n + j) * self.inner + i])
                    .collect()
            })
        })
    }

    fn apply(&self, input: &Dense, f: impl Fn(&[f64]) -> f64) -> Dense {
        let data = self.lanes(input).map(|lane| f(&lane)).collect();
        Dense::new(&self.out_shape, data)
    }
}

/// The sum of `values`, starting from +0 as IEEE addition does (Rust's
/// `Iterator::sum` of floats starts from -0, so an empty sum would be -0).
fn total(values: impl Iterator<Item = f64>) -> f64 {
    values.fold(0.0, |acc, v| acc + v)
}

/// Sum over `dim` (negative counts from the end); 0 over an empty dimension.
pub fn sum(input: &Dense, dim: i64, keepdim: bool) -> Result<Dense, RefError> {
    let r = Reduction::new("sum", input, dim, keepdim)?;
    Ok(r.apply(input, |lane| total(lane.iter().copied())))
}

/// Mean over `dim`; NaN over an empty dimension.
pub fn mean(input: &Dense, dim: i64, keepdim: bool) -> Result<Dense, RefError> {
    let r = Reduction::new("mean", input, dim, keepdim)?;
    Ok(r.apply(input, |lane| {
        total(lane.iter().copied()) / lane.len() as f64
    }))
}

/// Maximum over `dim`; NaN if the lane holds NaN, `-inf` if it is empty.
pub fn max(input: &Dense, dim: i64, keepdim: bool) -> Result<Dense, RefError> {
    let r = Reduction::new("max", input, dim, keepdim)?;
    Ok(r.apply(input, |lane| max_nan(lane.iter().copied())))
}

/// Index of the first maximum over `dim`, or of the first NaN; an error over
/// an empty dimension.
pub fn argmax(input: &Dense, dim: i64, keepdim: bool) -> Result<Indices, RefError> {
    let r = Reduction::new("argmax", input, dim, keepdim)?;
    if r.n == 0 {
        return Err(RefError::new(
            "argmax",
            format!("dimension {dim} of shape {:?} is empty", input.shape),
        ));
    }
    let data = r
        .lanes(input)
        .map(|lane| {
            if let Some(first_nan) = lane.iter().position(|x| x.is_nan()) {
                return first_nan as i64;
            }
            let mut best = 0;
            for (j, &x) in lane.iter().enumerate() {
                if x > lane[best] {
                    best = j;
                }
            }
            best as i64
        })
        .collect();
    Ok(Indices::new(&r.out_shape, data))
}

/// `sum(x^2)` over every element, as a 0-dimensional tensor.
pub fn sum_squares(input: &Dense) -> Result<Dense, RefError> {
    Ok(Dense::scalar(total(input.data.iter().map(|x| x * x))))
}

/// `out = x - max - ln(sum(exp(x - max)))` over the last dimension; a row of
/// `-inf` gives NaN, as in `softmax`.
pub fn log_softmax(input: &Dense) -> Result<Dense, RefError> {
    expect_rank("log_softmax", "input", input, 1)?;
    let (rows, h) = rows_of(input);
    let mut out = Dense::zeros(&input.shape);
    for r in 0..rows {
        let row = &input.data[r * h..(r + 1) * h];
        let m = max_nan(row.iter().copied());
        let log_sum = row.iter().map(|&x| (x - m).exp()).sum::<f64>().ln();
        for (o, &x) in out.data[r * h..(r + 1) * h].iter_mut().zip(row) {
            *o = x - m - log_sum;
        }
    }
    Ok(out)
}

/// Applies `f(y_row, g_row, grad_in_row)` to each row over the last dimension.
fn rowwise_backward(
    op: &'static str,
    out: &Dense,
    grad_out: &Dense,
    f: impl Fn(&[f64], &[f64], &mut [f64]),
) -> Result<Dense, RefError> {
    expect_rank(op, "out", out, 1)?;
    expect_shape(op, "grad_out", grad_out, &out.shape)?;
    let (rows, h) = rows_of(out);
    let mut grad_in = Dense::zeros(&out.shape);
    for r in 0..rows {
        let span = r * h..(r + 1) * h;
        f(
            &out.data[span.clone()],
            &grad_out.data[span.clone()],
            &mut grad_in.data[span],
        );
    }
    Ok(grad_in)
}

/// Backward of `softmax` from its output `y`: `grad_in = y * (g - sum(g * y))`.
pub fn softmax_backward(out: &Dense, grad_out: &Dense) -> Result<Dense, RefError> {
    rowwise_backward("softmax_backward", out, grad_out, |y, g, dx| {
        let dot: f64 = y.iter().zip(g).map(|(y, g)| y * g).sum();
        for ((d, &y), &g) in dx.iter_mut().zip(y).zip(g) {
            *d = y * (g - dot);
        }
    })
}

/// Backward of `log_softmax` from its output `y`: `grad_in = g - exp(y) * sum(g)`.
pub fn log_softmax_backward(out: &Dense, grad_out: &Dense) -> Result<Dense, RefError> {
    rowwise_backward("log_softmax_backward", out, grad_out, |y, g, dx| {
        let total: f64 = g.iter().sum();
        for ((d, &y), &g) in dx.iter_mut().zip(y).zip(g) {
            *d = g - y.exp() * total;
        }
    })
}
