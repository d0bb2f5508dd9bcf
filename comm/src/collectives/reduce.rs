//! Element types, reduction operators and the local reduction kernel: `n`
//! inputs combined element by element, always in rank order
//! `((x0 op x1) op x2) ...`, so a result never depends on timing. f16 and
//! bf16 accumulate in f32 and round once; integers wrap; bools combine as
//! logic (sum and max are or, min is and).

use half::{bf16, f16};

/// Element type of a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// IEEE binary16 (reduced in f32).
    F16,
    /// bfloat16 (reduced in f32).
    BF16,
    /// Two's-complement 32-bit integer (wrapping).
    I32,
    /// Two's-complement 64-bit integer (wrapping).
    I64,
    /// IEEE binary64.
    F64,
    /// Unsigned 8-bit integer (wrapping).
    U8,
    /// A byte that is 0 (false) or not (true): sum and max are or, min is
    /// and, the average is refused.
    Bool,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::U8 | DType::Bool => 1,
            DType::F16 | DType::BF16 => 2,
            DType::F32 | DType::I32 => 4,
            DType::I64 | DType::F64 => 8,
        }
    }

    /// The short name (`f32`, `bf16`...).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::F64 => "f64",
            DType::U8 => "u8",
            DType::Bool => "bool",
        }
    }

    /// Every element type, in code order.
    pub const ALL: [DType; 8] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::I32,
        DType::I64,
        DType::F64,
        DType::U8,
        DType::Bool,
    ];

    pub(crate) fn code(self) -> u64 {
        self as u64 + 1
    }
}

/// How elements are combined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum.
    Sum,
    /// Sum divided by the number of ranks (integers: truncating division).
    Avg,
    /// Maximum (floats: a NaN input is ignored when the other is a number).
    Max,
    /// Minimum (floats: as for `Max`).
    Min,
    /// Product (integers wrap).
    Prod,
    /// Bitwise and (integers and bools).
    BitAnd,
    /// Bitwise or (integers and bools).
    BitOr,
    /// Bitwise exclusive or (integers and bools).
    BitXor,
}

impl ReduceOp {
    /// The short name (`sum`, `avg`...).
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Avg => "avg",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::Prod => "prod",
            ReduceOp::BitAnd => "band",
            ReduceOp::BitOr => "bor",
            ReduceOp::BitXor => "bxor",
        }
    }

    /// Every operator, in code order.
    pub const ALL: [ReduceOp; 8] = [
        ReduceOp::Sum,
        ReduceOp::Avg,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::Prod,
        ReduceOp::BitAnd,
        ReduceOp::BitOr,
        ReduceOp::BitXor,
    ];

    pub(crate) fn code(self) -> u64 {
        self as u64 + 1
    }
}

trait Lane {
    const SIZE: usize;
    type A: Copy + Default;
    fn load(b: &[u8]) -> Self::A;
    fn store(a: Self::A, b: &mut [u8]);
    fn add(a: Self::A, b: Self::A) -> Self::A;
    fn max(a: Self::A, b: Self::A) -> Self::A;
    fn min(a: Self::A, b: Self::A) -> Self::A;
    fn div(a: Self::A, n: usize) -> Self::A;
    fn mul(a: Self::A, b: Self::A) -> Self::A;
    /// Bitwise and, or, xor: integers and bools only ([`check_op`]
    /// refuses them for floats, whose lanes leave `a` as it is).
    fn and(a: Self::A, b: Self::A) -> Self::A;
    fn or(a: Self::A, b: Self::A) -> Self::A;
    fn xor(a: Self::A, b: Self::A) -> Self::A;
}

macro_rules! float_lane {
    ($name:ident, $t:ty, $acc:ty, $n:expr, $to:expr, $from:expr) => {
        struct $name;
        impl Lane for $name {
            const SIZE: usize = $n;
            type A = $acc;
            #[inline(always)]
            fn load(b: &[u8]) -> $acc {
                $to(<$t>::from_ne_bytes(b.try_into().expect("lane")))
            }
            #[inline(always)]
            fn store(a: $acc, b: &mut [u8]) {
                b.copy_from_slice(&$from(a).to_ne_bytes())
            }
            #[inline(always)]
            fn add(a: $acc, b: $acc) -> $acc {
                a + b
            }
            #[inline(always)]
            fn max(a: $acc, b: $acc) -> $acc {
                a.max(b)
            }
            #[inline(always)]
            fn min(a: $acc, b: $acc) -> $acc {
                a.min(b)
            }
            #[inline(always)]
            fn div(a: $acc, n: usize) -> $acc {
                a / n as $acc
            }
            #[inline(always)]
            fn mul(a: $acc, b: $acc) -> $acc {
                a * b
            }
            #[inline(always)]
            fn and(a: $acc, _: $acc) -> $acc {
                a
            }
            #[inline(always)]
            fn or(a: $acc, _: $acc) -> $acc {
                a
            }
            #[inline(always)]
            fn xor(a: $acc, _: $acc) -> $acc {
                a
            }
        }
    };
}

macro_rules! int_lane {
    ($name:ident, $t:ty) => {
        struct $name;
        impl Lane for $name {
            const SIZE: usize = std::mem::size_of::<$t>();
            type A = $t;
            #[inline(always)]
            fn load(b: &[u8]) -> $t {
                <$t>::from_ne_bytes(b.try_into().expect("lane"))
            }
            #[inline(always)]
            fn store(a: $t, b: &mut [u8]) {
                b.copy_from_slice(&a.to_ne_bytes())
            }
            #[inline(always)]
            fn add(a: $t, b: $t) -> $t {
                a.wrapping_add(b)
            }
            #[inline(always)]
            fn max(a: $t, b: $t) -> $t {
                a.max(b)
            }
            #[inline(always)]
            fn min(a: $t, b: $t) -> $t {
                a.min(b)
            }
            #[inline(always)]
            fn div(a: $t, n: usize) -> $t {
                // Truncating, in a type that holds any rank count.
                (a as i128 / n as i128) as $t
            }
            #[inline(always)]
            fn mul(a: $t, b: $t) -> $t {
                a.wrapping_mul(b)
            }
            #[inline(always)]
            fn and(a: $t, b: $t) -> $t {
                a & b
            }
            #[inline(always)]
            fn or(a: $t, b: $t) -> $t {
                a | b
            }
            #[inline(always)]
            fn xor(a: $t, b: $t) -> $t {
                a ^ b
            }
        }
    };
}

float_lane!(F32L, f32, f32, 4, |x: f32| x, |x: f32| x);
float_lane!(F16L, f16, f32, 2, f16::to_f32, f16::from_f32);
float_lane!(BF16L, bf16, f32, 2, bf16::to_f32, bf16::from_f32);
float_lane!(F64L, f64, f64, 8, |x: f64| x, |x: f64| x);
int_lane!(I32L, i32);
int_lane!(I64L, i64);
int_lane!(U8L, u8);

/// Bools as bytes: any non-zero byte is true, and a result is stored as 0
/// or 1.
struct BoolL;
impl Lane for BoolL {
    const SIZE: usize = 1;
    type A = u8;
    #[inline(always)]
    fn load(b: &[u8]) -> u8 {
        (b[0] != 0) as u8
    }
    #[inline(always)]
    fn store(a: u8, b: &mut [u8]) {
        b[0] = a;
    }
    #[inline(always)]
    fn add(a: u8, b: u8) -> u8 {
        a | b
    }
    #[inline(always)]
    fn max(a: u8, b: u8) -> u8 {
        a | b
    }
    #[inline(always)]
    fn min(a: u8, b: u8) -> u8 {
        a & b
    }
    #[inline(always)]
    fn div(a: u8, _: usize) -> u8 {
        // Refused before any kernel runs ([`check_op`]).
        a
    }
    #[inline(always)]
    fn mul(a: u8, b: u8) -> u8 {
        a & b
    }
    #[inline(always)]
    fn and(a: u8, b: u8) -> u8 {
        a & b
    }
    #[inline(always)]
    fn or(a: u8, b: u8) -> u8 {
        a | b
    }
    #[inline(always)]
    fn xor(a: u8, b: u8) -> u8 {
        a ^ b
    }
}

/// Refuses a combination no kernel defines: the average of bools, and
/// bitwise operators on floats.
pub(crate) fn check_op(dtype: DType, op: ReduceOp) -> Result<(), String> {
    let float = matches!(dtype, DType::F32 | DType::F16 | DType::BF16 | DType::F64);
    let bitwise = matches!(op, ReduceOp::BitAnd | ReduceOp::BitOr | ReduceOp::BitXor);
    match (dtype, op) {
        (DType::Bool, ReduceOp::Avg) => Err(
            "bool tensors reduce with sum (or), max (or), min (and), prod (and) and the bitwise \
             operators, not avg"
                .into(),
        ),
        _ if float && bitwise => Err(format!(
            "{} is bitwise: it reduces integer and bool tensors, not {}",
            op.name(),
            dtype.name()
        )),
        _ => Ok(()),
    }
}

/// Writes into `out` the reduction of every rank's input, in rank order.
/// Rank `me`'s input is `own`, or `out`'s current contents when `own` is
/// `None`; `inputs[me]` is ignored. All inputs have `out.len()` bytes.
pub(crate) fn fold(
    dtype: DType,
    op: ReduceOp,
    out: &mut [u8],
    own: Option<&[u8]>,
    me: usize,
    inputs: &[&[u8]],
) {
    match dtype {
        DType::F32 => fold_t::<F32L>(op, out, own, me, inputs),
        DType::F16 => fold_t::<F16L>(op, out, own, me, inputs),
        DType::BF16 => fold_t::<BF16L>(op, out, own, me, inputs),
        DType::I32 => fold_t::<I32L>(op, out, own, me, inputs),
        DType::I64 => fold_t::<I64L>(op, out, own, me, inputs),
        DType::F64 => fold_t::<F64L>(op, out, own, me, inputs),
        DType::U8 => fold_t::<U8L>(op, out, own, me, inputs),
        DType::Bool => fold_t::<BoolL>(op, out, own, me, inputs),
    }
}

/// Elements per block when more than two inputs accumulate in f32 (or the
/// integer type) before the last one is combined and stored.
const BLOCK: usize = 512;

/// Where one rank's input comes from: a separate buffer, or `out` itself
/// (read element by element before that element is written).
#[derive(Clone, Copy)]
enum Src<'a> {
    Ext(&'a [u8]),
    Out,
}

impl<'a> Src<'a> {
    fn sub(self, start: usize, end: usize) -> Src<'a> {
        match self {
            Src::Ext(b) => Src::Ext(&b[start..end]),
            Src::Out => Src::Out,
        }
    }
}

fn fold_t<L: Lane>(op: ReduceOp, out: &mut [u8], own: Option<&[u8]>, me: usize, inputs: &[&[u8]]) {
    let n = inputs.len();
    let src = |j: usize| match (j == me, own) {
        (true, Some(o)) => Src::Ext(o),
        (true, None) => Src::Out,
        (false, _) => Src::Ext(inputs[j]),
    };
    // The operator and the final step are closures, so that each
    // combination compiles to its own straight (vectorizable) loop.
    match op {
        ReduceOp::Sum => fold_with::<L>(out, n, src, L::add, |a| a),
        ReduceOp::Avg => fold_with::<L>(out, n, src, L::add, |a| L::div(a, n)),
        ReduceOp::Max => fold_with::<L>(out, n, src, L::max, |a| a),
        ReduceOp::Min => fold_with::<L>(out, n, src, L::min, |a| a),
        ReduceOp::Prod => fold_with::<L>(out, n, src, L::mul, |a| a),
        ReduceOp::BitAnd => fold_with::<L>(out, n, src, L::and, |a| a),
        ReduceOp::BitOr => fold_with::<L>(out, n, src, L::or, |a| a),
        ReduceOp::BitXor => fold_with::<L>(out, n, src, L::xor, |a| a),
    }
}

/// `out = last(((x0 f x1) f x2) ...)`, in rank order, whatever `n`.
#[inline(always)]
fn fold_with<'a, L: Lane>(
    out: &mut [u8],
    n: usize,
    src: impl Fn(usize) -> Src<'a>,
    f: impl Fn(L::A, L::A) -> L::A + Copy,
    last: impl Fn(L::A) -> L::A + Copy,
) {
    let s = L::SIZE;
    match n {
        1 => {
            if let Src::Ext(x) = src(0) {
                out.copy_from_slice(x);
            }
            out.chunks_exact_mut(s)
                .for_each(|o| L::store(last(L::load(o)), o));
        }
        2 => pair::<L>(out, src(0), src(1), |a, b| last(f(a, b))),
        _ => {
            let mut acc = [L::A::default(); BLOCK];
            let mut start = 0;
            while start < out.len() {
                let end = (start + BLOCK * s).min(out.len());
                let o = &mut out[start..end];
                let acc = &mut acc[..(end - start) / s];
                let x = |j: usize| src(j).sub(start, end);
                {
                    let o: &[u8] = o;
                    let (x0, x1) = (pick(x(0), o), pick(x(1), o));
                    let lanes = acc
                        .iter_mut()
                        .zip(x0.chunks_exact(s).zip(x1.chunks_exact(s)));
                    lanes.for_each(|(a, (b, c))| *a = f(L::load(b), L::load(c)));
                    for j in 2..n - 1 {
                        let lanes = acc.iter_mut().zip(pick(x(j), o).chunks_exact(s));
                        lanes.for_each(|(a, b)| *a = f(*a, L::load(b)));
                    }
                }
                match x(n - 1) {
                    Src::Ext(b) => acc
                        .iter()
                        .zip(o.chunks_exact_mut(s).zip(b.chunks_exact(s)))
                        .for_each(|(a, (o, b))| L::store(last(f(*a, L::load(b))), o)),
                    Src::Out => acc
                        .iter()
                        .zip(o.chunks_exact_mut(s))
                        .for_each(|(a, o)| L::store(last(f(*a, L::load(o))), o)),
                }
                start = end;
            }
        }
    }
}

fn pick<'b>(x: Src<'b>, out: &'b [u8]) -> &'b [u8] {
    match x {
        Src::Ext(b) => b,
        Src::Out => out,
    }
}

/// `out = g(a, b)` element by element; `a` or `b` may be `out` itself.
#[inline(always)]
fn pair<L: Lane>(out: &mut [u8], a: Src, b: Src, g: impl Fn(L::A, L::A) -> L::A) {
    let s = L::SIZE;
    match (a, b) {
        (Src::Ext(a), Src::Ext(b)) => out
            .chunks_exact_mut(s)
            .zip(a.chunks_exact(s).zip(b.chunks_exact(s)))
            .for_each(|(o, (a, b))| L::store(g(L::load(a), L::load(b)), o)),
        (Src::Out, Src::Ext(b)) => out
            .chunks_exact_mut(s)
            .zip(b.chunks_exact(s))
            .for_each(|(o, b)| L::store(g(L::load(o), L::load(b)), o)),
        (Src::Ext(a), Src::Out) => out
            .chunks_exact_mut(s)
            .zip(a.chunks_exact(s))
            .for_each(|(o, a)| L::store(g(L::load(a), L::load(o)), o)),
        (Src::Out, Src::Out) => unreachable!("one rank's input is `out`"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition the kernel must match bit for bit: one element at a
    /// time, accumulated in rank order, the average divided once.
    fn reference<L: Lane>(op: ReduceOp, inputs: &[Vec<u8>]) -> Vec<u8> {
        let n = inputs.len();
        let mut out = vec![0u8; inputs[0].len()];
        for (i, o) in out.chunks_exact_mut(L::SIZE).enumerate() {
            let at = |j: usize| L::load(&inputs[j][i * L::SIZE..(i + 1) * L::SIZE]);
            let mut a = at(0);
            for j in 1..n {
                a = match op {
                    ReduceOp::Sum | ReduceOp::Avg => L::add(a, at(j)),
                    ReduceOp::Max => L::max(a, at(j)),
                    ReduceOp::Min => L::min(a, at(j)),
                    ReduceOp::Prod => L::mul(a, at(j)),
                    ReduceOp::BitAnd => L::and(a, at(j)),
                    ReduceOp::BitOr => L::or(a, at(j)),
                    ReduceOp::BitXor => L::xor(a, at(j)),
                };
            }
            if op == ReduceOp::Avg {
                a = L::div(a, n);
            }
            L::store(a, o);
        }
        out
    }

    fn bytes(dtype: DType, rank: usize, count: usize) -> Vec<u8> {
        let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (rank as u64 * 0x1000_0001);
        let mut out = Vec::with_capacity(count * dtype.size());
        for i in 0..count {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let v = (x >> 11) as f64 / (1u64 << 53) as f64 * 200.0 - 100.0;
            // Some NaNs, infinities and signed zeros among the floats.
            let v = match (i + rank) % 97 {
                0 => f64::NAN,
                1 => f64::INFINITY,
                2 => -0.0,
                _ => v,
            };
            match dtype {
                DType::F32 => out.extend((v as f32).to_ne_bytes()),
                DType::F16 => out.extend(half::f16::from_f64(v).to_ne_bytes()),
                DType::BF16 => out.extend(half::bf16::from_f64(v).to_ne_bytes()),
                DType::I32 => out.extend((x as i32).to_ne_bytes()),
                DType::I64 => out.extend((x as i64).to_ne_bytes()),
                DType::F64 => out.extend(v.to_ne_bytes()),
                DType::U8 => out.push(x as u8),
                // Bytes other than 0 and 1 are true too.
                DType::Bool => out.push((x % 3) as u8 * (x >> 60) as u8),
            }
        }
        out
    }

    fn expected(dtype: DType, op: ReduceOp, inputs: &[Vec<u8>]) -> Vec<u8> {
        match dtype {
            DType::F32 => reference::<F32L>(op, inputs),
            DType::F16 => reference::<F16L>(op, inputs),
            DType::BF16 => reference::<BF16L>(op, inputs),
            DType::I32 => reference::<I32L>(op, inputs),
            DType::I64 => reference::<I64L>(op, inputs),
            DType::F64 => reference::<F64L>(op, inputs),
            DType::U8 => reference::<U8L>(op, inputs),
            DType::Bool => reference::<BoolL>(op, inputs),
        }
    }

    #[test]
    fn fold_matches_the_element_by_element_definition() {
        for dtype in DType::ALL {
            for n in 1..=5 {
                for count in [0, 1, 7, BLOCK - 1, BLOCK + 3, 3 * BLOCK + 17] {
                    let inputs: Vec<Vec<u8>> = (0..n).map(|r| bytes(dtype, r, count)).collect();
                    let refs: Vec<&[u8]> = inputs.iter().map(|b| &b[..]).collect();
                    for op in ReduceOp::ALL {
                        if check_op(dtype, op).is_err() {
                            continue;
                        }
                        let want = expected(dtype, op, &inputs);
                        for (me, mine) in inputs.iter().enumerate() {
                            let mut out = vec![0u8; want.len()];
                            fold(dtype, op, &mut out, Some(mine), me, &refs);
                            assert_eq!(out, want, "{dtype:?} {op:?} n {n} count {count} me {me}");
                            let mut out = mine.clone();
                            fold(dtype, op, &mut out, None, me, &refs);
                            assert_eq!(out, want, "in place: {dtype:?} {op:?} n {n} me {me}");
                        }
                    }
                }
            }
        }
    }
}
