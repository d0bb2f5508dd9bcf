//! Log records reach the caller's callback, in a process of its own: the
//! callback and the level are process-wide, so another test's runtime made
//! at the same moment with other log options (or none) retargets them (run
//! beside `api.rs`'s tests, this one missed its debug record now and then).
//!
//! Needs the bundled plugins built (`cargo build --workspace`).

use std::ffi::{c_char, c_void};
use std::ptr::null_mut;
use std::sync::Mutex;

use polychip::*;

fn ok(error: *mut polychip_error_t) {
    if !error.is_null() {
        polychip_error_destroy(error);
        panic!("a call failed");
    }
}

static RECORDS: Mutex<Vec<(u32, String)>> = Mutex::new(Vec::new());

unsafe extern "C" fn record(_ctx: *mut c_void, level: u32, message: *const c_char, len: usize) {
    // SAFETY: `len` readable bytes for the call.
    let bytes = unsafe { std::slice::from_raw_parts(message.cast::<u8>(), len) };
    RECORDS
        .lock()
        .unwrap()
        .push((level, String::from_utf8_lossy(bytes).into_owned()));
}

#[test]
fn log_records_reach_the_callback() {
    // SAFETY: an all-zero options struct is a valid value to fill.
    let mut options: polychip_runtime_options_t = unsafe { std::mem::zeroed() };
    options.struct_size = size_of::<polychip_runtime_options_t>();
    // SAFETY: writable for its struct_size.
    ok(unsafe { polychip_runtime_options_init(&mut options) });
    options.log = Some(record);
    options.log_level = POLYCHIP_API_LOG_DEBUG;
    let mut rt = null_mut();
    // SAFETY: readable options; `rt` writable.
    ok(unsafe { polychip_runtime_new(&options, &mut rt) });
    let records = RECORDS.lock().unwrap().clone();
    assert!(
        records
            .iter()
            .any(|(level, m)| *level == POLYCHIP_API_LOG_DEBUG && m.contains("loaded Ferrite")),
        "{records:?}"
    );
    polychip_runtime_destroy(rt);
}
