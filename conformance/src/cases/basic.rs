//! Cases of the ABI 1.0 operators: fill, copy, cast, the elementwise binary
//! operators, matmul and softmax.

use polychip_host::{BinaryOp, DType, MatmulOptions, Op};

use super::{
    Rng, case, every_pair, inout, input, numel, output, rounding_ties, shape_label, specials,
};
use crate::case::{Case, Layout};
use crate::reference::{self, Dense};
use crate::tolerance::{Bias, Tolerance};

/// The case generator of each operator of this family.
pub(super) fn cases(op: Op) -> Option<fn(DType) -> Vec<Case>> {
    Some(match op {
        Op::Fill => fill,
        Op::Copy => copy,
        Op::Cast => cast,
        Op::Add => |d| binary(BinaryOp::Add, d),
        Op::Sub => |d| binary(BinaryOp::Sub, d),
        Op::Mul => |d| binary(BinaryOp::Mul, d),
        Op::Div => |d| binary(BinaryOp::Div, d),
        Op::Matmul => matmul,
        Op::Softmax => softmax,
        _ => return None,
    })
}

/// Values suited to `dtype`: floats in [-4, 4), integers in a small range,
/// booleans 0/1.
pub(super) fn any_values(rng: &mut Rng, dtype: DType, n: usize) -> Vec<f64> {
    match dtype {
        DType::Bool => (0..n).map(|_| rng.below(2) as f64).collect(),
        DType::U8 => (0..n).map(|_| rng.below(256) as f64).collect(),
        DType::I32 | DType::I64 => (0..n).map(|_| rng.below(2001) as f64 - 1000.0).collect(),
        _ => rng.values(dtype, n, -4.0, 4.0),
    }
}

fn fill(dtype: DType) -> Vec<Case> {
    let mut cases = Vec::new();
    let shapes: [(&[usize], Layout); 5] = [
        (&[], Layout::Contiguous),
        (&[5], Layout::Contiguous),
        (&[3, 4], Layout::Strided),
        (&[4, 3], Layout::Transposed),
        (&[0, 3], Layout::Contiguous),
    ];
    // The value arrives as f64: values at and around ties of the dtype
    // (among them values a conversion through f32 would round onto a tie,
    // and the tie between the largest value and infinity) must be rounded
    // once, to nearest-even.
    let ties = if dtype == DType::F64 {
        Vec::new()
    } else {
        rounding_ties(DType::F64, dtype)
    };
    let mut tie_values: Vec<f64> = ties.iter().copied().take(20).collect();
    tie_values.extend(ties.iter().rev().take(20));
    tie_values.sort_by(f64::total_cmp);
    tie_values.dedup();
    for value in tie_values {
        let label = format!("[5] tie value {value:e}");
        cases.push(case(
            "fill",
            dtype,
            label,
            vec![output("out", dtype, &[5], Layout::Contiguous)],
            Tolerance::EXACT,
            move |exec, t| exec.fill(&t[0], value),
            move |_| Ok(vec![reference::fill(&[5], value)?]),
        ));
    }
    // A NaN whose payload is only its lowest bit (signalling) must stay a
    // NaN: narrowing its bits by a shift, without setting the quiet bit,
    // makes it infinity.
    let low_nan = f64::from_bits(0x7ff0_0000_0000_0001);
    // Infinities and values past 2^63 saturate an integer dtype (a
    // conversion through a wider integer wraps or is undefined there);
    // 2^63 itself, the double `i64::MAX` arrives as (`x > 9223372036854775807.0`
    // is false there, as that literal is 2^63), -2^63 and 2^31 too. -0 stays
    // -0 in the floating dtypes (a `value == 0` memset fast path makes it +0).
    let saturating = [
        f64::INFINITY,
        f64::NEG_INFINITY,
        1e19,
        -1e20,
        9_223_372_036_854_775_808.0,
        -9_223_372_036_854_775_808.0,
        2_147_483_648.0,
        -0.0,
    ];
    for (shape, layout) in shapes {
        for value in [2.5, -3.75, 1e10, f64::NAN, low_nan]
            .into_iter()
            .chain(saturating)
        {
            let value_label = if value.to_bits() == low_nan.to_bits() {
                "NaN (payload 1)".to_string()
            } else {
                value.to_string()
            };
            let label = format!("{} value {value_label}", shape_label(shape, layout));
            let out_shape = shape.to_vec();
            cases.push(case(
                "fill",
                dtype,
                label,
                vec![output("out", dtype, shape, layout)],
                Tolerance::EXACT,
                move |exec, t| exec.fill(&t[0], value),
                move |_| Ok(vec![reference::fill(&out_shape, value)?]),
            ));
        }
    }
    // A permuted output of three dims, whose rows are not evenly spaced: a
    // fill that walks it as [rows, last] with one row stride leaves rows
    // unwritten and writes outside the view. (Three dims, not four: with
    // the last two compact, such a fill would cover the view's elements in
    // another order, which a fill cannot tell.)
    let shape = [3, 4, 5];
    cases.push(case(
        "fill",
        dtype,
        format!("{} value -7.75", shape_label(&shape, Layout::Permuted)),
        vec![output("out", dtype, &shape, Layout::Permuted)],
        Tolerance::EXACT,
        move |exec, t| exec.fill(&t[0], -7.75),
        move |_| Ok(vec![reference::fill(&shape, -7.75)?]),
    ));
    cases
}

fn copy(dtype: DType) -> Vec<Case> {
    let mut rng = Rng::for_case("copy", dtype);
    let mut cases = Vec::new();
    let layouts = [
        (&[3usize, 4][..], Layout::Transposed, Layout::Contiguous),
        (&[5, 6], Layout::Contiguous, Layout::Strided),
        (&[2, 3, 7], Layout::Strided, Layout::Transposed),
        (&[], Layout::Contiguous, Layout::Contiguous),
        (&[0, 4], Layout::Contiguous, Layout::Contiguous),
        (&[64, 33], Layout::Contiguous, Layout::Contiguous),
        // A transpose of more than 4,096 elements whose 37 rows end in a
        // partial tile (a tiled transpose's path for large copies).
        (&[37, 130], Layout::Transposed, Layout::Contiguous),
        (&[130, 37], Layout::Contiguous, Layout::Transposed),
        // Nine dimensions, past a kernel's fixed arrays of eight.
        (
            &[2, 1, 2, 3, 1, 2, 2, 1, 3],
            Layout::Reversed(3),
            Layout::Transposed,
        ),
    ];
    // Integers beyond f32's (i32) or at the ends of their dtype: a copy
    // through a float of the same width rounds or saturates them.
    let extremes: &[f64] = match dtype {
        DType::I32 => &[
            16_777_217.0,
            -16_777_217.0,
            -2_147_483_648.0,
            2_147_483_647.0,
        ],
        DType::I64 => &[-2_147_483_649.0],
        _ => &[],
    };
    // i64s a double cannot hold (it would round 2^53 + 1 to 2^53), and the
    // ends of the range, which a double saturates or rounds.
    let exact: &[i64] = match dtype {
        DType::I64 => &[
            i64::MIN,
            i64::MAX,
            (1 << 53) + 1,
            -(1 << 53) - 1,
            (1 << 62) + 1,
            (1 << 53) - 1,
        ],
        _ => &[],
    };
    for (shape, src_layout, dst_layout) in layouts {
        let mut values = any_values(&mut rng, dtype, numel(shape));
        let mut whole: Option<Vec<i64>> = None;
        if values.len() >= 2 * (extremes.len() + exact.len()) {
            values[..extremes.len()].copy_from_slice(extremes);
            if !exact.is_empty() {
                let mut w: Vec<i64> = values.iter().map(|&v| v as i64).collect();
                w[extremes.len()..extremes.len() + exact.len()].copy_from_slice(exact);
                values = w.iter().map(|&x| x as f64).collect();
                whole = Some(w);
            }
        }
        // NaNs of every kind, signalling ones among them, at the end: a copy
        // moves bits (mutation round 12: a copy through a floating
        // conversion, which quiets a signalling NaN, passed, as the
        // suite's values travel as f64s where any NaN is NaN).
        let nans = nan_patterns(dtype);
        if !nans.is_empty() && values.len() >= 2 * nans.len() {
            let mut w: Vec<i64> = crate::values::to_bytes(dtype, &values)
                .chunks_exact(dtype.size())
                .map(crate::case::element_bits)
                .collect();
            let at = values.len() - nans.len();
            for (k, &bits) in nans.iter().enumerate() {
                w[at + k] = bits as i64;
                values[at + k] = f64::NAN;
            }
            whole = Some(w);
        }
        let mut src = input("src", dtype, shape, values, src_layout);
        let mut dst = output("dst", dtype, shape, dst_layout);
        (src.exact_bits, dst.exact_bits) = (whole.clone(), whole);
        let label = format!("{} to {dst_layout}", shape_label(shape, src_layout));
        cases.push(case(
            "copy",
            dtype,
            label,
            vec![src, dst],
            Tolerance::EXACT,
            |exec, t| exec.copy(&t[0], &t[1]),
            |d| Ok(vec![reference::copy(&d[0])?]),
        ));
    }
    // The plugin's own memcpy_d2d (the host's `to_device` on the same
    // device), from a view's address inside its buffer into a new one,
    // over more than 4 KiB in the wider dtypes: no other case moves device
    // memory but through the host (mutation round 12: a d2d that copied a
    // device's encoded bytes without re-encoding them at the destination's
    // offset, or that mis-advanced its 4 KiB chunks, passed the suite).
    let n = 1031;
    let values = any_values(&mut rng, dtype, n);
    cases.push(case(
        "copy",
        dtype,
        format!("[{n}] staged by memcpy_d2d from inside its buffer"),
        vec![
            input("src", dtype, &[n], values, Layout::Contiguous),
            output("dst", dtype, &[n], Layout::Contiguous),
        ],
        Tolerance::EXACT,
        |exec, t| {
            let staged = t[0].to_device(exec.device())?;
            exec.copy(&staged, &t[1])
        },
        |d| Ok(vec![reference::copy(&d[0])?]),
    ));
    cases
}

/// NaN bit patterns of a floating dtype: signalling NaNs with the lowest
/// payload bit (of either sign) and with a high one, a quiet NaN with a
/// payload, and every bit set.
pub(super) fn nan_patterns(dtype: DType) -> Vec<u64> {
    match dtype {
        DType::F32 => vec![
            0x7f80_0001,
            0xff80_0001,
            0x7fa0_0000,
            0x7fc0_0001,
            0xffff_ffff,
        ],
        DType::F64 => vec![
            0x7ff0_0000_0000_0001,
            0xfff0_0000_0000_0001,
            0x7ff4_0000_0000_0000,
            0x7ff8_0000_0000_0001,
            0xffff_ffff_ffff_ffff,
        ],
        DType::F16 => vec![0x7c01, 0xfc01, 0x7d00, 0x7e01, 0xffff],
        DType::BF16 => vec![0x7f81, 0xff81, 0x7fa0, 0x7fc1, 0xffff],
        _ => Vec::new(),
    }
}

fn cast(dtype: DType) -> Vec<Case> {
    let mut rng = Rng::for_case("cast", dtype);
    let mut cases = Vec::new();
    for target in Op::Cast.dtypes().iter().copied() {
        let mut values = rng.values(dtype, 200, -1000.0, 1000.0);
        values.extend(rng.values(dtype, 100, -1e-3, 1e-3));
        values.extend(specials(dtype));
        // Ties and near-ties of the target's precision, where round-to-
        // nearest-even, truncation and double rounding through f32 differ
        // (see `rounding_ties`); a pure rounding, so every bit must match.
        let u = crate::values::ulp(target, 1.0);
        for k in 0..16 {
            let base = 1.0 + k as f64 * u;
            values.push(crate::values::round_to(dtype, base + u / 2.0));
            values.push(crate::values::round_to(dtype, -(base + 0.75 * u)));
        }
        if target != dtype {
            values.extend(rounding_ties(dtype, target));
        }
        if dtype == DType::F64 {
            // NaNs whose payload lies in the low bits only (signalling),
            // which a narrowing by shifts turns into infinities.
            values.extend(
                [
                    0x7ff0_0000_0000_0001u64,
                    0xfff0_0000_0000_0001,
                    0x7ff0_0000_1000_0000,
                ]
                .map(f64::from_bits),
            );
        }
        // NaNs with every payload bit set (f32's 0x7fffffff in f32): an
        // "add 0x7fff and shift" narrowing to bf16 carries into the sign.
        if dtype.is_float() {
            values.extend([0x7fff_ffff_e000_0000u64, 0xffff_ffff_e000_0000].map(f64::from_bits));
        }
        let n = values.len();
        for layout in [Layout::Contiguous, Layout::Strided] {
            cases.push(case(
                "cast",
                dtype,
                format!("to {target} [{n}] {layout}"),
                vec![
                    input("src", dtype, &[n], values.clone(), layout),
                    output("dst", target, &[n], Layout::Contiguous),
                ],
                Tolerance::EXACT,
                |exec, t| exec.cast(&t[0], &t[1]),
                |d| Ok(vec![reference::cast(&d[0])?]),
            ));
        }
    }
    // A destination of four dims, permuted (rows not evenly spaced, the last
    // two dims compact), from a permuted and from a transposed source: a
    // conversion that handles one- or two-dimensional views only (one row
    // stride), or judges a view compact by its inner dims, gets them wrong.
    let target = if dtype == DType::F32 {
        DType::BF16
    } else {
        DType::F32
    };
    let shape = [2, 3, 4, 5];
    for layout in [Layout::Permuted, Layout::Transposed] {
        let values = rng.values(dtype, numel(&shape), -1000.0, 1000.0);
        cases.push(case(
            "cast",
            dtype,
            format!(
                "to {target} {} src, permuted dst",
                shape_label(&shape, layout)
            ),
            vec![
                input("src", dtype, &shape, values, layout),
                output("dst", target, &shape, Layout::Permuted),
            ],
            Tolerance::EXACT,
            |exec, t| exec.cast(&t[0], &t[1]),
            |d| Ok(vec![reference::cast(&d[0])?]),
        ));
    }
    cases
}

fn binary(op: BinaryOp, dtype: DType) -> Vec<Case> {
    if !dtype.is_float() {
        // ABI 1.3's integer add, sub and mul.
        return super::data_1_3::binary_int(op, dtype);
    }
    let name = op.name();
    let mut rng = Rng::for_case(name, dtype);
    let alpha = if matches!(op, BinaryOp::Add | BinaryOp::Sub) {
        0.5
    } else {
        1.0
    };
    let mut cases = Vec::new();
    // The eighth pair broadcasts a column with as many elements as the
    // output has columns, which a bias-row fast path chosen by element
    // count alone would read as a row; the last two have a single-element
    // `b` (0-d and [1]), which a scalar fast path serves (with alpha, for
    // add and sub), and one more has nine dimensions (past a kernel's fixed
    // arrays of eight).
    let pairs: [(&[usize], &[usize], Layout); 11] = [
        (&[3, 4], &[3, 4], Layout::Contiguous),
        (&[2, 3], &[3], Layout::Contiguous),
        (&[3, 1, 5], &[4, 1], Layout::Contiguous),
        (&[], &[4], Layout::Contiguous),
        (&[0, 3], &[3], Layout::Contiguous),
        (&[64, 65], &[64, 65], Layout::Transposed),
        (&[7, 9], &[1, 9], Layout::Strided),
        (&[6, 6], &[6, 1], Layout::Contiguous),
        (&[2, 5], &[], Layout::Contiguous),
        (&[7], &[1], Layout::Contiguous),
        (&[2, 1, 2, 3, 1, 2, 2, 1, 3], &[2, 1, 3], Layout::Transposed),
    ];
    for (a_shape, b_shape, layout) in pairs {
        let out_shape = reference::broadcast_shapes(a_shape, b_shape).expect("the pairs broadcast");
        let a = rng.values(dtype, numel(a_shape), -4.0, 4.0);
        let b: Vec<f64> = rng
            .values(dtype, numel(b_shape), 0.25, 4.0)
            .into_iter()
            .map(|v| if rng.below(2) == 0 { v } else { -v })
            .collect();
        let label = format!(
            "{} {} {layout}",
            shape_label(a_shape, Layout::Contiguous),
            shape_label(b_shape, Layout::Contiguous)
        );
        cases.push(binary_case(
            op,
            dtype,
            label,
            (a_shape, a),
            (b_shape, b),
            &out_shape,
            layout,
            alpha,
        ));
    }
    // Special values against each other: every pair of NaN, ±inf, ±0, max, ...
    let s = specials(dtype);
    let n = s.len();
    let (a, b) = every_pair(&s);
    cases.push(binary_case(
        op,
        dtype,
        "special values".into(),
        (&[n * n], a.clone()),
        (&[n * n], b.clone()),
        &[n * n],
        Layout::Contiguous,
        alpha,
    ));
    // add and sub at other alphas (every case above has 0.5): alpha 0,
    // where `alpha * b` is still NaN for an infinite or NaN `b` (mutation
    // round 9: a kernel that skips `b` when alpha is 0, as BLAS's axpy
    // does, passed), and -1 (`add` as a subtraction).
    if matches!(op, BinaryOp::Add | BinaryOp::Sub) {
        for other in [0.0, -1.0] {
            cases.push(binary_case(
                op,
                dtype,
                format!("special values alpha {other}"),
                (&[n * n], a.clone()),
                (&[n * n], b.clone()),
                &[n * n],
                Layout::Contiguous,
                other,
            ));
        }
    }
    cases
}

#[allow(clippy::too_many_arguments)]
fn binary_case(
    op: BinaryOp,
    dtype: DType,
    label: String,
    a: (&[usize], Vec<f64>),
    b: (&[usize], Vec<f64>),
    out_shape: &[usize],
    layout: Layout,
    alpha: f64,
) -> Case {
    let a_layout = if a.0.len() >= 2 {
        layout
    } else {
        Layout::Contiguous
    };
    case(
        op.name(),
        dtype,
        label,
        vec![
            input("a", dtype, a.0, a.1, a_layout),
            input("b", dtype, b.0, b.1, Layout::Contiguous),
            output("out", dtype, out_shape, Layout::Contiguous),
        ],
        // alpha is 0.5 or 1, so alpha * b is exact: one correctly rounded
        // operation in f32 (or f64), rounded once more to bf16 or f16, and
        // unbiased in every dtype.
        Tolerance::computed(1.0).with_bias(Bias::Always),
        move |exec, t| exec.binary(op, &t[0], &t[1], &t[2], alpha),
        move |d| {
            let r = match op {
                BinaryOp::Add => reference::add(&d[0], &d[1], alpha),
                BinaryOp::Sub => reference::sub(&d[0], &d[1], alpha),
                BinaryOp::Mul => reference::mul(&d[0], &d[1], alpha),
                BinaryOp::Div => reference::div(&d[0], &d[1], alpha),
            };
            Ok(vec![r?])
        },
    )
}

/// (batch of a, batch of b, m, k, n, transpose_a, transpose_b, alpha, beta).
type MatmulPlan = (
    &'static [usize],
    &'static [usize],
    usize,
    usize,
    usize,
    bool,
    bool,
    f64,
    f64,
);

fn matmul(dtype: DType) -> Vec<Case> {
    let mut rng = Rng::for_case("matmul", dtype);
    let mut cases = Vec::new();
    // (batch of a, batch of b, m, k, n, transpose_a, transpose_b, alpha, beta)
    // Then the shapes kernels special-case: M = 1 against a transposed b
    // (a decoding step through a weight, the GEMV path) and K = 1 with
    // beta (a rank-1 update, the outer-product path); then a batch of one
    // `a` broadcast against three of `b` (a batch offset of index times
    // stride reads past `a`), and a batched, transposed, gapped `b` (a
    // batch stride computed from the shape as if packed).
    // The last broadcasts an inner batch dim of `a` against a `b` of
    // lower rank with batch dims of its own (multi-query attention's `q @
    // k`; round 7: batch dims aligned at the front, or an operand indexed
    // by the batch modulo its own count, passed every other plan).
    // And last, N = 1 with a transposed `a` (a matrix-vector product on
    // a naive path that reads `a` as packed rows; mutation round 10: every
    // N = 1 product before had a packed `a`).
    // After them, a short product over a long K with beta (few output
    // tiles and K = 600: a kernel splits K across work-groups and adds the
    // partial sums in an epilogue of its own, which must still apply beta;
    // mutation round 11: the split path dropped it).
    let plans: [MatmulPlan; 17] = [
        (&[], &[], 1, 1, 1, false, false, 1.0, 0.0),
        (&[], &[], 3, 5, 4, false, false, 1.0, 0.0),
        (&[], &[], 17, 33, 9, true, false, 1.0, 0.0),
        (&[], &[], 16, 24, 20, false, true, 1.5, 0.5),
        (&[], &[], 64, 128, 48, true, true, 1.0, 0.0),
        (&[2], &[], 5, 7, 3, false, false, 1.0, 0.0),
        (&[2, 3], &[1, 3], 4, 6, 5, false, true, -2.0, 1.0),
        (&[], &[], 4, 0, 3, false, false, 1.0, 0.5),
        (&[], &[], 8, 300, 8, false, false, 1.0, 0.0),
        (&[], &[], 1, 40, 24, false, true, 1.0, 0.0),
        (&[], &[], 6, 1, 5, false, false, 1.0, 0.5),
        (&[1], &[3], 4, 6, 5, false, false, 1.0, 0.0),
        (&[3], &[3], 4, 6, 5, false, true, 1.0, 0.0),
        // A product small enough for a kernel's naive loop, with alpha.
        (&[], &[], 2, 3, 2, false, false, 2.0, 0.0),
        (&[2, 1], &[3], 4, 6, 5, false, false, 1.0, 0.0),
        (&[], &[], 3, 5, 1, true, false, 1.0, 0.0),
        (&[], &[], 3, 600, 5, false, false, 1.0, 0.5),
    ];
    for (ba, bb, m, k, n, ta, tb, alpha, beta) in plans {
        let a_shape: Vec<usize> = ba
            .iter()
            .copied()
            .chain(if ta { [k, m] } else { [m, k] })
            .collect();
        let b_shape: Vec<usize> = bb
            .iter()
            .copied()
            .chain(if tb { [n, k] } else { [k, n] })
            .collect();
        let batch = reference::broadcast_shapes(ba, bb).expect("batches broadcast");
        let out_shape: Vec<usize> = batch.iter().copied().chain([m, n]).collect();
        let a = rng.values(dtype, numel(&a_shape), -2.0, 2.0);
        let b = rng.values(dtype, numel(&b_shape), -2.0, 2.0);
        // The accumulating plans over K > 1 read `out` through a view that
        // is not packed (an epilogue that assumes `ldc = N` reads the wrong
        // values), in every dtype: derived layouts reach only an operator's
        // first and largest plans.
        let out_layout = match (beta != 0.0 && k > 1, out_shape.len()) {
            (false, _) => Layout::Contiguous,
            (true, 2) => Layout::Transposed,
            (true, _) => Layout::Strided,
        };
        let out = if beta == 0.0 {
            output("out", dtype, &out_shape, out_layout)
        } else {
            inout(
                "out",
                dtype,
                &out_shape,
                rng.values(dtype, numel(&out_shape), -1.0, 1.0),
                out_layout,
            )
        };
        let a_layout = if m > 1 && k > 1 && rng.below(2) == 0 {
            Layout::Transposed
        } else {
            Layout::Contiguous
        };
        // The batched plans read b through a stride-2 view.
        let b_layout = if ba.len() == 1 {
            Layout::Strided
        } else {
            Layout::Contiguous
        };
        let label = format!(
            "a {:?} b {:?} ta {ta} tb {tb} alpha {alpha} beta {beta}{}{}",
            a_shape,
            b_shape,
            if a_layout == Layout::Transposed {
                " a transposed in memory"
            } else {
                ""
            },
            if out_layout == Layout::Contiguous {
                String::new()
            } else {
                format!(" out {out_layout}")
            }
        );
        let options = MatmulOptions {
            transpose_a: ta,
            transpose_b: tb,
            alpha,
            beta,
        };
        cases.push(case(
            "matmul",
            dtype,
            label,
            vec![
                input("a", dtype, &a_shape, a, a_layout),
                input("b", dtype, &b_shape, b, b_layout),
                out,
            ],
            // A dot product over K accumulated in f32, then alpha and
            // beta * out (two more terms), rounded once.
            Tolerance::accumulated(0.0, k + 2),
            move |exec, t| exec.matmul(&t[0], &t[1], &t[2], options),
            move |d| {
                Ok(vec![reference::matmul(
                    &d[0], &d[1], &d[2], ta, tb, alpha, beta,
                )?])
            },
        ));
    }
    // Sums past f16's largest finite value (64 products of 30 to 40),
    // brought back into range by alpha = 1/64: a kernel whose epilogue
    // rounds the f32 accumulator to the output dtype before applying alpha
    // (a half-precision C tile, cuBLAS's 16-bit compute types) gives
    // infinities (mutation round 11). Every dtype: the values are plain.
    let a = rng.values(dtype, 4 * 64, 30.0, 40.0);
    let b = rng.values(dtype, 64 * 3, 30.0, 40.0);
    let options = MatmulOptions {
        transpose_a: false,
        transpose_b: false,
        alpha: 1.0 / 64.0,
        beta: 0.0,
    };
    cases.push(case(
        "matmul",
        dtype,
        "sums past 65504 scaled back by alpha 1/64 a [4, 64] b [64, 3]",
        vec![
            input("a", dtype, &[4, 64], a, Layout::Contiguous),
            input("b", dtype, &[64, 3], b, Layout::Contiguous),
            output("out", dtype, &[4, 3], Layout::Contiguous),
        ],
        Tolerance::accumulated(0.0, 64 + 2),
        move |exec, t| exec.matmul(&t[0], &t[1], &t[2], options),
        move |d| {
            Ok(vec![reference::matmul(
                &d[0],
                &d[1],
                &d[2],
                false,
                false,
                1.0 / 64.0,
                0.0,
            )?])
        },
    ));
    // alpha == 0 reads neither a nor b: NaN there must not reach out.
    let a = vec![f64::NAN; 12];
    let b = rng.values(dtype, 12, -2.0, 2.0);
    let out = inout(
        "out",
        dtype,
        &[3, 3],
        rng.values(dtype, 9, -1.0, 1.0),
        Layout::Contiguous,
    );
    let options = MatmulOptions {
        transpose_a: false,
        transpose_b: false,
        alpha: 0.0,
        beta: 0.5,
    };
    cases.push(case(
        "matmul",
        dtype,
        "alpha 0 with NaN in a",
        vec![
            input("a", dtype, &[3, 4], a, Layout::Contiguous),
            input("b", dtype, &[4, 3], b, Layout::Contiguous),
            out,
        ],
        // beta * out alone: one product, rounded once.
        Tolerance::computed(1.0).with_bias(Bias::Always),
        move |exec, t| exec.matmul(&t[0], &t[1], &t[2], options),
        |d| {
            Ok(vec![reference::matmul(
                &d[0], &d[1], &d[2], false, false, 0.0, 0.5,
            )?])
        },
    ));
    cases
}

fn softmax(dtype: DType) -> Vec<Case> {
    let mut rng = Rng::for_case("softmax", dtype);
    let mut cases = Vec::new();
    let shapes: [(&[usize], Layout); 6] = [
        (&[5], Layout::Contiguous),
        (&[3, 7], Layout::Transposed),
        (&[2, 3, 64], Layout::Contiguous),
        (&[4, 1000], Layout::Contiguous),
        (&[6, 9], Layout::Strided),
        (&[3, 0], Layout::Contiguous),
    ];
    for (shape, layout) in shapes {
        let x = rng.values(dtype, numel(shape), -8.0, 8.0);
        cases.push(softmax_case(
            dtype,
            shape_label(shape, layout),
            shape,
            x,
            layout,
        ));
    }
    // Logits near 1000 overflow exp unless the row maximum is subtracted;
    // logits near -1000 underflow every exp to 0 (0/0) unless it is, even
    // when a running maximum starts at 0 rather than -inf; a -inf logit
    // gets probability 0; a row of -inf is NaN.
    let big = [1000.0, 1001.0, 1002.0, 999.0];
    let small = [-1000.0, -1001.0, -1002.0, -999.0];
    let neg_inf = [f64::NEG_INFINITY, 0.0, 1.0, 2.0];
    let all_inf = [f64::NEG_INFINITY; 4];
    let mut x: Vec<f64> = big
        .iter()
        .chain(&small)
        .map(|&v| crate::values::round_to(dtype, v))
        .collect();
    x.extend(neg_inf);
    x.extend(all_inf);
    cases.push(softmax_case(
        dtype,
        "large logits, large negative logits, -inf, an all -inf row".into(),
        &[4, 4],
        x,
        Layout::Contiguous,
    ));
    cases.push(softmax_case(
        dtype,
        "rows of one logit: NaN, +inf, -inf, 0, -5, 1000".into(),
        &[6, 1],
        rows_of_one(dtype),
        Layout::Contiguous,
    ));
    cases.push(softmax_case(
        dtype,
        "rows of 37 masked (-10000) but for the last 3, the largest last".into(),
        &[4, 37],
        tail_rows(&mut rng, dtype, 4, 37),
        Layout::Contiguous,
    ));
    // And of 61: 13, 29 and 61 left after 16-, 32- and 64-wide loops, the
    // last 3 past the middle of each (see the reductions' rows of 61).
    cases.push(softmax_case(
        dtype,
        "rows of 61 masked (-10000) but for the last 3, the largest last".into(),
        &[4, 61],
        tail_rows(&mut rng, dtype, 4, 61),
        Layout::Contiguous,
    ));
    cases.push(softmax_case(
        dtype,
        padded_rows::LABEL.into(),
        &padded_rows::SHAPE,
        padded_rows::values(&mut rng, dtype),
        Layout::Contiguous,
    ));
    // A permuted input (as [batch, heads, seq, keys] scores of a [batch,
    // seq, heads, keys] tensor): rows that are not evenly spaced, which a
    // kernel that walks [..., C] as [rows, C] with one row stride misreads,
    // and compact last two dims, which a kernel that judges a view compact
    // by its inner dims takes for a compact tensor. (The output is compact:
    // an output permuted as its input would make a row-wise kernel that
    // reads and writes every row in memory order right by accident.)
    let shape = [2, 3, 4, 19];
    let x = rng.values(dtype, numel(&shape), -8.0, 8.0);
    let label = shape_label(&shape, Layout::Permuted);
    cases.push(softmax_case(dtype, label, &shape, x, Layout::Permuted));
    // Evenly spaced rows whose extent-1 dim has a stride that is not its
    // compact one (see the norms' `UNIT_DIM_PLAN`, mutation round 10).
    let shape = [4, 1, 19];
    let x = rng.values(dtype, numel(&shape), -8.0, 8.0);
    let label = shape_label(&shape, Layout::Permuted);
    cases.push(softmax_case(dtype, label, &shape, x, Layout::Permuted));
    cases.push(softmax_case(
        dtype,
        left_padded::LABEL.into(),
        &left_padded::SHAPE,
        left_padded::values(&mut rng, dtype),
        Layout::Contiguous,
    ));
    cases
}

/// Rows whose first logits are -inf (a left-padded batch under an
/// additive mask, masked vocabulary entries), then ordinary logits:
/// prefixes of 2, 300 and 1,030 in rows of 1,100. An online softmax
/// (a running maximum and a sum rescaled by `exp(old_max - new_max)`) that
/// does not guard a maximum still at -inf computes `exp(-inf - -inf)`,
/// NaN: per element once two -inf lead the row, per block once a whole
/// block (of 256, of 1,024) is -inf. Mutation round 11: every -inf before
/// was in a row of 4 whose first logit was the only one, or all of it.
/// (Smaller than the `[4, 1000]` cases, so the derived layouts keep those
/// as their bases.)
pub(crate) mod left_padded {
    use super::*;

    pub const LABEL: &str = "rows of 1100 led by 2, 300 and 1030 -inf logits";
    pub const SHAPE: [usize; 2] = [3, 1100];
    pub const PREFIX: [usize; 3] = [2, 300, 1030];

    pub fn values(rng: &mut Rng, dtype: DType) -> Vec<f64> {
        let mut x = rng.values(dtype, SHAPE[0] * SHAPE[1], -8.0, 8.0);
        for (r, &p) in PREFIX.iter().enumerate() {
            x[r * SHAPE[1]..r * SHAPE[1] + p].fill(f64::NEG_INFINITY);
        }
        x
    }
}

/// Rows of one logit each for the softmax family and cross-entropy: a row
/// of one is 1 (log 0) only where its logit is finite; NaN, +inf and -inf
/// give NaN (`inf - inf`), as PyTorch's kernels do. Mutation round 10: a
/// kernel that writes 1 (or 0) for rows of one without looking at them
/// passed every case, no row of one holding anything but a finite value.
pub(crate) fn rows_of_one(dtype: DType) -> Vec<f64> {
    [
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        0.0,
        -5.0,
        1000.0,
    ]
    .iter()
    .map(|&v| crate::values::round_to(dtype, v))
    .collect()
}

/// Rows of `c` logits of -10,000 but for the last 3, random, the largest
/// last: a row maximum that skips a vector loop's remainder misses them.
pub(super) fn tail_rows(rng: &mut Rng, dtype: DType, rows: usize, c: usize) -> Vec<f64> {
    let masked = crate::values::round_to(dtype, -10_000.0);
    let mut x = vec![masked; rows * c];
    for r in 0..rows {
        let mut w = rng.values(dtype, 3, -4.0, 4.0);
        w.sort_by(|a, b| a.partial_cmp(b).unwrap());
        x[r * c + c - 3..r * c + c].copy_from_slice(&w);
    }
    x
}

/// Rows of 2,048 logits of -10,000 (masked, as an attention or a padded
/// batch masks them) but for a window of 128 ordinary logits, 256 further
/// in each row: a row's maximum that one part of a work-group's tree never
/// reaches is off by 10,000, where exp overflows or gives 0/0.
pub(super) mod padded_rows {
    use super::*;

    pub const LABEL: &str = "rows of 2048 masked logits (-10000) but for a window of 128, moving";
    pub const SHAPE: [usize; 2] = [8, 2048];
    pub const WINDOW: usize = 128;

    pub fn values(rng: &mut Rng, dtype: DType) -> Vec<f64> {
        let masked = crate::values::round_to(dtype, -10_000.0);
        let mut x = vec![masked; SHAPE[0] * SHAPE[1]];
        for r in 0..SHAPE[0] {
            let at = r * SHAPE[1] + 256 * r;
            x[at..at + WINDOW].copy_from_slice(&rng.values(dtype, WINDOW, -4.0, 4.0));
        }
        x
    }
}

pub(super) fn softmax_case(
    dtype: DType,
    label: String,
    shape: &[usize],
    x: Vec<f64>,
    layout: Layout,
) -> Case {
    let n = shape.last().copied().unwrap_or(1);
    case(
        "softmax",
        dtype,
        label,
        vec![
            input("input", dtype, shape, x, layout),
            output("out", dtype, shape, Layout::Contiguous),
        ],
        // exp(x - max) in f32 is off by a few u(f32) plus |x - max| u(f32)
        // (the rounded difference; at most 16 here), the row's sum of
        // positive terms by n u(f32) relative (charged as the probabilistic
        // length of `effective_length`), which every probability of the row
        // inherits: all relative to the element. Rounded once.
        Tolerance::computed(24.0 + 2.0 * Tolerance::effective_length(n)),
        |exec, t| exec.softmax(&t[0], &t[1]),
        |d: &[Dense]| Ok(vec![reference::softmax(&d[0])?]),
    )
}
