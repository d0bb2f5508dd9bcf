//! Streams and events: ordered queues of work on one device, and markers in
//! them.
//!
//! A stream keeps every buffer its enqueued work touches alive until it is
//! synchronized, so dropping a tensor never frees memory that queued work
//! still uses.

use std::sync::{Arc, Mutex};

use crate::device::Device;
use crate::error::Result;
use crate::ffi::{RawEvent, RawStream};
use crate::memory::Buffer;
use crate::ops::Exec;

/// An in-order queue of work on one device.
#[derive(Debug)]
pub struct Stream {
    device: Device,
    raw: Option<RawStream>,
    pinned: Mutex<Vec<Arc<Buffer>>>,
}

impl Stream {
    pub(crate) fn new(device: &Device) -> Result<Stream> {
        let raw = device.plugin().stream_create(device.index())?;
        Ok(Stream {
            device: device.clone(),
            raw: Some(raw),
            pinned: Mutex::new(Vec::new()),
        })
    }

    /// The device it runs on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    pub(crate) fn raw(&self) -> &RawStream {
        self.raw.as_ref().expect("present until drop")
    }

    pub(crate) fn pin(&self, buffer: &Arc<Buffer>) {
        self.pinned
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(buffer.clone());
    }

    /// Enqueues operators on this stream; they run after earlier work on it.
    pub fn exec(&self) -> Exec<'_> {
        Exec::new(&self.device, Some(self))
    }

    /// Blocks until all enqueued work has completed; reports the first error
    /// of that work.
    pub fn synchronize(&self) -> Result<()> {
        let result = self.device.plugin().stream_synchronize(self.raw());
        self.pinned
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        result
    }

    /// Records an event at the current end of the stream.
    pub fn record(&self) -> Result<Event> {
        let event = Event::new(&self.device)?;
        self.device
            .plugin()
            .event_record(event.raw(), Some(self.raw()))?;
        Ok(event)
    }

    /// Makes later work on this stream wait for `event`. An event of the same
    /// plugin is waited for on the device, without blocking the caller; an
    /// event of another plugin is waited for here, on the host.
    pub fn wait(&self, event: &Event) -> Result<()> {
        if std::sync::Arc::ptr_eq(self.device.plugin(), event.device.plugin()) {
            self.device
                .plugin()
                .stream_wait_event(Some(self.raw()), event.raw())
        } else {
            event.synchronize()
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if let Some(raw) = self.raw.take() {
            if let Err(e) = self.device.plugin().stream_destroy(raw) {
                log::error!("destroying a stream on {}: {e}", self.device);
            }
        }
    }
}

/// A marker recorded on a stream.
#[derive(Debug)]
pub struct Event {
    device: Device,
    raw: Option<RawEvent>,
}

impl Event {
    fn new(device: &Device) -> Result<Event> {
        let raw = device.plugin().event_create(device.index())?;
        Ok(Event {
            device: device.clone(),
            raw: Some(raw),
        })
    }

    fn raw(&self) -> &RawEvent {
        self.raw.as_ref().expect("present until drop")
    }

    /// Blocks until the work before the event has completed.
    pub fn synchronize(&self) -> Result<()> {
        self.device.plugin().event_synchronize(self.raw())
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if let Some(raw) = self.raw.take() {
            if let Err(e) = self.device.plugin().event_destroy(raw) {
                log::error!("destroying an event on {}: {e}", self.device);
            }
        }
    }
}
