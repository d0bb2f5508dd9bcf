//! A checked, borrowed view of a [`PolychipTensor`] descriptor.

use std::fmt;
use std::ops::Deref;

use crate::abi::{POLYCHIP_DEVICE_TYPE_EXT, PolychipTensor};
use crate::check::ArgError;
use crate::dtype::DType;

/// Dimensions printed as `[2, 3]` in messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shape(pub Vec<i64>);

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

impl From<&[i64]> for Shape {
    fn from(dims: &[i64]) -> Shape {
        Shape(dims.to_vec())
    }
}

/// A tensor whose dtype, rank and extents have been checked: the dtype is one
/// of ABI v1's, every extent is `>= 0`, and `strides` (if any) has one entry
/// per dimension. `data` already includes the descriptor's `byte_offset`.
#[derive(Debug, Clone, Copy)]
pub struct TensorDesc<'a> {
    /// Device address of the element at index `(0, 0, ...)`.
    pub data: *mut u8,
    /// Element type.
    pub dtype: DType,
    /// Extents.
    pub shape: &'a [i64],
    /// Strides in elements; `None` means compact row-major.
    pub strides: Option<&'a [i64]>,
}

/// Strides materialised for a kernel: borrowed when the descriptor had them,
/// computed (inline for up to 8 dimensions) when it did not.
#[derive(Debug, Clone)]
pub enum Strides<'a> {
    /// The descriptor's own strides.
    Borrowed(&'a [i64]),
    /// Compact row-major strides for up to 8 dimensions.
    Inline([i64; 8], usize),
    /// Compact row-major strides for more dimensions.
    Heap(Vec<i64>),
}

impl Deref for Strides<'_> {
    type Target = [i64];
    fn deref(&self) -> &[i64] {
        match self {
            Strides::Borrowed(s) => s,
            Strides::Inline(s, n) => &s[..*n],
            Strides::Heap(s) => s,
        }
    }
}

/// Compact row-major strides of `shape`, in elements.
pub fn contiguous_strides(shape: &[i64]) -> Vec<i64> {
    let mut strides = vec![0; shape.len()];
    fill_contiguous(shape, &mut strides);
    strides
}

fn fill_contiguous(shape: &[i64], out: &mut [i64]) {
    let mut acc = 1i64;
    for (s, &d) in out.iter_mut().zip(shape).rev() {
        *s = acc;
        acc = acc.saturating_mul(d.max(1));
    }
}

impl<'a> TensorDesc<'a> {
    /// A descriptor for `data` with the given layout, unchecked.
    #[inline]
    pub fn new(data: *mut u8, dtype: DType, shape: &'a [i64], strides: Option<&'a [i64]>) -> Self {
        TensorDesc {
            data,
            dtype,
            shape,
            strides,
        }
    }

    #[inline]
    /// Checks a raw descriptor for operator `op`'s argument `name` on plugin
    /// device `device`.
    ///
    /// # Safety
    /// `raw.shape` and `raw.strides`, when non-NULL, must point to `raw.ndim`
    /// readable `i64`s that stay valid and unchanged for `'a`.
    pub unsafe fn from_raw(
        op: &'static str,
        name: &'static str,
        device: u32,
        raw: &'a PolychipTensor,
    ) -> Result<Self, ArgError> {
        let invalid = |message: String| ArgError::Invalid { op, message };
        let dtype = DType::from_raw(raw.dtype).ok_or(ArgError::UnknownDType {
            op,
            tensor: name,
            code: raw.dtype.code,
            bits: raw.dtype.bits,
            lanes: raw.dtype.lanes,
        })?;
        if raw.device.device_type != POLYCHIP_DEVICE_TYPE_EXT
            || i64::from(raw.device.device_id) != i64::from(device)
        {
            return Err(invalid(format!(
                "{name} is on device (type {}, id {}) but the call is for plugin device {device}",
                raw.device.device_type, raw.device.device_id
            )));
        }
        let ndim = usize::try_from(raw.ndim)
            .map_err(|_| invalid(format!("{name} has a negative ndim {}", raw.ndim)))?;
        let shape: &[i64] = if ndim == 0 {
            &[]
        } else if raw.shape.is_null() {
            return Err(invalid(format!("{name} has ndim {ndim} but a NULL shape")));
        } else {
            // SAFETY: the caller guarantees `shape` points to `ndim` valid i64s for 'a.
            unsafe { std::slice::from_raw_parts(raw.shape, ndim) }
        };
        if let Some(d) = shape.iter().find(|&&d| d < 0) {
            return Err(invalid(format!(
                "{name} has a negative extent {d} in shape {}",
                Shape::from(shape)
            )));
        }
        let strides = if raw.strides.is_null() || ndim == 0 {
            None
        } else {
            // SAFETY: as for `shape`: `strides` points to `ndim` valid i64s for 'a.
            Some(unsafe { std::slice::from_raw_parts(raw.strides, ndim) })
        };
        let offset = usize::try_from(raw.byte_offset).map_err(|_| {
            invalid(format!(
                "{name} has byte_offset {} beyond the address space",
                raw.byte_offset
            ))
        })?;
        Ok(TensorDesc {
            data: raw.data.cast::<u8>().wrapping_add(offset),
            dtype,
            shape,
            strides,
        })
    }

    #[inline]
    /// Number of dimensions.
    pub fn ndim(&self) -> usize {
        self.shape.len()
    }

    #[inline]
    /// Number of elements (0 when any extent is 0).
    pub fn numel(&self) -> usize {
        self.shape.iter().map(|&d| d as usize).product()
    }

    #[inline]
    /// The strides in elements, computed when the descriptor had none.
    pub fn strides(&self) -> Strides<'a> {
        match self.strides {
            Some(s) => Strides::Borrowed(s),
            None if self.shape.len() <= 8 => {
                let mut buf = [0i64; 8];
                fill_contiguous(self.shape, &mut buf[..self.shape.len()]);
                Strides::Inline(buf, self.shape.len())
            }
            None => Strides::Heap(contiguous_strides(self.shape)),
        }
    }

    #[inline]
    /// Whether the elements are compact and row-major (ignoring the strides
    /// of extent-1 dimensions).
    pub fn is_contiguous(&self) -> bool {
        let Some(strides) = self.strides else {
            return true;
        };
        let mut expected = 1i64;
        for (&d, &s) in self.shape.iter().zip(strides).rev() {
            if d != 1 && s != expected {
                return false;
            }
            expected = expected.saturating_mul(d);
        }
        true
    }

    #[inline]
    /// The byte range `[lo, hi)` relative to `data` that the tensor's elements
    /// occupy; `None` for an empty tensor.
    pub fn byte_span(&self) -> Option<(i64, i64)> {
        if self.shape.contains(&0) {
            return None;
        }
        let strides = self.strides();
        let (mut lo, mut hi) = (0i64, 0i64);
        for (&d, &s) in self.shape.iter().zip(strides.iter()) {
            let reach = (d - 1).saturating_mul(s);
            if reach < 0 {
                lo = lo.saturating_add(reach);
            } else {
                hi = hi.saturating_add(reach);
            }
        }
        let size = self.dtype.size() as i64;
        Some((
            lo.saturating_mul(size),
            hi.saturating_add(1).saturating_mul(size),
        ))
    }
}
