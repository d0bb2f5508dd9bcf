//! Cases added by mutation round 15 (2026-12-06), the first round on the
//! operators of ABI 1.4, each class of which let a realistic bug in
//! Ferrite, Cobalt or OpenCL pass every earlier case.
//!
//! - `cumsum` of rows that start with -0: a running sum started from -0
//!   (IEEE's additive identity) or from a copy of the first element keeps
//!   -0 where the ABI's sum from +0 gives +0 (the earlier -0 terms came
//!   after a nonzero one). Exact values, judged exactly (the sign of a
//!   zero too).
//! - `any` and `all` of integers whose only set bits lie above the low
//!   byte (256, 2^24, the sign bit; 2^32 and 2^40 in i64) and of floats
//!   whose low byte is 0 (2, 0.5): a kernel that tests the first byte (a
//!   bool kernel run on every dtype) passed, the earlier integer inputs
//!   being 0 and 1.
//! - Integer `scatter_add` whose partial sums leave the dtype's range and
//!   come back, and i64 updates past 2^53: updates saturating at the range
//!   or added in double passed, the earlier updates being at most 1,000.
//! - A zero-stride index along a dimension that is not `dim`'s when `dim`
//!   is 1 (PyTorch's `index_select` and `index_add` along columns as a
//!   gather or a scatter_add, and an index constant along `dim` itself): a
//!   fast path for a zero-stride index written for dim 0 passed, the
//!   derived zero-stride indices being of cases along dim 0.
//!
//! These cases are not bases of derived layouts (they come after the
//! derived cases and rounds 13's and 14's, before the realistic ones).

use polychip_host::{DType, ReduceBoolOp};

use super::data_1_4::{cumsum_case, gather_call, reduce_bool_case, scatter_add_call};
use super::{Rng, case, inout, input, numel};
use crate::case::{Case, Layout};
use crate::reference::{self, Dense};
use crate::tolerance::Tolerance;

const C: Layout = Layout::Contiguous;

/// The round's cases of operator `op` in `dtype` (none for most operators).
pub(super) fn cases(op: &str, dtype: DType) -> Vec<Case> {
    match op {
        "cumsum" => cumsum_leading_negative_zero(dtype),
        "any" => reduce_bool_high_bits(ReduceBoolOp::Any, dtype),
        "all" => reduce_bool_high_bits(ReduceBoolOp::All, dtype),
        "gather" => zero_stride_index(dtype, false),
        "scatter_add" => {
            let mut cases = zero_stride_index(dtype, true);
            cases.extend(scatter_add_wraps(dtype));
            cases
        }
        _ => Vec::new(),
    }
}

/// Rows that start with -0 (all -0; -0 then a sum that cancels to 0;
/// -0 and +0 mixed; -0 after a nonzero term), along dim 1 of `[4, 4]` and
/// dim 0 of its transpose: every value and sum exact, judged exactly, so
/// the sign of each zero is judged.
fn cumsum_leading_negative_zero(dtype: DType) -> Vec<Case> {
    if !dtype.is_float() {
        return Vec::new();
    }
    let rows: [[f64; 4]; 4] = [
        [-0.0, -0.0, -0.0, -0.0],
        [-0.0, -0.0, 1.5, -1.5],
        [-0.0, 0.0, -0.0, -0.0],
        [2.0, -0.0, -2.0, -0.0],
    ];
    let x: Vec<f64> = rows.iter().flatten().copied().collect();
    let xt: Vec<f64> = (0..16).map(|k| rows[k % 4][k / 4]).collect();
    vec![
        cumsum_case(
            dtype,
            "[4, 4] dim 1: rows starting with -0 (the running sum starts from +0)".into(),
            input("input", dtype, &[4, 4], x, C),
            1,
            Tolerance::EXACT,
        ),
        cumsum_case(
            dtype,
            "[4, 4] dim 0: columns starting with -0 (the running sum starts from +0)".into(),
            input("input", dtype, &[4, 4], xt, C),
            0,
            Tolerance::EXACT,
        ),
    ]
}

/// Nonzero values whose low byte is 0 in `dtype` (none for u8 and bool,
/// whose one byte is the value).
fn high_bit_values(dtype: DType) -> Vec<f64> {
    match dtype {
        DType::I32 => vec![256.0, 65536.0, 16_777_216.0, -256.0, f64::from(i32::MIN)],
        DType::I64 => vec![
            256.0,
            2f64.powi(32),
            2f64.powi(40),
            -2f64.powi(56),
            -2f64.powi(63),
        ],
        DType::U8 | DType::Bool => Vec::new(),
        // 2, -2, 0.5 and -4 have every low mantissa bit 0 in each float
        // dtype.
        _ => vec![2.0, -2.0, 0.5, -4.0],
    }
}

/// `any` and `all` over rows `[0, v, 0]` and `[v, v, v]` for each `v` of
/// [`high_bit_values`] (any: true and true; all: false and true).
fn reduce_bool_high_bits(op: ReduceBoolOp, dtype: DType) -> Vec<Case> {
    let vals = high_bit_values(dtype);
    if vals.is_empty() {
        return Vec::new();
    }
    let x: Vec<f64> = vals.iter().flat_map(|&v| [0.0, v, 0.0, v, v, v]).collect();
    let rows = 2 * vals.len();
    vec![reduce_bool_case(
        op,
        dtype,
        &[rows, 3],
        x,
        C,
        1,
        false,
        " nonzero values whose low byte is 0".into(),
    )]
}

/// Values for `scatter_add`'s `dst` and `src` in `dtype`.
fn values(rng: &mut Rng, dtype: DType, n: usize) -> Vec<f64> {
    if dtype.is_float() {
        rng.values(dtype, n, -1.0, 1.0)
    } else {
        (0..n).map(|_| rng.below(2001) as f64 - 1000.0).collect()
    }
}

/// `gather` (`scatter == false`) or `scatter_add` along dim 1 of a `[6, 6]`
/// tensor by a `[4, 5]` index with a zero stride: along dim 0 (one index
/// row for every row, PyTorch's `index_select(x, 1, i)` and `index_add_`),
/// and along dim 1 itself (one index per row, repeated along it).
fn zero_stride_index(dtype: DType, scatter: bool) -> Vec<Case> {
    let op = if scatter { "scatter_add" } else { "gather" };
    let mut rng = Rng::for_case(&format!("{op} round 15"), dtype);
    let (data, index, dim) = ([6usize, 6], [4usize, 5], 1);
    let mut cases = Vec::new();
    for along in [0, 1] {
        // Equal along `along`, as a zero stride there reads them.
        let free = index[1 - along];
        let row: Vec<i64> = (0..free).map(|_| rng.below(data[dim]) as i64).collect();
        let idx: Vec<i64> = (0..numel(&index))
            .map(|k| {
                row[if along == 0 {
                    k % index[1]
                } else {
                    k / index[1]
                }]
            })
            .collect();
        let label = format!(
            "data [6, 6] dim 1 index [4, 5] i64 broadcast along dim {along} (stride 0): {}",
            if along == 0 {
                "index_select along columns"
            } else {
                "one index per row"
            }
        );
        let mut ix = input(
            "index",
            DType::I64,
            &index,
            idx.iter().map(|&i| i as f64).collect(),
            Layout::Broadcast(along),
        );
        ix.exact_bits = Some(idx.clone());
        let x = values(&mut rng, dtype, numel(&data));
        cases.push(if scatter {
            let src = values(&mut rng, dtype, numel(&index));
            // One element receives at most every update of its row.
            let tol = if dtype.is_float() {
                Tolerance::accumulated(0.0, index[1] + 1)
            } else {
                Tolerance::EXACT
            };
            scatter_add_call(
                dtype,
                label,
                dim,
                [
                    inout("dst", dtype, &data, x, C),
                    ix,
                    input("src", dtype, &index, src, C),
                ],
                tol,
            )
        } else {
            gather_call(dtype, label, dim, input("input", dtype, &data, x, C), ix)
        });
    }
    cases
}

/// Integer `scatter_add` whose partial sums leave the range and come back
/// (`2^(b-2)` four times plus 7 wraps to 7; the same negated; one past the
/// maximum and back), and, in i64, updates past 2^53 whose sum is small
/// (an addition in double rounds them first). Every result is an integer
/// of at most 2^53, so the reference's doubles hold it; the i64 updates
/// are carried bit for bit.
fn scatter_add_wraps(dtype: DType) -> Vec<Case> {
    let bits = match dtype {
        DType::I32 => 32,
        DType::I64 => 64,
        _ => return Vec::new(),
    };
    let q = 1i64 << (bits - 2);
    let max = if bits == 32 {
        i64::from(i32::MAX)
    } else {
        (1 << 53) - 1
    };
    let dst: Vec<i64> = vec![q, -q, max - 1, 0, 5];
    let mut pairs: Vec<(i64, i64)> = vec![
        (0, q),
        (0, q),
        (0, q),
        (0, 7),
        (1, -q),
        (1, -q),
        (1, -q),
        (1, -7),
        (2, 5),
        (2, -10),
    ];
    if bits == 32 {
        pairs.push((3, 1));
    } else {
        // 2^53 + 1 is not a double: added in double it rounds to 2^53.
        pairs.extend([(3, (1 << 53) + 1), (3, -(1 << 53))]);
    }
    let (idx, src): (Vec<i64>, Vec<i64>) = pairs.into_iter().unzip();
    let n = idx.len();
    let f = |v: &[i64]| v.iter().map(|&x| x as f64).collect::<Vec<f64>>();
    let mut ix = input("index", DType::I64, &[n], f(&idx), C);
    ix.exact_bits = Some(idx);
    let mut s = input("src", dtype, &[n], f(&src), Layout::Strided);
    s.exact_bits = Some(src.clone());
    let d = inout("dst", dtype, &[5], f(&dst), C);
    vec![case(
        "scatter_add",
        dtype,
        format!("[5] by {n} updates: partial sums past the ends of the range wrap"),
        vec![d, ix, s],
        Tolerance::EXACT,
        |exec, t| exec.scatter_add(&t[0], &t[1], &t[2], 0),
        move |d: &[Dense]| {
            let exact: Vec<i64> = d[0].data.iter().map(|&v| v as i64).collect();
            let out = reference::scatter_add_wrapping(&d[0], &exact, &d[1], &src, 0, bits)?;
            Ok(vec![Dense::new(
                &d[0].shape,
                out.into_iter().map(|v| v as f64).collect(),
            )])
        },
    )]
}
