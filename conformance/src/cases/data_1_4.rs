//! Cases of the operators ABI 1.4 added: `gather` and `scatter_add`
//! (indices at 0 and at the last element, repeated indices accumulating,
//! index extents below the data's, out-of-range indices refused), `cumsum`
//! (long rows, NaN and infinities, -0, integer wrapping), `any` and `all`
//! (NaN and -0, empty dimensions) and the bitwise operators. Zero-stride
//! indices (PyTorch's `index_select` and `index_add` as a gather or a
//! scatter) come from the derived cases (`variants.rs`).

use polychip_host::{BitwiseOp, DType, Op, ReduceBoolOp};

use super::basic::any_values;
use super::data_1_3::binary_shape_operands;
use super::{Rng, case, every_pair, inout, input, numel, output, shape_label, specials};
use crate::case::{Case, Layout, TensorSpec};
use crate::reference::{self, Dense};
use crate::tolerance::Tolerance;

/// The case generator of each operator of ABI 1.4.
pub(super) fn cases(op: Op) -> Option<fn(DType) -> Vec<Case>> {
    Some(match op {
        Op::Gather => gather,
        Op::ScatterAdd => scatter_add,
        Op::Cumsum => cumsum,
        Op::Any => |d| reduce_bool(ReduceBoolOp::Any, d),
        Op::All => |d| reduce_bool(ReduceBoolOp::All, d),
        Op::BitwiseAnd => |d| bitwise(BitwiseOp::BitwiseAnd, d),
        Op::BitwiseOr => |d| bitwise(BitwiseOp::BitwiseOr, d),
        Op::BitwiseXor => |d| bitwise(BitwiseOp::BitwiseXor, d),
        _ => return None,
    })
}

/// One indexing plan: the data's shape and layout, the dimension, the
/// index's shape, dtype and values, and a label.
struct Plan {
    label: String,
    data: Vec<usize>,
    layout: Layout,
    dim: usize,
    index: Vec<usize>,
    idx_dtype: DType,
    idx: Vec<i64>,
}

/// Indices into `n` places, `count` of them: 0 and `n - 1` first, then
/// random ones.
fn indices(rng: &mut Rng, n: usize, count: usize) -> Vec<i64> {
    (0..count)
        .map(|k| match k {
            0 => 0,
            1 => n as i64 - 1,
            _ => rng.below(n) as i64,
        })
        .collect()
}

/// The plans `gather` and `scatter_add` share.
fn plans(rng: &mut Rng) -> Vec<Plan> {
    let mut plans = Vec::new();
    let mut plan = |label: &str,
                    data: &[usize],
                    layout: Layout,
                    dim: usize,
                    index: &[usize],
                    idx_dtype: DType,
                    idx: Vec<i64>| {
        assert_eq!(idx.len(), numel(index));
        plans.push(Plan {
            label: format!(
                "{label}: data {} dim {dim} index {} {idx_dtype}",
                shape_label(data, layout),
                shape_label(index, Layout::Contiguous)
            ),
            data: data.to_vec(),
            layout,
            dim,
            index: index.to_vec(),
            idx_dtype,
            idx,
        });
    };
    let r = indices(rng, 5, 15);
    plan(
        "rows",
        &[5, 4],
        Layout::Contiguous,
        0,
        &[5, 3],
        DType::I64,
        r,
    );
    let r = indices(rng, 6, 8);
    plan(
        "columns",
        &[4, 6],
        Layout::Contiguous,
        1,
        &[2, 4],
        DType::I32,
        r,
    );
    // More indices along dim than the data has there, fewer elsewhere.
    let r = indices(rng, 4, 2 * 3 * 7);
    plan(
        "longer along dim",
        &[2, 5, 4],
        Layout::Contiguous,
        2,
        &[2, 3, 7],
        DType::I64,
        r,
    );
    let r = indices(rng, 3, 2 * 3 * 4);
    plan(
        "middle dim",
        &[2, 3, 4],
        Layout::Contiguous,
        1,
        &[2, 3, 4],
        DType::I32,
        r,
    );
    let r = indices(rng, 7, 5 * 7);
    plan(
        "transposed data",
        &[7, 5],
        Layout::Transposed,
        0,
        &[7, 5],
        DType::I64,
        r,
    );
    let r = indices(rng, 9, 3 * 4);
    plan(
        "strided data",
        &[3, 9],
        Layout::Strided,
        1,
        &[3, 4],
        DType::I64,
        r,
    );
    let r = indices(rng, 1, 6);
    plan(
        "one place",
        &[1, 6],
        Layout::Contiguous,
        0,
        &[1, 6],
        DType::I32,
        r,
    );
    plan(
        "empty index",
        &[3, 4],
        Layout::Contiguous,
        0,
        &[0, 4],
        DType::I64,
        vec![],
    );
    plan(
        "empty data",
        &[3, 0],
        Layout::Contiguous,
        0,
        &[2, 0],
        DType::I64,
        vec![],
    );
    let r = indices(rng, 300, 1100);
    plan(
        "1-D long",
        &[300],
        Layout::Contiguous,
        0,
        &[1100],
        DType::I32,
        r,
    );
    // Refused: one bad index among good ones, at each end of the range and
    // at the extremes of its dtype; and after 1,100 good ones (past a
    // device-side check's first work-group).
    for (idx_dtype, bad) in [
        (DType::I64, 5),
        (DType::I32, -1),
        (DType::I64, i64::MIN),
        (DType::I64, (1 << 32) + 1),
        (DType::I32, i64::from(i32::MAX)),
    ] {
        plan(
            &format!("index {bad} out of range"),
            &[5, 3],
            Layout::Contiguous,
            0,
            &[2, 3],
            idx_dtype,
            vec![0, 4, bad, 2, 1, 3],
        );
    }
    let mut long: Vec<i64> = (0..1100).map(|i| (i * 7) % 300).collect();
    long.push(300);
    plan(
        "index 300 out of range after 1100 in range",
        &[300],
        Layout::Contiguous,
        0,
        &[1101],
        DType::I64,
        long,
    );
    plans
}

/// An index tensor of `plan`'s (i64s carried exactly: the extremes are
/// not doubles).
fn index_tensor(p: &Plan) -> TensorSpec {
    let mut t = input(
        "index",
        p.idx_dtype,
        &p.index,
        p.idx.iter().map(|&i| i as f64).collect(),
        Layout::Contiguous,
    );
    if p.idx_dtype == DType::I64 {
        t.exact_bits = Some(p.idx.clone());
    }
    t
}

fn gather(dtype: DType) -> Vec<Case> {
    let mut rng = Rng::for_case("gather", dtype);
    let mut cases = Vec::new();
    for p in plans(&mut rng) {
        let data = any_values(&mut rng, dtype, numel(&p.data));
        cases.push(gather_case(
            dtype,
            &p,
            input("input", dtype, &p.data, data, p.layout),
        ));
    }
    // NaN, infinities, -0 and subnormals moved bit for bit.
    if dtype.is_float() {
        let s = specials(dtype);
        let n = s.len();
        let p = Plan {
            label: "special values moved unchanged".into(),
            data: vec![n],
            layout: Layout::Strided,
            dim: 0,
            index: vec![2 * n],
            idx_dtype: DType::I64,
            idx: (0..2 * n as i64).map(|i| (i * 5) % n as i64).collect(),
        };
        cases.push(gather_case(
            dtype,
            &p,
            input("input", dtype, &[n], s, Layout::Strided),
        ));
    }
    cases
}

fn gather_case(dtype: DType, p: &Plan, data: TensorSpec) -> Case {
    gather_call(dtype, p.label.clone(), p.dim, data, index_tensor(p))
}

/// `gather` of `data` by `index` along `dim` into a compact `out`.
pub(super) fn gather_call(
    dtype: DType,
    label: String,
    dim: usize,
    data: TensorSpec,
    index: TensorSpec,
) -> Case {
    let out = output("out", dtype, &index.shape, Layout::Contiguous);
    case(
        "gather",
        dtype,
        label,
        vec![data, index, out],
        Tolerance::EXACT,
        move |exec, t| exec.gather(&t[0], &t[1], &t[2], dim as i32),
        move |d| Ok(vec![reference::gather(&d[0], &d[1], dim)?]),
    )
}

/// The largest number of times one index repeats.
fn max_repeats(idx: &[i64]) -> usize {
    let mut counts = std::collections::HashMap::new();
    for &i in idx {
        *counts.entry(i).or_insert(0usize) += 1;
    }
    counts.into_values().max().unwrap_or(0)
}

fn scatter_add(dtype: DType) -> Vec<Case> {
    let mut rng = Rng::for_case("scatter_add", dtype);
    let mut cases = Vec::new();
    let values = |rng: &mut Rng, n: usize| {
        if dtype.is_float() {
            rng.values(dtype, n, -1.0, 1.0)
        } else {
            (0..n).map(|_| rng.below(2001) as f64 - 1000.0).collect()
        }
    };
    for p in plans(&mut rng) {
        let dst = values(&mut rng, numel(&p.data));
        let src = values(&mut rng, numel(&p.index));
        // The updates of one element in at least f32, rounded once.
        let tol = Tolerance::accumulated(0.0, max_repeats(&p.idx) + 1);
        cases.push(scatter_add_case(
            dtype,
            &p,
            [
                inout("dst", dtype, &p.data, dst, p.layout),
                index_tensor(&p),
                input("src", dtype, &p.index, src, Layout::Strided),
            ],
            tol,
        ));
    }
    // Eight updates of half an ULP of 1 into one element holding 1: rounded
    // per update in f16 or bf16 each is a tie that rounds back to 1; added
    // in f32 and rounded once they make 1 + 8 half-ULPs.
    let half_ulp = match dtype {
        DType::F16 => 2f64.powi(-11),
        DType::BF16 => 2f64.powi(-8),
        DType::F32 => 2f64.powi(-24),
        DType::F64 => 2f64.powi(-53),
        _ => 1.0,
    };
    let p = Plan {
        label: "eight half-ULP updates into one element: no rounding per update".into(),
        data: vec![3],
        layout: Layout::Contiguous,
        dim: 0,
        index: vec![8],
        idx_dtype: DType::I64,
        idx: vec![1; 8],
    };
    let tol = if dtype.is_float() {
        Tolerance::accumulated(0.0, 9)
    } else {
        Tolerance::EXACT
    };
    cases.push(scatter_add_case(
        dtype,
        &p,
        [
            inout("dst", dtype, &[3], vec![2.0, 1.0, 4.0], Layout::Contiguous),
            index_tensor(&p),
            input("src", dtype, &[8], vec![half_ulp; 8], Layout::Contiguous),
        ],
        tol,
    ));
    cases
}

fn scatter_add_case(dtype: DType, p: &Plan, tensors: [TensorSpec; 3], tol: Tolerance) -> Case {
    scatter_add_call(dtype, p.label.clone(), p.dim, tensors, tol)
}

/// `scatter_add` into `dst` (the first of `tensors`, then `index` and
/// `src`) along `dim`.
pub(super) fn scatter_add_call(
    dtype: DType,
    label: String,
    dim: usize,
    tensors: [TensorSpec; 3],
    tol: Tolerance,
) -> Case {
    case(
        "scatter_add",
        dtype,
        label,
        tensors.into(),
        tol,
        move |exec, t| exec.scatter_add(&t[0], &t[1], &t[2], dim as i32),
        move |d| Ok(vec![reference::scatter_add(&d[0], &d[1], &d[2], dim)?]),
    )
}

fn cumsum(dtype: DType) -> Vec<Case> {
    let mut rng = Rng::for_case("cumsum", dtype);
    let mut cases = Vec::new();
    let shapes: [(&[usize], usize, Layout); 7] = [
        (&[3, 7], 1, Layout::Contiguous),
        (&[6, 4], 0, Layout::Contiguous),
        (&[2, 5, 3], 1, Layout::Contiguous),
        (&[9, 6], 1, Layout::Transposed),
        (&[4, 8], 1, Layout::Strided),
        (&[3, 0], 1, Layout::Contiguous),
        (&[1], 0, Layout::Contiguous),
    ];
    for (shape, dim, layout) in shapes {
        let x = if dtype.is_float() {
            rng.values(dtype, numel(shape), -2.0, 2.0)
        } else {
            (0..numel(shape))
                .map(|_| rng.below(201) as f64 - 100.0)
                .collect()
        };
        let n = shape[dim];
        cases.push(cumsum_case(
            dtype,
            format!("{} dim {dim}", shape_label(shape, layout)),
            input("input", dtype, shape, x, layout),
            dim,
            Tolerance::accumulated(0.0, n),
        ));
    }
    if dtype.is_float() {
        // A long row of small terms: a running sum kept in f16 or bf16
        // stops growing once the sum's half-ULP exceeds a term.
        let n = 4096;
        let x = rng.values(dtype, n, 0.05, 0.15);
        cases.push(cumsum_case(
            dtype,
            format!("[{n}] of small positive terms: the running sum kept in at least f32"),
            input("input", dtype, &[n], x, Layout::Contiguous),
            0,
            Tolerance::accumulated(0.0, n),
        ));
        // Infinities and NaN from their position on; -0 terms: the running
        // sum starts at +0, so a row of -0 sums to +0 (PyTorch's).
        let x = vec![
            1.0,
            f64::INFINITY,
            2.0,
            f64::NEG_INFINITY,
            3.0,
            -0.0,
            -0.0,
            1.0,
        ];
        cases.push(cumsum_case(
            dtype,
            "[2, 4]: infinity, infinity minus infinity, -0 terms".into(),
            input("input", dtype, &[2, 4], x, Layout::Contiguous),
            1,
            Tolerance::accumulated(0.0, 4),
        ));
    } else {
        cases.push(cumsum_wraps(dtype));
    }
    cases
}

/// Integer running sums past the end of the range wrap in two's complement
/// (exact bits: the reference's doubles would saturate).
fn cumsum_wraps(dtype: DType) -> Case {
    let (x, want): (Vec<i64>, Vec<i64>) = if dtype == DType::I32 {
        let max = i64::from(i32::MAX);
        (
            vec![max, 1, -1, i64::from(i32::MIN), -7],
            vec![max, i64::from(i32::MIN), max, -1, -8],
        )
    } else {
        let big = 1i64 << 53;
        (
            vec![i64::MAX, 1, big + 1, -1, i64::MIN],
            vec![i64::MAX, i64::MIN, i64::MIN + big + 1, i64::MIN + big, big],
        )
    };
    let n = x.len();
    let mut t = input(
        "input",
        dtype,
        &[n],
        x.iter().map(|&v| v as f64).collect(),
        Layout::Strided,
    );
    let mut out = output("out", dtype, &[n], Layout::Contiguous);
    if dtype == DType::I64 {
        // The i32 values are doubles; the i64s past 2^53 need their bits.
        t.exact_bits = Some(x);
        out.exact_bits = Some(want.clone());
    }
    case(
        "cumsum",
        dtype,
        format!("[{n}] strided: running sums past the ends of the range wrap"),
        vec![t, out],
        Tolerance::EXACT,
        move |exec, t| exec.cumsum(&t[0], &t[1], 0),
        move |_| {
            Ok(vec![Dense::new(
                &[n],
                want.iter().map(|&v| v as f64).collect(),
            )])
        },
    )
}

pub(super) fn cumsum_case(
    dtype: DType,
    label: String,
    x: TensorSpec,
    dim: usize,
    tol: Tolerance,
) -> Case {
    let shape = x.shape.clone();
    case(
        "cumsum",
        dtype,
        label,
        vec![x, output("out", dtype, &shape, Layout::Contiguous)],
        tol,
        move |exec, t| exec.cumsum(&t[0], &t[1], dim as i32),
        move |d| Ok(vec![reference::cumsum(&d[0], dim)?]),
    )
}

fn reduce_bool(op: ReduceBoolOp, dtype: DType) -> Vec<Case> {
    let name = op.name();
    let mut rng = Rng::for_case(name, dtype);
    let mut cases = Vec::new();
    // Mostly zeros (any) or mostly ones (all), so that both answers occur.
    let every = op == ReduceBoolOp::All;
    let draw = |rng: &mut Rng, n: usize| -> Vec<f64> {
        (0..n)
            .map(|_| {
                let rare = rng.below(4) == 0;
                let v = if rare != every { 1.0 } else { 0.0 };
                if v != 0.0 && dtype.is_float() {
                    rng.uniform(-3.0, 3.0)
                } else {
                    v
                }
            })
            .collect()
    };
    let shapes: [(&[usize], usize, bool, Layout); 8] = [
        (&[4, 5], 1, false, Layout::Contiguous),
        (&[4, 5], 0, true, Layout::Contiguous),
        (&[2, 3, 4], 1, true, Layout::Contiguous),
        (&[6, 7], 1, false, Layout::Transposed),
        (&[3, 8], 1, false, Layout::Strided),
        (&[4, 0], 1, false, Layout::Contiguous),
        (&[0, 3], 1, true, Layout::Contiguous),
        (&[5], 0, false, Layout::Contiguous),
    ];
    for (shape, dim, keepdim, layout) in shapes {
        let x = draw(&mut rng, numel(shape));
        cases.push(reduce_bool_case(
            op,
            dtype,
            shape,
            x,
            layout,
            dim,
            keepdim,
            String::new(),
        ));
    }
    // One element that decides the row, at its end after 1,100 that do not.
    let mut x = vec![if every { 1.0 } else { 0.0 }; 1101];
    x[1100] = if every { 0.0 } else { 1.0 };
    cases.push(reduce_bool_case(
        op,
        dtype,
        &[1, 1101],
        x,
        Layout::Contiguous,
        1,
        false,
        " the deciding element last".into(),
    ));
    if dtype.is_float() {
        // NaN is nonzero, -0 is zero, the smallest subnormal nonzero.
        let s = specials(dtype);
        let (a, b) = every_pair(&s);
        let n = s.len();
        let rows: Vec<f64> = a.iter().zip(&b).flat_map(|(&x, &y)| [x, y]).collect();
        cases.push(reduce_bool_case(
            op,
            dtype,
            &[n * n, 2],
            rows,
            Layout::Contiguous,
            1,
            false,
            " every pair of special values".into(),
        ));
    }
    cases
}

#[allow(clippy::too_many_arguments)]
pub(super) fn reduce_bool_case(
    op: ReduceBoolOp,
    dtype: DType,
    shape: &[usize],
    x: Vec<f64>,
    layout: Layout,
    dim: usize,
    keepdim: bool,
    what: String,
) -> Case {
    let mut out_shape = shape.to_vec();
    if keepdim {
        out_shape[dim] = 1;
    } else {
        out_shape.remove(dim);
    }
    let every = op == ReduceBoolOp::All;
    case(
        op.name(),
        dtype,
        format!(
            "{} dim {dim} keepdim {keepdim}{what}",
            shape_label(shape, layout)
        ),
        vec![
            input("input", dtype, shape, x, layout),
            output("out", DType::Bool, &out_shape, Layout::Contiguous),
        ],
        Tolerance::EXACT,
        move |exec, t| exec.reduce_bool(op, &t[0], &t[1], dim as i32, keepdim),
        move |d| Ok(vec![reference::reduce_bool(&d[0], dim, keepdim, every)?]),
    )
}

fn bitwise(op: BitwiseOp, dtype: DType) -> Vec<Case> {
    let name = op.name();
    let mut rng = Rng::for_case(name, dtype);
    let mut cases = Vec::new();
    let draw = |rng: &mut Rng, n: usize| -> Vec<f64> {
        (0..n)
            .map(|_| match dtype {
                DType::Bool => rng.below(2) as f64,
                DType::U8 => rng.below(256) as f64,
                _ => rng.below(1 << 20) as f64 - (1 << 19) as f64,
            })
            .collect()
    };
    for (label, tensors) in binary_shape_operands(&mut rng, dtype, dtype, draw) {
        cases.push(bitwise_case(op, dtype, label, tensors));
    }
    // Every pair of the dtype's extremes: the sign bit, all ones, 0.
    let ends: Vec<i64> = match dtype {
        DType::I32 => vec![
            i64::from(i32::MIN),
            i64::from(i32::MAX),
            -1,
            0,
            1,
            0x5555_5555,
        ],
        DType::I64 => vec![
            i64::MIN,
            i64::MAX,
            -1,
            0,
            (1 << 53) + 1,
            0x5555_5555_5555_5555,
        ],
        DType::U8 => vec![0, 255, 128, 127, 0x55, 1],
        _ => vec![0, 1],
    };
    let (a, b) = every_pair(&ends.iter().map(|&v| v as f64).collect::<Vec<_>>());
    let (ai, bi): (Vec<i64>, Vec<i64>) = (
        a.iter().map(|&v| v as i64).collect(),
        b.iter().map(|&v| v as i64).collect(),
    );
    let n = a.len();
    let f: fn(i64, i64) -> i64 = match op {
        BitwiseOp::BitwiseAnd => |x, y| x & y,
        BitwiseOp::BitwiseOr => |x, y| x | y,
        BitwiseOp::BitwiseXor => |x, y| x ^ y,
    };
    // Exact bits: i64s past 2^53 are not doubles. The pairs are rebuilt
    // from the list, not from the doubles.
    let (ai, bi) = if dtype == DType::I64 {
        let k = ends.len();
        (
            (0..n).map(|i| ends[i / k]).collect::<Vec<_>>(),
            (0..n).map(|i| ends[i % k]).collect::<Vec<_>>(),
        )
    } else {
        (ai, bi)
    };
    let want: Vec<i64> = ai.iter().zip(&bi).map(|(&x, &y)| f(x, y)).collect();
    let mut ta = input("a", dtype, &[n], a, Layout::Strided);
    let mut tb = input("b", dtype, &[n], b, Layout::Contiguous);
    let mut out = output("out", dtype, &[n], Layout::Contiguous);
    if dtype == DType::I64 {
        ta.exact_bits = Some(ai);
        tb.exact_bits = Some(bi);
        out.exact_bits = Some(want.clone());
    }
    cases.push(case(
        name,
        dtype,
        format!("[{n}] strided: every pair of the dtype's extremes"),
        vec![ta, tb, out],
        Tolerance::EXACT,
        move |exec, t| exec.bitwise(op, &t[0], &t[1], &t[2]),
        move |_| {
            Ok(vec![Dense::new(
                &[n],
                want.iter().map(|&v| v as f64).collect(),
            )])
        },
    ));
    cases
}

fn bitwise_case(op: BitwiseOp, dtype: DType, label: String, tensors: [TensorSpec; 3]) -> Case {
    case(
        op.name(),
        dtype,
        label,
        tensors.into(),
        Tolerance::EXACT,
        move |exec, t| exec.bitwise(op, &t[0], &t[1], &t[2]),
        move |d| Ok(vec![reference::bitwise(op.name(), &d[0], &d[1])?]),
    )
}
