//! Streams and events of the planted plugin.
//!
//! A [`Stream`] is an in-order queue with a worker thread of its own. In
//! full mode `copy` and `fill` on a stream are queued there and run on the
//! worker, as a device runs its kernels after the launching call returned;
//! every other operator first waits for its stream's queue to drain and
//! then runs on the calling thread, which keeps the order a stream
//! promises. (Legacy mode queues nothing: its operators run at once.) An
//! [`Event`] counts records and completions: a record on a stream completes
//! when the worker reaches it; a wait queued on a stream holds the worker
//! until the event has completed the record it saw.
//!
//! This is what lets the stream bugs of [`crate::mutants`] be planted (a
//! wait, an event or a synchronisation that returns early, an operator
//! that ignores its stream), each of which the conformance suite's stream
//! cases must flag.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use polychip_plugin_sdk::{DType, Error, Result, TensorDesc};

use crate::mutants::{Bug, is};

/// A unit of queued work; its error is kept for the next synchronisation.
type Job = Box<dyn FnOnce() -> Result<()> + Send + 'static>;

enum Task {
    Job(Job),
    Record(Arc<EventState>, u64),
    Wait(Arc<EventState>, u64),
}

#[derive(Default)]
struct Queue {
    tasks: VecDeque<Task>,
    /// The worker is running a task it took from `tasks`.
    busy: bool,
    /// The stream is being destroyed: the worker ends once `tasks` is empty.
    closed: bool,
    /// The first error of a queued job since the last synchronisation.
    error: Option<Error>,
}

#[derive(Default)]
struct Shared {
    queue: Mutex<Queue>,
    changed: Condvar,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// An in-order queue of work with its own worker thread.
pub struct Stream {
    shared: Arc<Shared>,
    worker: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream").finish_non_exhaustive()
    }
}

impl Stream {
    /// A new stream and its worker.
    pub fn new() -> Result<Stream> {
        let shared = Arc::new(Shared::default());
        let worker = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("planted-stream".into())
                .spawn(move || work(&shared))
                .map_err(|e| {
                    Error::invalid(format!("planted: cannot start a stream's worker: {e}"))
                })?
        };
        Ok(Stream {
            shared,
            worker: Some(worker),
        })
    }

    fn push(&self, task: Task) {
        lock(&self.shared.queue).tasks.push_back(task);
        self.shared.changed.notify_all();
    }

    /// Queues `job` after the stream's earlier work.
    pub fn enqueue(&self, job: Job) {
        self.push(Task::Job(job));
    }

    /// Waits until every task queued so far has run.
    pub fn drain(&self) {
        let mut q = lock(&self.shared.queue);
        while !q.tasks.is_empty() || q.busy {
            q = self
                .shared
                .changed
                .wait(q)
                .unwrap_or_else(|e| e.into_inner());
        }
    }

    /// `stream_synchronize`: drains, then reports the first error of the
    /// work since the last synchronisation.
    pub fn synchronize(&self) -> Result<()> {
        if !is(Bug::StreamSynchronizeReturnsAtOnce) {
            self.drain();
        }
        match lock(&self.shared.queue).error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        lock(&self.shared.queue).closed = true;
        self.shared.changed.notify_all();
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
    }
}

/// The worker: runs tasks in order until the stream is closed and empty.
fn work(shared: &Shared) {
    loop {
        let task = {
            let mut q = lock(&shared.queue);
            loop {
                if let Some(task) = q.tasks.pop_front() {
                    q.busy = true;
                    break task;
                }
                if q.closed {
                    return;
                }
                q = shared.changed.wait(q).unwrap_or_else(|e| e.into_inner());
            }
        };
        let error = match task {
            Task::Job(job) => job().err(),
            Task::Record(event, generation) => {
                event.complete(generation);
                None
            }
            Task::Wait(event, generation) => {
                event.wait_for(generation);
                None
            }
        };
        let mut q = lock(&shared.queue);
        q.busy = false;
        if q.error.is_none() {
            q.error = error;
        }
        drop(q);
        shared.changed.notify_all();
    }
}

#[derive(Debug, Default)]
struct EventState {
    /// (records made, the highest record completed).
    counts: Mutex<(u64, u64)>,
    changed: Condvar,
}

impl EventState {
    fn complete(&self, generation: u64) {
        let mut c = lock(&self.counts);
        c.1 = c.1.max(generation);
        drop(c);
        self.changed.notify_all();
    }

    fn wait_for(&self, generation: u64) {
        let mut c = lock(&self.counts);
        while c.1 < generation {
            c = self.changed.wait(c).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// A marker recorded on a stream. A new event counts as completed.
#[derive(Debug, Default)]
pub struct Event(Arc<EventState>);

impl Event {
    /// `event_record`: on a stream, completes when the stream reaches it; on
    /// the default stream (`None`), at once.
    pub fn record(&self, stream: Option<&Stream>) {
        let generation = {
            let mut c = lock(&self.0.counts);
            c.0 += 1;
            c.0
        };
        match stream {
            Some(s) if !is(Bug::EventRecordCompletesAtOnce) => {
                s.push(Task::Record(Arc::clone(&self.0), generation));
            }
            _ => self.0.complete(generation),
        }
    }

    /// `stream_wait_event`: later work on `stream` waits for the record made
    /// last; with `None` the caller waits.
    pub fn wait_on(&self, stream: Option<&Stream>) {
        let generation = lock(&self.0.counts).0;
        match stream {
            Some(_) if is(Bug::StreamWaitEventIgnored) => {}
            Some(s) => s.push(Task::Wait(Arc::clone(&self.0), generation)),
            None => self.0.wait_for(generation),
        }
    }

    /// `event_synchronize`: the caller waits for the record made last.
    pub fn synchronize(&self) {
        if !is(Bug::EventSynchronizeReturnsAtOnce) {
            let generation = lock(&self.0.counts).0;
            self.0.wait_for(generation);
        }
    }
}

/// A tensor descriptor whose extents and strides are owned, so that queued
/// work can rebuild it after the call that queued it returned (the host
/// keeps the memory alive until the stream is synchronised).
#[derive(Debug)]
pub struct OwnedDesc {
    data: usize,
    dtype: DType,
    shape: Vec<i64>,
    strides: Vec<i64>,
}

impl OwnedDesc {
    /// An owned copy of `desc`.
    pub fn new(desc: &TensorDesc<'_>) -> OwnedDesc {
        OwnedDesc {
            data: desc.data as usize,
            dtype: desc.dtype,
            shape: desc.shape.to_vec(),
            strides: desc.strides().to_vec(),
        }
    }

    /// The descriptor again.
    pub fn desc(&self) -> TensorDesc<'_> {
        TensorDesc {
            data: self.data as *mut u8,
            dtype: self.dtype,
            shape: &self.shape,
            strides: Some(&self.strides),
        }
    }
}
