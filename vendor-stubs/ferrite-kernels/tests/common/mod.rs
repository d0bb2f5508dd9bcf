//! Test support: owned tensors of any dtype with arbitrary layouts
//! (permuted storage order, padding, reversed dimensions), element access as
//! `f64`, a deterministic value generator, and tolerance helpers.
#![allow(dead_code)]

pub mod attention;
pub mod norm;
pub mod parity;
pub mod pointwise;
mod tol;

pub use tol::*;

use ferrite_kernels::{DType, View};
use half::{bf16, f16};

pub const FLOATS: [DType; 4] = [DType::F32, DType::F16, DType::BF16, DType::F64];
/// The dtypes the ABI 1.1 floating operators must support.
pub const FLOATS32: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// Unit roundoff of a float dtype.
pub fn eps(dt: DType) -> f64 {
    match dt {
        DType::F32 => 2f64.powi(-24),
        DType::F16 => 2f64.powi(-11),
        DType::BF16 => 2f64.powi(-8),
        _ => 2f64.powi(-53),
    }
}

/// How a tensor's elements are laid out in its buffer.
#[derive(Clone, Debug, Default)]
pub struct Layout {
    /// Storage order of the dimensions, outermost first (default: 0..r).
    pub order: Option<Vec<usize>>,
    /// Extra elements after each innermost storage line.
    pub pad: usize,
    /// Dimensions walked backwards (negative stride).
    pub flip: Vec<usize>,
}

impl Layout {
    pub fn contiguous() -> Self {
        Self::default()
    }
    /// Last two dimensions swapped in storage (a transposed view).
    pub fn transposed(rank: usize) -> Self {
        let mut order: Vec<usize> = (0..rank).collect();
        if rank >= 2 {
            order.swap(rank - 2, rank - 1);
        }
        Self {
            order: Some(order),
            ..Self::default()
        }
    }
    pub fn padded(pad: usize) -> Self {
        Self {
            pad,
            ..Self::default()
        }
    }
    pub fn flipped(dims: &[usize]) -> Self {
        Self {
            flip: dims.to_vec(),
            ..Self::default()
        }
    }
    /// A mix of all of the above.
    pub fn messy(rank: usize) -> Self {
        let mut l = Self::transposed(rank);
        l.pad = 3;
        l.flip = if rank > 0 { vec![0] } else { vec![] };
        l
    }
}

/// An owned tensor: 8-byte-aligned storage plus shape, strides and offset.
pub struct Tensor {
    pub dtype: DType,
    data: Vec<u64>,
    pub shape: Vec<i64>,
    pub strides: Vec<i64>,
    /// Element index of logical index (0, .., 0) in the buffer.
    pub offset: i64,
    pub storage_len: usize,
}

impl Tensor {
    pub fn new(dtype: DType, shape: &[i64], layout: &Layout) -> Self {
        let r = shape.len();
        let order = layout.order.clone().unwrap_or_else(|| (0..r).collect());
        let mut strides = vec![0i64; r];
        let mut running: i64 = 1;
        for (j, &d) in order.iter().enumerate().rev() {
            strides[d] = running;
            running *= shape[d].max(1);
            if j == r - 1 {
                running += layout.pad as i64;
            }
        }
        let storage_len = running.max(1) as usize;
        let mut offset = 0;
        for &d in &layout.flip {
            offset += (shape[d] - 1).max(0) * strides[d];
            strides[d] = -strides[d];
        }
        let words = (storage_len * dtype.size()).div_ceil(8) + 1;
        Self {
            dtype,
            data: vec![0; words],
            shape: shape.to_vec(),
            strides,
            offset,
            storage_len,
        }
    }

    /// A tensor whose elements are `f(linear logical index)`.
    pub fn from_fn(dtype: DType, shape: &[i64], layout: &Layout, f: impl Fn(usize) -> f64) -> Self {
        let mut t = Self::new(dtype, shape, layout);
        for i in 0..t.numel() {
            let pos = t.pos(i);
            t.set_raw(pos, f(i));
        }
        t
    }

    /// Deterministic pseudo-random values in about [-2, 2], distinct per seed.
    pub fn random(dtype: DType, shape: &[i64], layout: &Layout, seed: u64) -> Self {
        Self::from_fn(dtype, shape, layout, |i| rnd(seed, i))
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product::<i64>() as usize
    }

    pub fn view(&mut self) -> View<'_> {
        let ptr = self
            .base_ptr()
            .wrapping_add(self.offset as usize * self.dtype.size());
        View {
            ptr,
            dtype: self.dtype,
            shape: &self.shape,
            strides: &self.strides,
        }
    }

    pub fn base_ptr(&mut self) -> *mut u8 {
        self.data.as_mut_ptr() as *mut u8
    }

    /// Buffer position of the `i`-th element in logical row-major order.
    pub fn pos(&self, mut i: usize) -> usize {
        let mut p = self.offset;
        for d in (0..self.shape.len()).rev() {
            let n = self.shape[d] as usize;
            p += (i % n) as i64 * self.strides[d];
            i /= n;
        }
        p as usize
    }

    /// Element `i` in logical row-major order.
    pub fn get(&self, i: usize) -> f64 {
        self.get_raw(self.pos(i))
    }

    pub fn at(&self, idx: &[usize]) -> f64 {
        let p: i64 = self.offset
            + idx
                .iter()
                .zip(&self.strides)
                .map(|(&i, &s)| i as i64 * s)
                .sum::<i64>();
        self.get_raw(p as usize)
    }

    pub fn bits(&self, i: usize) -> u64 {
        let p = self.pos(i);
        let bytes = self.bytes();
        let sz = self.dtype.size();
        let mut b = [0u8; 8];
        b[..sz].copy_from_slice(&bytes[p * sz..(p + 1) * sz]);
        u64::from_le_bytes(b)
    }

    pub fn set_bits(&mut self, i: usize, v: u64) {
        let p = self.pos(i);
        let sz = self.dtype.size();
        self.bytes_mut()[p * sz..(p + 1) * sz].copy_from_slice(&v.to_le_bytes()[..sz]);
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: reinterpreting initialised u64 storage as bytes.
        unsafe { std::slice::from_raw_parts(self.data.as_ptr() as *const u8, self.data.len() * 8) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: reinterpreting initialised u64 storage as bytes.
        unsafe {
            std::slice::from_raw_parts_mut(self.data.as_mut_ptr() as *mut u8, self.data.len() * 8)
        }
    }

    /// Raw buffer element at position `p`, as f64 (any dtype).
    pub fn get_raw(&self, p: usize) -> f64 {
        let sz = self.dtype.size();
        let b = &self.bytes()[p * sz..(p + 1) * sz];
        match self.dtype {
            DType::F32 => f32::from_le_bytes(b.try_into().unwrap()) as f64,
            DType::F64 => f64::from_le_bytes(b.try_into().unwrap()),
            DType::F16 => f16::from_le_bytes(b.try_into().unwrap()).to_f64(),
            DType::BF16 => bf16::from_le_bytes(b.try_into().unwrap()).to_f64(),
            DType::I32 => i32::from_le_bytes(b.try_into().unwrap()) as f64,
            DType::I64 => i64::from_le_bytes(b.try_into().unwrap()) as f64,
            DType::U8 | DType::Bool => b[0] as f64,
        }
    }

    /// Sets raw buffer element `p` (values should be representable).
    pub fn set_raw(&mut self, p: usize, v: f64) {
        let sz = self.dtype.size();
        let bytes: Vec<u8> = match self.dtype {
            DType::F32 => (v as f32).to_le_bytes().to_vec(),
            DType::F64 => v.to_le_bytes().to_vec(),
            DType::F16 => f16::from_f32(v as f32).to_le_bytes().to_vec(),
            DType::BF16 => bf16::from_f32(v as f32).to_le_bytes().to_vec(),
            DType::I32 => (v as i32).to_le_bytes().to_vec(),
            DType::I64 => (v as i64).to_le_bytes().to_vec(),
            DType::U8 | DType::Bool => vec![v as u8],
        };
        self.bytes_mut()[p * sz..(p + 1) * sz].copy_from_slice(&bytes);
    }

    /// Fills every buffer slot (including padding) with `v`.
    pub fn fill_storage(&mut self, v: f64) {
        for p in 0..self.storage_len {
            self.set_raw(p, v);
        }
    }

    /// Buffer positions not addressed by the view.
    pub fn padding_positions(&self) -> Vec<usize> {
        let mut used = vec![false; self.storage_len];
        for i in 0..self.numel() {
            used[self.pos(i)] = true;
        }
        (0..self.storage_len).filter(|&p| !used[p]).collect()
    }
}

/// Deterministic value in about [-2, 2] with a few fractional bits.
pub fn rnd(seed: u64, i: usize) -> f64 {
    let mut x =
        seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (i as u64).wrapping_mul(0xD1B5_4A32_D192_ED03);
    x ^= x >> 31;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 29;
    ((x % 4001) as f64 - 2000.0) / 1000.0
}

/// Row-major unravel of `i` for `shape`.
pub fn unravel(mut i: usize, shape: &[i64]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        let n = shape[d] as usize;
        idx[d] = i % n;
        i /= n;
    }
    idx
}

/// Asserts `got` is within `tol` of `want` (NaN must match NaN, infinities
/// must match exactly).
pub fn assert_close(got: f64, want: f64, tol: f64, ctx: &str) {
    if want.is_nan() {
        assert!(got.is_nan(), "{ctx}: got {got}, want NaN");
    } else if want.is_infinite() {
        assert_eq!(got, want, "{ctx}");
    } else {
        assert!(
            (got - want).abs() <= tol,
            "{ctx}: got {got}, want {want}, tol {tol:e}"
        );
    }
}
