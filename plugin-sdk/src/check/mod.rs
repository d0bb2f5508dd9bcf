//! The rules operators place on their arguments, checked in one place.
//!
//! The generic rules of `spec/ops.toml` (dtypes, ranks, shapes relative to
//! other tensors, dimension arguments, outputs that overlap themselves) are
//! the functions of this module; the generated constructors of the checked
//! argument structs (`BinaryArgs::new`, ...) call them in the spec's order,
//! then the hand-written rule of [`rules`] where the spec names one. The
//! host runs those constructors before it calls a plugin (so a framework
//! gets a typed error naming the op and shapes), and the Rust SDK runs them
//! again on the plugin's side of the boundary (so a plugin never trusts its
//! caller).

pub mod rules;

use crate::dtype::DType;
use crate::error::ErrorCode;
use crate::tensor::{Shape, TensorDesc};

/// Why an operator's arguments are not acceptable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgError {
    /// A pointer, size, rank or layout that cannot be used.
    #[error("{op}: {message}")]
    Invalid {
        /// The operator.
        op: &'static str,
        /// What is wrong.
        message: String,
    },
    /// A dtype outside ABI v1's set.
    #[error(
        "{op}: {tensor} has a data type ABI v1 does not define (code {code}, bits {bits}, lanes {lanes})"
    )]
    UnknownDType {
        /// The operator.
        op: &'static str,
        /// The argument's name.
        tensor: &'static str,
        /// DLPack code.
        code: u8,
        /// Bits.
        bits: u8,
        /// Lanes.
        lanes: u16,
    },
    /// A dtype the operator does not accept.
    #[error("{op}: {tensor} has dtype {dtype}, but {op} accepts only {accepted}")]
    UnsupportedDType {
        /// The operator.
        op: &'static str,
        /// The argument's name.
        tensor: &'static str,
        /// Its dtype.
        dtype: DType,
        /// What the operator accepts.
        accepted: &'static str,
    },
    /// Two arguments that must share a dtype do not.
    #[error("{op}: {lhs} is {lhs_dtype} but {rhs} is {rhs_dtype}; they must have the same dtype")]
    DTypeMismatch {
        /// The operator.
        op: &'static str,
        /// First argument.
        lhs: &'static str,
        /// Its dtype.
        lhs_dtype: DType,
        /// Second argument.
        rhs: &'static str,
        /// Its dtype.
        rhs_dtype: DType,
    },
    /// An argument's shape does not fit.
    #[error("{op}: {tensor} has shape {actual}, but {expected}")]
    ShapeMismatch {
        /// The operator.
        op: &'static str,
        /// The argument's name.
        tensor: &'static str,
        /// Its shape.
        actual: Shape,
        /// What was expected, as a clause.
        expected: String,
    },
}

impl ArgError {
    /// The ABI code this error travels as.
    pub fn code(&self) -> ErrorCode {
        match self {
            ArgError::Invalid { .. } => ErrorCode::InvalidArgument,
            ArgError::UnknownDType { .. }
            | ArgError::UnsupportedDType { .. }
            | ArgError::DTypeMismatch { .. } => ErrorCode::DTypeMismatch,
            ArgError::ShapeMismatch { .. } => ErrorCode::ShapeMismatch,
        }
    }
}

/// The result of a check.
pub type Checked = Result<(), ArgError>;

/// `t`'s dtype is one of `accepted` (`accepted_text` as messages write it).
#[inline]
pub fn dtype_in(
    op: &'static str,
    tensor: &'static str,
    t: &TensorDesc,
    accepted: &'static [DType],
    accepted_text: &'static str,
) -> Checked {
    if accepted.contains(&t.dtype) {
        Ok(())
    } else {
        Err(ArgError::UnsupportedDType {
            op,
            tensor,
            dtype: t.dtype,
            accepted: accepted_text,
        })
    }
}

/// Two tensors have the same dtype.
#[inline]
pub fn same_dtype(
    op: &'static str,
    lhs: (&'static str, &TensorDesc),
    rhs: (&'static str, &TensorDesc),
) -> Checked {
    if lhs.1.dtype == rhs.1.dtype {
        Ok(())
    } else {
        Err(ArgError::DTypeMismatch {
            op,
            lhs: lhs.0,
            lhs_dtype: lhs.1.dtype,
            rhs: rhs.0,
            rhs_dtype: rhs.1.dtype,
        })
    }
}

/// `t`'s shape is `expected`; `why` is the clause the message puts before it.
#[inline]
pub fn shape_is(
    op: &'static str,
    tensor: &'static str,
    t: &TensorDesc,
    expected: &[i64],
    why: &str,
) -> Checked {
    if t.shape == expected {
        Ok(())
    } else {
        Err(ArgError::ShapeMismatch {
            op,
            tensor,
            actual: Shape::from(t.shape),
            expected: format!("{why} {}", Shape::from(expected)),
        })
    }
}

/// `t` has at least `min` dimensions (a layout such as `[..., M, K]`).
#[inline]
pub fn min_rank(op: &'static str, tensor: &'static str, t: &TensorDesc, min: usize) -> Checked {
    if t.ndim() >= min {
        return Ok(());
    }
    Err(ArgError::ShapeMismatch {
        op,
        tensor,
        actual: Shape::from(t.shape),
        expected: format!(
            "{op} needs at least {min} dimension{}",
            if min == 1 { "" } else { "s" }
        ),
    })
}

/// `t` has exactly `n` dimensions; `what` is its layout (`[N, K]`).
#[inline]
pub fn rank(
    op: &'static str,
    tensor: &'static str,
    t: &TensorDesc,
    n: usize,
    what: &str,
) -> Checked {
    if t.ndim() == n {
        Ok(())
    } else {
        Err(ArgError::ShapeMismatch {
            op,
            tensor,
            actual: Shape::from(t.shape),
            expected: format!("it must be {what}"),
        })
    }
}

/// `t`'s shape is `expected`, the message's clause made only on failure.
#[inline]
fn shape_equals(
    op: &'static str,
    t: (&'static str, &TensorDesc),
    expected: &[i64],
    why: impl FnOnce() -> String,
) -> Checked {
    if t.1.shape == expected {
        Ok(())
    } else {
        shape_is(op, t.0, t.1, expected, &why())
    }
}

/// `t` has `like`'s shape.
#[inline]
pub fn shape_like(
    op: &'static str,
    t: (&'static str, &TensorDesc),
    like: (&'static str, &TensorDesc),
) -> Checked {
    shape_equals(op, t, like.1.shape, || {
        format!("it must equal {}'s shape", like.0)
    })
}

/// `t` is `[H]`, H being `of`'s last dimension (a normalisation's parameter).
#[inline]
pub fn shape_last(
    op: &'static str,
    t: (&'static str, &TensorDesc),
    of: (&'static str, &TensorDesc),
) -> Checked {
    let h = [of.1.shape.last().copied().unwrap_or(1)];
    shape_equals(op, t, &h, || {
        format!("it must be [H] where H is {}'s last dimension:", of.0)
    })
}

/// `t` is `of`'s shape without its last dimension (per-row statistics).
#[inline]
pub fn shape_rows(
    op: &'static str,
    t: (&'static str, &TensorDesc),
    of: (&'static str, &TensorDesc),
) -> Checked {
    let rows = &of.1.shape[..of.1.ndim().saturating_sub(1)];
    shape_equals(op, t, rows, || {
        format!("it must be {}'s shape without its last dimension:", of.0)
    })
}

/// `out` has the NumPy broadcast shape of `a` and `b` (which must broadcast).
#[inline]
pub fn shape_broadcast(
    op: &'static str,
    out: (&'static str, &TensorDesc),
    a: (&'static str, &TensorDesc),
    b: (&'static str, &TensorDesc),
) -> Checked {
    if broadcasts_to(a.1.shape, b.1.shape, out.1.shape) {
        return Ok(());
    }
    let Some(shape) = broadcast_shapes(a.1.shape, b.1.shape) else {
        return Err(ArgError::ShapeMismatch {
            op,
            tensor: b.0,
            actual: Shape::from(b.1.shape),
            expected: format!(
                "it does not broadcast with {}'s shape {}",
                a.0,
                Shape::from(a.1.shape)
            ),
        });
    };
    shape_is(
        op,
        out.0,
        out.1,
        &shape,
        &format!("it must equal the broadcast shape of {} and {}", a.0, b.0),
    )
}

/// `out` has the NumPy broadcast shape of every tensor of `all` (which
/// must broadcast together): `select`'s three operands (ABI 1.3).
pub fn shape_broadcast_all(
    op: &'static str,
    out: (&'static str, &TensorDesc),
    all: &[(&'static str, &TensorDesc)],
) -> Checked {
    let mut shape: Vec<i64> = Vec::new();
    for (i, &(name, t)) in all.iter().enumerate() {
        shape = match broadcast_shapes(&shape, t.shape) {
            Some(s) => s,
            None => {
                let before: Vec<&str> = all[..i].iter().map(|x| x.0).collect();
                return Err(ArgError::ShapeMismatch {
                    op,
                    tensor: name,
                    actual: Shape::from(t.shape),
                    expected: format!(
                        "it does not broadcast with the shape {} of {}",
                        Shape::from(shape.as_slice()),
                        before.join(" and ")
                    ),
                });
            }
        };
    }
    let names: Vec<&str> = all.iter().map(|x| x.0).collect();
    shape_is(
        op,
        out.0,
        out.1,
        &shape,
        &format!("it must equal the broadcast shape of {}", names.join(", ")),
    )
}

/// `t` broadcasts (NumPy rules) to `to`'s shape, which it does not change:
/// a mask applied to a tensor (ABI 1.3's `masked_fill`).
pub fn shape_broadcasts_to(
    op: &'static str,
    t: (&'static str, &TensorDesc),
    to: (&'static str, &TensorDesc),
) -> Checked {
    if broadcast_shapes(t.1.shape, to.1.shape).as_deref() == Some(to.1.shape) {
        return Ok(());
    }
    Err(ArgError::ShapeMismatch {
        op,
        tensor: t.0,
        actual: Shape::from(t.1.shape),
        expected: format!(
            "it must broadcast to {}'s shape {}",
            to.0,
            Shape::from(to.1.shape)
        ),
    })
}

/// A dimension of `of` given as `dim` (negative counts from the end),
/// counted from the front.
#[inline]
pub fn dim_of(
    op: &'static str,
    of: (&'static str, &TensorDesc),
    dim: i32,
) -> Result<usize, ArgError> {
    let n = of.1.ndim() as i64;
    let d = if dim < 0 {
        i64::from(dim) + n
    } else {
        i64::from(dim)
    };
    if (0..n).contains(&d) {
        Ok(d as usize)
    } else {
        Err(ArgError::Invalid {
            op,
            message: format!(
                "dim {dim} is out of range for {} of shape {}",
                of.0,
                Shape::from(of.1.shape)
            ),
        })
    }
}

/// An output must not write one element twice. The test is the usual
/// sufficient one: ordered by stride magnitude, each dimension's stride must
/// step over everything the smaller dimensions reach. Views it rejects that
/// do not overlap are exotic interleavings no framework produces.
pub fn writable(op: &'static str, tensor: &'static str, t: &TensorDesc) -> Checked {
    let Some(strides) = t.strides else {
        return Ok(());
    };
    if t.shape.contains(&0) {
        return Ok(());
    }
    let mut dims: [(u64, u64); 16] = [(0, 0); 16];
    let mut n = 0;
    for (&extent, &stride) in t.shape.iter().zip(strides) {
        if extent > 1 {
            if n == dims.len() {
                return Ok(()); // more than 16 non-trivial dimensions: not checked
            }
            dims[n] = (stride.unsigned_abs(), extent as u64);
            n += 1;
        }
    }
    let dims = &mut dims[..n];
    dims.sort_unstable();
    let mut reach = 0u64;
    for &(stride, extent) in dims.iter() {
        if stride <= reach {
            return Err(ArgError::Invalid {
                op,
                message: format!(
                    "output {tensor} with shape {} and strides {} writes some elements more than once; outputs must not overlap themselves",
                    Shape::from(t.shape),
                    Shape::from(strides)
                ),
            });
        }
        reach = reach.saturating_add(stride.saturating_mul(extent - 1));
    }
    Ok(())
}

/// How two tensors of one call share memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sharing {
    /// No byte of one is a byte of the other.
    Apart,
    /// The same view: address, dtype, shape and strides.
    Same,
    /// Some elements overlap (or the test could not rule it out).
    Overlap,
}

/// Most nodes [`sharing`]'s search visits before it takes two views as
/// overlapping (views that far from simple no framework makes).
const SHARING_WORK: usize = 100_000;

/// How `a` and `b` share memory. Views whose byte spans are disjoint are
/// apart at once; otherwise the test is exact: it looks for element indices
/// of the two whose bytes overlap (a bounded search over the dimensions by
/// stride, as NumPy's `may_share_memory` does), so interleaved views (the
/// even and the odd columns of one matrix, two halves of one row) are apart.
pub fn sharing(a: &TensorDesc, b: &TensorDesc) -> Sharing {
    // Saturating throughout: the SDK checks descriptors from any host, and
    // an absurd one must not overflow here (it is refused elsewhere, or
    // taken as overlapping).
    let count = |t: &TensorDesc| {
        t.shape
            .iter()
            .try_fold(1i128, |n, &d| n.checked_mul(i128::from(d)))
            .unwrap_or(i128::MAX)
    };
    let (na, nb) = (count(a), count(b));
    if na == 0 || nb == 0 {
        return Sharing::Apart;
    }
    let (ea, eb) = (a.dtype.size() as i128, b.dtype.size() as i128);
    // The bytes each spans: compact tensors (no strides) at once.
    let span = |t: &TensorDesc, n: i128, e: i128| {
        let base = t.data as usize as i128;
        let Some(strides) = t.strides else {
            return (base, base.saturating_add(n.saturating_mul(e)));
        };
        let (mut lo, mut hi) = (0i128, 0i128);
        for (&d, &s) in t.shape.iter().zip(strides) {
            let reach = (i128::from(d) - 1)
                .saturating_mul(i128::from(s))
                .saturating_mul(e);
            if reach < 0 {
                lo = lo.saturating_add(reach);
            } else {
                hi = hi.saturating_add(reach);
            }
        }
        (
            base.saturating_add(lo),
            base.saturating_add(hi).saturating_add(e),
        )
    };
    let (alo, ahi) = span(a, na, ea);
    let (blo, bhi) = span(b, nb, eb);
    if ahi <= blo || bhi <= alo {
        return Sharing::Apart;
    }
    let alike = a.data == b.data && a.dtype == b.dtype && a.shape == b.shape;
    if alike && a.strides == b.strides {
        return Sharing::Same;
    }
    let (sa, sb) = (a.strides(), b.strides());
    if alike {
        let same = a
            .shape
            .iter()
            .zip(sa.iter().zip(sb.iter()))
            .all(|(&d, (&x, &y))| d == 1 || x == y);
        if same {
            return Sharing::Same;
        }
    }
    // Variables: a's indices with coefficient `stride * size`, b's with the
    // negated one; an overlap is a sum in [lo, hi], where the two elements'
    // bytes intersect (a's address minus b's in (-ea, eb)).
    let mut vars: Vec<(i128, i128)> = Vec::new();
    for (t, strides, e, sign) in [(a, &sa, ea, 1i128), (b, &sb, eb, -1i128)] {
        for (&d, &s) in t.shape.iter().zip(strides.iter()) {
            if d > 1 && s != 0 {
                vars.push((sign * i128::from(s) * e, i128::from(d) - 1));
            }
        }
    }
    vars.sort_by_key(|&(c, _)| std::cmp::Reverse(c.abs()));
    let offset = b.data as usize as i128 - a.data as usize as i128;
    let (lo, hi) = (offset - ea + 1, offset + eb - 1);
    // The least and most the variables from `k` on can add.
    let mut rest = vec![(0i128, 0i128); vars.len() + 1];
    for k in (0..vars.len()).rev() {
        let (c, n) = vars[k];
        let reach = c.saturating_mul(n);
        let (x, y) = (0.min(reach), 0.max(reach));
        rest[k] = (
            rest[k + 1].0.saturating_add(x),
            rest[k + 1].1.saturating_add(y),
        );
    }
    let mut work = 0usize;
    match solvable(&vars, &rest, 0, 0, (lo, hi), &mut work) {
        Some(false) => Sharing::Apart,
        _ => Sharing::Overlap,
    }
}

/// Whether some `x_k` in `0..=n_k` from variable `k` on bring `sum` into
/// `target`; `None` when the search ran out of work.
fn solvable(
    vars: &[(i128, i128)],
    rest: &[(i128, i128)],
    k: usize,
    sum: i128,
    target: (i128, i128),
    work: &mut usize,
) -> Option<bool> {
    *work += 1;
    if *work > SHARING_WORK {
        return None;
    }
    let (lo, hi) = target;
    if sum.saturating_add(rest[k].1) < lo || sum.saturating_add(rest[k].0) > hi {
        return Some(false);
    }
    let Some(&(c, n)) = vars.get(k) else {
        return Some(true);
    };
    // c x must land in [lo - sum - rest_max, hi - sum - rest_min].
    let (want_lo, want_hi) = (
        lo.saturating_sub(sum).saturating_sub(rest[k + 1].1),
        hi.saturating_sub(sum).saturating_sub(rest[k + 1].0),
    );
    let (mut x0, mut x1) = if c > 0 {
        (
            want_lo.div_euclid(c) + i128::from(want_lo.rem_euclid(c) != 0),
            want_hi.div_euclid(c),
        )
    } else {
        let c = -c;
        // -c x in [want_lo, want_hi]  <=>  x in [-want_hi / c, -want_lo / c]
        let (l, h) = (want_hi.saturating_neg(), want_lo.saturating_neg());
        (
            l.div_euclid(c) + i128::from(l.rem_euclid(c) != 0),
            h.div_euclid(c),
        )
    };
    x0 = x0.max(0);
    x1 = x1.min(n);
    let mut x = x0;
    while x <= x1 {
        match solvable(
            vars,
            rest,
            k + 1,
            sum.saturating_add(c.saturating_mul(x)),
            target,
            work,
        ) {
            Some(false) => x += 1,
            other => return other,
        }
    }
    Some(false)
}

/// The operator's tensors share memory only where it works in place: each
/// output apart from every other output, and from every input unless it is
/// exactly that input and the input is one of the output's `aliases` (the
/// spec's `alias`). An output that overlaps an input in part, or one the
/// operator does not update in place, gets a wrong result (the kernel
/// reads what it has already written); optional tensors absent are `None`.
#[allow(clippy::type_complexity)]
pub fn apart(
    op: &'static str,
    inputs: &[(&'static str, Option<&TensorDesc>)],
    outputs: &[(&'static str, Option<&TensorDesc>, &[&str])],
) -> Checked {
    let describe = |t: &TensorDesc| {
        format!(
            "shape {} and strides {}",
            Shape::from(t.shape),
            Shape::from(&*t.strides())
        )
    };
    for (i, &(oname, o, aliases)) in outputs.iter().enumerate() {
        let Some(o) = o else { continue };
        for &(iname, x) in inputs {
            let Some(x) = x else { continue };
            let message = match sharing(o, x) {
                Sharing::Apart => continue,
                Sharing::Same if aliases.contains(&iname) => continue,
                Sharing::Same => format!(
                    "output {oname} is input {iname}, and {op} does not write {oname} in place \
                     of {iname}; pass an output of its own"
                ),
                Sharing::Overlap => format!(
                    "output {oname} ({}) overlaps input {iname} ({}) in part: {op} would read \
                     elements of {iname} it has already written; pass an output apart from it{}",
                    describe(o),
                    describe(x),
                    if aliases.contains(&iname) {
                        format!(", or exactly {iname} to work in place")
                    } else {
                        String::new()
                    }
                ),
            };
            return Err(ArgError::Invalid { op, message });
        }
        for &(other, p, _) in &outputs[i + 1..] {
            let Some(p) = p else { continue };
            if sharing(o, p) != Sharing::Apart {
                return Err(ArgError::Invalid {
                    op,
                    message: format!(
                        "outputs {oname} ({}) and {other} ({}) share memory; {op} writes each \
                         apart",
                        describe(o),
                        describe(p)
                    ),
                });
            }
        }
    }
    Ok(())
}

/// NumPy broadcasting of two shapes, or `None` when they do not broadcast.
pub fn broadcast_shapes(a: &[i64], b: &[i64]) -> Option<Vec<i64>> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for i in 0..n {
        let da = if i < n - a.len() {
            1
        } else {
            a[i - (n - a.len())]
        };
        let db = if i < n - b.len() {
            1
        } else {
            b[i - (n - b.len())]
        };
        out[i] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return None,
        };
    }
    Some(out)
}

/// Whether `a` and `b` broadcast to exactly `out` (no allocation: this runs
/// on every elementwise call).
#[inline]
fn broadcasts_to(a: &[i64], b: &[i64], out: &[i64]) -> bool {
    let n = out.len();
    if a.len() > n || b.len() > n || a.len().max(b.len()) != n {
        return false;
    }
    (0..n).all(|i| {
        let da = if i < n - a.len() {
            1
        } else {
            a[i - (n - a.len())]
        };
        let db = if i < n - b.len() {
            1
        } else {
            b[i - (n - b.len())]
        };
        let d = out[i];
        (da == d || da == 1) && (db == d || db == 1) && (da == d || db == d)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcasting_follows_numpy() {
        assert_eq!(broadcast_shapes(&[3, 1, 5], &[4, 1]), Some(vec![3, 4, 5]));
        assert_eq!(broadcast_shapes(&[], &[2]), Some(vec![2]));
        assert_eq!(broadcast_shapes(&[0], &[1]), Some(vec![0]));
        assert_eq!(broadcast_shapes(&[2, 3], &[3, 2]), None);
        for (a, b) in [
            (&[3i64, 1, 5][..], &[4i64, 1][..]),
            (&[2, 3], &[3]),
            (&[1], &[0]),
            (&[], &[]),
            (&[2, 1], &[1, 2]),
        ] {
            let out = broadcast_shapes(a, b).unwrap();
            assert!(broadcasts_to(a, b, &out), "{a:?} {b:?}");
            assert!(
                !broadcasts_to(a, b, &[out.as_slice(), &[1]].concat()),
                "an extra dimension is not the broadcast shape"
            );
        }
        assert!(!broadcasts_to(&[2, 3], &[3], &[1, 3]));
        assert!(
            !broadcasts_to(&[1, 3], &[1, 3], &[2, 3]),
            "out may not be larger than both"
        );
    }

    fn desc(shape: &[i64]) -> TensorDesc<'_> {
        TensorDesc {
            data: std::ptr::null_mut(),
            dtype: crate::DType::F32,
            shape,
            strides: None,
        }
    }

    #[test]
    fn three_operands_broadcast_together_and_a_mask_broadcasts_to_its_tensor() {
        let (c, a, b) = (desc(&[3, 1]), desc(&[1, 4]), desc(&[]));
        let all = [("cond", &c), ("a", &a), ("b", &b)];
        assert!(shape_broadcast_all("select", ("out", &desc(&[3, 4])), &all).is_ok());
        let wrong = shape_broadcast_all("select", ("out", &desc(&[4, 3])), &all).unwrap_err();
        assert!(wrong.to_string().contains("cond, a, b"), "{wrong}");
        let (x, y) = (desc(&[2, 3]), desc(&[3, 2]));
        let apart = shape_broadcast_all("select", ("out", &desc(&[2, 3])), &[("a", &x), ("b", &y)]);
        assert!(
            apart
                .unwrap_err()
                .to_string()
                .contains("b has shape [3, 2]")
        );
        let input = desc(&[2, 3]);
        for (mask, ok) in [
            (&[3i64][..], true),
            (&[2, 1], true),
            (&[], true),
            (&[2], false),
            (&[1, 2, 3], false),
        ] {
            let got = shape_broadcasts_to("masked_fill", ("mask", &desc(mask)), ("input", &input));
            assert_eq!(got.is_ok(), ok, "{mask:?}: {got:?}");
        }
    }
}
