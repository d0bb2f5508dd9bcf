//! What the tests that call the C API from Rust share: taking an error,
//! a runtime, a device of a vendor, f32 tensors written and read back.

use std::ffi::CStr;
use std::ptr::{null, null_mut};

use polychip::*;

/// Takes an error: `Ok` for NULL, else its code and message (freed).
pub fn take(error: *mut polychip_error_t) -> Result<(), (u32, String)> {
    if error.is_null() {
        return Ok(());
    }
    let code = polychip_error_code(error);
    // SAFETY: a live error's message is a NUL-terminated string until destroy.
    let message = unsafe { CStr::from_ptr(polychip_error_message(error)) }
        .to_string_lossy()
        .into_owned();
    polychip_error_destroy(error);
    Err((code, message))
}

/// Panics with the error's code and message unless the call succeeded.
pub fn ok(error: *mut polychip_error_t) {
    take(error).unwrap_or_else(|(code, message)| panic!("error {code}: {message}"));
}

/// The error of a call that must fail.
pub fn refused(error: *mut polychip_error_t) -> (u32, String) {
    take(error).expect_err("the call should have failed")
}

/// A runtime with the default options.
pub fn runtime() -> *mut polychip_runtime_t {
    let mut rt = null_mut();
    // SAFETY: NULL options; `rt` is writable.
    ok(unsafe { polychip_runtime_new(null(), &mut rt) });
    rt
}

/// Device `index`'s vendor and whether the host can read its memory.
pub fn info(rt: *const polychip_runtime_t, index: u32) -> (String, bool) {
    // SAFETY: an all-zero info with its struct_size is a valid out-param.
    let mut info: polychip_device_info_t = unsafe { std::mem::zeroed() };
    info.struct_size = size_of::<polychip_device_info_t>();
    // SAFETY: `info` is writable for its struct_size.
    ok(unsafe { polychip_runtime_device_info(rt, index, &mut info) });
    // SAFETY: the runtime owns the NUL-terminated vendor string.
    let vendor = unsafe { CStr::from_ptr(info.vendor) }
        .to_string_lossy()
        .into_owned();
    (vendor, info.host_visible)
}

/// The runtime index of the first device of `vendor`.
pub fn device_of(rt: *const polychip_runtime_t, vendor: &str) -> u32 {
    let mut count = 0;
    // SAFETY: `count` is writable.
    ok(unsafe { polychip_runtime_device_count(rt, &mut count) });
    (0..count)
        .find(|&i| info(rt, i).0 == vendor)
        .unwrap_or_else(|| panic!("no {vendor} device: build the workspace first"))
}

/// A 1-D f32 tensor of `values` on `device`.
pub fn tensor(
    rt: *const polychip_runtime_t,
    device: u32,
    values: &[f32],
) -> *mut polychip_tensor_t {
    let shape = [values.len() as i64];
    let mut t = null_mut();
    // SAFETY: `shape` has one extent; `t` is writable.
    ok(unsafe {
        polychip_tensor_new(
            rt,
            device,
            POLYCHIP_DTYPE_F32,
            1,
            shape.as_ptr(),
            false,
            &mut t,
        )
    });
    // SAFETY: `values` is readable for its byte length.
    ok(unsafe { polychip_tensor_write(t, values.as_ptr().cast(), size_of_val(values)) });
    t
}

/// The first `n` f32 values of `t`.
pub fn read(t: *const polychip_tensor_t, n: usize) -> Vec<f32> {
    let mut out = vec![0f32; n];
    // SAFETY: `out` is writable for n floats.
    ok(unsafe { polychip_tensor_read(t, out.as_mut_ptr().cast(), n * 4) });
    out
}
