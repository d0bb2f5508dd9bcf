//! The operators of ABI 1.3 (`spec/ops.toml`): `sin` and `cos`, `select`
//! (PyTorch's `where`) with three-way NumPy broadcasting, `masked_fill`,
//! and the comparisons, which give 0 or 1 (the suite rounds to bool).

use super::basic::{broadcast_shapes, broadcast_source};
use super::{Dense, RefError};

/// `sin(x)`, f64's (its argument reduction is exact for every finite x).
pub fn sin(input: &Dense) -> Result<Dense, RefError> {
    Ok(input.map(f64::sin))
}

/// `cos(x)`.
pub fn cos(input: &Dense) -> Result<Dense, RefError> {
    Ok(input.map(f64::cos))
}

/// `dst = (dtype) src`: the identity on exact f64 values (the suite
/// rounds to the destination dtype with the ABI's conversion rules),
/// except from an integer dtype to a narrower one (`to` of `to_bits`
/// bits, signed or not), which keeps the low bits in two's complement, as
/// PyTorch does (i64 2^40 to i32 is 0, -1 to u8 is 255). The integers are
/// those the suite stored: f64s converted to i64 saturating.
pub fn convert(src: &Dense, narrowing: Option<(u32, bool)>) -> Result<Dense, RefError> {
    Ok(match narrowing {
        None => src.clone(),
        Some((bits, signed)) => src.map(|x| {
            let low = (x as i64 as u64) & ((1u64 << bits) - 1);
            match signed && low >> (bits - 1) == 1 {
                true => low as f64 - (1u64 << bits) as f64,
                false => low as f64,
            }
        }),
    })
}

/// `out[i] = start + i * step` for `n` values, in f64 (a product and a
/// sum; the suite converts to the dtype).
pub fn arange(n: usize, start: f64, step: f64) -> Result<Dense, RefError> {
    Ok(Dense::new(
        &[n],
        (0..n).map(|i| start + (i as f64) * step).collect(),
    ))
}

/// `out = cond ? a : b` over the broadcast shape of the three.
pub fn select(cond: &Dense, a: &Dense, b: &Dense) -> Result<Dense, RefError> {
    let shape = broadcast_shapes(&cond.shape, &a.shape)
        .and_then(|s| broadcast_shapes(&s, &b.shape))
        .ok_or_else(|| {
            RefError::new(
                "select",
                format!(
                    "shapes {:?}, {:?} and {:?} do not broadcast",
                    cond.shape, a.shape, b.shape
                ),
            )
        })?;
    Ok(Dense::from_fn(&shape, |index| {
        if cond.data[broadcast_source(index, &cond.shape)] != 0.0 {
            a.data[broadcast_source(index, &a.shape)]
        } else {
            b.data[broadcast_source(index, &b.shape)]
        }
    }))
}

/// `out = mask ? value : input`, `mask` broadcast to `input`'s shape (the
/// suite converts `value` to the dtype as `fill` does).
pub fn masked_fill(input: &Dense, mask: &Dense, value: f64) -> Result<Dense, RefError> {
    if broadcast_shapes(&mask.shape, &input.shape).as_deref() != Some(&input.shape[..]) {
        return Err(RefError::new(
            "masked_fill",
            format!(
                "mask {:?} does not broadcast to input {:?}",
                mask.shape, input.shape
            ),
        ));
    }
    Ok(Dense::from_fn(&input.shape, |index| {
        if mask.data[broadcast_source(index, &mask.shape)] != 0.0 {
            value
        } else {
            input.data[broadcast_source(index, &input.shape)]
        }
    }))
}

/// An elementwise comparison by name (`eq`, `ne`, `lt`, `le`, `gt`,
/// `ge`), IEEE: only `ne` is true with a NaN, `-0 == +0`.
pub fn compare_fn(op: &str) -> fn(f64, f64) -> bool {
    match op {
        "eq" => |x, y| x == y,
        "ne" => |x, y| x != y,
        "lt" => |x, y| x < y,
        "le" => |x, y| x <= y,
        "gt" => |x, y| x > y,
        _ => |x, y| x >= y,
    }
}

/// `out = a OP b` (1 or 0) over the broadcast shape of `a` and `b`.
pub fn compare(op: &'static str, a: &Dense, b: &Dense) -> Result<Dense, RefError> {
    let shape = broadcast_shapes(&a.shape, &b.shape).ok_or_else(|| {
        RefError::new(
            op,
            format!("shapes {:?} and {:?} do not broadcast", a.shape, b.shape),
        )
    })?;
    let f = compare_fn(op);
    Ok(Dense::from_fn(&shape, |index| {
        let x = a.data[broadcast_source(index, &a.shape)];
        let y = b.data[broadcast_source(index, &b.shape)];
        if f(x, y) { 1.0 } else { 0.0 }
    }))
}
