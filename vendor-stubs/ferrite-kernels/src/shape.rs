//! Shape bookkeeping: a small inline vector for per-dimension data, the
//! row-major contiguity test behind every fast path, and NumPy broadcasting
//! of a view's strides to a target shape.

use crate::error::{KernelError, bail};
use crate::view::View;

/// Dimensions held without a heap allocation.
const INLINE: usize = 8;

/// A tiny vector that keeps up to [`INLINE`] items inline and spills to the
/// heap only beyond that, so ordinary ranks never allocate.
#[derive(Clone, Debug)]
pub(crate) struct SmallDims<T: Copy + Default> {
    len: usize,
    inline: [T; INLINE],
    heap: Vec<T>,
}

impl<T: Copy + Default> SmallDims<T> {
    pub(crate) fn new() -> Self {
        Self {
            len: 0,
            inline: [T::default(); INLINE],
            heap: Vec::new(),
        }
    }

    pub(crate) fn push(&mut self, value: T) {
        if self.heap.is_empty() && self.len < INLINE {
            self.inline[self.len] = value;
        } else {
            if self.heap.is_empty() {
                self.heap.extend_from_slice(&self.inline[..self.len]);
            }
            self.heap.push(value);
        }
        self.len += 1;
    }

    pub(crate) fn as_slice(&self) -> &[T] {
        if self.heap.is_empty() {
            &self.inline[..self.len]
        } else {
            &self.heap
        }
    }
}

/// Element count of a row-major contiguous view, or `None` when the strides
/// are not row-major contiguous. Size-1 dimensions may have any stride.
#[inline]
pub(crate) fn contiguous_len(shape: &[i64], strides: &[i64]) -> Option<usize> {
    let mut expected: i64 = 1;
    for (&n, &s) in shape.iter().zip(strides).rev() {
        if n == 0 {
            return Some(0);
        }
        if n != 1 && s != expected {
            return None;
        }
        expected = expected.saturating_mul(n);
    }
    Some(expected as usize)
}

/// Strides (in elements) of `v` broadcast to `shape`: right-aligned, with
/// size-1 and missing leading dimensions getting stride 0.
pub(crate) fn broadcast_strides(
    name: &str,
    v: &View,
    shape: &[i64],
) -> Result<SmallDims<i64>, KernelError> {
    let (r, ro) = (v.shape.len(), shape.len());
    if r > ro {
        bail!("{name}: shape {:?} has more dims than {:?}", v.shape, shape);
    }
    let mut out = SmallDims::new();
    for (d, &n) in shape.iter().enumerate() {
        let s = match (d + r).checked_sub(ro) {
            None => 0,
            Some(k) if v.shape[k] == n => v.strides[k],
            Some(k) if v.shape[k] == 1 => 0,
            Some(_) => bail!(
                "{name}: shape {:?} does not broadcast to {:?}",
                v.shape,
                shape
            ),
        };
        out.push(s);
    }
    Ok(out)
}
