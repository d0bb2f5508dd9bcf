//! Cases at the sizes real models run: vocabulary rows of 32K to 152K
//! classes, activations of millions of elements, reductions over a million
//! terms, matmuls with a long inner dimension and edges that are not tile
//! multiples, embedding tables with more than 65,536 rows. Bugs that only
//! show above a threshold (a second code path, a tile boundary, an index
//! that overflows 16 bits, an accumulator too narrow for a long sum) need
//! them.
//!
//! Each size is a point of a family `build(dtype, params)`, so a failing
//! case can be shrunk along its parameters (`crate::shrink`) to the
//! smallest size that still fails. The default tier runs with every
//! `polychip conform`; the full tier (`--full`) adds larger sizes for a
//! vendor's nightly run.

use polychip_host::{
    ActivationBackwardOp, BinaryOp, DType, MatmulOptions, OutputBackwardOp, ReduceOp, UnaryOp,
};

use super::{Rng, case, input, numel, output};
use crate::case::{Case, Layout, Resize};
use crate::reference::{self, Indices};
use crate::tolerance::{Bias, Tolerance};

/// Which sizes run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Tier {
    /// Small cases and the realistic sizes (every run).
    #[default]
    Default,
    /// Also the largest sizes (`--full`).
    Full,
}

/// Builds a family's case for `(dtype, params)`.
type Build = fn(DType, &[usize]) -> Case;

/// A family of cases of one operator, by size.
struct Family {
    op: &'static str,
    build: Build,
    /// Parameters of the default tier's cases.
    default: &'static [&'static [usize]],
    /// Parameters added by the full tier.
    full: &'static [&'static [usize]],
}

const C: Layout = Layout::Contiguous;

macro_rules! unary_family {
    ($op:expr, $name:literal) => {
        Family {
            op: $name,
            build: |d, p| unary(d, p, $op),
            // 1025 rows: a split of the work over 2 to 8 threads (or
            // lanes) that drops its remainder shows.
            default: &[&[1025, 2048]],
            full: &[&[4096, 4096]],
        }
    };
}

macro_rules! binary_family {
    ($op:expr, $name:literal) => {
        Family {
            op: $name,
            build: |d, p| binary(d, p, $op),
            default: &[&[1024, 2048]],
            full: &[&[4096, 4096]],
        }
    };
}

macro_rules! reduce_family {
    ($op:expr, $name:literal) => {
        Family {
            op: $name,
            build: |d, p| reduce(d, p, $op),
            default: &[&[4, 262_144], &[16_384, 64]],
            full: &[&[16, 1 << 20]],
        }
    };
}

const FAMILIES: &[Family] = &[
    Family {
        op: "fill",
        build: fill,
        // 2^21 + 7 elements: not a multiple of any thread count to 8.
        default: &[&[(1 << 21) + 7]],
        full: &[&[1 << 24]],
    },
    Family {
        op: "copy",
        build: copy,
        default: &[&[1024, 2048]],
        full: &[&[4096, 4096]],
    },
    Family {
        op: "cast",
        build: cast,
        default: &[&[(1 << 21) + 7]],
        full: &[&[1 << 24]],
    },
    binary_family!(BinaryOp::Add, "add"),
    binary_family!(BinaryOp::Sub, "sub"),
    binary_family!(BinaryOp::Mul, "mul"),
    binary_family!(BinaryOp::Div, "div"),
    Family {
        op: "matmul",
        build: matmul,
        // [M, K, N]: a long inner dimension; edges past 256 that are not
        // multiples of a tile.
        default: &[&[16, 11_008, 64], &[300, 257, 260]],
        full: &[&[512, 4096, 512], &[1031, 1033, 67]],
    },
    Family {
        op: "softmax",
        build: |d, p| rows(d, p, "softmax"),
        // [rows, classes]: vocabulary rows.
        default: &[&[4, 152_064], &[8, 32_000]],
        full: &[&[32, 152_064]],
    },
    unary_family!(UnaryOp::Neg, "neg"),
    unary_family!(UnaryOp::Exp, "exp"),
    unary_family!(UnaryOp::Log, "log"),
    unary_family!(UnaryOp::Sqrt, "sqrt"),
    unary_family!(UnaryOp::Rsqrt, "rsqrt"),
    unary_family!(UnaryOp::Tanh, "tanh"),
    unary_family!(UnaryOp::Relu, "relu"),
    unary_family!(UnaryOp::Silu, "silu"),
    unary_family!(UnaryOp::Gelu, "gelu"),
    Family {
        op: "silu_backward",
        build: |d, p| activation_backward(d, p, ActivationBackwardOp::SiluBackward),
        default: &[&[1024, 2048]],
        full: &[&[4096, 4096]],
    },
    Family {
        op: "gelu_backward",
        build: |d, p| activation_backward(d, p, ActivationBackwardOp::GeluBackward),
        default: &[&[1024, 2048]],
        full: &[&[4096, 4096]],
    },
    reduce_family!(ReduceOp::Sum, "sum"),
    reduce_family!(ReduceOp::Mean, "mean"),
    reduce_family!(ReduceOp::Max, "max"),
    reduce_family!(ReduceOp::Argmax, "argmax"),
    Family {
        op: "sum_squares",
        build: sum_squares,
        // Just past 2^16, where kernels start splitting the work.
        default: &[&[(1 << 21) + 7], &[65_537]],
        full: &[&[1 << 24]],
    },
    Family {
        op: "linear",
        build: linear,
        // [rows, in, out]: a long inner dimension; a token count past 256
        // that is not a multiple of a row tile.
        default: &[&[16, 4096, 300], &[300, 256, 64]],
        full: &[&[256, 4096, 1024]],
    },
    Family {
        op: "log_softmax",
        build: |d, p| rows(d, p, "log_softmax"),
        default: &[&[4, 152_064], &[8, 32_000]],
        full: &[&[32, 152_064]],
    },
    Family {
        op: "rms_norm",
        build: rms_norm,
        // [rows, hidden].
        default: &[&[64, 8192]],
        full: &[&[512, 16_384]],
    },
    Family {
        op: "layer_norm",
        build: layer_norm,
        default: &[&[64, 8192]],
        full: &[&[512, 16_384]],
    },
    Family {
        op: "attention",
        build: attention,
        // [batch, heads, kv heads, queries, keys, head_dim, causal]; a
        // causal prefix of keys (more keys than queries) over several
        // query blocks.
        default: &[&[1, 2, 2, 512, 512, 64, 1], &[1, 1, 1, 128, 384, 16, 1]],
        full: &[&[1, 8, 8, 2048, 2048, 128, 1]],
    },
    Family {
        op: "attention_backward",
        build: attention_backward,
        // [batch, heads, kv heads, queries, keys, head_dim, causal]: a head
        // dim of 128 and a sequence past 256 that is not a multiple of a key
        // tile; and the shapes a kernel that splits the keys across threads
        // must map back: a causal prefix of keys over several query blocks,
        // grouped heads over two batches, grouped heads of two kv heads.
        default: &[
            &[1, 1, 1, 300, 300, 128, 1],
            &[1, 1, 1, 128, 384, 16, 1],
            &[2, 4, 1, 64, 300, 16, 0],
            &[1, 4, 2, 64, 300, 16, 1],
        ],
        full: &[&[1, 4, 4, 1031, 1031, 128, 1]],
    },
    Family {
        op: "rope",
        build: |d, p| rope(d, p, false),
        // [seq, heads, head_dim]: a head dim of 128, half-split pairs.
        default: &[&[256, 4, 128]],
        full: &[&[2048, 8, 128]],
    },
    Family {
        op: "rope_backward",
        build: |d, p| rope(d, p, true),
        default: &[&[256, 4, 128]],
        full: &[&[2048, 8, 128]],
    },
    Family {
        op: "rms_norm_backward",
        build: rms_norm_backward,
        // [rows, hidden].
        default: &[&[16, 8192]],
        full: &[&[512, 16_384]],
    },
    Family {
        op: "layer_norm_backward",
        build: layer_norm_backward,
        default: &[&[16, 8192]],
        full: &[&[512, 16_384]],
    },
    Family {
        op: "embedding",
        build: embedding,
        // [vocab, hidden, tokens].
        default: &[&[152_064, 8, 4096]],
        full: &[&[152_064, 256, 16_384]],
    },
    Family {
        op: "embedding_backward",
        build: embedding_backward,
        default: &[&[152_064, 8, 4096]],
        full: &[&[152_064, 64, 16_384]],
    },
    Family {
        op: "cross_entropy",
        build: |d, p| cross_entropy(d, p, false),
        // [rows, classes, logit offset]: vocabulary rows, and logits near
        // 100 (whose exp overflows f32 without the max shift).
        default: &[&[4, 152_064, 0], &[8, 32_000, 0], &[2, 152_064, 100]],
        full: &[&[32, 152_064, 0]],
    },
    Family {
        op: "cross_entropy_backward",
        build: |d, p| cross_entropy(d, p, true),
        default: &[&[4, 152_064, 0], &[8, 32_000, 0], &[2, 152_064, 100]],
        full: &[&[32, 152_064, 0]],
    },
    Family {
        op: "softmax_backward",
        build: |d, p| rows_backward(d, p, false),
        default: &[&[4, 152_064]],
        full: &[&[32, 152_064]],
    },
    Family {
        op: "log_softmax_backward",
        build: |d, p| rows_backward(d, p, true),
        default: &[&[4, 152_064]],
        full: &[&[32, 152_064]],
    },
    Family {
        op: "swiglu",
        build: swiglu,
        default: &[&[1024, 2048]],
        full: &[&[4096, 4096]],
    },
    Family {
        op: "scale",
        build: scale,
        default: &[&[1 << 21]],
        full: &[&[1 << 24]],
    },
    Family {
        op: "pow_scalar",
        build: pow_scalar,
        default: &[&[1 << 21]],
        full: &[&[1 << 24]],
    },
    Family {
        op: "adamw",
        build: adamw,
        default: &[&[1 << 20]],
        full: &[&[1 << 24]],
    },
    unary_family!(UnaryOp::GeluErf, "gelu_erf"),
    Family {
        op: "gelu_erf_backward",
        build: |d, p| activation_backward(d, p, ActivationBackwardOp::GeluErfBackward),
        default: &[&[1024, 2048]],
        full: &[&[4096, 4096]],
    },
    unary_family!(UnaryOp::Sigmoid, "sigmoid"),
    Family {
        op: "sigmoid_backward",
        build: |d, p| output_backward(d, p, OutputBackwardOp::SigmoidBackward),
        default: &[&[1024, 2048]],
        full: &[&[4096, 4096]],
    },
    Family {
        op: "tanh_backward",
        build: |d, p| output_backward(d, p, OutputBackwardOp::TanhBackward),
        default: &[&[1024, 2048]],
        full: &[&[4096, 4096]],
    },
];

/// The realistic cases of `op` in `dtype` for `tier`.
pub fn cases(op: &str, dtype: DType, tier: Tier) -> Vec<Case> {
    sizes(op, tier)
        .into_iter()
        .map(|(build, p)| sized(build, dtype, p))
        .collect()
}

/// The sizes of `op`'s families in `tier`, with their builders.
fn sizes(op: &str, tier: Tier) -> Vec<(Build, &'static [usize])> {
    let mut out = Vec::new();
    for f in FAMILIES.iter().filter(|f| f.op == op) {
        let full: &[&[usize]] = if tier == Tier::Full { f.full } else { &[] };
        out.extend(f.default.iter().chain(full).map(|&p| (f.build, p)));
    }
    out
}

/// How many realistic cases `op` has in `tier`.
pub fn count(op: &str, tier: Tier) -> usize {
    sizes(op, tier).len()
}

/// The labels of [`cases`], building one case at a time.
pub fn labels(op: &str, dtype: DType, tier: Tier) -> Vec<String> {
    sizes(op, tier)
        .into_iter()
        .map(|(build, p)| sized(build, dtype, p).label)
        .collect()
}

/// The family member of `params`, which the shrinker can rebuild smaller.
pub fn sized(build: Build, dtype: DType, params: &[usize]) -> Case {
    let mut c = build(dtype, params);
    c.label = format!("realistic {}", c.label);
    c.resize = Some(Resize {
        build,
        params: params.to_vec(),
    });
    c
}

fn dims(shape: &[usize]) -> String {
    let d: Vec<String> = shape.iter().map(|x| x.to_string()).collect();
    format!("[{}]", d.join(", "))
}

fn rng(op: &str, dtype: DType, params: &[usize]) -> Rng {
    Rng::for_case(&format!("{op}{params:?}"), dtype)
}

fn fill(dtype: DType, p: &[usize]) -> Case {
    let value = 1.0 + 1.0 / 3.0;
    case(
        "fill",
        dtype,
        format!("{} = 4/3", dims(p)),
        vec![output("out", dtype, p, C)],
        Tolerance::EXACT,
        move |exec, t| exec.fill(&t[0], value),
        move |d| {
            Ok(vec![reference::fill(
                &d[0].shape,
                crate::values::round_to(dtype, value),
            )?])
        },
    )
}

fn copy(dtype: DType, p: &[usize]) -> Case {
    let x = rng("copy", dtype, p).values(dtype, p.iter().product(), -1e3, 1e3);
    case(
        "copy",
        dtype,
        dims(p),
        vec![input("src", dtype, p, x, C), output("dst", dtype, p, C)],
        Tolerance::EXACT,
        |exec, t| exec.copy(&t[0], &t[1]),
        |d| Ok(vec![reference::copy(&d[0])?]),
    )
}

/// f32 values spread over many binades (casts to `dtype` round them).
fn cast(dtype: DType, p: &[usize]) -> Case {
    let mut r = rng("cast", dtype, p);
    let n: usize = p.iter().product();
    let src = if dtype == DType::F32 {
        DType::F64
    } else {
        DType::F32
    };
    let x: Vec<f64> = (0..n)
        .map(|_| {
            let m = r.uniform(-2.0, 2.0);
            crate::values::round_to(src, m * 2f64.powi(r.below(24) as i32 - 12))
        })
        .collect();
    case(
        "cast",
        dtype,
        format!("{} {src} to {dtype}", dims(p)),
        vec![input("src", src, p, x, C), output("dst", dtype, p, C)],
        Tolerance::EXACT,
        |exec, t| exec.cast(&t[0], &t[1]),
        |d| Ok(vec![reference::cast(&d[0])?]),
    )
}

fn binary(dtype: DType, p: &[usize], op: BinaryOp) -> Case {
    let mut r = rng(op.name(), dtype, p);
    let (rows, cols) = (p[0], p[1]);
    let a = r.values(dtype, rows * cols, -4.0, 4.0);
    // A bias row broadcast over every row, as a model adds one; away from 0
    // for div.
    let b: Vec<f64> = r
        .values(dtype, cols, 0.5, 4.0)
        .into_iter()
        .enumerate()
        .map(|(i, v)| if i % 2 == 0 { v } else { -v })
        .collect();
    case(
        op.name(),
        dtype,
        format!("{} with a [{cols}] row broadcast", dims(p)),
        vec![
            input("a", dtype, p, a, C),
            input("b", dtype, &[cols], b, C),
            output("out", dtype, p, C),
        ],
        // alpha is 1: one correctly rounded operation (see `basic`).
        Tolerance::computed(1.0).with_bias(Bias::Always),
        move |exec, t| exec.binary(op, &t[0], &t[1], &t[2], 1.0),
        move |d| {
            Ok(vec![match op {
                BinaryOp::Add => reference::add(&d[0], &d[1], 1.0),
                BinaryOp::Sub => reference::sub(&d[0], &d[1], 1.0),
                BinaryOp::Mul => reference::mul(&d[0], &d[1], 1.0),
                BinaryOp::Div => reference::div(&d[0], &d[1], 1.0),
            }?])
        },
    )
}

fn unary(dtype: DType, p: &[usize], op: UnaryOp) -> Case {
    let (lo, hi) = match op {
        UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Rsqrt => (0.01, 10.0),
        UnaryOp::Exp => (-10.0, 10.0),
        _ => (-4.0, 4.0),
    };
    let x = rng(op.name(), dtype, p).values(dtype, p.iter().product(), lo, hi);
    let tolerance = super::elementwise::unary_tolerance(op);
    super::elementwise::unary_case(op, dtype, dims(p), p, x, C, tolerance)
}

fn activation_backward(dtype: DType, p: &[usize], op: ActivationBackwardOp) -> Case {
    let mut r = rng(op.name(), dtype, p);
    let n = p.iter().product();
    let g = r.values(dtype, n, -2.0, 2.0);
    let x = r.values(dtype, n, -4.0, 4.0);
    case(
        op.name(),
        dtype,
        dims(p),
        vec![
            input("grad_out", dtype, p, g, C),
            input("input", dtype, p, x, C),
            output("grad_in", dtype, p, C),
        ],
        super::elementwise::activation_backward_tolerance(op),
        move |exec, t| exec.activation_backward(op, &t[0], &t[1], &t[2]),
        move |d| {
            Ok(vec![match op {
                ActivationBackwardOp::ReluBackward => reference::relu_backward(&d[0], &d[1]),
                ActivationBackwardOp::SiluBackward => reference::silu_backward(&d[0], &d[1]),
                ActivationBackwardOp::GeluBackward => reference::gelu_backward(&d[0], &d[1]),
                ActivationBackwardOp::GeluErfBackward => reference::gelu_erf_backward(&d[0], &d[1]),
            }?])
        },
    )
}

fn output_backward(dtype: DType, p: &[usize], op: OutputBackwardOp) -> Case {
    let mut r = rng(op.name(), dtype, p);
    let n = p.iter().product();
    let (lo, hi) = super::output_backward::range(op);
    let g = r.values(dtype, n, -2.0, 2.0);
    let y = r.values(dtype, n, lo, hi);
    case(
        op.name(),
        dtype,
        dims(p),
        vec![
            input("grad_out", dtype, p, g, C),
            input("output", dtype, p, y, C),
            output("grad_in", dtype, p, C),
        ],
        super::output_backward::tolerance(),
        move |exec, t| exec.output_backward(op, &t[0], &t[1], &t[2]),
        move |d| super::output_backward::reference(op, d),
    )
}

fn matmul(dtype: DType, p: &[usize]) -> Case {
    let (m, k, n) = (p[0], p[1], p[2]);
    let mut r = rng("matmul", dtype, p);
    let a = r.values(dtype, m * k, -1.0, 1.0);
    let b = r.values(dtype, k * n, -1.0, 1.0);
    let options = MatmulOptions {
        transpose_a: false,
        transpose_b: false,
        alpha: 1.0,
        beta: 0.0,
    };
    case(
        "matmul",
        dtype,
        format!("[{m}, {k}] x [{k}, {n}]"),
        vec![
            input("a", dtype, &[m, k], a, C),
            input("b", dtype, &[k, n], b, C),
            output("out", dtype, &[m, n], C),
        ],
        Tolerance::accumulated(0.0, k + 2),
        move |exec, t| exec.matmul(&t[0], &t[1], &t[2], options),
        |d| {
            Ok(vec![reference::matmul(
                &d[0], &d[1], &d[2], false, false, 1.0, 0.0,
            )?])
        },
    )
}

fn linear(dtype: DType, p: &[usize]) -> Case {
    let (rows, k, n) = (p[0], p[1], p[2]);
    let mut r = rng("linear", dtype, p);
    let x = r.values(dtype, rows * k, -1.0, 1.0);
    let w = r.values(dtype, n * k, -1.0, 1.0);
    case(
        "linear",
        dtype,
        format!("[{rows}, {k}] by a [{n}, {k}] weight"),
        vec![
            input("input", dtype, &[rows, k], x, C),
            input("weight", dtype, &[n, k], w, C),
            output("out", dtype, &[rows, n], C),
        ],
        Tolerance::accumulated(0.0, k + 1),
        |exec, t| exec.linear(&t[0], &t[1], None, &t[2]),
        |d| Ok(vec![reference::linear(&d[0], &d[1], None)?]),
    )
}

/// softmax and log_softmax over vocabulary rows.
fn rows(dtype: DType, p: &[usize], op: &'static str) -> Case {
    let x = rng(op, dtype, p).values(dtype, p.iter().product(), -8.0, 8.0);
    let n = p[1];
    case(
        op,
        dtype,
        dims(p),
        vec![input("input", dtype, p, x, C), output("out", dtype, p, C)],
        // As the small cases (`basic` and `nn::softmax`) derive them.
        if op == "softmax" {
            Tolerance::computed(24.0 + 2.0 * Tolerance::effective_length(n))
        } else {
            Tolerance::accumulated(8.0, n + 2)
        },
        move |exec, t| {
            if op == "softmax" {
                exec.softmax(&t[0], &t[1])
            } else {
                exec.log_softmax(&t[0], &t[1])
            }
        },
        move |d| {
            Ok(vec![if op == "softmax" {
                reference::softmax(&d[0])?
            } else {
                reference::log_softmax(&d[0])?
            }])
        },
    )
}

fn reduce(dtype: DType, p: &[usize], op: ReduceOp) -> Case {
    // Values away from 0 on average, so a sum does not cancel to nothing.
    let x = rng(op.name(), dtype, p).values(dtype, p.iter().product(), -0.5, 1.5);
    super::elementwise::reduce_case(
        op,
        dtype,
        format!("{} over the last dim", dims(p)),
        p,
        x,
        -1,
        false,
        C,
    )
}

fn sum_squares(dtype: DType, p: &[usize]) -> Case {
    let n: usize = p.iter().product();
    let mut x = rng("sum_squares", dtype, p).values(dtype, n, -1.0, 1.0);
    // The last element holds most of the sum (an outlier gradient): a
    // split of the work over threads that drops its remainder loses it.
    if let Some(last) = x.last_mut() {
        *last = (4.0 * n as f64).sqrt().round();
    }
    case(
        "sum_squares",
        dtype,
        format!("{}, the last element largest", dims(p)),
        vec![
            input("input", dtype, p, x, C),
            output("out", DType::F32, &[], C),
        ],
        Tolerance::accumulated(0.0, n),
        |exec, t| exec.sum_squares(&t[0], &t[1]),
        |d| Ok(vec![reference::sum_squares(&d[0])?]),
    )
}

fn rms_norm(dtype: DType, p: &[usize]) -> Case {
    let (rows, h) = (p[0], p[1]);
    let mut r = rng("rms_norm", dtype, p);
    let x = r.values(dtype, rows * h, -2.0, 2.0);
    let w = r.values(dtype, h, 0.5, 1.5);
    let eps = 1e-6;
    case(
        "rms_norm",
        dtype,
        dims(p),
        vec![
            input("input", dtype, p, x, C),
            input("weight", dtype, &[h], w, C),
            output("out", dtype, p, C),
            output("inv_rms", DType::F32, &[rows], C),
        ],
        Tolerance::computed(8.0 + Tolerance::effective_length(h)),
        move |exec, t| exec.rms_norm(&t[0], &t[1], &t[2], &t[3], eps),
        move |d| {
            let (out, inv) = reference::rms_norm(&d[0], &d[1], eps)?;
            Ok(vec![out, inv])
        },
    )
}

fn layer_norm(dtype: DType, p: &[usize]) -> Case {
    let (rows, h) = (p[0], p[1]);
    let mut r = rng("layer_norm", dtype, p);
    let x = r.values(dtype, rows * h, -2.0, 2.0);
    let w = r.values(dtype, h, 0.5, 1.5);
    let b = r.values(dtype, h, -0.5, 0.5);
    let eps = 1e-5;
    case(
        "layer_norm",
        dtype,
        dims(p),
        vec![
            input("input", dtype, p, x, C),
            input("weight", dtype, &[h], w, C),
            input("bias", dtype, &[h], b, C),
            output("out", dtype, p, C),
            output("mean", DType::F32, &[rows], C),
            output("rstd", DType::F32, &[rows], C),
        ],
        // The mean is about 0 here, so the condition term of `nn::norm` is small.
        Tolerance::accumulated(8.0, 2 * h + 2),
        move |exec, t| exec.layer_norm(&t[0], &t[1], &t[2], &t[3], &t[4], &t[5], eps),
        move |d| {
            let (out, mean, rstd) = reference::layer_norm(&d[0], &d[1], &d[2], eps)?;
            Ok(vec![out, mean, rstd])
        },
    )
}

/// Attention's shapes from a family's parameters `[batch, heads, kv
/// heads, queries, keys, head_dim, causal]`: q's shape, k's and v's, the
/// statistics', the scale, whether causal, and the label (q's shape, then
/// the keys' where they differ, as in `[1, 1, 300, 128] causal`).
struct AttentionShape {
    q: [usize; 4],
    kv: [usize; 4],
    stats: [usize; 3],
    scale: f64,
    causal: bool,
    label: String,
}

fn attention_shape(p: &[usize]) -> AttentionShape {
    let (b, hq, sq, skv, hd) = (p[0], p[1].max(1), p[3], p[4], p[5]);
    // The kv heads divide the heads (a size the shrinker or a test made
    // smaller may not: the largest that does).
    let hkv = (1..=p[2].clamp(1, hq))
        .rev()
        .find(|k| hq % k == 0)
        .unwrap_or(1);
    let causal = p[6] != 0;
    let (q, kv) = ([b, hq, sq, hd], [b, hkv, skv, hd]);
    let mut label = dims(&q);
    if kv != q {
        label += &format!(" kv {}", dims(&kv));
    }
    if causal {
        label += " causal";
    }
    AttentionShape {
        q,
        kv,
        stats: [b, hq, sq],
        scale: 1.0 / (hd as f64).sqrt(),
        causal,
        label,
    }
}

fn attention(dtype: DType, p: &[usize]) -> Case {
    let a = attention_shape(p);
    let mut r = rng("attention", dtype, p);
    let q = r.values(dtype, numel(&a.q), -1.0, 1.0);
    let k = r.values(dtype, numel(&a.kv), -1.0, 1.0);
    let v = r.values(dtype, numel(&a.kv), -1.0, 1.0);
    let (scale, causal) = (a.scale, a.causal);
    case(
        "attention",
        dtype,
        a.label,
        vec![
            input("q", dtype, &a.q, q, C),
            input("k", dtype, &a.kv, k, C),
            input("v", dtype, &a.kv, v, C),
            output("out", dtype, &a.q, C),
            output("lse", DType::F32, &a.stats, C),
        ],
        Tolerance::accumulated(8.0, a.kv[2] + a.q[3]).with_low(2.0),
        move |exec, t| exec.attention(&t[0], &t[1], &t[2], &t[3], &t[4], scale, causal),
        move |d| {
            let (out, lse) = reference::attention(&d[0], &d[1], &d[2], scale, causal)?;
            Ok(vec![out, lse])
        },
    )
}

/// Attention's backward at a realistic head dim and sequence: the saved
/// `out` and `lse` of the reference forward, stored as a plugin would have
/// (as `nn::attention`'s small cases).
fn attention_backward(dtype: DType, p: &[usize]) -> Case {
    let a = attention_shape(p);
    let mut r = rng("attention_backward", dtype, p);
    let q = r.values(dtype, numel(&a.q), -1.0, 1.0);
    let k = r.values(dtype, numel(&a.kv), -1.0, 1.0);
    let v = r.values(dtype, numel(&a.kv), -1.0, 1.0);
    let g = r.values(dtype, numel(&a.q), -1.0, 1.0);
    let (scale, causal) = (a.scale, a.causal);
    let dense = |shape: &[usize], x: &Vec<f64>| reference::Dense::new(shape, x.clone());
    let (out, lse) = reference::attention(
        &dense(&a.q, &q),
        &dense(&a.kv, &k),
        &dense(&a.kv, &v),
        scale,
        causal,
    )
    .expect("valid shapes");
    let stored = super::nn::stored;
    case(
        "attention_backward",
        dtype,
        a.label,
        vec![
            input("q", dtype, &a.q, q, C),
            input("k", dtype, &a.kv, k, C),
            input("v", dtype, &a.kv, v, C),
            input("out", dtype, &a.q, stored(dtype, &out), C),
            input("lse", DType::F32, &a.stats, stored(DType::F32, &lse), C),
            input("grad_out", dtype, &a.q, g, C),
            output("grad_q", dtype, &a.q, C),
            output("grad_k", dtype, &a.kv, C),
            output("grad_v", dtype, &a.kv, C),
        ],
        // As `nn::attention`: sums over the keys, the queries (of every
        // query head of a group, for a kv head's gradients) and the head.
        Tolerance::accumulated(8.0, a.kv[2] + a.q[2] * (a.q[1] / a.kv[1]) + a.q[3]).with_low(3.0),
        move |exec, t| {
            exec.attention_backward(
                &t[0], &t[1], &t[2], &t[3], &t[4], &t[5], &t[6], &t[7], &t[8], scale, causal,
            )
        },
        move |d| {
            let (gq, gk, gv) = reference::attention_backward(
                &d[0], &d[1], &d[2], &d[3], &d[4], &d[5], scale, causal,
            )?;
            Ok(vec![gq, gk, gv])
        },
    )
}

/// rope or its backward over `[1, seq, heads, head_dim]` with half-split
/// pairs (as Llama), positions from 0.
fn rope(dtype: DType, p: &[usize], backward: bool) -> Case {
    let (seq, heads, hd) = (p[0], p[1], p[2] / 2 * 2);
    let op = if backward { "rope_backward" } else { "rope" };
    let shape = [1, seq, heads, hd];
    let x = rng(op, dtype, p).values(dtype, seq * heads * hd, -2.0, 2.0);
    let (cos, sin) = super::nn::rope_tables(seq, hd, 0);
    case(
        op,
        dtype,
        format!("{} half-split", dims(&shape)),
        vec![
            input("input", dtype, &shape, x, C),
            input("cos", DType::F32, &[seq, hd / 2], cos, C),
            input("sin", DType::F32, &[seq, hd / 2], sin, C),
            output("out", dtype, &shape, C),
        ],
        // As `nn::rope`.
        Tolerance::accumulated(2.0, 2).with_bias(Bias::LowPrecision),
        move |exec, t| {
            if backward {
                exec.rope_backward(&t[0], &t[1], &t[2], &t[3], false)
            } else {
                exec.rope(&t[0], &t[1], &t[2], &t[3], false)
            }
        },
        move |d| {
            Ok(vec![if backward {
                reference::rope_backward(&d[0], &d[1], &d[2], false)?
            } else {
                reference::rope(&d[0], &d[1], &d[2], false)?
            }])
        },
    )
}

fn rms_norm_backward(dtype: DType, p: &[usize]) -> Case {
    let (rows, h) = (p[0], p[1]);
    let mut r = rng("rms_norm_backward", dtype, p);
    let x = r.values(dtype, rows * h, -2.0, 2.0);
    let w = r.values(dtype, h, 0.5, 1.5);
    let g = r.values(dtype, rows * h, -1.0, 1.0);
    let (_, inv) = reference::rms_norm(
        &reference::Dense::new(p, x.clone()),
        &reference::Dense::new(&[h], w.clone()),
        1e-6,
    )
    .expect("valid shapes");
    let inv = super::nn::stored(DType::F32, &inv);
    case(
        "rms_norm_backward",
        dtype,
        dims(p),
        vec![
            input("grad_out", dtype, p, g, C),
            input("input", dtype, p, x, C),
            input("weight", dtype, &[h], w, C),
            input("inv_rms", DType::F32, &[rows], inv, C),
            output("grad_input", dtype, p, C),
            output("grad_weight", dtype, &[h], C),
        ],
        // As `nn::norm`.
        Tolerance::accumulated(8.0, h + rows),
        |exec, t| exec.rms_norm_backward(&t[0], &t[1], &t[2], &t[3], &t[4], &t[5]),
        |d| {
            let (gi, gw) = reference::rms_norm_backward(&d[0], &d[1], &d[2], &d[3])?;
            Ok(vec![gi, gw])
        },
    )
}

fn layer_norm_backward(dtype: DType, p: &[usize]) -> Case {
    let (rows, h) = (p[0], p[1]);
    let mut r = rng("layer_norm_backward", dtype, p);
    let x = r.values(dtype, rows * h, -1.0, 3.0);
    let w = r.values(dtype, h, 0.5, 1.5);
    let b = r.values(dtype, h, -0.5, 0.5);
    let g = r.values(dtype, rows * h, -1.0, 1.0);
    let (_, mean, rstd) = reference::layer_norm(
        &reference::Dense::new(p, x.clone()),
        &reference::Dense::new(&[h], w.clone()),
        &reference::Dense::new(&[h], b),
        1e-5,
    )
    .expect("valid shapes");
    let f32s = |d: &reference::Dense| super::nn::stored(DType::F32, d);
    case(
        "layer_norm_backward",
        dtype,
        dims(p),
        vec![
            input("grad_out", dtype, p, g, C),
            input("input", dtype, p, x, C),
            input("weight", dtype, &[h], w, C),
            input("mean", DType::F32, &[rows], f32s(&mean), C),
            input("rstd", DType::F32, &[rows], f32s(&rstd), C),
            output("grad_input", dtype, p, C),
            output("grad_weight", dtype, &[h], C),
            output("grad_bias", dtype, &[h], C),
        ],
        // As `nn::norm`.
        Tolerance::accumulated(8.0, h + rows),
        |exec, t| exec.layer_norm_backward(&t[0], &t[1], &t[2], &t[3], &t[4], &t[5], &t[6], &t[7]),
        |d| {
            let (gi, gw, gb) = reference::layer_norm_backward(&d[0], &d[1], &d[2], &d[3], &d[4])?;
            Ok(vec![gi, gw, gb])
        },
    )
}

/// Token ids over the whole table, the last rows (above 65,535) included.
fn token_ids(r: &mut Rng, vocab: usize, tokens: usize) -> Vec<f64> {
    (0..tokens)
        .map(|i| match i % 4 {
            0 => (vocab - 1).saturating_sub(r.below(64)) as f64,
            _ => r.below(vocab) as f64,
        })
        .collect()
}

fn embedding(dtype: DType, p: &[usize]) -> Case {
    let (vocab, h, tokens) = (p[0], p[1], p[2]);
    let mut r = rng("embedding", dtype, p);
    let w = r.values(dtype, vocab * h, -1.0, 1.0);
    let idx = token_ids(&mut r, vocab, tokens);
    case(
        "embedding",
        dtype,
        format!("a [{vocab}, {h}] table, {tokens} i32 ids"),
        vec![
            input("weight", dtype, &[vocab, h], w, C),
            input("indices", DType::I32, &[tokens], idx, C),
            output("out", dtype, &[tokens, h], C),
        ],
        Tolerance::EXACT,
        |exec, t| exec.embedding(&t[0], &t[1], &t[2]),
        |d| Ok(vec![reference::embedding(&d[0], &as_indices(&d[1]))?]),
    )
}

fn as_indices(d: &crate::reference::Dense) -> Indices {
    Indices {
        shape: d.shape.clone(),
        data: d.data.iter().map(|&v| v as i64).collect(),
    }
}

fn embedding_backward(dtype: DType, p: &[usize]) -> Case {
    let (vocab, h, tokens) = (p[0], p[1], p[2]);
    let mut r = rng("embedding_backward", dtype, p);
    let g = r.values(dtype, tokens * h, -1.0, 1.0);
    let idx = token_ids(&mut r, vocab, tokens);
    let prev = r.values(dtype, vocab * h, -0.1, 0.1);
    let repeats = super::training_max_repeats(&idx);
    case(
        "embedding_backward",
        dtype,
        format!("a [{vocab}, {h}] table, {tokens} i64 ids"),
        vec![
            input("grad_out", dtype, &[tokens, h], g, C),
            input("indices", DType::I64, &[tokens], idx, C),
            crate::cases::inout("grad_weight", dtype, &[vocab, h], prev, C),
        ],
        Tolerance::accumulated(0.0, repeats).with_low(repeats.saturating_sub(1) as f64),
        |exec, t| exec.embedding_backward(&t[0], &t[1], &t[2]),
        |d| {
            Ok(vec![reference::embedding_backward(
                &d[0],
                &as_indices(&d[1]),
                &d[2],
            )?])
        },
    )
}

fn cross_entropy(dtype: DType, p: &[usize], backward: bool) -> Case {
    let (n, c, offset) = (p[0], p[1], p[2]);
    let op = if backward {
        "cross_entropy_backward"
    } else {
        "cross_entropy"
    };
    let mut r = rng(op, dtype, p);
    let offset_f = offset as f64;
    let logits = r.values(dtype, n * c, offset_f - 8.0, offset_f + 8.0);
    // Logits far from 0 cancel in `x - lse` (as in `training::loss`).
    let extra = offset / 2;
    let targets: Vec<f64> = (0..n)
        .map(|i| {
            if i % 2 == 0 {
                (c - 1) as f64
            } else {
                r.below(c) as f64
            }
        })
        .collect();
    let mut tensors = vec![
        input("logits", dtype, &[n, c], logits, C),
        input("targets", DType::I64, &[n], targets, C),
    ];
    if backward {
        tensors.push(output("grad_logits", dtype, &[n, c], C));
        case(
            op,
            dtype,
            format!("[{n}, {c}] logits near {offset}"),
            tensors,
            Tolerance::accumulated(8.0, c + extra),
            |exec, t| exec.cross_entropy_backward(&t[0], &t[1], &t[2], 1.0, -100),
            |d| {
                Ok(vec![reference::cross_entropy_backward(
                    &d[0],
                    &as_indices(&d[1]),
                    1.0,
                    -100,
                )?])
            },
        )
    } else {
        tensors.push(output("loss", DType::F32, &[], C));
        case(
            op,
            dtype,
            format!("[{n}, {c}] logits near {offset}"),
            tensors,
            Tolerance::accumulated(8.0, c + n + extra),
            |exec, t| exec.cross_entropy(&t[0], &t[1], &t[2], -100),
            |d| {
                Ok(vec![reference::cross_entropy(
                    &d[0],
                    &as_indices(&d[1]),
                    -100,
                )?])
            },
        )
    }
}

fn adamw(dtype: DType, p: &[usize]) -> Case {
    let n: usize = p.iter().product();
    let mut r = rng("adamw", dtype, p);
    let param = r.values(dtype, n, -1.0, 1.0);
    let grad = r.values(dtype, n, -1.0, 1.0);
    let m = r.values(DType::F32, n, -0.1, 0.1);
    let v = r.values(DType::F32, n, 0.0, 0.01);
    // In bf16 and f16 an update must be more than half an ULP of the
    // parameter to show at all (as in `training::optim`).
    let low = matches!(dtype, DType::BF16 | DType::F16);
    let options = polychip_host::AdamwOptions {
        lr: if low { 0.064 } else { 1e-3 },
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: if low { 0.3 } else { 0.1 },
        step: 10,
    };
    super::training::adamw_case(
        dtype,
        format!("{} parameters, step 10", dims(p)),
        p,
        [param, grad, m, v],
        [C; 3],
        options,
    )
}

/// softmax_backward and log_softmax_backward over vocabulary rows: the
/// forward output of seeded logits, stored in the dtype, and a gradient.
fn rows_backward(dtype: DType, p: &[usize], log: bool) -> Case {
    let op = if log {
        "log_softmax_backward"
    } else {
        "softmax_backward"
    };
    let mut r = rng(op, dtype, p);
    let n: usize = p.iter().product();
    let logits = crate::reference::Dense::new(p, r.values(DType::F64, n, -8.0, 8.0));
    let forward = if log {
        reference::log_softmax(&logits)
    } else {
        reference::softmax(&logits)
    }
    .expect("row-wise shapes are valid");
    let y = super::nn::stored(dtype, &forward);
    let g = r.values(dtype, n, -1.0, 1.0);
    super::nn::softmax_backward_case(op, log, dtype, dims(p), p, y, g, [C; 3])
}

fn swiglu(dtype: DType, p: &[usize]) -> Case {
    let mut r = rng("swiglu", dtype, p);
    let n = p.iter().product();
    let gate = r.values(dtype, n, -5.0, 5.0);
    let up = r.values(dtype, n, -2.0, 2.0);
    case(
        "swiglu",
        dtype,
        dims(p),
        vec![
            input("gate", dtype, p, gate, C),
            input("up", dtype, p, up, C),
            output("out", dtype, p, C),
        ],
        // As `elementwise`: silu(gate) * up in f32, no cancellation.
        Tolerance::computed(16.0),
        |exec, t| exec.swiglu(&t[0], &t[1], &t[2]),
        |d| Ok(vec![reference::swiglu(&d[0], &d[1])?]),
    )
}

/// An in-place scale by a value that is not a power of two.
fn scale(dtype: DType, p: &[usize]) -> Case {
    let x = rng("scale", dtype, p).values(dtype, p.iter().product(), -4.0, 4.0);
    let alpha = 0.7;
    case(
        "scale",
        dtype,
        format!("{} by {alpha}", dims(p)),
        vec![crate::cases::inout("tensor", dtype, p, x, C)],
        // As `training::optim`: one product, alpha rounded to f32 first.
        Tolerance::computed(2.0),
        move |exec, t| exec.scale(&t[0], alpha),
        move |d| Ok(vec![reference::scale(&d[0], alpha)?]),
    )
}

fn pow_scalar(dtype: DType, p: &[usize]) -> Case {
    let x = rng("pow_scalar", dtype, p).values(dtype, p.iter().product(), 0.01, 10.0);
    let exponent = 1.5;
    case(
        "pow_scalar",
        dtype,
        format!("{} to the power {exponent}", dims(p)),
        vec![input("input", dtype, p, x, C), output("out", dtype, p, C)],
        // As `elementwise`: the condition number |e ln x| times u(f32).
        Tolerance::computed(8.0 + 2.0 * f64::abs(exponent) * 100f64.ln()),
        move |exec, t| exec.pow_scalar(&t[0], &t[1], exponent),
        move |d| Ok(vec![reference::pow_scalar(&d[0], exponent)?]),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::case::{Role, TensorSpec};

    #[test]
    fn every_family_builds_well_formed_cases_at_small_sizes() {
        for f in FAMILIES {
            let op = polychip_host::Op::from_name(f.op).expect("a known operator");
            for &dtype in op.dtypes() {
                for params in f.default.iter().chain(f.full) {
                    assert!(!params.is_empty(), "{}", f.op);
                    let small: Vec<usize> = params.iter().map(|&p| p.min(3)).collect();
                    let c = sized(f.build, dtype, &small);
                    assert_eq!((c.op, c.dtype), (f.op, dtype));
                    let dense: Vec<_> = c.tensors.iter().map(TensorSpec::dense).collect();
                    let out = (c.reference)(&dense).unwrap_or_else(|e| panic!("{c:?}: {e}"));
                    let written: Vec<_> =
                        c.tensors.iter().filter(|t| t.role != Role::Input).collect();
                    assert_eq!(out.len(), written.len(), "{c:?}");
                    for (o, t) in out.iter().zip(written) {
                        assert_eq!(o.shape, t.shape, "{c:?} {}", t.name);
                    }
                }
            }
        }
    }

    #[test]
    fn the_default_tier_reaches_real_sizes() {
        let biggest = |op: &str| {
            cases(op, DType::BF16, Tier::Default)
                .iter()
                .flat_map(|c| c.tensors.iter().map(|t| t.values.len()))
                .max()
                .unwrap_or(0)
        };
        assert!(biggest("add") >= 2_000_000);
        assert!(biggest("softmax") >= 152_064 * 4);
        let ids = cases("embedding", DType::F32, Tier::Default);
        assert!(ids[0].tensors[1].values.iter().any(|&i| i > 65_535.0));
        assert!(
            cases("softmax", DType::F32, Tier::Full).len()
                > cases("softmax", DType::F32, Tier::Default).len()
        );
    }
}
