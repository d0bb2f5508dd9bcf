//! The log callback's lifetime, in a process of its own (the target is
//! process-wide): its context is not used once every runtime is gone, and
//! a callback that makes a runtime of its own does not deadlock.
//!
//! Needs the bundled plugins built (`cargo build --workspace`).

use std::ffi::{c_char, c_void};
use std::ptr::{null, null_mut};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use polychip::*;

fn ok(error: *mut polychip_error_t) {
    if !error.is_null() {
        polychip_error_destroy(error);
        panic!("a call failed");
    }
}

fn options(callback: polychip_log_fn, context: *mut c_void) -> polychip_runtime_options_t {
    // SAFETY: an all-zero options struct is a valid value to fill.
    let mut options: polychip_runtime_options_t = unsafe { std::mem::zeroed() };
    options.struct_size = size_of::<polychip_runtime_options_t>();
    // SAFETY: writable for its struct_size.
    ok(unsafe { polychip_runtime_options_init(&mut options) });
    options.log = callback;
    options.log_context = context;
    options.log_level = POLYCHIP_API_LOG_DEBUG;
    options
}

/// Counts its calls in the `AtomicUsize` its context points to.
unsafe extern "C" fn count(ctx: *mut c_void, _level: u32, _m: *const c_char, _len: usize) {
    // SAFETY: the test passes a live AtomicUsize as the context.
    unsafe { &*ctx.cast::<AtomicUsize>() }.fetch_add(1, Ordering::SeqCst);
}

/// Makes (and destroys) a runtime of its own, with itself as callback.
unsafe extern "C" fn nested(ctx: *mut c_void, _level: u32, _m: *const c_char, _len: usize) {
    // SAFETY: as in `count`.
    let calls = unsafe { &*ctx.cast::<AtomicUsize>() };
    if calls.fetch_add(1, Ordering::SeqCst) == 0 {
        let o = options(Some(nested), ctx);
        let mut rt = null_mut();
        // SAFETY: readable options; `rt` writable.
        ok(unsafe { polychip_runtime_new(&o, &mut rt) });
        polychip_runtime_destroy(rt);
    }
}

#[test]
fn the_callback_outlives_no_runtime_and_may_make_one() {
    // A callback that makes a runtime: it deadlocked on the target's lock.
    let (done, wait) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let calls = Box::leak(Box::new(AtomicUsize::new(0)));
        let o = options(Some(nested), (calls as *mut AtomicUsize).cast());
        let mut rt = null_mut();
        // SAFETY: readable options; `rt` writable.
        ok(unsafe { polychip_runtime_new(&o, &mut rt) });
        polychip_runtime_destroy(rt);
        done.send(calls.load(Ordering::SeqCst)).unwrap();
    });
    let calls = wait
        .recv_timeout(Duration::from_secs(60))
        .expect("a callback that makes a runtime deadlocked");
    assert!(calls >= 1);

    // With every runtime gone, nothing reaches the callback any more.
    let calls = AtomicUsize::new(0);
    let o = options(Some(count), (&raw const calls).cast_mut().cast());
    let mut rt = null_mut();
    // SAFETY: readable options; `rt` writable.
    ok(unsafe { polychip_runtime_new(&o, &mut rt) });
    assert!(calls.load(Ordering::SeqCst) > 0, "loading logs");
    // A bad handle logs a warning while the runtime lives...
    let before = calls.load(Ordering::SeqCst);
    polychip_runtime_destroy(8 as *mut polychip_runtime_t);
    assert!(calls.load(Ordering::SeqCst) > before);
    polychip_runtime_destroy(rt);
    // ...and not after the last one is gone.
    let after = calls.load(Ordering::SeqCst);
    polychip_runtime_destroy(8 as *mut polychip_runtime_t);
    assert_eq!(calls.load(Ordering::SeqCst), after);
    // A runtime that fails to make (strict, a plugin that is not one)
    // leaves no callback behind either.
    let mut o = options(Some(count), (&raw const calls).cast_mut().cast());
    o.strict = true;
    o.plugin_path = c"/nonexistent/libnothing.so".as_ptr();
    let mut rt = null_mut();
    // SAFETY: readable options; `rt` writable.
    let error = unsafe { polychip_runtime_new(&o, &mut rt) };
    assert!(!error.is_null() && rt.is_null());
    polychip_error_destroy(error);
    let after = calls.load(Ordering::SeqCst);
    polychip_runtime_destroy(8 as *mut polychip_runtime_t);
    assert_eq!(calls.load(Ordering::SeqCst), after);
    let _ = null::<u8>();
}
