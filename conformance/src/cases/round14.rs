//! Cases added by mutation round 14 (2026-12-06), the first round on the
//! operators of ABI 1.3, each class of which let a realistic bug in
//! Ferrite, Cobalt or OpenCL pass every earlier case.
//!
//! - `sin` of ±0 and of arguments so small that `sin(x)` rounds to `x`,
//!   judged exactly (the sign of a zero too): a zero fast path giving +0
//!   for -0 passed, `sin`'s tolerance leaving the sign of a zero open.
//! - A one-element (0-d) operand whose value a double cannot carry (an
//!   i64 past 2^53, a NaN's payload): `select` taking a scalar branch as
//!   a double, and the comparisons taking a broadcast `b` as an f32 kernel
//!   argument, passed, every earlier scalar operand being a small value.
//! - A 0-d `cond` against broadcast or strided branches: a scalar-condition
//!   path that copies the chosen operand as if it were packed like `out`.
//! - Square shapes with a 1-D `cond`, `mask` or `b` (NumPy aligns it with
//!   the last dim): a kernel that picks the axis by extent and reads it per
//!   row when there are as many rows as columns.
//! - i32 to bf16 just past a bf16 tie, where a detour through f32 lands
//!   exactly on the tie (two roundings).
//! - `arange` whose product `i * step` is inexact and whose start is not
//!   0 (a fused multiply-add rounds once where the ABI rounds twice), and
//!   i64 ranges past 2^53, where the ABI's f64 values are not the integers
//!   an integer computation gives (judged bit for bit).
//!
//! These cases are not bases of derived layouts (they come after the
//! derived cases and round 13's, before the realistic ones).

use polychip_host::{BinaryOp, CompareOp, DType};

use super::basic::{any_values, nan_patterns};
use super::data_1_3::{convert_case, select_case};
use super::{Rng, case, input, numel, output, shape_label};
use crate::case::{Case, Layout};
use crate::reference::{self, Dense};
use crate::tolerance::Tolerance;
use crate::values::round_to;

const C: Layout = Layout::Contiguous;

/// The round's cases of operator `op` in `dtype` (none for most operators).
pub(super) fn cases(op: &str, dtype: DType) -> Vec<Case> {
    if let Some(c) = CompareOp::ALL.into_iter().find(|c| c.name() == op) {
        let mut cases = compare_scalar(c, dtype);
        cases.push(compare_square(c, dtype));
        return cases;
    }
    match op {
        "sin" => vec![sin_tiny(dtype)],
        "select" => {
            let mut cases = select_scalar_bits(dtype);
            cases.extend(select_scalar_cond(dtype));
            cases.push(select_square(dtype));
            cases
        }
        "masked_fill" => vec![masked_fill_square(dtype)],
        "convert" => {
            let mut cases = convert_past_bf16_ties(dtype);
            cases.extend(convert_near_overflow(dtype));
            cases
        }
        "arange" => arange(dtype),
        "add" => int_scalar_b(BinaryOp::Add, dtype),
        "sub" => int_scalar_b(BinaryOp::Sub, dtype),
        "mul" => int_scalar_b(BinaryOp::Mul, dtype),
        _ => Vec::new(),
    }
}

/// The seed of the round's cases of `op`.
fn rng(op: &str, dtype: DType) -> Rng {
    Rng::for_case(&format!("{op} round 14"), dtype)
}

/// Bits of `dtype`'s element holding `v` (as the suite uploads it).
fn bits_of(dtype: DType, v: f64) -> i64 {
    crate::case::element_bits(&crate::values::to_bytes(dtype, &[v]))
}

/// `sin` of ±0, ±the smallest subnormal, ±the smallest normal and small
/// powers of two (and 1.5 times them), where `sin(x)` rounds to `x`
/// itself: judged exactly, the sign of a zero included.
fn sin_tiny(dtype: DType) -> Case {
    // sin(x) = x (1 - x^2 / 6 + ...) rounds to x while x^2 / 6 is below
    // half an ULP of x: |x| < 2^-12 in f32, 2^-5 in f16, 2^-4 in bf16.
    let (tiny, normal, top) = match dtype {
        DType::F32 => (2f64.powi(-149), 2f64.powi(-126), -14),
        DType::F16 => (2f64.powi(-24), 2f64.powi(-14), -8),
        _ => (2f64.powi(-133), 2f64.powi(-126), -8),
    };
    let mut x = vec![0.0, -0.0];
    for m in [tiny, normal, 2f64.powi(-20), 2f64.powi(top)] {
        x.extend([m, -m, 1.5 * m, -1.5 * m]);
    }
    let x: Vec<f64> = x.into_iter().map(|v| round_to(dtype, v)).collect();
    let n = x.len();
    case(
        "sin",
        dtype,
        format!("[{n}] ±0 and arguments so small that sin(x) is x, its sign too"),
        vec![
            input("input", dtype, &[n], x, C),
            output("out", dtype, &[n], C),
        ],
        Tolerance::EXACT,
        |exec, t| exec.unary(polychip_host::UnaryOp::Sin, &t[0], &t[1]),
        |d| Ok(vec![reference::sin(&d[0])?]),
    )
}

/// A value of `dtype` whose bits a double does not carry, or `None` where
/// a double carries every value (bool, u8, i32).
fn uncarried(dtype: DType) -> Option<i64> {
    match dtype {
        DType::I64 => Some((1 << 53) + 1),
        d if d.is_float() => Some(nan_patterns(d)[0] as i64),
        _ => None,
    }
}

/// `select` with one branch 0-d holding bits a double does not carry (a
/// signalling NaN, an i64 past 2^53), the other branch full; once as `b`
/// and once as `a`. Bits must be moved unchanged.
fn select_scalar_bits(dtype: DType) -> Vec<Case> {
    let Some(special) = uncarried(dtype) else {
        return Vec::new();
    };
    let n = 6;
    let full: Vec<f64> = vec![2.0, -3.0, 0.5, 7.0, -1.0, 4.0];
    let full_bits: Vec<i64> = full.iter().map(|&v| bits_of(dtype, v)).collect();
    let value = if dtype.is_float() {
        f64::NAN
    } else {
        special as f64
    };
    let cond: Vec<f64> = (0..n).map(|i| (i % 2) as f64).collect();
    let mut cases = Vec::new();
    for scalar_is_b in [true, false] {
        let mut scalar = input(
            if scalar_is_b { "b" } else { "a" },
            dtype,
            &[],
            vec![value],
            C,
        );
        scalar.exact_bits = Some(vec![special]);
        let mut wide = input(
            if scalar_is_b { "a" } else { "b" },
            dtype,
            &[n],
            full.clone(),
            C,
        );
        wide.exact_bits = Some(full_bits.clone());
        // cond is 1 at odd positions: a there, b elsewhere.
        let want: Vec<i64> = (0..n)
            .map(|i| {
                let takes_a = i % 2 == 1;
                if takes_a == scalar_is_b {
                    full_bits[i]
                } else {
                    special
                }
            })
            .collect();
        let mut out = output("out", dtype, &[n], C);
        out.exact_bits = Some(want);
        let (a, b) = if scalar_is_b {
            (wide, scalar)
        } else {
            (scalar, wide)
        };
        cases.push(select_case(
            dtype,
            format!(
                "a 0-d {} holding bits a double cannot carry, moved unchanged",
                if scalar_is_b { "b" } else { "a" }
            ),
            [input("cond", DType::Bool, &[n], cond.clone(), C), a, b, out],
        ));
    }
    cases
}

/// `select` with a 0-d `cond` (true, then false) against branches that
/// broadcast or are strided.
fn select_scalar_cond(dtype: DType) -> Vec<Case> {
    let mut rng = rng("select", dtype);
    let mut cases = Vec::new();
    let shapes: [(&[usize], Layout, &[usize], Layout); 2] = [
        (&[3, 1], C, &[1, 4], C),
        (&[4, 3], Layout::Transposed, &[4, 3], Layout::Strided),
    ];
    for (a_shape, a_layout, b_shape, b_layout) in shapes {
        let out_shape = reference::broadcast_shapes(a_shape, b_shape).expect("they broadcast");
        for c in [1.0, 0.0] {
            let a = any_values(&mut rng, dtype, numel(a_shape));
            let b = any_values(&mut rng, dtype, numel(b_shape));
            cases.push(select_case(
                dtype,
                format!(
                    "cond 0-d {} a {} b {}",
                    c != 0.0,
                    shape_label(a_shape, a_layout),
                    shape_label(b_shape, b_layout)
                ),
                [
                    input("cond", DType::Bool, &[], vec![c], C),
                    input("a", dtype, a_shape, a, a_layout),
                    input("b", dtype, b_shape, b, b_layout),
                    output("out", dtype, &out_shape, C),
                ],
            ));
        }
    }
    cases
}

/// `select` over a square `[6, 6]` with a 1-D `cond` of 6 (one per
/// column, as NumPy aligns it).
fn select_square(dtype: DType) -> Case {
    let mut rng = rng("select square", dtype);
    let cond: Vec<f64> = vec![1.0, 0.0, 0.0, 1.0, 1.0, 0.0];
    let a = any_values(&mut rng, dtype, 36);
    let b = any_values(&mut rng, dtype, 36);
    select_case(
        dtype,
        "cond [6] a [6, 6] b [6, 6]: a square out, cond per column".into(),
        [
            input("cond", DType::Bool, &[6], cond, C),
            input("a", dtype, &[6, 6], a, C),
            input("b", dtype, &[6, 6], b, C),
            output("out", dtype, &[6, 6], C),
        ],
    )
}

/// `masked_fill` of a square `[6, 6]` input with a 1-D mask of 6 (one
/// per column).
fn masked_fill_square(dtype: DType) -> Case {
    let mut rng = rng("masked_fill square", dtype);
    let x = any_values(&mut rng, dtype, 36);
    let mask: Vec<f64> = vec![0.0, 1.0, 1.0, 0.0, 0.0, 1.0];
    let value = if dtype == DType::Bool { 1.0 } else { 2.0 };
    case(
        "masked_fill",
        dtype,
        "[6, 6] mask [6]: a square input, the mask per column",
        vec![
            input("input", dtype, &[6, 6], x, C),
            input("mask", DType::Bool, &[6], mask, C),
            output("out", dtype, &[6, 6], C),
        ],
        Tolerance::EXACT,
        move |exec, t| exec.masked_fill(&t[0], &t[1], &t[2], value),
        move |d| Ok(vec![reference::masked_fill(&d[0], &d[1], value)?]),
    )
}

/// A value of `dtype` f32 cannot hold (where the dtype has one), and its
/// neighbours in the dtype, as integers where the dtype is one.
fn scalar_and_neighbours(dtype: DType) -> (i64, f64, [f64; 2]) {
    match dtype {
        DType::I64 => ((1 << 53) + 1, 0.0, [0.0; 2]),
        DType::I32 => (i64::from(i32::MAX - 1), 0.0, [0.0; 2]),
        DType::U8 => (201, 0.0, [0.0; 2]),
        d => {
            let v = round_to(d, 0.1);
            let u = crate::values::ulp(d, v);
            (0, v, [v - u, v + u])
        }
    }
}

/// A comparison whose one operand is 0-d and holds a value f32 cannot
/// (0.1 in f64, 2^53 + 1 in i64, 2^31 - 2 in i32), against its
/// neighbours, itself and values either side; once as `b`, once as `a`.
/// i64 values are carried bit for bit and the result computed on them.
fn compare_scalar(op: CompareOp, dtype: DType) -> Vec<Case> {
    let (int_value, float_value, near) = scalar_and_neighbours(dtype);
    let (scalar, wide): (Vec<i64>, Vec<i64>) = if dtype.is_float() {
        (Vec::new(), Vec::new())
    } else {
        let v = int_value;
        (vec![v], vec![v, v + 1, v - 1, 0, v / 2, v, v + 1, 1])
    };
    let (scalar_f, wide_f): (f64, Vec<f64>) = if dtype.is_float() {
        let v = float_value;
        (
            v,
            vec![
                v,
                near[0],
                near[1],
                -v,
                0.0,
                f64::NAN,
                f64::from(v as f32),
                1.0,
            ],
        )
    } else {
        (scalar[0] as f64, wide.iter().map(|&x| x as f64).collect())
    };
    let n = wide_f.len();
    let f = reference::compare_fn(op.name());
    let mut cases = Vec::new();
    for scalar_is_b in [true, false] {
        let want: Vec<f64> = (0..n)
            .map(|i| {
                let r = if dtype.is_float() {
                    let (x, y) = if scalar_is_b {
                        (wide_f[i], scalar_f)
                    } else {
                        (scalar_f, wide_f[i])
                    };
                    f(round_to(dtype, x), round_to(dtype, y))
                } else {
                    let (x, y) = if scalar_is_b {
                        (wide[i], scalar[0])
                    } else {
                        (scalar[0], wide[i])
                    };
                    // The integers' order, through the f64 comparison of -1/0/1.
                    f(x.cmp(&y) as i64 as f64, 0.0)
                };
                if r { 1.0 } else { 0.0 }
            })
            .collect();
        let mut s = input(
            if scalar_is_b { "b" } else { "a" },
            dtype,
            &[],
            vec![scalar_f],
            C,
        );
        let mut w = input(
            if scalar_is_b { "a" } else { "b" },
            dtype,
            &[n],
            wide_f.clone(),
            C,
        );
        if dtype == DType::I64 {
            s.exact_bits = Some(scalar.clone());
            w.exact_bits = Some(wide.clone());
        }
        let (a, b) = if scalar_is_b { (w, s) } else { (s, w) };
        cases.push(case(
            op.name(),
            dtype,
            format!(
                "a 0-d {} against its neighbours (in f64, i32 and i64 a value f32 cannot hold)",
                if scalar_is_b { "b" } else { "a" }
            ),
            vec![a, b, output("out", DType::Bool, &[n], C)],
            Tolerance::EXACT,
            move |exec, t| exec.compare(op, &t[0], &t[1], &t[2]),
            move |_| Ok(vec![Dense::new(&[n], want.clone())]),
        ));
    }
    cases
}

/// A comparison of a square `[6, 6]` `a` with a 1-D `b` of 6 (one per
/// column).
fn compare_square(op: CompareOp, dtype: DType) -> Case {
    let mut rng = rng(op.name(), dtype);
    let mut draw = |n: usize| -> Vec<f64> {
        (0..n)
            .map(|_| {
                let k = rng.below(5) as f64 - 2.0;
                if dtype == DType::U8 { k + 2.0 } else { k }
            })
            .collect()
    };
    let (a, b) = (draw(36), draw(6));
    case(
        op.name(),
        dtype,
        "[6, 6] against b [6]: a square a, b per column",
        vec![
            input("a", dtype, &[6, 6], a, C),
            input("b", dtype, &[6], b, C),
            output("out", DType::Bool, &[6, 6], C),
        ],
        Tolerance::EXACT,
        move |exec, t| exec.compare(op, &t[0], &t[1], &t[2]),
        move |d| Ok(vec![reference::compare(op.name(), &d[0], &d[1])?]),
    )
}

/// Integer `add`, `sub` and `mul` in i64 against a 0-d `b` past i32's
/// range (2^40 + 3, which a 32-bit kernel argument makes 3), `a` holding
/// the ends of the range and values past 2^53, bit for bit.
fn int_scalar_b(op: BinaryOp, dtype: DType) -> Vec<Case> {
    if dtype != DType::I64 {
        return Vec::new();
    }
    let b: i64 = (1 << 40) + 3;
    let a: Vec<i64> = vec![1, -1, 0, 5, 1 << 40, -(1 << 53) - 1, i64::MAX, i64::MIN];
    let alpha: i64 = if op == BinaryOp::Mul { 1 } else { 3 };
    let want: Vec<i64> = a
        .iter()
        .map(|&x| match op {
            BinaryOp::Add => x.wrapping_add(alpha.wrapping_mul(b)),
            BinaryOp::Sub => x.wrapping_sub(alpha.wrapping_mul(b)),
            _ => x.wrapping_mul(b),
        })
        .collect();
    let n = a.len();
    let mut ta = input("a", dtype, &[n], a.iter().map(|&x| x as f64).collect(), C);
    ta.exact_bits = Some(a);
    let mut tb = input("b", dtype, &[], vec![b as f64], C);
    tb.exact_bits = Some(vec![b]);
    let mut out = output("out", dtype, &[n], C);
    out.exact_bits = Some(want.clone());
    let want: Vec<f64> = want.iter().map(|&x| x as f64).collect();
    let alpha = alpha as f64;
    vec![case(
        op.name(),
        dtype,
        format!("[{n}] against a 0-d b of 2^40 + 3, alpha {alpha}: past i32's range"),
        vec![ta, tb, out],
        Tolerance::EXACT,
        move |exec, t| exec.binary(op, &t[0], &t[1], &t[2], alpha),
        move |_| Ok(vec![Dense::new(&[n], want.clone())]),
    )]
}

/// i32 (and i64) to bf16 for integers one past a bf16 tie,
/// `2^k + 2^(k-8) + 1`: f32 rounds them onto the tie (its ULP there is 2
/// or more), which then goes to the even neighbour below, where the
/// integer is nearer the one above.
fn convert_past_bf16_ties(src: DType) -> Vec<Case> {
    if !matches!(src, DType::I32 | DType::I64) {
        return Vec::new();
    }
    let values: Vec<f64> = [24, 25, 27, 30]
        .into_iter()
        .flat_map(|k| {
            let x = 2f64.powi(k) + 2f64.powi(k - 8) + 1.0;
            [x, -x]
        })
        .collect();
    let n = values.len();
    vec![convert_case(
        src,
        format!("to bf16 [{n}]: integers one past a bf16 tie, which f32 rounds onto"),
        input("src", src, &[n], values, C),
        output("dst", DType::BF16, &[n], C),
    )]
}

/// Floats converted to a narrower float near its overflow threshold (the
/// largest finite value plus half an ULP, which rounds to infinity as a
/// tie): values just above the largest finite one round down to it, a
/// kernel that overflows past the largest value itself gives infinity.
fn convert_near_overflow(src: DType) -> Vec<Case> {
    let narrower: &[DType] = match src {
        DType::F64 => &[DType::F32, DType::F16, DType::BF16],
        DType::F32 => &[DType::F16, DType::BF16],
        DType::BF16 => &[DType::F16],
        _ => &[],
    };
    narrower
        .iter()
        .map(|&dst| {
            let max = match dst {
                DType::F32 => f64::from(f32::MAX),
                DType::F16 => 65504.0,
                _ => f64::from(half::bf16::MAX),
            };
            let half_ulp = crate::values::ulp(dst, max) / 2.0;
            let mut values: Vec<f64> = [0.25, 0.5, 0.75, 0.999, 1.0, 1.5]
                .into_iter()
                .map(|k| max + k * half_ulp)
                .map(|v| round_to(src, v))
                .filter(|v| v.is_finite())
                .collect();
            values.dedup();
            let negatives: Vec<f64> = values.iter().map(|v| -v).collect();
            values.extend(negatives);
            values.push(max);
            let n = values.len();
            convert_case(
                src,
                format!(
                    "to {dst} [{n}]: just past the largest {dst}, below and at the overflow tie"
                ),
                input("src", src, &[n], values, C),
                output("dst", dst, &[n], C),
            )
        })
        .collect()
}

/// `arange` from 0.1 by 0.1 (every product inexact and the start not 0,
/// where a fused multiply-add differs), and in i64 from 2^53 by 1 and 3
/// and from -2^53 by -3, where the f64 values the ABI defines are not the
/// integers (judged bit for bit).
fn arange(dtype: DType) -> Vec<Case> {
    let mut cases = vec![arange_case(
        dtype,
        200,
        0.1,
        0.1,
        "start and step not dyadic: the product rounded before the sum",
    )];
    if dtype == DType::I64 {
        let two53 = 2f64.powi(53);
        for (start, step) in [(two53, 1.0), (two53, 3.0), (-two53, -3.0)] {
            cases.push(arange_case(
                dtype,
                16,
                start,
                step,
                "past 2^53: the f64 values, not the integers",
            ));
        }
    }
    cases
}

fn arange_case(dtype: DType, n: usize, start: f64, step: f64, what: &str) -> Case {
    let mut out = output("out", dtype, &[n], C);
    if dtype == DType::I64 {
        // Every value here is an integer an f64 holds, so exactly an i64.
        out.exact_bits = Some((0..n).map(|i| (start + (i as f64) * step) as i64).collect());
    }
    case(
        "arange",
        dtype,
        format!("[{n}] from {start} by {step}: {what}"),
        vec![out],
        Tolerance::EXACT,
        move |exec, t| exec.arange(&t[0], start, step),
        move |_| Ok(vec![reference::arange(n, start, step)?]),
    )
}
