//! Error objects the host creates for plugins (`error_new`), and taking
//! back the ones plugins return.
//!
//! Every live error object is recorded in a set, so a pointer a plugin
//! returns that the host never made (a bug in the plugin) is reported as a
//! contract violation instead of being dereferenced. The last
//! [`QUARANTINE`] objects taken back are kept allocated (emptied) rather
//! than freed, so their addresses are not reused at once and a plugin that
//! returns the same object a second time is told apart from one that
//! returns a foreign pointer.

use std::collections::{HashSet, VecDeque};
use std::ffi::{c_char, c_void};
use std::sync::Mutex;

use polychip_plugin_sdk::ErrorCode;
use polychip_plugin_sdk::abi::{PolychipError, PolychipErrorCode};

/// What an error object holds.
struct ErrorObject {
    code: PolychipErrorCode,
    message: String,
}

/// How many objects taken back stay allocated to catch double returns.
const QUARANTINE: usize = 256;

/// The live objects, and the addresses of the ones taken back recently
/// (whose allocations are still held, in `held`).
#[derive(Default)]
struct Registry {
    live: HashSet<usize>,
    recent: HashSet<usize>,
    held: VecDeque<Box<ErrorObject>>,
}

static LIVE: Mutex<Option<Registry>> = Mutex::new(None);

fn live() -> std::sync::MutexGuard<'static, Option<Registry>> {
    LIVE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Why an error pointer a plugin returned was not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Misuse {
    /// The host never made it (or made it long ago and freed it).
    Foreign,
    /// The host made it and already took it back: returned twice, or
    /// returned after `error_destroy`.
    Twice,
}

impl Misuse {
    /// The contract violation, as a message says it.
    pub(crate) fn what(self) -> &'static str {
        match self {
            Misuse::Foreign => "returned an error pointer the host never created",
            Misuse::Twice => {
                "returned an error object the host had already taken back (returned twice, or after error_destroy)"
            }
        }
    }
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

/// The most bytes of a plugin's error message the host keeps. A longer one
/// is cut there and says how long it was: until 2026-12-06 the host copied
/// any length (each failed call of `polychip conform` kept its message, so a
/// plugin failing every case with a few megabytes held gigabytes), and a
/// message past the conform worker's 1 MiB line made its case vanish from
/// the report.
pub const MAX_ERROR_MESSAGE: usize = 64 << 10;

/// The message (or log record) of `len` bytes at `ptr`, at most
/// [`MAX_ERROR_MESSAGE`] of them read.
///
/// # Safety
/// As for [`lossy`].
pub(crate) unsafe fn bounded_message(ptr: *const c_char, len: usize) -> String {
    if len <= MAX_ERROR_MESSAGE {
        // SAFETY: forwarded.
        return unsafe { lossy(ptr, len) };
    }
    // SAFETY: forwarded; fewer bytes than the caller has.
    let mut kept = unsafe { lossy(ptr, MAX_ERROR_MESSAGE) };
    // A character cut in two reads as U+FFFD at the end.
    if kept.ends_with('\u{fffd}') {
        kept.pop();
    }
    format!(
        "{kept}... (the plugin's message is {len} bytes; the first {MAX_ERROR_MESSAGE} are kept)"
    )
}

/// The host's `error_new` callback.
pub(crate) unsafe extern "C" fn error_new(
    _ctx: *mut c_void,
    code: PolychipErrorCode,
    message: *const c_char,
    len: usize,
) -> *mut PolychipError {
    // SAFETY: the ABI says `message` has `len` readable bytes for the call.
    let message = unsafe { bounded_message(message, len) };
    let ptr = Box::into_raw(Box::new(ErrorObject { code, message }));
    live()
        .get_or_insert_with(Registry::default)
        .live
        .insert(ptr as usize);
    ptr.cast::<PolychipError>()
}

/// The host's `error_destroy` callback.
pub(crate) unsafe extern "C" fn error_destroy(_ctx: *mut c_void, error: *mut PolychipError) {
    let _ = take(error);
}

/// Takes ownership of an error object a plugin returned. `Ok(None)` for
/// NULL (success); `Err` for a pointer the host never made or already took.
pub(crate) fn take(error: *mut PolychipError) -> Result<Option<(ErrorCode, String)>, Misuse> {
    if error.is_null() {
        return Ok(None);
    }
    let mut guard = live();
    let registry = guard.get_or_insert_with(Registry::default);
    let address = error as usize;
    if !registry.live.remove(&address) {
        return Err(if registry.recent.contains(&address) {
            Misuse::Twice
        } else {
            Misuse::Foreign
        });
    }
    // SAFETY: the pointer was in the live set, so it came from Box::into_raw in
    // `error_new` and has not been freed; removing it gives us sole ownership.
    let mut object = unsafe { Box::from_raw(error.cast::<ErrorObject>()) };
    let taken = (
        ErrorCode::from_raw(object.code),
        std::mem::take(&mut object.message),
    );
    registry.recent.insert(address);
    registry.held.push_back(object);
    if registry.held.len() > QUARANTINE {
        let old = registry.held.pop_front().expect("not empty");
        registry
            .recent
            .remove(&(&*old as *const ErrorObject as usize));
    }
    Ok(Some(taken))
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
            Err(Misuse::Twice),
            "a second take is a double free and is refused"
        );
        assert_eq!(take(std::ptr::null_mut()), Ok(None));
        let mut x = 0u8;
        assert_eq!(take((&mut x as *mut u8).cast()), Err(Misuse::Foreign));
    }

    #[test]
    fn a_message_past_the_bound_is_cut_and_says_its_length() {
        // "é" is two bytes: the bound falls inside one, which is dropped.
        let long = format!("x{}", "é".repeat(MAX_ERROR_MESSAGE));
        // SAFETY: long is valid for its length.
        let e = unsafe { error_new(std::ptr::null_mut(), 1, long.as_ptr().cast(), long.len()) };
        let (_, message) = take(e).unwrap().unwrap();
        let said = format!(
            "... (the plugin's message is {} bytes; the first {MAX_ERROR_MESSAGE} are kept)",
            long.len()
        );
        assert!(
            message.ends_with(&said),
            "{}",
            &message[message.len() - 200..]
        );
        let kept = &message[..message.len() - said.len()];
        assert_eq!(kept, &long[..MAX_ERROR_MESSAGE - 1]);
        // One at the bound is kept whole.
        let exact = "y".repeat(MAX_ERROR_MESSAGE);
        // SAFETY: as above.
        let e = unsafe { error_new(std::ptr::null_mut(), 1, exact.as_ptr().cast(), exact.len()) };
        assert_eq!(take(e).unwrap().unwrap().1, exact);
    }
}
