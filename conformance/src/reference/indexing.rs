//! The operators of ABI 1.4 (`spec/ops.toml`): `gather` and `scatter_add`
//! along one dimension (indices out of range refused), `cumsum` (an f64
//! running sum from +0), the boolean reductions `any` and `all`, and the
//! bitwise operators on integer values.

use super::basic::{broadcast_shapes, broadcast_source};
use super::{Dense, RefError, flat_index, numel, unravel};

/// Checks `index` against `data` (the same rank, each extent but `dim`'s
/// at most `data`'s) and every index in `[0, data.shape[dim])`.
fn check_index(op: &'static str, data: &Dense, index: &Dense, dim: usize) -> Result<(), RefError> {
    let r = data.ndim();
    if dim >= r || index.ndim() != r || (0..r).any(|d| d != dim && index.shape[d] > data.shape[d]) {
        return Err(RefError::new(
            op,
            format!(
                "index of shape {:?} does not fit data {:?} along dim {dim}",
                index.shape, data.shape
            ),
        ));
    }
    let n = data.shape[dim];
    if let Some(bad) = index.data.iter().find(|&&i| !(0.0..n as f64).contains(&i)) {
        return Err(RefError::new(
            op,
            format!("index {bad} is out of range [0, {n})"),
        ));
    }
    Ok(())
}

/// The position in `data` that element `k` of `index` addresses.
fn source(data: &Dense, index: &Dense, dim: usize, k: usize) -> usize {
    let mut at = unravel(k, &index.shape);
    at[dim] = index.data[k] as usize;
    flat_index(&data.shape, &at)
}

/// `out[i] = input[i with dimension dim replaced by index[i]]`.
pub fn gather(input: &Dense, index: &Dense, dim: usize) -> Result<Dense, RefError> {
    check_index("gather", input, index, dim)?;
    let data = (0..index.numel())
        .map(|k| input.data[source(input, index, dim, k)])
        .collect();
    Ok(Dense::new(&index.shape, data))
}

/// `dst` with `src[i]` added at `i` with dimension `dim` replaced by
/// `index[i]`, for every `i` (in f64; the suite rounds once).
pub fn scatter_add(dst: &Dense, index: &Dense, src: &Dense, dim: usize) -> Result<Dense, RefError> {
    check_index("scatter_add", dst, index, dim)?;
    if src.shape != index.shape {
        return Err(RefError::new(
            "scatter_add",
            format!("src {:?} is not index's shape {:?}", src.shape, index.shape),
        ));
    }
    let mut out = dst.clone();
    for k in 0..index.numel() {
        out.data[source(dst, index, dim, k)] += src.data[k];
    }
    Ok(out)
}

/// [`scatter_add`] of integers of `bits` bits (32 or 64) on their exact
/// values (`dst` and `src` as i64s, in row-major order: an i64 past 2^53
/// is not a double), wrapping in two's complement as the ABI's integer
/// `scatter_add` does; the result's elements as i64s.
pub fn scatter_add_wrapping(
    dst: &Dense,
    dst_exact: &[i64],
    index: &Dense,
    src_exact: &[i64],
    dim: usize,
    bits: u32,
) -> Result<Vec<i64>, RefError> {
    check_index("scatter_add", dst, index, dim)?;
    if dst_exact.len() != dst.numel()
        || src_exact.len() != index.numel()
        || !(1..=64).contains(&bits)
    {
        return Err(RefError::new(
            "scatter_add",
            format!(
                "{} dst and {} src values for {} and {} elements of {bits} bits",
                dst_exact.len(),
                src_exact.len(),
                dst.numel(),
                index.numel()
            ),
        ));
    }
    let mut out = dst_exact.to_vec();
    for (k, &v) in src_exact.iter().enumerate() {
        let at = source(dst, index, dim, k);
        out[at] = out[at].wrapping_add(v);
    }
    // Keep the low `bits` bits, sign-extended.
    let shift = 64 - bits;
    Ok(out.into_iter().map(|v| (v << shift) >> shift).collect())
}

/// The running sum of `input` along `dim`, in f64 from +0.
pub fn cumsum(input: &Dense, dim: usize) -> Result<Dense, RefError> {
    if dim >= input.ndim() {
        return Err(RefError::new(
            "cumsum",
            format!("dim {dim} is out of range"),
        ));
    }
    let mut out = input.clone();
    let n = input.shape[dim];
    let step: usize = input.shape[dim + 1..].iter().product();
    for base in 0..input.numel() {
        if (base / step) % n.max(1) != 0 {
            continue;
        }
        let mut acc = 0.0;
        for k in 0..n {
            acc += input.data[base + k * step];
            out.data[base + k * step] = acc;
        }
    }
    Ok(out)
}

/// `any` (`all`: `every`) of `input != 0` over `dim` (NaN is nonzero), 1 or 0.
pub fn reduce_bool(
    input: &Dense,
    dim: usize,
    keepdim: bool,
    every: bool,
) -> Result<Dense, RefError> {
    let op = if every { "all" } else { "any" };
    if dim >= input.ndim() {
        return Err(RefError::new(op, format!("dim {dim} is out of range")));
    }
    let mut shape = input.shape.clone();
    shape[dim] = 1;
    let mut out = Dense::from_fn(&shape, |at| {
        let mut at = at.to_vec();
        let hit = (0..input.shape[dim]).any(|k| {
            at[dim] = k;
            (input.data[flat_index(&input.shape, &at)] != 0.0) != every
        });
        f64::from(u8::from(hit != every))
    });
    if !keepdim {
        shape.remove(dim);
        out = out.reshape(&shape);
    }
    debug_assert_eq!(out.numel(), numel(&shape));
    Ok(out)
}

/// `a OP b` on the integer values (`and`, `or`, `xor`) over the broadcast
/// shape; the values are integers of at most 2^53 (the suite carries
/// larger i64s as exact bits).
pub fn bitwise(op: &'static str, a: &Dense, b: &Dense) -> Result<Dense, RefError> {
    let shape = broadcast_shapes(&a.shape, &b.shape).ok_or_else(|| {
        RefError::new(
            op,
            format!("shapes {:?} and {:?} do not broadcast", a.shape, b.shape),
        )
    })?;
    let f: fn(i64, i64) -> i64 = match op {
        "bitwise_and" => |x, y| x & y,
        "bitwise_or" => |x, y| x | y,
        _ => |x, y| x ^ y,
    };
    Ok(Dense::from_fn(&shape, |at| {
        let x = a.data[broadcast_source(at, &a.shape)] as i64;
        let y = b.data[broadcast_source(at, &b.shape)] as i64;
        f(x, y) as f64
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scatter_add_wrapping_wraps_per_width_and_keeps_i64_bits() {
        let dst = Dense::new(&[3], vec![0.0; 3]);
        let index = Dense::new(&[6], vec![0.0, 0.0, 0.0, 0.0, 1.0, 1.0]);
        let q = 1i64 << 30;
        let out = scatter_add_wrapping(&dst, &[q, 0, 9], &index, &[q, q, q, 7, i64::MAX, 3], 0, 32)
            .unwrap();
        // 2^32 + 7 keeps its low 32 bits; i64::MAX + 3 its low 32 bits,
        // sign-extended (0xffff_ffff + 3 = 2); the untouched element stays.
        assert_eq!(out, vec![7, 2, 9]);
        let big = (1i64 << 53) + 1;
        let out = scatter_add_wrapping(
            &dst,
            &[1 << 62, 0, 5],
            &index,
            &[1 << 62, 1 << 62, 1 << 62, 7, big, -(1 << 53)],
            0,
            64,
        )
        .unwrap();
        assert_eq!(out, vec![7, 1, 5]);
        // An index out of range is refused, as the other references do.
        let bad = Dense::new(&[1], vec![3.0]);
        assert!(scatter_add_wrapping(&dst, &[0, 0, 0], &bad, &[1], 0, 64).is_err());
    }
}
