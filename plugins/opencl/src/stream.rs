//! Streams as OpenCL command queues, events as OpenCL events.
//!
//! A stream is an in-order `cl_command_queue` of its device; the default
//! stream is the device's own queue, and a call on it waits (`clFinish`)
//! before returning. An event holds the marker last recorded into it
//! (`clEnqueueMarkerWithWaitList`); a stream waits for it with a barrier
//! (`clEnqueueBarrierWithWaitList`), which keeps the wait on the device.
//! Queues of devices on different platforms (different contexts) cannot
//! wait on each other's events, so such a wait blocks the calling thread
//! until the event completes, which keeps the order the ABI promises.
//! An event never recorded is complete.

use std::sync::{Mutex, PoisonError};

use cl3::command_queue::{enqueue_barrier_with_wait_list, enqueue_marker_with_wait_list};
use opencl3::command_queue::CommandQueue;
use opencl3::event::Event as ClEvent;
use polychip_plugin_sdk::Result;

use crate::driver::ClResult;

/// A stream: a command queue of one device.
#[derive(Debug)]
pub struct Stream {
    /// The plugin device.
    pub device: u32,
    /// Its platform (events of the same platform are waited on the device).
    pub platform: usize,
    /// The queue.
    pub queue: CommandQueue,
}

// SAFETY: command queues are thread-safe (OpenCL 1.2 appendix A.2).
unsafe impl Send for Stream {}
// SAFETY: as above.
unsafe impl Sync for Stream {}

/// An event: the marker last recorded, with its queue's platform.
#[derive(Debug)]
pub struct Event {
    last: Mutex<Option<(ClEvent, usize)>>,
}

// SAFETY: event objects are thread-safe (OpenCL 1.2 appendix A.2).
unsafe impl Send for Event {}
// SAFETY: as above.
unsafe impl Sync for Event {}

impl Event {
    /// An event that is complete.
    pub fn new() -> Event {
        Event {
            last: Mutex::new(None),
        }
    }

    /// Records the current end of `queue` (of platform `platform`).
    pub fn record(&self, queue: &CommandQueue, platform: usize) -> Result<()> {
        // SAFETY: a marker with no wait list on a live queue.
        let raw = unsafe { enqueue_marker_with_wait_list(queue.get(), 0, std::ptr::null()) }
            .cl("clEnqueueMarkerWithWaitList")?;
        *self.last.lock().unwrap_or_else(PoisonError::into_inner) =
            Some((ClEvent::new(raw), platform));
        Ok(())
    }

    /// Makes later work on `queue` (of platform `platform`) wait for the
    /// marker recorded last, if any.
    pub fn wait_on(&self, queue: &CommandQueue, platform: usize) -> Result<()> {
        let last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        let Some((event, from)) = last.as_ref() else {
            return Ok(());
        };
        if *from == platform {
            let raw = event.get();
            // SAFETY: one live event of the queue's own context.
            let barrier = unsafe { enqueue_barrier_with_wait_list(queue.get(), 1, &raw) }
                .cl("clEnqueueBarrierWithWaitList")?;
            drop(ClEvent::new(barrier));
            Ok(())
        } else {
            event
                .wait()
                .cl("clWaitForEvents (an event of another platform)")
        }
    }

    /// Blocks until the marker recorded last has completed.
    pub fn synchronize(&self) -> Result<()> {
        let last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        match last.as_ref() {
            Some((event, _)) => event.wait().cl("clWaitForEvents"),
            None => Ok(()),
        }
    }
}

impl Default for Event {
    fn default() -> Self {
        Event::new()
    }
}
