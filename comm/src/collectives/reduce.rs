//! Element types, reduction operators and the local reduction kernel: `n`
//! inputs combined element by element, always in rank order
//! `((x0 op x1) op x2) ...`, so a result never depends on timing. f16 and
//! bf16 accumulate in f32 and round once; integers wrap.

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
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F16 | DType::BF16 => 2,
            DType::F32 | DType::I32 => 4,
            DType::I64 => 8,
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
        }
    }

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
}

impl ReduceOp {
    /// The short name (`sum`, `avg`...).
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Avg => "avg",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
        }
    }

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
}

macro_rules! float_lane {
    ($name:ident, $t:ty, $n:expr, $to:expr, $from:expr) => {
        struct $name;
        impl Lane for $name {
            const SIZE: usize = $n;
            type A = f32;
            #[inline(always)]
            fn load(b: &[u8]) -> f32 {
                $to(<$t>::from_ne_bytes(b.try_into().expect("lane")))
            }
            #[inline(always)]
            fn store(a: f32, b: &mut [u8]) {
                b.copy_from_slice(&$from(a).to_ne_bytes())
            }
            #[inline(always)]
            fn add(a: f32, b: f32) -> f32 {
                a + b
            }
            #[inline(always)]
            fn max(a: f32, b: f32) -> f32 {
                a.max(b)
            }
            #[inline(always)]
            fn min(a: f32, b: f32) -> f32 {
                a.min(b)
            }
            #[inline(always)]
            fn div(a: f32, n: usize) -> f32 {
                a / n as f32
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
                a / n as $t
            }
        }
    };
}

float_lane!(F32L, f32, 4, |x: f32| x, |x: f32| x);
float_lane!(F16L, f16, 2, f16::to_f32, f16::from_f32);
float_lane!(BF16L, bf16, 2, bf16::to_f32, bf16::from_f32);
int_lane!(I32L, i32);
int_lane!(I64L, i64);

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
    }
}

const BLOCK: usize = 1024;

fn fold_t<L: Lane>(op: ReduceOp, out: &mut [u8], own: Option<&[u8]>, me: usize, inputs: &[&[u8]]) {
    let n = inputs.len();
    let mut acc = [L::A::default(); BLOCK];
    let mut start = 0;
    while start < out.len() {
        let end = (start + BLOCK * L::SIZE).min(out.len());
        let acc = &mut acc[..(end - start) / L::SIZE];
        for (j, input) in inputs.iter().enumerate() {
            let src: &[u8] = match (j == me, own) {
                (true, Some(o)) => &o[start..end],
                (true, None) => &out[start..end],
                (false, _) => &input[start..end],
            };
            let lanes = acc.iter_mut().zip(src.chunks_exact(L::SIZE));
            match (j, op) {
                (0, _) => lanes.for_each(|(a, b)| *a = L::load(b)),
                (_, ReduceOp::Sum | ReduceOp::Avg) => {
                    lanes.for_each(|(a, b)| *a = L::add(*a, L::load(b)))
                }
                (_, ReduceOp::Max) => lanes.for_each(|(a, b)| *a = L::max(*a, L::load(b))),
                (_, ReduceOp::Min) => lanes.for_each(|(a, b)| *a = L::min(*a, L::load(b))),
            }
        }
        if op == ReduceOp::Avg {
            acc.iter_mut().for_each(|a| *a = L::div(*a, n));
        }
        for (a, b) in acc.iter().zip(out[start..end].chunks_exact_mut(L::SIZE)) {
            L::store(*a, b);
        }
        start = end;
    }
}
