//! libpolychip: the polychip host as a C API, for frameworks written in C,
//! C++ or anything with a C FFI. `include/libpolychip.h` is generated from
//! this crate by cbindgen and checked fresh by `cargo test`; the vendors'
//! contract, `include/polychip.h`, is a different header.
//!
//! The rules are the plugin ABI's own: the caller states the API version it
//! was built for (`polychip_runtime_options_t.api_major/api_minor`) and the
//! library refuses another major or a newer minor; structs crossing the
//! boundary start with `struct_size` and only grow; a fallible function
//! returns a `polychip_error_t *` (NULL is success) that the caller frees;
//! out-params are written only on success; every handle is looked up, so a
//! NULL, freed or foreign handle is an error naming the argument; no panic
//! crosses the boundary. Ownership and thread safety are stated per
//! function in the header.
//!
//! The operator functions (`polychip_op_*`) are derived from
//! `spec/ops.toml` (`ops/generated.rs`) and run the host's checked calls.

// The C names (`polychip_tensor_t`, ...) keep C's conventions, so that the
// embedding API reads apart from the vendors' `Polychip*` ABI types.
#![allow(non_camel_case_types)]

mod comm;
mod dlpack;
mod error;
mod handle;
mod log;
mod ops;
mod runtime;
mod stream;
mod tensor;

pub use comm::*;
pub use dlpack::*;
pub use error::*;
pub use ops::*;
pub use runtime::*;
pub use stream::*;
pub use tensor::*;

use std::ptr::NonNull;

use crate::error::{ApiError, ApiResult};

/// The API major version this header describes; another major is
/// incompatible.
pub const POLYCHIP_API_MAJOR: u32 = 1;
/// The API minor version this header describes; minors only add functions
/// and append struct fields.
pub const POLYCHIP_API_MINOR: u32 = 1;

/// A non-NULL out-param, or an error naming it.
fn out_param<T>(ptr: *mut T, name: &str) -> ApiResult<NonNull<T>> {
    let ptr = NonNull::new(ptr).ok_or_else(|| ApiError::invalid(format!("{name} is NULL")))?;
    address(ptr.as_ptr(), name)?;
    Ok(ptr)
}

/// Refuses a non-NULL pointer argument that no allocation has, before it
/// is dereferenced: one of libpolychip's handles (a `polychip_tensor_t *`
/// passed where a buffer or a DLPack struct belongs: both are opaque
/// pointers to C, and reading through a handle crashed), or an address in
/// the first page (a small integer or an offset passed as a pointer).
fn address<T>(ptr: *const T, name: &str) -> ApiResult<()> {
    let value = ptr as usize;
    if value == 0 {
        return Ok(());
    }
    if let Some(kind) = handle::kind_of(value) {
        return Err(ApiError::invalid(format!(
            "{name} is a {kind} handle ({ptr:p}), not a pointer to memory"
        )));
    }
    if value < 4096 {
        return Err(ApiError::invalid(format!(
            "{name} ({ptr:p}) is not an address (it lies in the first page)"
        )));
    }
    Ok(())
}

/// Size-first structs crossing the boundary: every field of API 1.0 is
/// required, so a struct shorter than this library's is refused (a longer
/// one, from a newer header, is read or written up to the fields known here).
mod struct_prefix {
    use std::ptr::NonNull;

    use crate::error::{ApiError, ApiResult};

    /// The caller's `struct_size`, checked to cover every field of API 1.0.
    ///
    /// # Safety
    /// `ptr` points to a readable struct starting with a `usize`.
    unsafe fn size_of_callers<T>(ptr: *const T, name: &str) -> ApiResult<usize> {
        crate::address(ptr, name)?;
        // SAFETY: per the contract, the struct starts with a readable usize
        // (read unaligned: a packed caller's struct is not undefined here).
        let size = unsafe { ptr.cast::<usize>().read_unaligned() };
        if size < size_of::<T>() {
            return Err(ApiError::invalid(format!(
                "{name}->struct_size is {size} but polychip API 1.0 needs at least {}",
                size_of::<T>()
            )));
        }
        Ok(size)
    }

    /// Reads the caller's struct into `out`.
    ///
    /// # Safety
    /// `src` points to a readable struct of its own `struct_size`.
    pub(crate) unsafe fn read<T: Copy>(src: *const T, out: &mut T, name: &str) -> ApiResult<()> {
        // SAFETY: forwarded contract.
        unsafe { size_of_callers(src, name)? };
        // SAFETY: the caller's struct is at least size_of::<T>() readable bytes.
        *out = unsafe { src.read_unaligned() };
        Ok(())
    }

    /// Writes `value` (whose own `struct_size` says how much of it this
    /// library knows) into the caller's struct; fields of a newer header
    /// beyond it are left as they were.
    ///
    /// # Safety
    /// `dst` points to a writable struct of its own `struct_size`.
    pub(crate) unsafe fn write<T: Copy>(dst: NonNull<T>, value: &T, name: &str) -> ApiResult<()> {
        // SAFETY: forwarded contract.
        unsafe { size_of_callers(dst.as_ptr(), name)? };
        // SAFETY: the caller's struct has at least size_of::<T>() writable bytes.
        unsafe { dst.as_ptr().write_unaligned(*value) };
        Ok(())
    }
}

/// Handles alive now, per kind (for leak checks in tests and by callers).
#[doc(hidden)]
pub fn live_handles() -> [(&'static str, usize); 6] {
    [
        ("comm", comm::COMMS.live()),
        ("runtime", runtime::RUNTIMES.live()),
        ("tensor", tensor::TENSORS.live()),
        ("stream", stream::STREAMS.live()),
        ("event", stream::EVENTS.live()),
        ("error", error::ERRORS.live()),
    ]
}
