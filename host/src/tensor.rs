//! Tensors: a shared device buffer plus a dtype, shape, strides and offset,
//! and the host's copies of their elements to and from host memory and
//! between devices of any vendors.

use std::ffi::c_void;
use std::sync::Arc;

use polychip_plugin_sdk::abi::{POLYCHIP_DEVICE_TYPE_EXT, PolychipDevice, PolychipTensor};
use polychip_plugin_sdk::{DType, Shape, TensorDesc, contiguous_strides};

use crate::device::Device;
use crate::element::Element;
use crate::error::{HostError, Result};
use crate::memory::Buffer;
use crate::stream::Stream;

/// A strided view of device memory. Cloning shares the memory.
#[derive(Debug, Clone)]
pub struct Tensor {
    buffer: Arc<Buffer>,
    dtype: DType,
    shape: Vec<i64>,
    strides: Vec<i64>,
    offset: u64,
    /// Whether [`Tensor::raw`] gives the sparest descriptor the ABI allows
    /// (see [`Tensor::bare`]).
    bare: bool,
}

/// Calls `f` with the element offset of every index of `shape` under
/// `strides`, in row-major index order.
fn for_each_offset(shape: &[i64], strides: &[i64], mut f: impl FnMut(i64)) {
    if shape.contains(&0) {
        return;
    }
    let mut index = vec![0i64; shape.len()];
    let mut offset = 0i64;
    loop {
        f(offset);
        let mut k = shape.len();
        loop {
            if k == 0 {
                return;
            }
            k -= 1;
            index[k] += 1;
            offset += strides[k];
            if index[k] < shape[k] {
                break;
            }
            offset -= strides[k] * shape[k];
            index[k] = 0;
        }
    }
}

impl Tensor {
    pub(crate) fn compact(buffer: Arc<Buffer>, dtype: DType, shape: &[i64]) -> Tensor {
        Tensor {
            buffer,
            dtype,
            shape: shape.to_vec(),
            strides: contiguous_strides(shape),
            offset: 0,
            bare: false,
        }
    }

    /// A view of `buffer`: `dtype` elements of `shape` and `strides` (in
    /// elements) starting `byte_offset` bytes into it, which must lie inside it.
    pub fn from_buffer(
        buffer: Arc<Buffer>,
        dtype: DType,
        shape: &[i64],
        strides: &[i64],
        byte_offset: u64,
    ) -> Result<Tensor> {
        if byte_offset % dtype.size() as u64 != 0 {
            return Err(HostError::Usage(format!(
                "a {dtype} view cannot start at byte offset {byte_offset}, which is not a multiple of {}",
                dtype.size()
            )));
        }
        let base = Tensor::compact(buffer, dtype, &[0]);
        base.as_strided(shape, strides, (byte_offset / dtype.size() as u64) as i64)
    }

    /// The device holding it.
    pub fn device(&self) -> &Device {
        self.buffer.device()
    }

    /// Its memory.
    pub fn buffer(&self) -> &Arc<Buffer> {
        &self.buffer
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Extents.
    pub fn shape(&self) -> &[i64] {
        &self.shape
    }

    /// Strides in elements.
    pub fn strides(&self) -> &[i64] {
        &self.strides
    }

    /// Offset of element `(0, ...)` in bytes from the buffer's start.
    pub fn byte_offset(&self) -> u64 {
        self.offset
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().map(|&d| d as usize).product()
    }

    /// The checked descriptor the operator checks take.
    pub fn desc(&self) -> TensorDesc<'_> {
        TensorDesc::new(
            self.buffer
                .ptr()
                .cast::<u8>()
                .wrapping_add(self.offset as usize),
            self.dtype,
            &self.shape,
            Some(&self.strides),
        )
    }

    /// The same view, whose ABI descriptor ([`Tensor::raw`]) is the sparest
    /// the ABI allows, as a DLPack producer may pass it: NULL `strides` when
    /// the view is compact, and NULL `data` (and a zero `byte_offset`) when
    /// it has no elements (a zero-byte allocation may be NULL). The checks
    /// the host makes, and the elements, are those of the view itself.
    pub fn bare(&self) -> Tensor {
        Tensor {
            bare: true,
            ..self.clone()
        }
    }

    /// The ABI descriptor; borrows `self` for the pointers inside.
    pub fn raw(&self) -> PolychipTensor {
        let empty = self.bare && self.numel() == 0;
        let strides = if self.bare && self.is_compact() {
            std::ptr::null()
        } else {
            self.strides.as_ptr()
        };
        PolychipTensor {
            data: if empty {
                std::ptr::null_mut()
            } else {
                self.buffer.ptr()
            },
            device: PolychipDevice {
                device_type: POLYCHIP_DEVICE_TYPE_EXT,
                device_id: self.device().index() as i32,
            },
            ndim: self.shape.len() as i32,
            dtype: self.dtype.to_raw(),
            shape: self.shape.as_ptr(),
            strides,
            byte_offset: if empty { 0 } else { self.offset },
        }
    }

    /// Whether the elements are compact and row-major.
    pub fn is_compact(&self) -> bool {
        self.desc().is_contiguous()
    }

    /// A view with other extents, strides (elements) and offset (elements
    /// from this view's first element), checked to stay inside the buffer.
    pub fn as_strided(
        &self,
        shape: &[i64],
        strides: &[i64],
        offset_elements: i64,
    ) -> Result<Tensor> {
        if shape.len() != strides.len() || shape.iter().any(|&d| d < 0) {
            return Err(HostError::Usage(format!(
                "as_strided: shape {} and strides {} do not describe a view",
                Shape::from(shape),
                Shape::from(strides)
            )));
        }
        let overflow = || {
            HostError::Usage(format!(
                "as_strided: a view of shape {} with strides {} at element offset \
                 {offset_elements} overflows 64-bit sizes",
                Shape::from(shape),
                Shape::from(strides)
            ))
        };
        // Every count a view's users compute from it (its elements, its
        // bytes, its offset) must fit: checked here, once.
        shape
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d as usize))
            .and_then(|n| n.checked_mul(self.dtype.size()))
            .ok_or_else(overflow)?;
        let offset = offset_elements
            .checked_mul(self.dtype.size() as i64)
            .and_then(|o| o.checked_add(self.offset as i64))
            .ok_or_else(overflow)?;
        let view = Tensor {
            buffer: self.buffer.clone(),
            dtype: self.dtype,
            shape: shape.to_vec(),
            strides: strides.to_vec(),
            offset: offset.max(0) as u64,
            bare: false,
        };
        if let Some((lo, hi)) = view.desc().byte_span() {
            let (first, end) = (offset.checked_add(lo), offset.checked_add(hi));
            if offset < 0
                || first.is_none_or(|f| f < 0)
                || end.is_none_or(|e| e as u64 > self.buffer.len())
            {
                return Err(HostError::Usage(format!(
                    "as_strided: a view of shape {} with strides {} at element offset {offset_elements} reaches outside its {}-byte buffer",
                    Shape::from(shape),
                    Shape::from(strides),
                    self.buffer.len()
                )));
            }
        }
        Ok(view)
    }

    /// The view with dimensions `d0` and `d1` swapped.
    pub fn transpose(&self, d0: usize, d1: usize) -> Result<Tensor> {
        if d0 >= self.shape.len() || d1 >= self.shape.len() {
            return Err(HostError::Usage(format!(
                "transpose({d0}, {d1}) of a tensor with {} dimensions",
                self.shape.len()
            )));
        }
        let mut t = self.clone();
        t.shape.swap(d0, d1);
        t.strides.swap(d0, d1);
        Ok(t)
    }

    /// The same compact elements under another shape.
    pub fn reshape(&self, shape: &[i64]) -> Result<Tensor> {
        let numel: i64 = shape.iter().product();
        if !self.is_compact() || shape.iter().any(|&d| d < 0) || numel as usize != self.numel() {
            return Err(HostError::Usage(format!(
                "reshape: cannot view a {} tensor of shape {} as {}",
                if self.is_compact() {
                    "compact"
                } else {
                    "strided"
                },
                Shape::from(self.shape.as_slice()),
                Shape::from(shape)
            )));
        }
        let mut t = self.clone();
        t.shape = shape.to_vec();
        t.strides = contiguous_strides(shape);
        Ok(t)
    }

    fn device_addr(&self, byte: i64) -> *mut c_void {
        self.buffer
            .ptr()
            .cast::<u8>()
            .wrapping_offset(self.offset as isize + byte as isize)
            .cast()
    }

    /// Copies `bytes.len()` bytes from device address `offset` (relative to
    /// element 0) to host memory, on the default stream.
    fn d2h(&self, byte: i64, out: &mut [u8]) -> Result<()> {
        self.d2h_on(byte, out, None)
    }

    /// [`Tensor::d2h`] on `stream` (synchronized before returning) or the
    /// default stream.
    fn d2h_on(&self, byte: i64, out: &mut [u8], stream: Option<&Stream>) -> Result<()> {
        let device = self.device();
        // SAFETY: `out` is writable for its length, the device range lies in
        // the buffer (callers stay within the tensor's span), and the copy
        // completes before this returns (the default stream's before the
        // call returns, another stream's when it is synchronized below;
        // `out` and the buffer outlive both).
        unsafe {
            device.plugin().memcpy(
                "memcpy_d2h",
                device.index(),
                stream.map(Stream::raw),
                out.as_mut_ptr().cast(),
                self.device_addr(byte),
                out.len() as u64,
            )
        }?;
        stream.map_or(Ok(()), Stream::synchronize)
    }

    fn h2d(&self, byte: i64, data: &[u8]) -> Result<()> {
        self.h2d_on(byte, data, None)
    }

    fn h2d_on(&self, byte: i64, data: &[u8], stream: Option<&Stream>) -> Result<()> {
        let device = self.device();
        // SAFETY: as in `d2h_on`, with `data` readable and unchanged until
        // the copy completes.
        unsafe {
            device.plugin().memcpy(
                "memcpy_h2d",
                device.index(),
                stream.map(Stream::raw),
                self.device_addr(byte),
                data.as_ptr().cast(),
                data.len() as u64,
            )
        }?;
        stream.map_or(Ok(()), Stream::synchronize)
    }

    /// Checks that bytes `at..at + len` of this tensor's elements can be
    /// copied as one run on `stream`: a compact tensor, a range inside it,
    /// a stream of its device.
    fn check_range(&self, at: usize, len: usize, stream: Option<&Stream>) -> Result<()> {
        let bytes = self.numel() * self.dtype.size();
        if !self.is_compact() {
            return Err(HostError::Usage(format!(
                "a byte range of a {} tensor of shape {} with strides {:?}: only compact tensors \
                 are copied by byte range",
                self.dtype,
                Shape::from(self.shape.as_slice()),
                self.strides
            )));
        }
        if at.checked_add(len).is_none_or(|end| end > bytes) {
            return Err(HostError::Usage(format!(
                "bytes {at}..{} of a {} tensor of shape {} ({bytes} bytes): past its end",
                at.saturating_add(len),
                self.dtype,
                Shape::from(self.shape.as_slice()),
            )));
        }
        if let Some(s) = stream.filter(|s| s.device() != self.device()) {
            return Err(HostError::Usage(format!(
                "a tensor on {} copied on a stream of {}",
                self.device(),
                s.device()
            )));
        }
        Ok(())
    }

    /// Copies bytes `at..at + out.len()` of this compact tensor's elements
    /// into `out`, on `stream` (waiting for it) or, with `None`, on the
    /// device's default stream. A thread that copies while another runs
    /// work on the default stream passes a stream of its own: the ABI asks
    /// callers to serialize the calls on one stream.
    pub fn read_range(&self, at: usize, out: &mut [u8], stream: Option<&Stream>) -> Result<()> {
        self.check_range(at, out.len(), stream)?;
        if out.is_empty() {
            return Ok(());
        }
        self.d2h_on(at as i64, out, stream)
    }

    /// Copies `data` into bytes `at..at + data.len()` of this compact
    /// tensor's elements, on `stream` (waiting for it) or the default
    /// stream (see [`Tensor::read_range`]).
    pub fn write_range(&self, at: usize, data: &[u8], stream: Option<&Stream>) -> Result<()> {
        self.check_range(at, data.len(), stream)?;
        if data.is_empty() {
            return Ok(());
        }
        self.h2d_on(at as i64, data, stream)
    }

    /// The elements in row-major order as native-endian bytes.
    pub fn read_bytes(&self) -> Result<Vec<u8>> {
        let size = self.dtype.size();
        let Some((lo, hi)) = self.desc().byte_span() else {
            return Ok(Vec::new());
        };
        let mut span = vec![0u8; (hi - lo) as usize];
        self.d2h(lo, &mut span)?;
        if self.is_compact() {
            return Ok(span);
        }
        // A broadcast view of a small span may name far more elements than
        // the host can hold: an error, not an abort in the allocator.
        let mut out = Vec::new();
        out.try_reserve_exact(self.numel() * size).map_err(|_| {
            HostError::Usage(format!(
                "reading a {} tensor of shape {} needs {} bytes of host memory, which could not \
                 be allocated",
                self.dtype,
                Shape::from(self.shape.as_slice()),
                self.numel() * size
            ))
        })?;
        for_each_offset(&self.shape, &self.strides, |e| {
            let at = (e * size as i64 - lo) as usize;
            out.extend_from_slice(&span[at..at + size]);
        });
        Ok(out)
    }

    /// Copies the elements into `out` in row-major order (`out` holds exactly
    /// `numel * dtype size` bytes); a compact tensor is copied straight into
    /// `out`, without a staging buffer.
    pub fn read_into(&self, out: &mut [u8]) -> Result<()> {
        let size = self.dtype.size();
        if out.len() != self.numel() * size {
            return Err(HostError::Usage(format!(
                "{} bytes do not hold a {} tensor of shape {} ({} bytes)",
                out.len(),
                self.dtype,
                Shape::from(self.shape.as_slice()),
                self.numel() * size
            )));
        }
        match self.desc().byte_span() {
            None => Ok(()),
            Some((lo, _)) if self.is_compact() => self.d2h(lo, out),
            Some(_) => {
                out.copy_from_slice(&self.read_bytes()?);
                Ok(())
            }
        }
    }

    /// Overwrites the elements from row-major native-endian bytes.
    pub fn write_bytes(&self, data: &[u8]) -> Result<()> {
        let size = self.dtype.size();
        if data.len() != self.numel() * size {
            return Err(HostError::Usage(format!(
                "{} bytes do not fill a {} tensor of shape {} ({} bytes)",
                data.len(),
                self.dtype,
                Shape::from(self.shape.as_slice()),
                self.numel() * size
            )));
        }
        let Some((lo, hi)) = self.desc().byte_span() else {
            return Ok(());
        };
        if self.is_compact() {
            return self.h2d(lo, data);
        }
        // A view that reaches one element through several indices (a zero
        // stride) would keep only the last of their values: refused, as an
        // operator's output of that view is.
        polychip_plugin_sdk::check::writable("write", "tensor", &self.desc()).map_err(|e| {
            HostError::Usage(format!(
                "cannot write {} bytes into this view: {e}",
                data.len()
            ))
        })?;
        let mut span = vec![0u8; (hi - lo) as usize];
        self.d2h(lo, &mut span)?;
        let mut src = data.chunks_exact(size);
        for_each_offset(&self.shape, &self.strides, |e| {
            let at = (e * size as i64 - lo) as usize;
            span[at..at + size].copy_from_slice(src.next().expect("numel chunks"));
        });
        self.h2d(lo, &span)
    }

    /// The elements in row-major order.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        if T::DTYPE != self.dtype {
            return Err(HostError::Usage(format!(
                "to_vec::<{}>() of a {} tensor",
                T::DTYPE,
                self.dtype
            )));
        }
        Ok(T::from_bytes(&self.read_bytes()?))
    }

    /// A compact copy on `dst`, which may belong to another vendor. When one
    /// side's memory is host-visible the bytes move in one copy by the other
    /// side's plugin; otherwise they are staged through host memory.
    pub fn to_device(&self, dst: &Device) -> Result<Tensor> {
        let out = dst.empty(self.dtype, &self.shape)?;
        let bytes = (self.numel() * self.dtype.size()) as u64;
        if bytes == 0 {
            return Ok(out);
        }
        let src = self.device();
        if self.is_compact() && src != dst {
            if src.props().host_visible {
                // SAFETY: the source is host-visible memory holding `bytes`
                // bytes from device_addr(0); the destination is a fresh
                // allocation of the same size; the default stream completes the copy.
                return unsafe {
                    dst.plugin().memcpy(
                        "memcpy_h2d",
                        dst.index(),
                        None,
                        out.buffer.ptr(),
                        self.device_addr(0),
                        bytes,
                    )
                }
                .map(|()| out);
            }
            if dst.props().host_visible {
                // SAFETY: as above, with the destination host-visible.
                return unsafe {
                    src.plugin().memcpy(
                        "memcpy_d2h",
                        src.index(),
                        None,
                        out.buffer.ptr(),
                        self.device_addr(0),
                        bytes,
                    )
                }
                .map(|()| out);
            }
        }
        if src == dst && self.is_compact() {
            // SAFETY: both ranges lie in live allocations of this device and do not overlap.
            unsafe {
                src.plugin().memcpy(
                    "memcpy_d2d",
                    src.index(),
                    None,
                    out.buffer.ptr(),
                    self.device_addr(0),
                    bytes,
                )?;
            }
            return Ok(out);
        }
        out.write_bytes(&self.read_bytes()?)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::for_each_offset;

    #[test]
    fn offsets_follow_strides_in_row_major_order() {
        let mut seen = Vec::new();
        for_each_offset(&[2, 3], &[1, 2], |o| seen.push(o));
        assert_eq!(seen, [0, 2, 4, 1, 3, 5]);
        seen.clear();
        for_each_offset(&[], &[], |o| seen.push(o));
        assert_eq!(seen, [0], "a scalar has one element");
        seen.clear();
        for_each_offset(&[3, 0], &[1, 1], |o| seen.push(o));
        assert!(seen.is_empty());
    }
}
