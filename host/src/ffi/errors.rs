//! Error objects the host creates for plugins (`error_new`), and taking
//! back the ones plugins return.
//!
//! Every live error object is recorded in a set, so a pointer a plugin
//! returns that the host never made (a bug in the plugin) is reported as a
//! contract violation instead of being dereferenced.

use std::collections::HashSet;
use std::ffi::{c_char, c_void};
use std::sync::Mutex;

use polychip_plugin_sdk::ErrorCode;
use polychip_plugin_sdk::abi::{PolychipError, PolychipErrorCode};

/// What an error object holds.
struct ErrorObject {
    code: PolychipErrorCode,
    message: String,
}

static LIVE: Mutex<Option<HashSet<usize>>> = Mutex::new(None);

fn live() -> std::sync::MutexGuard<'static, Option<HashSet<usize>>> {
    LIVE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Reads `len` bytes of possibly invalid UTF-8.
///
/// # Safety
/// `ptr` is NULL or points to `len` readable bytes.
pub(crate) unsafe fn lossy(ptr: *const c_char, len: usize) -> String {
    if ptr.is_null() || len == 0 {
        return String::new();
    }
    // SAFETY: guaranteed by the caller.
    let bytes = unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) };
    String::from_utf8_lossy(bytes).into_owned()
}

/// The host's `error_new` callback.
pub(crate) unsafe extern "C" fn error_new(
    _ctx: *mut c_void,
    code: PolychipErrorCode,
    message: *const c_char,
    len: usize,
) -> *mut PolychipError {
    // SAFETY: the ABI says `message` has `len` readable bytes for the call.
    let message = unsafe { lossy(message, len) };
    let ptr = Box::into_raw(Box::new(ErrorObject { code, message }));
    live().get_or_insert_with(HashSet::new).insert(ptr as usize);
    ptr.cast::<PolychipError>()
}

/// The host's `error_destroy` callback.
pub(crate) unsafe extern "C" fn error_destroy(_ctx: *mut c_void, error: *mut PolychipError) {
    let _ = take(error);
}

/// Takes ownership of an error object a plugin returned. `Ok(None)` for
/// NULL (success); `Err(())` for a pointer the host never made or already freed.
#[allow(clippy::result_unit_err)]
pub(crate) fn take(error: *mut PolychipError) -> Result<Option<(ErrorCode, String)>, ()> {
    if error.is_null() {
        return Ok(None);
    }
    let known = live()
        .as_mut()
        .is_some_and(|set| set.remove(&(error as usize)));
    if !known {
        return Err(());
    }
    // SAFETY: the pointer was in the live set, so it came from Box::into_raw in
    // `error_new` and has not been freed; removing it gives us sole ownership.
    let object = unsafe { Box::from_raw(error.cast::<ErrorObject>()) };
    Ok(Some((ErrorCode::from_raw(object.code), object.message)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_round_trip_and_unknown_pointers_are_refused() {
        let msg = "bad shape";
        // SAFETY: msg is valid for its length.
        let e = unsafe { error_new(std::ptr::null_mut(), 6, msg.as_ptr().cast(), msg.len()) };
        assert_eq!(
            take(e),
            Ok(Some((ErrorCode::ShapeMismatch, "bad shape".to_string())))
        );
        assert_eq!(
            take(e),
            Err(()),
            "a second take is a double free and is refused"
        );
        assert_eq!(take(std::ptr::null_mut()), Ok(None));
        let mut x = 0u8;
        assert_eq!(take((&mut x as *mut u8).cast()), Err(()));
    }
}
