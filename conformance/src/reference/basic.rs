//! The operators of ABI 1.0 (`spec/ops.toml`): fill, copy, cast, the four
//! binary operators with NumPy broadcasting, batched matmul with broadcast
//! batch dimensions, and softmax over the last dimension. In f64, `cast` and
//! `copy` are the identity: the suite rounds to the destination dtype.

use super::{Dense, RefError, expect_rank, max_nan, numel, rows_of, unravel};

/// `out[...] = value`. Only the floating case is modelled: the suite rounds
/// the value to the dtype under test.
pub fn fill(shape: &[usize], value: f64) -> Result<Dense, RefError> {
    Ok(Dense::full(shape, value))
}

/// `dst = src`.
pub fn copy(src: &Dense) -> Result<Dense, RefError> {
    Ok(src.clone())
}

/// `dst = (dtype) src`: the identity on exact f64 values.
pub fn cast(src: &Dense) -> Result<Dense, RefError> {
    Ok(src.clone())
}

/// NumPy broadcasting: shapes are aligned at their last dimension, and each
/// pair of extents must be equal or contain a 1. `None` when they do not
/// broadcast.
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for (d, slot) in out.iter_mut().enumerate() {
        // Missing leading dimensions count as 1.
        let ea = if d + a.len() >= n {
            a[d + a.len() - n]
        } else {
            1
        };
        let eb = if d + b.len() >= n {
            b[d + b.len() - n]
        } else {
            1
        };
        *slot = match (ea, eb) {
            _ if ea == eb => ea,
            (1, e) | (e, 1) => e,
            _ => return None,
        };
    }
    Some(out)
}

/// The flat position in a tensor of shape `shape` that broadcasts to the
/// element at `out_index` of the broadcast result.
pub(super) fn broadcast_source(out_index: &[usize], shape: &[usize]) -> usize {
    let skip = out_index.len() - shape.len();
    let mut flat = 0;
    for (d, &n) in shape.iter().enumerate() {
        let i = if n == 1 { 0 } else { out_index[skip + d] };
        flat = flat * n + i;
    }
    flat
}

/// `out = f(a, b)` elementwise over the broadcast shape.
fn binary(
    op: &'static str,
    a: &Dense,
    b: &Dense,
    f: impl Fn(f64, f64) -> f64,
) -> Result<Dense, RefError> {
    let shape = broadcast_shapes(&a.shape, &b.shape).ok_or_else(|| {
        RefError::new(
            op,
            format!("shapes {:?} and {:?} do not broadcast", a.shape, b.shape),
        )
    })?;
    Ok(Dense::from_fn(&shape, |index| {
        let x = a.data[broadcast_source(index, &a.shape)];
        let y = b.data[broadcast_source(index, &b.shape)];
        f(x, y)
    }))
}

/// `out = a + alpha * b`, broadcast.
pub fn add(a: &Dense, b: &Dense, alpha: f64) -> Result<Dense, RefError> {
    binary("add", a, b, |x, y| x + alpha * y)
}

/// `out = a - alpha * b`, broadcast.
pub fn sub(a: &Dense, b: &Dense, alpha: f64) -> Result<Dense, RefError> {
    binary("sub", a, b, |x, y| x - alpha * y)
}

/// `out = a * b`, broadcast; `alpha` is ignored (it is in the args struct).
pub fn mul(a: &Dense, b: &Dense, _alpha: f64) -> Result<Dense, RefError> {
    binary("mul", a, b, |x, y| x * y)
}

/// `out = a / b`, broadcast, IEEE division; `alpha` is ignored.
pub fn div(a: &Dense, b: &Dense, _alpha: f64) -> Result<Dense, RefError> {
    binary("div", a, b, |x, y| x / y)
}

/// `out = alpha * op(a) @ op(b) + beta * out_prev`, where `op` transposes the
/// last two dimensions when asked. `a` is `[..., M, K]` (`[..., K, M]`
/// transposed), `b` is `[..., K, N]` (`[..., N, K]` transposed), and the
/// result and `out_prev` are `[batch..., M, N]` with the broadcast batch
/// dimensions.
///
/// The values of `out_prev` are read only when `beta != 0` (NaN in them does
/// not propagate otherwise). When `alpha == 0`, `a` and `b` are not read
/// either (the BLAS convention; the ABI text only states the `beta` rule).
pub fn matmul(
    a: &Dense,
    b: &Dense,
    out_prev: &Dense,
    transpose_a: bool,
    transpose_b: bool,
    alpha: f64,
    beta: f64,
) -> Result<Dense, RefError> {
    const OP: &str = "matmul";
    expect_rank(OP, "a", a, 2)?;
    expect_rank(OP, "b", b, 2)?;
    let last2 = |t: &Dense, trans: bool| {
        let (r, c) = (t.shape[t.ndim() - 2], t.shape[t.ndim() - 1]);
        if trans { (c, r) } else { (r, c) }
    };
    let (m, k) = last2(a, transpose_a);
    let (kb, n) = last2(b, transpose_b);
    if k != kb {
        return Err(RefError::new(
            OP,
            format!(
                "inner dimensions differ: op(a) is {m}x{k}, op(b) is {kb}x{n} (a {:?}, b {:?})",
                a.shape, b.shape
            ),
        ));
    }
    let batch_a = &a.shape[..a.ndim() - 2];
    let batch_b = &b.shape[..b.ndim() - 2];
    let batch = broadcast_shapes(batch_a, batch_b).ok_or_else(|| {
        RefError::new(
            OP,
            format!(
                "batch dimensions of {:?} and {:?} do not broadcast",
                a.shape, b.shape
            ),
        )
    })?;
    let mut shape = batch.clone();
    shape.extend([m, n]);
    super::expect_shape(OP, "out", out_prev, &shape)?;

    // op(t)[batch, i, j] read from t's own layout, batch broadcast.
    let element = |t: &Dense, batch_index: &[usize], trans: bool, i: usize, j: usize| {
        let tb = &t.shape[..t.ndim() - 2];
        let (r, c) = if trans { (j, i) } else { (i, j) };
        let cols = t.shape[t.ndim() - 1];
        let rows = t.shape[t.ndim() - 2];
        let matrix = broadcast_source(batch_index, tb);
        t.data[(matrix * rows + r) * cols + c]
    };

    let mut out = Dense::zeros(&shape);
    for bi in 0..numel(&batch) {
        let batch_index = unravel(bi, &batch);
        // Rows of op(a) and columns of op(b), each gathered once into a
        // compact vector, so that each output element is one plain dot product.
        let rows_a: Vec<Vec<f64>> = (0..m)
            .map(|i| {
                (0..k)
                    .map(|p| element(a, &batch_index, transpose_a, i, p))
                    .collect()
            })
            .collect();
        let cols_b: Vec<Vec<f64>> = (0..n)
            .map(|j| {
                (0..k)
                    .map(|p| element(b, &batch_index, transpose_b, p, j))
                    .collect()
            })
            .collect();
        for (i, row) in rows_a.iter().enumerate() {
            for (j, col) in cols_b.iter().enumerate() {
                let flat = (bi * m + i) * n + j;
                let mut value = 0.0;
                if alpha != 0.0 {
                    let dot: f64 = row.iter().zip(col).map(|(x, y)| x * y).sum();
                    value = alpha * dot;
                }
                if beta != 0.0 {
                    value += beta * out_prev.data[flat];
                }
                out.data[flat] = value;
            }
        }
    }
    Ok(out)
}

/// Softmax over the last dimension: `exp(x - max) / sum(exp(x - max))`.
/// A row of `-inf` (or with NaN) gives NaN everywhere in the row.
pub fn softmax(input: &Dense) -> Result<Dense, RefError> {
    expect_rank("softmax", "input", input, 1)?;
    let (rows, h) = rows_of(input);
    let mut out = Dense::zeros(&input.shape);
    for r in 0..rows {
        let row = &input.data[r * h..(r + 1) * h];
        let m = max_nan(row.iter().copied());
        let e: Vec<f64> = row.iter().map(|&x| (x - m).exp()).collect();
        let s: f64 = e.iter().sum();
        for (o, x) in out.data[r * h..(r + 1) * h].iter_mut().zip(e) {
            *o = x / s;
        }
    }
    Ok(out)
}
