//! Tensors: allocate on any device of any vendor, view with shape, strides
//! and offset, copy between host memory and devices and between devices of
//! different vendors, and describe.
//!
//! A tensor handle owns a view of a device buffer; views share the buffer,
//! which is freed when the last view (and the last stream work using it) is
//! gone, whatever happens to the runtime that made it.

use std::ffi::c_void;
use std::sync::Arc;

use polychip_host::{DType, Tensor};

use crate::error::{
    ApiError, ApiResult, POLYCHIP_API_ERROR_DTYPE_MISMATCH, POLYCHIP_API_ERROR_SHAPE_MISMATCH,
    guard, polychip_error_t, quiet,
};
use crate::handle::{Handle, Registry};
use crate::runtime::{RUNTIMES, polychip_runtime_t};
use crate::{out_param, struct_prefix};

/// A tensor: a strided view of device memory. Opaque.
#[allow(non_camel_case_types)]
#[derive(Debug)]
pub struct polychip_tensor_t {
    _private: [u8; 0],
}

/// An element type.
pub type polychip_dtype_t = u32;
/// 32-bit IEEE float.
pub const POLYCHIP_DTYPE_F32: polychip_dtype_t = 0;
/// 16-bit IEEE float.
pub const POLYCHIP_DTYPE_F16: polychip_dtype_t = 1;
/// bfloat16.
pub const POLYCHIP_DTYPE_BF16: polychip_dtype_t = 2;
/// 64-bit IEEE float.
pub const POLYCHIP_DTYPE_F64: polychip_dtype_t = 3;
/// 32-bit signed integer.
pub const POLYCHIP_DTYPE_I32: polychip_dtype_t = 4;
/// 64-bit signed integer.
pub const POLYCHIP_DTYPE_I64: polychip_dtype_t = 5;
/// 8-bit unsigned integer.
pub const POLYCHIP_DTYPE_U8: polychip_dtype_t = 6;
/// Boolean, one byte.
pub const POLYCHIP_DTYPE_BOOL: polychip_dtype_t = 7;

pub(crate) fn dtype(code: polychip_dtype_t, name: &str) -> ApiResult<DType> {
    DType::ALL.get(code as usize).copied().ok_or_else(|| {
        ApiError::invalid(format!(
            "{name} {code} is not a polychip_dtype_t (POLYCHIP_DTYPE_F32 = 0 to POLYCHIP_DTYPE_BOOL = 7)"
        ))
    })
}

pub(crate) fn dtype_code(dtype: DType) -> polychip_dtype_t {
    DType::ALL
        .iter()
        .position(|&d| d == dtype)
        .expect("every dtype is listed") as u32
}

/// What a tensor handle holds: the view, and the index of its device in the
/// runtime that made it.
#[derive(Debug)]
pub(crate) struct TensorObject {
    pub(crate) tensor: Tensor,
    pub(crate) device: u32,
}

pub(crate) static TENSORS: Registry<TensorObject> = Registry::new(Handle::TENSOR);

/// The tensor behind a handle argument named `name`.
pub(crate) fn tensor(handle: *const polychip_tensor_t, name: &str) -> ApiResult<Arc<TensorObject>> {
    TENSORS.get(handle.cast(), name)
}

/// Hands a new tensor to the caller.
pub(crate) fn give(tensor: Tensor, device: u32) -> *mut polychip_tensor_t {
    TENSORS.insert(TensorObject { tensor, device }).cast()
}

/// `ndim` extents at `shape`, checked.
///
/// # Safety
/// `shape` points to `ndim` readable `int64_t`s when `ndim > 0`.
pub(crate) unsafe fn dims<'a>(ndim: i32, shape: *const i64, name: &str) -> ApiResult<&'a [i64]> {
    let n =
        usize::try_from(ndim).map_err(|_| ApiError::invalid(format!("ndim {ndim} is negative")))?;
    if n == 0 {
        return Ok(&[]);
    }
    if shape.is_null() {
        return Err(ApiError::invalid(format!("{name} is NULL for ndim {n}")));
    }
    crate::address(shape, name)?;
    if n > 64 {
        return Err(ApiError::invalid(format!(
            "ndim {n} is above the 64 dimensions polychip supports"
        )));
    }
    // SAFETY: per the contract, `n` readable i64s.
    Ok(unsafe { std::slice::from_raw_parts(shape, n) })
}

/// Refuses a view that 64-bit sizes cannot describe: its element count,
/// its byte size, or the bytes its strides reach from `first_byte` (the
/// byte offset of its first element) overflowing. `what` describes it in
/// the message ("a f32 view of shape [..] with strides [..] at element
/// offset 3"). Negative extents are left to the host's checks.
pub(crate) fn check_view_sizes(
    what: impl Fn() -> String,
    dtype: DType,
    shape: &[i64],
    strides: &[i64],
    first_byte: i128,
) -> ApiResult<()> {
    if shape.iter().any(|&d| d < 0) || shape.len() != strides.len() {
        return Ok(());
    }
    let size = dtype.size() as i128;
    let overflow = || ApiError::invalid(format!("{} overflows 64-bit sizes", what()));
    // The element count in the order the host multiplies it, then bytes.
    let mut numel: i64 = 1;
    for &d in shape {
        numel = numel.checked_mul(d).ok_or_else(overflow)?;
    }
    if i128::from(numel) * size > i128::from(i64::MAX) {
        return Err(overflow());
    }
    // The farthest byte either way from the buffer's start.
    let mut reach = first_byte.abs() + size;
    if numel > 0 {
        for (&d, &s) in shape.iter().zip(strides) {
            reach = reach.saturating_add(i128::from(d - 1) * i128::from(s).abs() * size);
        }
    }
    if reach > i128::from(i64::MAX) {
        return Err(overflow());
    }
    Ok(())
}

/// `bytes`, the caller's buffer length, checked to be `t`'s size before
/// any slice of it is made (`verb`: "hold" or "fill").
fn check_byte_count(t: &Tensor, bytes: usize, verb: &str) -> ApiResult<()> {
    let expected = t.numel() as u128 * t.dtype().size() as u128;
    if bytes as u128 != expected {
        return Err(ApiError::invalid(format!(
            "{bytes} bytes do not {verb} a {} tensor of shape {:?} ({expected} bytes)",
            t.dtype(),
            t.shape()
        )));
    }
    Ok(())
}

/// Whether the host bytes `start..start + len` overlap `t`'s buffer.
fn overlaps(t: &Tensor, start: usize, len: usize) -> bool {
    let base = t.buffer().ptr() as usize;
    let end = base.saturating_add(t.buffer().len() as usize);
    len > 0 && start < end && base < start.saturating_add(len)
}

/// Room for `len` bytes of host memory to stage a copy of `name` through
/// (it overlaps the tensor's own memory), or OUT_OF_MEMORY naming it.
fn staging(len: usize, name: &str) -> ApiResult<Vec<u8>> {
    let mut staged = Vec::new();
    staged.try_reserve_exact(len).map_err(|_| {
        ApiError::new(
            crate::error::POLYCHIP_API_ERROR_OUT_OF_MEMORY,
            format!(
                "{name} overlaps the tensor's own memory, and the {len} bytes of host memory \
                 to stage the copy through could not be allocated"
            ),
        )
    })?;
    Ok(staged)
}

/// A description of a tensor. Pointers are owned by the tensor and valid
/// until it is destroyed.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy)]
pub struct polychip_tensor_info_t {
    /// Size of this struct as the caller knows it.
    pub struct_size: usize,
    /// The device's index in the runtime that made the tensor.
    pub device: u32,
    /// Element type.
    pub dtype: polychip_dtype_t,
    /// Number of dimensions.
    pub ndim: i32,
    /// `ndim` extents.
    pub shape: *const i64,
    /// `ndim` strides, in elements.
    pub strides: *const i64,
    /// The device address of the buffer (dereferenceable by the host only on
    /// host-visible devices).
    pub data: *mut c_void,
    /// Bytes from `data` to the element at index 0.
    pub byte_offset: u64,
    /// Number of elements.
    pub numel: u64,
    /// Whether the elements are compact and row-major.
    pub contiguous: bool,
}

/// A new tensor of `dtype` and `shape` on device `device` of `runtime`,
/// compact row-major, its contents undefined (`zero`: zeros).
///
/// Ownership: `*out` is the caller's, freed with `polychip_tensor_destroy`.
/// Thread safety: any thread.
///
/// # Safety
/// `shape` points to `ndim` readable `int64_t`s; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn polychip_tensor_new(
    runtime: *const polychip_runtime_t,
    device: u32,
    dtype: polychip_dtype_t,
    ndim: i32,
    shape: *const i64,
    zero: bool,
    out: *mut *mut polychip_tensor_t,
) -> *mut polychip_error_t {
    guard("polychip_tensor_new", || {
        let out = out_param(out, "out")?;
        let rt = RUNTIMES.get(runtime.cast(), "runtime")?;
        let dev = rt.device(device)?;
        let dtype = self::dtype(dtype, "dtype")?;
        // SAFETY: forwarded contract.
        let shape = unsafe { dims(ndim, shape, "shape")? };
        let t = if zero {
            dev.zeros(dtype, shape)?
        } else {
            dev.empty(dtype, shape)?
        };
        // SAFETY: checked non-NULL; writable per the contract.
        unsafe { out.write(give(t, device)) };
        Ok(())
    })
}

/// A view of `tensor`'s buffer with its own shape, strides (in elements) and
/// offset (in elements, from `tensor`'s first element); it must lie inside
/// the buffer. The view shares the memory and keeps it alive.
///
/// Ownership: `*out` is the caller's. Thread safety: any thread.
///
/// # Safety
/// `shape` and `strides` point to `ndim` readable `int64_t`s; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn polychip_tensor_view(
    tensor: *const polychip_tensor_t,
    ndim: i32,
    shape: *const i64,
    strides: *const i64,
    offset: i64,
    out: *mut *mut polychip_tensor_t,
) -> *mut polychip_error_t {
    guard("polychip_tensor_view", || {
        let out = out_param(out, "out")?;
        let t = self::tensor(tensor, "tensor")?;
        // SAFETY: forwarded contract.
        let (shape, strides) =
            unsafe { (dims(ndim, shape, "shape")?, dims(ndim, strides, "strides")?) };
        let first = i128::from(t.tensor.byte_offset())
            + i128::from(offset) * t.tensor.dtype().size() as i128;
        let dtype = t.tensor.dtype();
        let what = || {
            format!(
                "a {dtype} view of shape {shape:?} with strides {strides:?} at element offset {offset}"
            )
        };
        check_view_sizes(what, dtype, shape, strides, first)?;
        let view = t.tensor.as_strided(shape, strides, offset)?;
        // SAFETY: checked non-NULL; writable per the contract.
        unsafe { out.write(give(view, t.device)) };
        Ok(())
    })
}

/// A view of `tensor`'s buffer as elements of another type: `dtype`, with
/// its own shape and strides (in elements of `dtype`), starting
/// `byte_offset` bytes from the start of the buffer (not from `tensor`'s
/// first element); the offset must be a multiple of `dtype`'s size and the
/// view must lie inside the buffer. This is how a framework that allocates
/// raw bytes (PyTorch's storages) hands typed views of them to operators.
///
/// Ownership: `*out` is the caller's. Thread safety: any thread.
///
/// # Safety
/// `shape` and `strides` point to `ndim` readable `int64_t`s; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn polychip_tensor_view_as(
    tensor: *const polychip_tensor_t,
    dtype: polychip_dtype_t,
    ndim: i32,
    shape: *const i64,
    strides: *const i64,
    byte_offset: u64,
    out: *mut *mut polychip_tensor_t,
) -> *mut polychip_error_t {
    guard("polychip_tensor_view_as", || {
        let out = out_param(out, "out")?;
        let t = self::tensor(tensor, "tensor")?;
        let dtype = self::dtype(dtype, "dtype")?;
        // SAFETY: forwarded contract.
        let (shape, strides) =
            unsafe { (dims(ndim, shape, "shape")?, dims(ndim, strides, "strides")?) };
        let len = t.tensor.buffer().len();
        if byte_offset > len {
            return Err(ApiError::invalid(format!(
                "byte offset {byte_offset} is past the end of the tensor's {len}-byte buffer"
            )));
        }
        check_view_sizes(
            || {
                format!(
                    "a {dtype} view of shape {shape:?} with strides {strides:?} at byte offset {byte_offset}"
                )
            },
            dtype,
            shape,
            strides,
            i128::from(byte_offset),
        )?;
        let view = Tensor::from_buffer(
            t.tensor.buffer().clone(),
            dtype,
            shape,
            strides,
            byte_offset,
        )?;
        // SAFETY: checked non-NULL; writable per the contract.
        unsafe { out.write(give(view, t.device)) };
        Ok(())
    })
}

/// Frees a tensor handle (its memory goes when no view or queued work uses
/// it). NULL is ignored; a handle that is not a live tensor is logged.
///
/// Thread safety: any thread, not concurrently with a call using `tensor`.
#[unsafe(no_mangle)]
pub extern "C" fn polychip_tensor_destroy(tensor: *mut polychip_tensor_t) {
    quiet("polychip_tensor_destroy", (), || {
        if !tensor.is_null() {
            if let Err(e) = TENSORS.remove(tensor.cast(), "tensor") {
                log::warn!("polychip_tensor_destroy: {}", e.message);
            }
        }
    })
}

/// Describes `tensor`, writing the fields `info->struct_size` covers.
///
/// Thread safety: any thread.
///
/// # Safety
/// `info` points to a writable struct of its own `struct_size`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn polychip_tensor_info(
    tensor: *const polychip_tensor_t,
    info: *mut polychip_tensor_info_t,
) -> *mut polychip_error_t {
    guard("polychip_tensor_info", || {
        let info = out_param(info, "info")?;
        let t = self::tensor(tensor, "tensor")?;
        let v = &t.tensor;
        let full = polychip_tensor_info_t {
            struct_size: size_of::<polychip_tensor_info_t>(),
            device: t.device,
            dtype: dtype_code(v.dtype()),
            ndim: v.shape().len() as i32,
            // The registry keeps the object, and so these arrays, alive
            // until the handle is destroyed.
            shape: v.shape().as_ptr(),
            strides: v.strides().as_ptr(),
            data: v.buffer().ptr(),
            byte_offset: v.byte_offset(),
            numel: v.numel() as u64,
            contiguous: v.is_compact(),
        };
        // SAFETY: per this function's contract.
        unsafe { struct_prefix::write(info, &full, "info") }
    })
}

/// Copies `bytes` bytes of host memory at `src` into `tensor`'s elements,
/// in row-major order (`bytes` must be exactly numel × element size).
/// Returns when the copy is done. `src` may overlap the tensor's own memory
/// (a host-visible device's): the copy is then staged through host memory.
///
/// Thread safety: any thread.
///
/// # Safety
/// `src` points to `bytes` readable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn polychip_tensor_write(
    tensor: *const polychip_tensor_t,
    src: *const c_void,
    bytes: usize,
) -> *mut polychip_error_t {
    guard("polychip_tensor_write", || {
        let t = self::tensor(tensor, "tensor")?;
        if src.is_null() && bytes > 0 {
            return Err(ApiError::invalid(format!("src is NULL for {bytes} bytes")));
        }
        if bytes > 0 {
            // (Empty slices' pointers are dangling, like Rust's 0x1.)
            crate::address(src, "src")?;
        }
        check_byte_count(&t.tensor, bytes, "fill")?;
        let data: &[u8] = if bytes == 0 {
            &[]
        } else {
            // SAFETY: per the contract, `bytes` readable bytes.
            unsafe { std::slice::from_raw_parts(src.cast(), bytes) }
        };
        // Host memory that is the tensor's own (a host-visible device's,
        // found through polychip_tensor_info) goes through a copy: the
        // plugin's copy takes ranges that do not overlap.
        if overlaps(&t.tensor, src as usize, bytes) {
            let mut staged = staging(bytes, "src")?;
            staged.extend_from_slice(data);
            return Ok(t.tensor.write_bytes(&staged)?);
        }
        Ok(t.tensor.write_bytes(data)?)
    })
}

/// Copies `tensor`'s elements, in row-major order, into `bytes` bytes of
/// host memory at `dst` (exactly numel × element size). Returns when done.
/// `dst` may overlap the tensor's own memory, as for `polychip_tensor_write`.
///
/// Thread safety: any thread.
///
/// # Safety
/// `dst` points to `bytes` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn polychip_tensor_read(
    tensor: *const polychip_tensor_t,
    dst: *mut c_void,
    bytes: usize,
) -> *mut polychip_error_t {
    guard("polychip_tensor_read", || {
        let t = self::tensor(tensor, "tensor")?;
        if dst.is_null() && bytes > 0 {
            return Err(ApiError::invalid(format!("dst is NULL for {bytes} bytes")));
        }
        if bytes > 0 {
            // (Empty slices' pointers are dangling, like Rust's 0x1.)
            crate::address(dst, "dst")?;
        }
        check_byte_count(&t.tensor, bytes, "hold")?;
        if bytes > 0 && overlaps(&t.tensor, dst as usize, bytes) {
            // As for a write: read into host memory of its own first.
            let mut staged = staging(bytes, "dst")?;
            staged.resize(bytes, 0);
            t.tensor.read_into(&mut staged)?;
            // SAFETY: per the contract, `bytes` writable bytes; `staged` is
            // a separate allocation of as many.
            unsafe { std::ptr::copy(staged.as_ptr(), dst.cast::<u8>(), bytes) };
            return Ok(());
        }
        let out: &mut [u8] = if bytes == 0 {
            &mut []
        } else {
            // SAFETY: per the contract, `bytes` writable bytes.
            unsafe { std::slice::from_raw_parts_mut(dst.cast(), bytes) }
        };
        Ok(t.tensor.read_into(out)?)
    })
}

/// A compact copy of `tensor` on device `device` of `runtime`, which may
/// belong to another vendor (one copy when either side's memory is
/// host-visible, otherwise staged through host memory). Returns when done.
///
/// Ownership: `*out` is the caller's. Thread safety: any thread.
///
/// # Safety
/// `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn polychip_tensor_to_device(
    tensor: *const polychip_tensor_t,
    runtime: *const polychip_runtime_t,
    device: u32,
    out: *mut *mut polychip_tensor_t,
) -> *mut polychip_error_t {
    guard("polychip_tensor_to_device", || {
        let out = out_param(out, "out")?;
        let t = self::tensor(tensor, "tensor")?;
        let rt = RUNTIMES.get(runtime.cast(), "runtime")?;
        let copy = t.tensor.to_device(rt.device(device)?)?;
        // SAFETY: checked non-NULL; writable per the contract.
        unsafe { out.write(give(copy, device)) };
        Ok(())
    })
}

/// Copies `src` into `dst`: same dtype and shape, any strides, any devices
/// (of one vendor or two). On one device the copy runs on the default
/// stream; across devices it is staged through host memory. Returns when done.
///
/// Thread safety: any thread.
#[unsafe(no_mangle)]
pub extern "C" fn polychip_tensor_copy(
    src: *const polychip_tensor_t,
    dst: *const polychip_tensor_t,
) -> *mut polychip_error_t {
    guard("polychip_tensor_copy", || {
        let (s, d) = (tensor(src, "src")?, tensor(dst, "dst")?);
        let (s, d) = (&s.tensor, &d.tensor);
        if s.device() == d.device() {
            return Ok(d.device().exec().copy(s, d)?);
        }
        // The codes the one-device copy gives (the plugin's argument check).
        let differ = match (s.dtype() != d.dtype(), s.shape() != d.shape()) {
            (true, _) => Some(POLYCHIP_API_ERROR_DTYPE_MISMATCH),
            (false, true) => Some(POLYCHIP_API_ERROR_SHAPE_MISMATCH),
            (false, false) => None,
        };
        if let Some(code) = differ {
            return Err(ApiError::new(
                code,
                format!(
                    "src is {} {:?} but dst is {} {:?}; a copy needs one dtype and shape",
                    s.dtype(),
                    s.shape(),
                    d.dtype(),
                    d.shape()
                ),
            ));
        }
        let moved = s.to_device(d.device())?;
        Ok(d.device().exec().copy(&moved, d)?)
    })
}
