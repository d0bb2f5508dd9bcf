//! The strided view through which every kernel sees memory, plus the cheap
//! sanity checks run on each view before a kernel touches it.

use crate::dtype::DType;
use crate::error::{KernelError, bail};

/// A strided view of device memory (which for this chip is ordinary host
/// memory).
#[derive(Clone, Copy, Debug)]
pub struct View<'a> {
    /// Address of the element at index `(0, 0, ...)` (byte offset already
    /// applied).
    pub ptr: *mut u8,
    /// Element type.
    pub dtype: DType,
    /// Extent of each dimension; all `>= 0`, a `0` means an empty tensor.
    pub shape: &'a [i64],
    /// Step of each dimension in elements; same length as `shape`, may be
    /// zero (broadcast inputs) or negative, in any order.
    pub strides: &'a [i64],
}

impl<'a> View<'a> {
    /// Builds a view.
    pub fn new(ptr: *mut u8, dtype: DType, shape: &'a [i64], strides: &'a [i64]) -> Self {
        Self {
            ptr,
            dtype,
            shape,
            strides,
        }
    }

    /// Number of elements (product of the shape; 1 for a scalar).
    pub fn numel(&self) -> usize {
        self.shape
            .iter()
            .fold(1usize, |acc, &n| acc.saturating_mul(n.max(0) as usize))
    }

    /// Whether the strides are those of a row-major contiguous tensor
    /// (dimensions of size 1 may have any stride).
    pub fn is_contiguous(&self) -> bool {
        crate::shape::contiguous_len(self.shape, self.strides).is_some()
    }

    /// Checks that the view is well formed: matching rank of shape and
    /// strides, no negative extent, and (when not empty) a non-null pointer
    /// aligned for the dtype.
    pub(crate) fn validate(&self, kernel: &str, name: &str) -> Result<(), KernelError> {
        if self.shape.len() != self.strides.len() {
            bail!(
                "{kernel}: {name}: shape has {} dims but strides has {}",
                self.shape.len(),
                self.strides.len()
            );
        }
        let mut numel: usize = 1;
        for &n in self.shape {
            if n < 0 {
                bail!(
                    "{kernel}: {name}: negative extent in shape {:?}",
                    self.shape
                );
            }
            numel = match numel.checked_mul(n as usize) {
                Some(v) => v,
                None => bail!(
                    "{kernel}: {name}: element count of shape {:?} overflows",
                    self.shape
                ),
            };
        }
        if numel > 0 {
            if self.ptr.is_null() {
                bail!("{kernel}: {name}: null pointer for a non-empty view");
            }
            if (self.ptr as usize) % self.dtype.size() != 0 {
                bail!(
                    "{kernel}: {name}: pointer {:p} is not aligned for {:?}",
                    self.ptr,
                    self.dtype
                );
            }
        }
        Ok(())
    }
}
