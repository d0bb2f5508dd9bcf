//! Cases of the operators ABI 1.3 added: `sin` and `cos` beyond the unary
//! cases they share (large arguments, as rotary tables have, and arguments
//! next to the multiples of pi/2 where the results are tiny), `select`
//! (PyTorch's `where`), `masked_fill` and the comparisons.

use polychip_host::{BinaryOp, CompareOp, DType, Op, UnaryOp};

use super::basic::{any_values, nan_patterns};
use super::{Rng, case, every_pair, input, numel, output, rounding_ties, shape_label, specials};
use crate::case::{Case, Layout, TensorSpec};
use crate::reference;
use crate::tolerance::Tolerance;

/// The case generator of each operator of this family (`sin` and `cos`
/// are `UnaryOp`s: their cases start in `elementwise.rs`).
pub(super) fn cases(op: Op) -> Option<fn(DType) -> Vec<Case>> {
    if let Some(c) = CompareOp::ALL.into_iter().find(|c| c.op() == op) {
        return Some(compare_cases(c));
    }
    Some(match op {
        Op::Select => select,
        Op::MaskedFill => masked_fill,
        Op::Convert => convert,
        Op::Arange => arange,
        _ => return None,
    })
}

/// The error model of `sin` and `cos`: computed with an exact argument
/// reduction (in f64, or f32 with a long 2/pi) and rounded once; within
/// about 1 ULP of the output dtype: the final rounding plus 2 u(f32)
/// relative to the element (no condition-number term: the reduction is
/// exact, so the result next to a root is as accurate as anywhere).
pub(super) fn trig_tolerance() -> Tolerance {
    Tolerance::computed(2.0)
}

/// The values of `dtype` nearest `x` for each `x`.
fn rounded(dtype: DType, x: impl IntoIterator<Item = f64>) -> Vec<f64> {
    x.into_iter()
        .map(|v| crate::values::round_to(dtype, v))
        .filter(|v| v.is_finite())
        .collect()
}

/// `sin` and `cos` beyond the shared unary cases: arguments up to 1e5 (a
/// rotary table's positions times its lowest frequency; f16 stops at
/// 65504) and a few far beyond, where a reduction in the working precision
/// (`x - round(x / 2pi) 2pi` in f32) is off by up to `|x| u(f32)`; and the
/// dtype's values nearest the multiples of pi/2, where the results are
/// tiny and only an exact reduction keeps their relative accuracy.
pub(super) fn trig_extra(op: UnaryOp, dtype: DType) -> Vec<Case> {
    let mut rng = Rng::for_case(&format!("{} large", op.name()), dtype);
    let top = if dtype == DType::F16 { 65504.0 } else { 1e5 };
    let mut large: Vec<f64> = (0..48).map(|_| rng.uniform(100.0, top)).collect();
    // Integer positions of long contexts, and a few far beyond.
    large.extend([8191.0, 16383.0, 32767.0, 65504.0, 2048.0 * 3.0, top]);
    if dtype != DType::F16 {
        large.extend([1e6, 1e10, 1e20, 3e38, -1e7]);
    }
    let negatives: Vec<f64> = large.iter().take(8).map(|x| -x).collect();
    large.extend(negatives);
    let large = rounded(dtype, large);
    let near_roots = rounded(
        dtype,
        [1.0, 2.0, 3.0, 4.0, 7.0, 10.0, 100.0, 355.0, 1000.0, 20000.0]
            .into_iter()
            .flat_map(|k| [k * std::f64::consts::PI, k * std::f64::consts::FRAC_PI_2])
            .flat_map(|x| [x, -x]),
    );
    let mut cases = Vec::new();
    for (label, x, layout) in [
        (
            "large arguments up to 1e5 (65504 in f16), as rotary tables reach",
            large,
            Layout::Contiguous,
        ),
        (
            "the values nearest multiples of pi/2: tiny results",
            near_roots,
            Layout::Strided,
        ),
    ] {
        let n = x.len();
        cases.push(case(
            op.name(),
            dtype,
            label,
            vec![
                input("input", dtype, &[n], x, layout),
                output("out", dtype, &[n], Layout::Contiguous),
            ],
            trig_tolerance(),
            move |exec, t| exec.unary(op, &t[0], &t[1]),
            move |d| {
                Ok(vec![if op == UnaryOp::Sin {
                    reference::sin(&d[0])?
                } else {
                    reference::cos(&d[0])?
                }])
            },
        ));
    }
    cases
}

/// Bits of `dtype`'s element holding `v` (as the suite uploads it).
fn element_bits(dtype: DType, v: f64) -> i64 {
    let bytes = crate::values::to_bytes(dtype, &[v]);
    crate::case::element_bits(&bytes)
}

/// Shapes of `cond`, `a` and `b`, and the layout of `a`.
type Triple = (&'static [usize], &'static [usize], &'static [usize], Layout);

fn select(dtype: DType) -> Vec<Case> {
    let mut rng = Rng::for_case("select", dtype);
    let mut cases = Vec::new();
    // (cond, a, b, layout of a): every broadcast of three operands,
    // 0-d operands, an empty output and strided and transposed views.
    let triples: [Triple; 9] = [
        (&[3, 4], &[3, 4], &[3, 4], Layout::Contiguous),
        (&[3, 1], &[1, 4], &[], Layout::Contiguous),
        (&[2, 3, 4], &[4], &[3, 1], Layout::Contiguous),
        (&[], &[5], &[5], Layout::Contiguous),
        (&[], &[], &[], Layout::Contiguous),
        (&[0, 3], &[3], &[1], Layout::Contiguous),
        (&[5, 6], &[5, 6], &[6], Layout::Transposed),
        (&[4, 6], &[4, 6], &[4, 1], Layout::Strided),
        (&[33, 65], &[33, 65], &[33, 65], Layout::Contiguous),
    ];
    for (c_shape, a_shape, b_shape, layout) in triples {
        let out_shape = reference::broadcast_shapes(c_shape, a_shape)
            .and_then(|s| reference::broadcast_shapes(&s, b_shape))
            .expect("the triples broadcast");
        let c: Vec<f64> = (0..numel(c_shape)).map(|_| rng.below(2) as f64).collect();
        let a = any_values(&mut rng, dtype, numel(a_shape));
        let b = any_values(&mut rng, dtype, numel(b_shape));
        let label = format!(
            "cond {} a {} b {}",
            shape_label(c_shape, Layout::Contiguous),
            shape_label(a_shape, layout),
            shape_label(b_shape, Layout::Contiguous)
        );
        cases.push(select_case(
            dtype,
            label,
            [
                input("cond", DType::Bool, c_shape, c, Layout::Contiguous),
                input("a", dtype, a_shape, a, layout),
                input("b", dtype, b_shape, b, Layout::Contiguous),
                output("out", dtype, &out_shape, Layout::Contiguous),
            ],
        ));
    }
    // Special values in both branches, each taken where the other holds
    // another special value: a blend `c a + (1 - c) b` leaks the branch
    // not taken (NaN, inf * 0) and turns -0 into +0.
    let s = if dtype.is_float() {
        specials(dtype)
    } else {
        extremes(dtype)
    };
    let (a, b) = every_pair(&s);
    let n = a.len();
    let c: Vec<f64> = (0..n).map(|i| (i % 2) as f64).collect();
    cases.push(select_case(
        dtype,
        "NaN and infinities in the branch not taken, -0 in the one taken".into(),
        [
            input("cond", DType::Bool, &[n], c, Layout::Contiguous),
            input("a", dtype, &[n], a, Layout::Contiguous),
            input("b", dtype, &[n], b, Layout::Contiguous),
            output("out", dtype, &[n], Layout::Contiguous),
        ],
    ));
    // Bits the f64 values cannot carry (signalling NaNs, i64s past 2^53),
    // which must be moved unchanged. Strided, so that no derived case
    // rewrites the values under the exact bits.
    if let Some(case) = select_exact_bits(dtype) {
        cases.push(case);
    }
    cases
}

/// The integer dtype's extremes (and bool's two values), as the special
/// values of a selection.
fn extremes(dtype: DType) -> Vec<f64> {
    match dtype {
        DType::I32 => vec![f64::from(i32::MIN), f64::from(i32::MAX), -1.0, 0.0, 1.0],
        DType::I64 => vec![
            -9.223_372_036_854_776e18,
            9.007_199_254_740_992e15,
            -1.0,
            0.0,
        ],
        DType::U8 => vec![0.0, 255.0, 128.0, 1.0],
        _ => vec![0.0, 1.0],
    }
}

fn select_exact_bits(dtype: DType) -> Option<Case> {
    let exact: Vec<i64> = match dtype {
        DType::I64 => vec![
            i64::MIN,
            i64::MAX,
            (1 << 53) + 1,
            -(1 << 53) - 1,
            (1 << 62) + 3,
            7,
        ],
        d if d.is_float() => nan_patterns(d).into_iter().map(|b| b as i64).collect(),
        _ => return None,
    };
    let n = exact.len();
    let value = |bits: i64| {
        if dtype.is_float() {
            f64::NAN
        } else {
            bits as f64
        }
    };
    // a holds the exact elements, b the value 2 (bits of its own); cond
    // takes a at even positions.
    let two = element_bits(dtype, 2.0);
    let cond: Vec<f64> = (0..n).map(|i| ((i + 1) % 2) as f64).collect();
    let want: Vec<i64> = (0..n)
        .map(|i| if i % 2 == 0 { exact[i] } else { two })
        .collect();
    let mut a = input(
        "a",
        dtype,
        &[n],
        exact.iter().map(|&b| value(b)).collect(),
        Layout::Strided,
    );
    a.exact_bits = Some(exact.clone());
    let mut out = output("out", dtype, &[n], Layout::Contiguous);
    out.exact_bits = Some(want);
    Some(select_case(
        dtype,
        format!("[{n}] strided: bits a double cannot carry, moved unchanged"),
        [
            input("cond", DType::Bool, &[n], cond, Layout::Contiguous),
            a,
            input("b", dtype, &[n], vec![2.0; n], Layout::Contiguous),
            out,
        ],
    ))
}

pub(super) fn select_case(dtype: DType, label: String, tensors: [TensorSpec; 4]) -> Case {
    case(
        "select",
        dtype,
        label,
        tensors.into(),
        Tolerance::EXACT,
        |exec, t| exec.select(&t[0], &t[1], &t[2], &t[3]),
        |d| Ok(vec![reference::select(&d[0], &d[1], &d[2])?]),
    )
}

fn masked_fill(dtype: DType) -> Vec<Case> {
    let mut rng = Rng::for_case("masked_fill", dtype);
    let mut cases = Vec::new();
    // (input, mask, layout of input, value).
    let shapes: [(&[usize], &[usize], Layout, f64); 8] = [
        (&[3, 4], &[3, 4], Layout::Contiguous, 2.5),
        (&[3, 4], &[4], Layout::Contiguous, -3.75),
        (&[2, 3, 4], &[3, 1], Layout::Contiguous, f64::NAN),
        (&[], &[], Layout::Contiguous, f64::INFINITY),
        (&[0, 3], &[3], Layout::Contiguous, 1.0),
        (&[5, 6], &[6], Layout::Transposed, -0.0),
        (&[4, 6], &[1], Layout::Strided, 1e10),
        (&[2, 8, 64], &[8, 1], Layout::Contiguous, f64::NEG_INFINITY),
    ];
    for (shape, m_shape, layout, value) in shapes {
        let x = any_values(&mut rng, dtype, numel(shape));
        let m: Vec<f64> = (0..numel(m_shape)).map(|_| rng.below(2) as f64).collect();
        let label = format!(
            "{} mask {} value {value}",
            shape_label(shape, layout),
            shape_label(m_shape, Layout::Contiguous)
        );
        cases.push(masked_fill_case(
            dtype, label, shape, x, layout, m_shape, m, value,
        ));
    }
    // Values the conversion must round once (ties of the dtype, and values
    // a detour through f32 rounds onto a tie), saturate (integers), or
    // keep whole (integers past 2^24, which an f32 argument would round).
    let values: Vec<f64> = match dtype {
        DType::F64 => vec![0.1, 1e300, 5e-324],
        d if d.is_float() => {
            let ties = rounding_ties(DType::F64, d);
            ties.iter()
                .take(10)
                .chain(ties.iter().rev().take(4))
                .copied()
                .collect()
        }
        DType::I32 => vec![
            16_777_217.0,
            -16_777_219.0,
            2_147_483_648.0,
            -3e9,
            7.9,
            -7.9,
            f64::NAN,
        ],
        DType::I64 => vec![
            1_099_511_627_777.0,
            -16_777_217.0,
            1e19,
            -1e19,
            9_223_372_036_854_775_808.0,
            f64::NAN,
        ],
        DType::U8 => vec![300.0, -5.0, 2.9, 255.5, f64::NAN],
        _ => vec![0.5, f64::NAN, -0.0, -2.0],
    };
    for value in values {
        let x = any_values(&mut rng, dtype, 5);
        cases.push(masked_fill_case(
            dtype,
            format!("[5] value {value:e}: a rounding tie, or past 2^24, or saturating"),
            &[5],
            x,
            Layout::Contiguous,
            &[5],
            vec![1.0, 0.0, 1.0, 1.0, 0.0],
            value,
        ));
    }
    cases
}

#[allow(clippy::too_many_arguments)]
fn masked_fill_case(
    dtype: DType,
    label: String,
    shape: &[usize],
    x: Vec<f64>,
    layout: Layout,
    m_shape: &[usize],
    m: Vec<f64>,
    value: f64,
) -> Case {
    case(
        "masked_fill",
        dtype,
        label,
        vec![
            input("input", dtype, shape, x, layout),
            input("mask", DType::Bool, m_shape, m, Layout::Contiguous),
            output("out", dtype, shape, Layout::Contiguous),
        ],
        Tolerance::EXACT,
        move |exec, t| exec.masked_fill(&t[0], &t[1], &t[2], value),
        move |d| Ok(vec![reference::masked_fill(&d[0], &d[1], value)?]),
    )
}

fn compare_cases(op: CompareOp) -> fn(DType) -> Vec<Case> {
    match op {
        CompareOp::Eq => |d| compare(CompareOp::Eq, d),
        CompareOp::Ne => |d| compare(CompareOp::Ne, d),
        CompareOp::Lt => |d| compare(CompareOp::Lt, d),
        CompareOp::Le => |d| compare(CompareOp::Le, d),
        CompareOp::Gt => |d| compare(CompareOp::Gt, d),
        CompareOp::Ge => |d| compare(CompareOp::Ge, d),
    }
}

/// A 1-D integer input of `values`; an i64 one carries them bit for bit
/// too (past 2^53 the f64 the reference sees is not the value).
fn integer_input(name: &'static str, dtype: DType, values: Vec<i64>, layout: Layout) -> TensorSpec {
    let mut t = input(
        name,
        dtype,
        &[values.len()],
        values.iter().map(|&x| x as f64).collect(),
        layout,
    );
    if dtype == DType::I64 {
        t.exact_bits = Some(values);
    }
    t
}

/// The operand shapes of the two-operand cases (comparisons, integer
/// arithmetic, ABI 1.4's bitwise operators): equal shapes, a row, a three-way broadcast, 0-d, 0-size,
/// transposed and strided operands, and a 0-d right side.
/// The labelled operands `a`, `b` and `out` of a case per pair of
/// [`BINARY_SHAPES`]: `a` in the pair's layout and `b` drawn by `draw` (in
/// that order, a pair after another), `out` of `out_dtype` in their
/// broadcast shape. The comparisons' and the bitwise operators' cases.
pub(super) fn binary_shape_operands(
    rng: &mut Rng,
    dtype: DType,
    out_dtype: DType,
    draw: impl Fn(&mut Rng, usize) -> Vec<f64>,
) -> Vec<(String, [TensorSpec; 3])> {
    BINARY_SHAPES
        .into_iter()
        .map(|(a_shape, b_shape, layout)| {
            let out_shape = reference::broadcast_shapes(a_shape, b_shape).expect("they broadcast");
            let a = draw(rng, numel(a_shape));
            let b = draw(rng, numel(b_shape));
            let label = format!(
                "{} {}",
                shape_label(a_shape, layout),
                shape_label(b_shape, Layout::Contiguous)
            );
            let tensors = [
                input("a", dtype, a_shape, a, layout),
                input("b", dtype, b_shape, b, Layout::Contiguous),
                output("out", out_dtype, &out_shape, Layout::Contiguous),
            ];
            (label, tensors)
        })
        .collect()
}

pub(super) const BINARY_SHAPES: [(&[usize], &[usize], Layout); 8] = [
    (&[3, 4], &[3, 4], Layout::Contiguous),
    (&[2, 3], &[3], Layout::Contiguous),
    (&[3, 1, 5], &[4, 1], Layout::Contiguous),
    (&[], &[4], Layout::Contiguous),
    (&[0, 3], &[3], Layout::Contiguous),
    (&[24, 33], &[24, 33], Layout::Transposed),
    (&[7, 9], &[1, 9], Layout::Strided),
    (&[2, 5], &[], Layout::Contiguous),
];

fn compare(op: CompareOp, dtype: DType) -> Vec<Case> {
    let name = op.name();
    let mut rng = Rng::for_case(name, dtype);
    let mut cases = Vec::new();
    // Few distinct values, so that equal pairs are common.
    let draw = |rng: &mut Rng, n: usize| -> Vec<f64> {
        (0..n)
            .map(|_| {
                let k = rng.below(7) as f64 - 3.0;
                if dtype == DType::U8 {
                    k + 3.0
                } else if dtype.is_float() {
                    k * 0.75
                } else {
                    k
                }
            })
            .collect()
    };
    for (label, tensors) in binary_shape_operands(&mut rng, dtype, DType::Bool, draw) {
        cases.push(compare_case(op, dtype, label, tensors));
    }
    // Every pair of special values: NaN against everything (itself too),
    // infinities against themselves, -0 against +0, the smallest subnormal
    // against 0 (which flush-to-zero makes equal); for integers the ends
    // of the range.
    let s = if dtype.is_float() {
        specials(dtype)
    } else {
        extremes(dtype)
    };
    let (a, b) = every_pair(&s);
    let n = a.len();
    cases.push(compare_case(
        op,
        dtype,
        "special values against themselves and each other".into(),
        [
            input("a", dtype, &[n], a, Layout::Contiguous),
            input("b", dtype, &[n], b, Layout::Contiguous),
            output("out", DType::Bool, &[n], Layout::Contiguous),
        ],
    ));
    if dtype == DType::I64 {
        cases.push(compare_i64_exact(op));
    }
    cases
}

/// i64s past 2^53 that differ by one (a comparison through a double finds
/// them equal), compared as integers; strided, so that no derived case
/// rewrites the values under the exact bits.
fn compare_i64_exact(op: CompareOp) -> Case {
    let big = 1i64 << 53;
    let a: Vec<i64> = vec![big, big + 1, i64::MAX, i64::MIN, i64::MAX - 1, -big - 1, 5];
    let b: Vec<i64> = vec![big + 1, big, i64::MAX - 1, i64::MIN + 1, i64::MAX, -big, 5];
    let n = a.len();
    let f = reference::compare_fn(op.name());
    let want: Vec<f64> = a
        .iter()
        .zip(&b)
        .map(|(&x, &y)| {
            let ord = x.cmp(&y);
            // The integers' order, through the f64 comparison of -1/0/1.
            let r = f(ord as i64 as f64, 0.0);
            if r { 1.0 } else { 0.0 }
        })
        .collect();
    let ta = integer_input("a", DType::I64, a, Layout::Strided);
    let tb = integer_input("b", DType::I64, b, Layout::Contiguous);
    case(
        op.name(),
        DType::I64,
        format!("[{n}] strided: i64s past 2^53 that differ by one"),
        vec![ta, tb, output("out", DType::Bool, &[n], Layout::Contiguous)],
        Tolerance::EXACT,
        move |exec, t| exec.compare(op, &t[0], &t[1], &t[2]),
        move |_| Ok(vec![reference::Dense::new(&[n], want.clone())]),
    )
}

fn compare_case(op: CompareOp, dtype: DType, label: String, tensors: [TensorSpec; 3]) -> Case {
    case(
        op.name(),
        dtype,
        label,
        tensors.into(),
        Tolerance::EXACT,
        move |exec, t| exec.compare(op, &t[0], &t[1], &t[2]),
        move |d| Ok(vec![reference::compare(op.name(), &d[0], &d[1])?]),
    )
}

/// The nearest f64 to `x` rounded to odd: what the suite's final rounding
/// (to nearest even, in a format of at most 51 bits) needs to give `x`
/// correctly rounded, for i64s a double cannot hold.
fn i64_as_f64_odd(x: i64) -> f64 {
    let r = x as f64;
    let (back, exact) = (r as i128, i128::from(x));
    if back == exact {
        return r;
    }
    let toward_zero = if back.abs() > exact.abs() {
        f64::from_bits(r.to_bits() - 1)
    } else {
        r
    };
    f64::from_bits(toward_zero.to_bits() | 1)
}

/// Values of `src` that exercise the conversion to `dst`: ordinary ones,
/// the special values, values at and past the integer ranges, halves
/// (truncation, not rounding), and ties of a narrower floating `dst`.
fn convert_values(rng: &mut Rng, src: DType, dst: DType) -> Vec<f64> {
    let mut v = any_values(rng, src, 24);
    if src.is_float() {
        v.extend(specials(src));
        v.extend([
            2.5,
            -2.5,
            0.999,
            -0.999,
            255.5,
            256.0,
            -1.0,
            127.0,
            2_147_483_648.0,
            -2_147_483_649.0,
            2_147_483_647.5,
            16_777_217.0,
            1e19,
            -1e19,
            9_223_372_036_854_775_808.0,
            3e38,
            70000.0,
            65520.0,
        ]);
        if dst.is_float() && dst != src {
            v.extend(rounding_ties(src, dst).into_iter().take(30));
        }
    } else {
        v.extend(extremes(src));
        v.extend([
            1.0, 0.0, 255.0, 256.0, 257.0, 259.0, 2049.0, 2051.0, 65519.0, 65520.0,
        ]);
        v.extend([16_777_217.0, 16_777_219.0, -16_777_217.0, 100_000.0]);
    }
    let mut v: Vec<f64> = v
        .into_iter()
        .map(|x| crate::values::round_to(src, x))
        .collect();
    v.dedup();
    v
}

/// `convert`'s cases for the source dtype `src`: to every dtype, the
/// source strided for half of them; a transposed source; and (i64) values
/// past 2^53 whose conversion must round once.
pub(super) fn convert(src: DType) -> Vec<Case> {
    let mut rng = Rng::for_case("convert", src);
    let mut cases = Vec::new();
    for (k, dst) in DType::ALL.into_iter().enumerate() {
        let values = convert_values(&mut rng, src, dst);
        let n = values.len();
        let layout = if k % 2 == 0 {
            Layout::Contiguous
        } else {
            Layout::Strided
        };
        cases.push(convert_case(
            src,
            format!("to {dst} [{n}] {layout}: specials, ties, range ends"),
            input("src", src, &[n], values, layout),
            output("dst", dst, &[n], Layout::Contiguous),
        ));
    }
    // A transposed source into a permuted destination.
    let dst = if src == DType::F32 {
        DType::I64
    } else {
        DType::F32
    };
    let shape = [3, 4, 5];
    let values = any_values(&mut rng, src, numel(&shape));
    cases.push(convert_case(
        src,
        format!(
            "to {dst} {} src, permuted dst",
            shape_label(&shape, Layout::Transposed)
        ),
        input("src", src, &shape, values, Layout::Transposed),
        output("dst", dst, &shape, Layout::Permuted),
    ));
    if src == DType::I64 {
        cases.extend(convert_i64_exact());
    }
    cases
}

pub(super) fn convert_case(src: DType, label: String, s: TensorSpec, d: TensorSpec) -> Case {
    let narrowing = narrowing(src, d.dtype);
    case(
        "convert",
        src,
        label,
        vec![s, d],
        Tolerance::EXACT,
        |exec, t| exec.convert(&t[0], &t[1]),
        move |d| Ok(vec![reference::convert(&d[0], narrowing)?]),
    )
}

/// From integer dtype `src` to a narrower integer `dst`: `dst`'s bits and
/// whether it is signed (the conversion keeps the low bits).
fn narrowing(src: DType, dst: DType) -> Option<(u32, bool)> {
    let int = |d: DType| match d {
        DType::I32 => Some((32, true)),
        DType::I64 => Some((64, true)),
        DType::U8 => Some((8, false)),
        _ => None,
    };
    let ((from, _), (to, signed)) = (int(src)?, int(dst)?);
    (to < from).then_some((to, signed))
}

/// i64s a double cannot hold, converted to each floating dtype (one
/// rounding: through f64 first, `2^60 + 2^36 + 1` lands on f32's tie and
/// goes to the even neighbour below, where the right answer is above),
/// and to i64 itself (bit for bit). Strided, so that no derived case
/// rewrites the values under the exact bits.
fn convert_i64_exact() -> Vec<Case> {
    let exact: Vec<i64> = vec![
        (1 << 60) + (1 << 36) + 1,
        -(1 << 60) - (1 << 36) - 1,
        (1 << 60) + (1 << 52) + 1,
        (1 << 53) + 1,
        i64::MAX,
        i64::MIN,
        (1 << 62) + (1 << 38) + 1,
    ];
    let n = exact.len();
    let near: Vec<f64> = exact.iter().map(|&x| i64_as_f64_odd(x)).collect();
    let mut cases = Vec::new();
    for dst in [DType::F32, DType::F16, DType::BF16, DType::F64, DType::I64] {
        let mut s = input("src", DType::I64, &[n], vec![0.0; n], Layout::Strided);
        s.values = exact.iter().map(|&x| x as f64).collect();
        s.exact_bits = Some(exact.clone());
        let mut d = output("dst", dst, &[n], Layout::Contiguous);
        if dst == DType::I64 {
            d.exact_bits = Some(exact.clone());
        }
        // The judge reads an f64 or i64 output back as the nearest f64.
        let want = if matches!(dst, DType::F64 | DType::I64) {
            exact.iter().map(|&x| x as f64).collect()
        } else {
            near.clone()
        };
        cases.push(case(
            "convert",
            DType::I64,
            format!("to {dst} [{n}] strided: i64s past 2^53, rounded once"),
            vec![s, d],
            Tolerance::EXACT,
            |exec, t| exec.convert(&t[0], &t[1]),
            move |_| Ok(vec![reference::Dense::new(&[n], want.clone())]),
        ));
    }
    cases
}

/// `arange`'s cases: short and empty ranges, a strided output, steps that
/// are not powers of two over long ranges (where a running sum drifts),
/// fractional values (truncated in integer dtypes), and values past the
/// dtype's range (saturated; infinite in f16).
fn arange(dtype: DType) -> Vec<Case> {
    let top = match dtype {
        DType::I32 => 2_147_483_600.0,
        DType::U8 => 250.0,
        DType::F16 => 65_000.0,
        DType::I64 => 9_007_199_254_740_000.0,
        _ => 1e30,
    };
    let ranges: [(usize, Layout, f64, f64, &str); 9] = [
        (0, Layout::Contiguous, 0.0, 1.0, "empty"),
        (1, Layout::Contiguous, 5.0, 1.0, "one value"),
        (16, Layout::Contiguous, 0.0, 1.0, "positions"),
        (
            13,
            Layout::Strided,
            -3.0,
            0.5,
            "halves, strided: truncated in integer dtypes",
        ),
        (
            1000,
            Layout::Contiguous,
            0.0,
            0.1,
            "long ranges with a step that is not a power of two",
        ),
        (
            300,
            Layout::Contiguous,
            1e4,
            -123.25,
            "long ranges with a step that is not a power of two, downwards",
        ),
        (64, Layout::Contiguous, 0.0, 2.0, "even numbers"),
        (40, Layout::Contiguous, top, 3.0, "past the dtype's range"),
        (
            10,
            Layout::Contiguous,
            -2.0,
            -7.5,
            "negative values (saturated at 0 in u8)",
        ),
    ];
    ranges
        .into_iter()
        .map(|(n, layout, start, step, what)| {
            case(
                "arange",
                dtype,
                format!("[{n}] {layout} from {start} by {step}: {what}"),
                vec![output("out", dtype, &[n], layout)],
                Tolerance::EXACT,
                move |exec, t| exec.arange(&t[0], start, step),
                move |_| Ok(vec![reference::arange(n, start, step)?]),
            )
        })
        .collect()
}

/// `a OP b` on integers of `dtype` as the ABI defines it: wrapping in
/// two's complement, `alpha` converted to the dtype (wrapping).
fn wrap_int(op: BinaryOp, dtype: DType, x: i64, y: i64, alpha: i64) -> i64 {
    let r = match op {
        BinaryOp::Add => x.wrapping_add(alpha.wrapping_mul(y)),
        BinaryOp::Sub => x.wrapping_sub(alpha.wrapping_mul(y)),
        _ => x.wrapping_mul(y),
    };
    if dtype == DType::I32 {
        i64::from(r as i32)
    } else {
        r
    }
}

/// The integer `add`, `sub` and `mul` of ABI 1.3: the float cases'
/// shapes (broadcasts, 0-d, empty, strided and transposed) on small
/// integers, then wrapping past the ends of the range with the exact
/// results (bits too, for i64), a large `alpha`, and a fractional `alpha`
/// the host must refuse.
pub(super) fn binary_int(op: BinaryOp, dtype: DType) -> Vec<Case> {
    let name = op.name();
    let mut rng = Rng::for_case(name, dtype);
    let uses_alpha = matches!(op, BinaryOp::Add | BinaryOp::Sub);
    let alpha = if uses_alpha { 3.0 } else { 1.0 };
    let pairs = BINARY_SHAPES;
    let mut cases = Vec::new();
    for (a_shape, b_shape, layout) in pairs {
        let out_shape = reference::broadcast_shapes(a_shape, b_shape).expect("they broadcast");
        let a = any_values(&mut rng, dtype, numel(a_shape));
        let b = any_values(&mut rng, dtype, numel(b_shape));
        let label = format!(
            "{} {}",
            shape_label(a_shape, layout),
            shape_label(b_shape, Layout::Contiguous)
        );
        cases.push(case(
            name,
            dtype,
            label,
            vec![
                input("a", dtype, a_shape, a, layout),
                input("b", dtype, b_shape, b, Layout::Contiguous),
                output("out", dtype, &out_shape, Layout::Contiguous),
            ],
            Tolerance::EXACT,
            move |exec, t| exec.binary(op, &t[0], &t[1], &t[2], alpha),
            move |d| {
                // Small integers: f64 arithmetic is exact here.
                Ok(vec![match op {
                    BinaryOp::Add => reference::add(&d[0], &d[1], alpha)?,
                    BinaryOp::Sub => reference::sub(&d[0], &d[1], alpha)?,
                    _ => reference::mul(&d[0], &d[1], alpha)?,
                }])
            },
        ));
    }
    // Wrapping: every pair of values at and near the ends of the range,
    // with alpha 1 (and a large alpha for add and sub).
    let (lo, hi) = if dtype == DType::I32 {
        (i64::from(i32::MIN), i64::from(i32::MAX))
    } else {
        (i64::MIN, i64::MAX)
    };
    let values = [lo, hi, lo + 1, hi - 1, -1, 0, 1, 2, hi / 2 + 1, 65_537];
    let mut alphas = vec![1.0];
    if uses_alpha {
        alphas.push(if dtype == DType::I32 {
            3e9
        } else {
            2f64.powi(40) + 1.0
        });
    }
    for alpha in alphas {
        let n = values.len();
        let a: Vec<i64> = (0..n * n).map(|i| values[i / n]).collect();
        let b: Vec<i64> = (0..n * n).map(|i| values[i % n]).collect();
        let al = alpha as i64;
        let want: Vec<i64> = a
            .iter()
            .zip(&b)
            .map(|(&x, &y)| wrap_int(op, dtype, x, y, al))
            .collect();
        let ta = integer_input("a", dtype, a, Layout::Strided);
        let tb = integer_input("b", dtype, b, Layout::Contiguous);
        let mut to = output("out", dtype, &[n * n], Layout::Contiguous);
        if dtype == DType::I64 {
            to.exact_bits = Some(want.clone());
        }
        let want: Vec<f64> = want.iter().map(|&x| x as f64).collect();
        let m = n * n;
        cases.push(case(
            name,
            dtype,
            format!("[{m}] strided, alpha {alpha}: wrapping past the ends of the range"),
            vec![ta, tb, to],
            Tolerance::EXACT,
            move |exec, t| exec.binary(op, &t[0], &t[1], &t[2], alpha),
            move |_| Ok(vec![reference::Dense::new(&[m], want.clone())]),
        ));
    }
    if uses_alpha {
        cases.push(case(
            name,
            dtype,
            "[4] alpha 0.5 on integers: must be refused",
            vec![
                input(
                    "a",
                    dtype,
                    &[4],
                    vec![1.0, 2.0, 3.0, 4.0],
                    Layout::Contiguous,
                ),
                input("b", dtype, &[4], vec![1.0; 4], Layout::Contiguous),
                output("out", dtype, &[4], Layout::Contiguous),
            ],
            Tolerance::EXACT,
            move |exec, t| exec.binary(op, &t[0], &t[1], &t[2], 0.5),
            move |_| {
                Err(reference::RefError::new(
                    op.name(),
                    "alpha 0.5 is not an integer",
                ))
            },
        ));
    }
    cases
}
