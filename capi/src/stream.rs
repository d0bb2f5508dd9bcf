//! Streams (in-order queues of work on one device) and events (markers in
//! them). A stream may wait for an event of another vendor's device: the
//! host then waits for it before enqueueing more, since one vendor's queue
//! cannot see another's event.

use std::sync::{Arc, Mutex, MutexGuard};

use polychip_host::{Event, Stream};

use crate::error::{ApiResult, guard, polychip_error_t, quiet};
use crate::handle::{Handle, Registry};
use crate::out_param;
use crate::runtime::{RUNTIMES, polychip_runtime_t};

/// A stream of one device. Opaque.
#[allow(non_camel_case_types)]
#[derive(Debug)]
pub struct polychip_stream_t {
    _private: [u8; 0],
}

/// An event recorded on a stream. Opaque.
#[allow(non_camel_case_types)]
#[derive(Debug)]
pub struct polychip_event_t {
    _private: [u8; 0],
}

/// What a stream handle holds. The lock serializes the calls that enqueue
/// on one stream, as the plugin ABI requires of its callers.
#[derive(Debug)]
pub(crate) struct StreamObject {
    stream: Mutex<Stream>,
}

impl StreamObject {
    /// The stream, locked for the call.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Stream> {
        self.stream.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What an event handle holds.
#[derive(Debug)]
pub(crate) struct EventObject {
    event: Mutex<Event>,
}

impl EventObject {
    fn lock(&self) -> MutexGuard<'_, Event> {
        self.event.lock().unwrap_or_else(|e| e.into_inner())
    }
}

pub(crate) static STREAMS: Registry<StreamObject> = Registry::new(Handle::STREAM);
pub(crate) static EVENTS: Registry<EventObject> = Registry::new(Handle::EVENT);

/// The stream behind a handle argument, or `None` for NULL (the default stream).
pub(crate) fn stream_arg(handle: *const polychip_stream_t) -> ApiResult<Option<Arc<StreamObject>>> {
    if handle.is_null() {
        return Ok(None);
    }
    STREAMS.get(handle.cast(), "stream").map(Some)
}

/// A new stream on device `device` of `runtime`. Work enqueued on it runs in
/// order, asynchronously where the plugin allows; buffers it uses stay alive
/// until it is synchronized.
///
/// Ownership: `*out` is the caller's, freed with `polychip_stream_destroy`.
/// Thread safety: any thread; calls that enqueue on one stream must not run
/// concurrently.
///
/// # Safety
/// `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn polychip_stream_new(
    runtime: *const polychip_runtime_t,
    device: u32,
    out: *mut *mut polychip_stream_t,
) -> *mut polychip_error_t {
    guard("polychip_stream_new", || {
        let out = out_param(out, "out")?;
        let rt = RUNTIMES.get(runtime.cast(), "runtime")?;
        let stream = rt.device(device)?.stream()?;
        // SAFETY: checked non-NULL; writable per the contract.
        unsafe {
            out.write(
                STREAMS
                    .insert(StreamObject {
                        stream: Mutex::new(stream),
                    })
                    .cast(),
            )
        };
        Ok(())
    })
}

/// Blocks until the stream's work has completed; reports the first error
/// that work met.
///
/// Thread safety: any thread.
#[unsafe(no_mangle)]
pub extern "C" fn polychip_stream_synchronize(
    stream: *const polychip_stream_t,
) -> *mut polychip_error_t {
    guard("polychip_stream_synchronize", || {
        let s = STREAMS.get(stream.cast(), "stream")?;
        Ok(s.lock().synchronize()?)
    })
}

/// Destroys a stream after its work has completed. NULL is ignored; a
/// handle that is not a live stream is logged.
///
/// Thread safety: any thread, not concurrently with work enqueued on it.
#[unsafe(no_mangle)]
pub extern "C" fn polychip_stream_destroy(stream: *mut polychip_stream_t) {
    quiet("polychip_stream_destroy", (), || {
        if stream.is_null() {
            return;
        }
        match STREAMS.remove(stream.cast(), "stream") {
            Ok(s) => {
                if let Err(e) = s.lock().synchronize() {
                    log::warn!("polychip_stream_destroy: the stream's work failed: {e}");
                }
            }
            Err(e) => log::warn!("polychip_stream_destroy: {}", e.message),
        }
    })
}

/// Records an event at the current end of `stream`.
///
/// Ownership: `*out` is the caller's, freed with `polychip_event_destroy`.
/// Thread safety: as for enqueueing on `stream`.
///
/// # Safety
/// `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn polychip_stream_record(
    stream: *const polychip_stream_t,
    out: *mut *mut polychip_event_t,
) -> *mut polychip_error_t {
    guard("polychip_stream_record", || {
        let out = out_param(out, "out")?;
        let s = STREAMS.get(stream.cast(), "stream")?;
        let event = s.lock().record()?;
        // SAFETY: checked non-NULL; writable per the contract.
        unsafe {
            out.write(
                EVENTS
                    .insert(EventObject {
                        event: Mutex::new(event),
                    })
                    .cast(),
            )
        };
        Ok(())
    })
}

/// Makes work enqueued on `stream` from now on wait for `event`, which may
/// come from any device of any vendor (across vendors the host waits).
///
/// Thread safety: as for enqueueing on `stream`.
#[unsafe(no_mangle)]
pub extern "C" fn polychip_stream_wait(
    stream: *const polychip_stream_t,
    event: *const polychip_event_t,
) -> *mut polychip_error_t {
    guard("polychip_stream_wait", || {
        let s = STREAMS.get(stream.cast(), "stream")?;
        let e = EVENTS.get(event.cast(), "event")?;
        Ok(s.lock().wait(&e.lock())?)
    })
}

/// Blocks until the work before `event` has completed.
///
/// Thread safety: any thread.
#[unsafe(no_mangle)]
pub extern "C" fn polychip_event_synchronize(
    event: *const polychip_event_t,
) -> *mut polychip_error_t {
    guard("polychip_event_synchronize", || {
        let e = EVENTS.get(event.cast(), "event")?;
        Ok(e.lock().synchronize()?)
    })
}

/// Frees an event. NULL is ignored; a handle that is not a live event is
/// logged.
///
/// Thread safety: any thread, not concurrently with a call using `event`.
#[unsafe(no_mangle)]
pub extern "C" fn polychip_event_destroy(event: *mut polychip_event_t) {
    quiet("polychip_event_destroy", (), || {
        if !event.is_null() {
            if let Err(e) = EVENTS.remove(event.cast(), "event") {
                log::warn!("polychip_event_destroy: {}", e.message);
            }
        }
    })
}
