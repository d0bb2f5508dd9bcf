//! `Stream` and `Event`.

use std::ptr::null_mut;

use polychip::*;
use pyo3::prelude::*;

use crate::Handle;
use crate::errors::{Int, check, handle, held};
use crate::runtime::Runtime;

/// An in-order queue of work on one device; operators given `stream=` run
/// on it asynchronously where the plugin allows.
#[pyclass(frozen, module = "polychip._native")]
pub(crate) struct Stream {
    pub(crate) handle: Handle,
}

/// A marker recorded on a stream.
#[pyclass(frozen, module = "polychip._native")]
pub(crate) struct Event {
    handle: Handle,
}

#[pymethods]
impl Stream {
    /// A new stream on device `device` of `runtime`.
    #[new]
    fn new(py: Python<'_>, runtime: &Runtime, device: Int<u32>) -> PyResult<Stream> {
        let device = device.0;
        let mut out = null_mut();
        // SAFETY: `out` writable.
        let e = unsafe { polychip_stream_new(runtime.ptr(), device, &mut out) };
        check(py, held(e))?;
        Ok(Stream {
            handle: out as Handle,
        })
    }

    /// Blocks until the stream's work is done; raises its first error.
    fn synchronize(&self, py: Python<'_>) -> PyResult<()> {
        let s = self.handle;
        let error = py.detach(move || handle(polychip_stream_synchronize(s as *const _)));
        check(py, error)
    }

    /// Records an event at the end of the stream's work so far.
    fn record(&self, py: Python<'_>) -> PyResult<Event> {
        let mut out = null_mut();
        // SAFETY: `out` writable.
        let e = unsafe { polychip_stream_record(self.handle as *const _, &mut out) };
        check(py, held(e))?;
        Ok(Event {
            handle: out as Handle,
        })
    }

    /// Makes later work on this stream wait for `event` (of any device,
    /// any vendor).
    fn wait(&self, py: Python<'_>, event: &Event) -> PyResult<()> {
        let (s, e) = (self.handle, event.handle);
        let error = py.detach(move || handle(polychip_stream_wait(s as *const _, e as *const _)));
        check(py, error)
    }
}

#[pymethods]
impl Event {
    /// Blocks until the work before the event is done.
    fn synchronize(&self, py: Python<'_>) -> PyResult<()> {
        let e = self.handle;
        let error = py.detach(move || handle(polychip_event_synchronize(e as *const _)));
        check(py, error)
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        polychip_stream_destroy(self.handle as *mut polychip_stream_t);
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        polychip_event_destroy(self.handle as *mut polychip_event_t);
    }
}
