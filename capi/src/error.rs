//! Error objects and the panic firewall.
//!
//! A fallible function returns `polychip_error_t *`, NULL meaning success.
//! The caller owns a returned error and frees it with
//! `polychip_error_destroy`; its code never changes meaning and its message
//! names what was wrong (the function, the argument, the operator, the
//! shape or dtype, the file). Every exported function runs inside
//! [`guard`], so a Rust panic becomes a `POLYCHIP_API_ERROR_PANIC` error
//! instead of unwinding into the caller.

use std::ffi::{CString, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr::null_mut;

use polychip_comm::CommError;
use polychip_host::{ErrorCode, HostError};

use crate::handle::{Handle, Registry};

/// An error: a code and a message. Opaque; made by libpolychip, freed by the
/// caller with `polychip_error_destroy`.
#[allow(non_camel_case_types)]
#[derive(Debug)]
pub struct polychip_error_t {
    _private: [u8; 0],
}

/// The closed set of error codes. Numbers never change meaning; a caller
/// that meets a code it does not know treats it as `INTERNAL`.
pub type polychip_error_code_t = u32;
/// An argument is wrong: NULL, out of range, a freed or foreign handle, a
/// bad layout.
pub const POLYCHIP_API_ERROR_INVALID_ARGUMENT: polychip_error_code_t = 1;
/// A device or the host ran out of memory.
pub const POLYCHIP_API_ERROR_OUT_OF_MEMORY: polychip_error_code_t = 2;
/// The device's plugin does not implement the operator.
pub const POLYCHIP_API_ERROR_UNIMPLEMENTED: polychip_error_code_t = 3;
/// A fault inside polychip or a plugin that broke its contract.
pub const POLYCHIP_API_ERROR_INTERNAL: polychip_error_code_t = 4;
/// The caller's API version, or a plugin's ABI version, is not supported.
pub const POLYCHIP_API_ERROR_VERSION_MISMATCH: polychip_error_code_t = 5;
/// Tensor shapes do not fit the operation.
pub const POLYCHIP_API_ERROR_SHAPE_MISMATCH: polychip_error_code_t = 6;
/// Tensor dtypes do not fit the operation.
pub const POLYCHIP_API_ERROR_DTYPE_MISMATCH: polychip_error_code_t = 7;
/// A device stopped working.
pub const POLYCHIP_API_ERROR_DEVICE_LOST: polychip_error_code_t = 8;
/// A panic inside polychip or a Rust plugin was caught.
pub const POLYCHIP_API_ERROR_PANIC: polychip_error_code_t = 9;
/// A collective or a rendezvous did not complete in time.
pub const POLYCHIP_API_ERROR_TIMEOUT: polychip_error_code_t = 10;
/// A peer rank died or left the job.
pub const POLYCHIP_API_ERROR_PEER_LOST: polychip_error_code_t = 11;
/// The environment (launcher variables, a transport) does not allow the
/// request.
pub const POLYCHIP_API_ERROR_UNAVAILABLE: polychip_error_code_t = 12;
/// Reading or writing a file or a socket failed.
pub const POLYCHIP_API_ERROR_IO: polychip_error_code_t = 13;

/// An error on its way to becoming a `polychip_error_t`.
#[derive(Debug, Clone)]
pub(crate) struct ApiError {
    pub(crate) code: polychip_error_code_t,
    pub(crate) message: String,
}

pub(crate) type ApiResult<T> = Result<T, ApiError>;

impl ApiError {
    pub(crate) fn new(code: polychip_error_code_t, message: impl Into<String>) -> ApiError {
        ApiError {
            code,
            message: message.into(),
        }
    }

    pub(crate) fn invalid(message: impl Into<String>) -> ApiError {
        ApiError::new(POLYCHIP_API_ERROR_INVALID_ARGUMENT, message)
    }
}

impl From<HostError> for ApiError {
    fn from(e: HostError) -> ApiError {
        let code = match e.code() {
            ErrorCode::InvalidArgument => POLYCHIP_API_ERROR_INVALID_ARGUMENT,
            ErrorCode::OutOfMemory => POLYCHIP_API_ERROR_OUT_OF_MEMORY,
            ErrorCode::Unimplemented => POLYCHIP_API_ERROR_UNIMPLEMENTED,
            ErrorCode::VersionMismatch => POLYCHIP_API_ERROR_VERSION_MISMATCH,
            ErrorCode::ShapeMismatch => POLYCHIP_API_ERROR_SHAPE_MISMATCH,
            ErrorCode::DTypeMismatch => POLYCHIP_API_ERROR_DTYPE_MISMATCH,
            ErrorCode::DeviceLost => POLYCHIP_API_ERROR_DEVICE_LOST,
            ErrorCode::Panic => POLYCHIP_API_ERROR_PANIC,
            ErrorCode::Internal => POLYCHIP_API_ERROR_INTERNAL,
        };
        ApiError::new(code, e.to_string())
    }
}

impl From<CommError> for ApiError {
    fn from(e: CommError) -> ApiError {
        let code = match &e {
            CommError::Timeout { .. } => POLYCHIP_API_ERROR_TIMEOUT,
            CommError::PeerLost { .. } => POLYCHIP_API_ERROR_PEER_LOST,
            CommError::Environment(_) | CommError::Unavailable { .. } => {
                POLYCHIP_API_ERROR_UNAVAILABLE
            }
            CommError::Io { .. } => POLYCHIP_API_ERROR_IO,
            CommError::Mismatch { .. } | CommError::Usage(_) => POLYCHIP_API_ERROR_INVALID_ARGUMENT,
        };
        ApiError::new(code, e.to_string())
    }
}

/// What an error handle holds.
#[derive(Debug)]
pub(crate) struct ErrorObject {
    code: polychip_error_code_t,
    message: CString,
}

pub(crate) static ERRORS: Registry<ErrorObject> = Registry::new(Handle::ERROR);

/// Makes the error object a failed call returns.
pub(crate) fn make(e: ApiError) -> *mut polychip_error_t {
    let message = CString::new(e.message.replace('\0', "\\0")).unwrap_or_default();
    ERRORS
        .insert(ErrorObject {
            code: e.code,
            message,
        })
        .cast()
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a non-string payload".to_owned()
    }
}

/// Runs `f` inside the panic firewall; an `Err` or a panic becomes an error
/// object whose message starts with `function`.
pub(crate) fn guard(function: &str, f: impl FnOnce() -> ApiResult<()>) -> *mut polychip_error_t {
    crate::log::enter();
    let result = catch_unwind(AssertUnwindSafe(f));
    crate::log::leave();
    match result {
        Ok(Ok(())) => null_mut(),
        Ok(Err(mut e)) => {
            if !e.message.starts_with(function) {
                e.message = format!("{function}: {}", e.message);
            }
            make(e)
        }
        Err(payload) => make(ApiError::new(
            POLYCHIP_API_ERROR_PANIC,
            format!("{function} panicked: {}", panic_message(&*payload)),
        )),
    }
}

/// Runs `f` inside the panic firewall for a function that cannot report an
/// error (a destroy, a getter); a panic is logged and `fallback` returned.
pub(crate) fn quiet<T>(function: &str, fallback: T, f: impl FnOnce() -> T) -> T {
    crate::log::enter();
    let result = catch_unwind(AssertUnwindSafe(f));
    crate::log::leave();
    result.unwrap_or_else(|payload| {
        log::error!("{function} panicked: {}", panic_message(&*payload));
        fallback
    })
}

/// The error's code, or `POLYCHIP_API_ERROR_INVALID_ARGUMENT` when `error`
/// is not a live error object.
///
/// Thread safety: any thread.
#[unsafe(no_mangle)]
pub extern "C" fn polychip_error_code(error: *const polychip_error_t) -> polychip_error_code_t {
    quiet("polychip_error_code", POLYCHIP_API_ERROR_INTERNAL, || {
        ERRORS
            .get(error.cast(), "error")
            .map_or(POLYCHIP_API_ERROR_INVALID_ARGUMENT, |e| e.code)
    })
}

/// The error's message, UTF-8 and NUL-terminated, owned by the error and
/// valid until `polychip_error_destroy`. A handle that is not a live error
/// object gives a static message saying so.
///
/// Thread safety: any thread.
#[unsafe(no_mangle)]
pub extern "C" fn polychip_error_message(error: *const polychip_error_t) -> *const c_char {
    const NOT_AN_ERROR: &std::ffi::CStr =
        c"polychip_error_message: not a live polychip_error_t (freed, or never made by libpolychip)";
    quiet("polychip_error_message", NOT_AN_ERROR.as_ptr(), || {
        ERRORS
            .get(error.cast(), "error")
            // The registry keeps the object (and its CString) alive until
            // destroy; the caller may only use the pointer until then.
            .map_or(NOT_AN_ERROR.as_ptr(), |e| e.message.as_ptr())
    })
}

/// Frees an error. NULL is ignored; so is a handle that is not a live error
/// object (it is logged).
///
/// Thread safety: any thread, but not while another thread reads the same
/// error's message.
#[unsafe(no_mangle)]
pub extern "C" fn polychip_error_destroy(error: *mut polychip_error_t) {
    quiet("polychip_error_destroy", (), || {
        if !error.is_null() {
            if let Err(e) = ERRORS.remove(error.cast(), "error") {
                log::warn!("polychip_error_destroy: {}", e.message);
            }
        }
    })
}
