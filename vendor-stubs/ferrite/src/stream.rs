//! Streams and events.
//!
//! A [`Stream`] is an in-order queue served by its own worker thread. Work
//! arrives as boxed jobs ([`Job`]); event records and waits are queued as
//! plain markers. Enqueueing takes one short lock and wakes the worker only
//! when it is idle (a condvar notify costs a syscall even with no waiter).
//!
//! Errors: the first error of a job is remembered and returned by the next
//! [`Stream::synchronize`]. Until then the stream is *poisoned*: later jobs
//! already queued or queued meanwhile are skipped (not run), because they
//! usually consume what the failed job should have produced; the error's
//! message says how many were skipped. Event records and waits still run
//! even when poisoned, so nothing waiting on this stream's events hangs and
//! the ordering events promise is kept. After `synchronize` has returned the
//! error the stream is clean again. A panicking job becomes an error with
//! code `Panic`; the worker survives it.
//!
//! An [`Event`] is a pair of generations behind a mutex: recording bumps the
//! recorded generation and queues a marker that raises the completed
//! generation to it when the stream reaches it (on the default stream it
//! completes at once). Waits capture the recorded generation at the time of
//! the call, so re-recording an event later never extends an earlier wait,
//! and waits cannot form cycles. The completed generation only grows (it is
//! the maximum of the generations reached so far): when one event is recorded
//! on two streams, a later record completing first also completes the
//! earlier one, as an approximation.

use std::collections::VecDeque;
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

use polychip_plugin_sdk::{Error, ErrorCode, Result};

/// A unit of work queued on a stream.
pub type Job = Box<dyn FnOnce() -> Result<()> + Send + 'static>;

enum Task {
    Job(Job),
    Record(Arc<EventState>, u64),
    Wait(Arc<EventState>, u64),
}

impl fmt::Debug for Task {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Task::Job(_) => f.write_str("Job"),
            Task::Record(_, g) => write!(f, "Record({g})"),
            Task::Wait(_, g) => write!(f, "Wait({g})"),
        }
    }
}

#[derive(Debug, Default)]
struct QueueState {
    tasks: VecDeque<Task>,
    /// Tasks ever pushed.
    submitted: u64,
    /// Tasks finished (run or skipped).
    completed: u64,
    /// The first error not yet reported by `synchronize`.
    error: Option<Error>,
    /// Jobs skipped since that error.
    skipped: u64,
    /// The worker is waiting for tasks.
    worker_idle: bool,
    /// Threads blocked in `synchronize`.
    syncers: usize,
    /// The stream is being dropped: exit once the queue is empty.
    shutdown: bool,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<QueueState>,
    /// Signalled when a task is pushed to an idle worker, or on shutdown.
    work_ready: Condvar,
    /// Signalled when a task finishes and someone synchronizes.
    work_done: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// An asynchronous in-order queue of work on one device, with its own
/// worker thread.
#[derive(Debug)]
pub struct Stream {
    device: u32,
    shared: Arc<Shared>,
    worker: Option<JoinHandle<()>>,
}

impl Stream {
    /// Creates a stream on `device` and starts its worker.
    pub fn new(device: u32) -> Result<Stream> {
        let shared = Arc::new(Shared::default());
        let worker_shared = Arc::clone(&shared);
        let worker = std::thread::Builder::new()
            .name(format!("ferrite{device}-stream"))
            .spawn(move || work(&worker_shared))
            .map_err(|e| {
                Error::internal(format!(
                    "stream_create: Ferrite device {device} cannot start a stream thread: {e}"
                ))
            })?;
        Ok(Stream {
            device,
            shared,
            worker: Some(worker),
        })
    }

    /// The stream's device.
    pub fn device(&self) -> u32 {
        self.device
    }

    fn push(&self, task: Task) {
        let mut state = self.shared.lock();
        state.tasks.push_back(task);
        state.submitted += 1;
        let wake = state.worker_idle;
        state.worker_idle = false;
        drop(state);
        if wake {
            self.shared.work_ready.notify_one();
        }
    }

    /// Queues `job` after everything queued so far.
    pub fn enqueue(&self, job: Job) {
        self.push(Task::Job(job));
    }

    /// Blocks until everything queued so far has finished; returns (and
    /// forgets) the first error since the last synchronize.
    pub fn synchronize(&self) -> Result<()> {
        let mut state = self.shared.lock();
        let target = state.submitted;
        state.syncers += 1;
        while state.completed < target {
            state = self
                .shared
                .work_done
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
        state.syncers -= 1;
        let skipped = std::mem::take(&mut state.skipped);
        match state.error.take() {
            None => Ok(()),
            Some(mut error) => {
                if skipped > 0 {
                    error.message.push_str(&format!(
                        " ({skipped} later operation(s) on this stream were skipped)"
                    ));
                }
                Err(error)
            }
        }
    }
}

impl Drop for Stream {
    /// Lets the worker finish what is queued, then joins it.
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        state.shutdown = true;
        drop(state);
        self.shared.work_ready.notify_one();
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
        if let Some(error) = self.shared.lock().error.take() {
            log::warn!(
                "a Ferrite stream on device {} was destroyed with an unreported error: {error}",
                self.device
            );
        }
    }
}

/// The worker loop: runs tasks in order until shutdown and an empty queue.
fn work(shared: &Shared) {
    loop {
        let mut state = shared.lock();
        let task = loop {
            if let Some(task) = state.tasks.pop_front() {
                break task;
            }
            if state.shutdown {
                return;
            }
            state.worker_idle = true;
            state = shared
                .work_ready
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        };
        state.worker_idle = false;
        let poisoned = state.error.is_some();
        drop(state);

        let (result, skipped) = match task {
            Task::Job(_) if poisoned => (Ok(()), true),
            Task::Job(job) => (run(job), false),
            Task::Record(event, generation) => {
                event.complete(generation);
                (Ok(()), false)
            }
            Task::Wait(event, generation) => {
                event.wait_for(generation);
                (Ok(()), false)
            }
        };

        let mut state = shared.lock();
        state.completed += 1;
        state.skipped += u64::from(skipped);
        if let Err(error) = result {
            state.error.get_or_insert(error);
        }
        let wake = state.syncers > 0;
        drop(state);
        if wake {
            shared.work_done.notify_all();
        }
    }
}

/// Runs a job, turning a panic into an error.
fn run(job: Job) -> Result<()> {
    catch_unwind(AssertUnwindSafe(job)).unwrap_or_else(|payload| {
        let what = payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a non-string payload".to_owned());
        Err(Error::new(
            ErrorCode::Panic,
            format!("Ferrite: an operation on a stream panicked: {what}"),
        ))
    })
}

#[derive(Debug, Default)]
struct Generations {
    recorded: u64,
    completed: u64,
    /// Threads blocked in `wait_for`.
    waiters: usize,
}

#[derive(Debug, Default)]
struct EventState {
    generations: Mutex<Generations>,
    done: Condvar,
}

impl EventState {
    fn lock(&self) -> MutexGuard<'_, Generations> {
        self.generations
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Marks `generation` (and every earlier one) complete.
    fn complete(&self, generation: u64) {
        let mut g = self.lock();
        g.completed = g.completed.max(generation);
        let wake = g.waiters > 0;
        drop(g);
        if wake {
            self.done.notify_all();
        }
    }

    /// Blocks until `generation` has completed.
    fn wait_for(&self, generation: u64) {
        let mut g = self.lock();
        if g.completed >= generation {
            return;
        }
        g.waiters += 1;
        while g.completed < generation {
            g = self.done.wait(g).unwrap_or_else(PoisonError::into_inner);
        }
        g.waiters -= 1;
    }
}

/// A marker recorded on a stream. A new event counts as completed.
#[derive(Debug, Default)]
pub struct Event {
    state: Arc<EventState>,
}

impl Event {
    /// A new, completed event.
    pub fn new() -> Event {
        Event::default()
    }

    /// Records the event at the current end of `stream` (`None`: the default
    /// stream, where it completes at once).
    pub fn record(&self, stream: Option<&Stream>) {
        let mut g = self.state.lock();
        g.recorded += 1;
        let generation = g.recorded;
        drop(g);
        match stream {
            None => self.state.complete(generation),
            Some(stream) => stream.push(Task::Record(Arc::clone(&self.state), generation)),
        }
    }

    /// Makes later work on `stream` wait for the event as recorded now
    /// (`None`: the default stream, which blocks the caller instead).
    pub fn wait_on(&self, stream: Option<&Stream>) {
        let g = self.state.lock();
        let generation = g.recorded;
        if g.completed >= generation {
            return;
        }
        drop(g);
        match stream {
            None => self.state.wait_for(generation),
            Some(stream) => stream.push(Task::Wait(Arc::clone(&self.state), generation)),
        }
    }

    /// Blocks until the event's last record has completed.
    pub fn synchronize(&self) {
        let generation = self.state.lock().recorded;
        self.state.wait_for(generation);
    }

    /// Whether the last record has completed.
    pub fn is_complete(&self) -> bool {
        let g = self.state.lock();
        g.completed >= g.recorded
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    #[test]
    fn jobs_run_in_order_off_the_calling_thread() {
        let stream = Stream::new(0).unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let caller = std::thread::current().id();
        for i in 0..200 {
            let log = Arc::clone(&log);
            stream.enqueue(Box::new(move || {
                assert_ne!(std::thread::current().id(), caller);
                if i % 50 == 0 {
                    std::thread::sleep(Duration::from_millis(2));
                }
                log.lock().unwrap().push(i);
                Ok(())
            }));
        }
        stream.synchronize().unwrap();
        assert_eq!(*log.lock().unwrap(), (0..200).collect::<Vec<_>>());
        // An idle stream synchronizes at once, repeatedly.
        stream.synchronize().unwrap();
        stream.synchronize().unwrap();
    }

    #[test]
    fn the_first_error_is_reported_at_synchronize_and_later_jobs_are_skipped() {
        let stream = Stream::new(1).unwrap();
        let ran = Arc::new(AtomicU64::new(0));
        let count = |ran: &Arc<AtomicU64>| -> Job {
            let ran = Arc::clone(ran);
            Box::new(move || {
                ran.fetch_add(1, Ordering::SeqCst);
                Ok(())
            })
        };
        stream.enqueue(count(&ran));
        stream.enqueue(Box::new(|| Err(Error::invalid("first failure"))));
        stream.enqueue(Box::new(|| Err(Error::internal("second failure"))));
        stream.enqueue(count(&ran));
        let event = Event::new();
        event.record(Some(&stream));
        let err = stream.synchronize().unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidArgument);
        assert!(err.message.starts_with("first failure"), "{}", err.message);
        assert!(
            err.message.contains("2 later operation(s)"),
            "{}",
            err.message
        );
        assert_eq!(
            ran.load(Ordering::SeqCst),
            1,
            "jobs after the failure are skipped"
        );
        assert!(event.is_complete(), "event records still run when poisoned");

        // Reported once; the stream is clean again.
        stream.synchronize().unwrap();
        stream.enqueue(count(&ran));
        stream.synchronize().unwrap();
        assert_eq!(ran.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn a_panicking_job_is_an_error_and_the_worker_survives() {
        let stream = Stream::new(0).unwrap();
        stream.enqueue(Box::new(|| panic!("kernel exploded")));
        let err = stream.synchronize().unwrap_err();
        assert_eq!(err.code, ErrorCode::Panic);
        assert!(err.message.contains("kernel exploded"), "{}", err.message);
        let flag = Arc::new(AtomicU64::new(0));
        let f = Arc::clone(&flag);
        stream.enqueue(Box::new(move || {
            f.store(1, Ordering::SeqCst);
            Ok(())
        }));
        stream.synchronize().unwrap();
        assert_eq!(flag.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn dropping_a_stream_finishes_its_work() {
        let flag = Arc::new(AtomicU64::new(0));
        {
            let stream = Stream::new(0).unwrap();
            let f = Arc::clone(&flag);
            stream.enqueue(Box::new(move || {
                std::thread::sleep(Duration::from_millis(20));
                f.store(7, Ordering::SeqCst);
                Ok(())
            }));
        }
        assert_eq!(flag.load(Ordering::SeqCst), 7);
    }

    #[test]
    fn a_stream_waits_for_an_event_recorded_on_another() {
        for _ in 0..20 {
            let a = Stream::new(0).unwrap();
            let b = Stream::new(1).unwrap();
            let cell = Arc::new(AtomicU64::new(0));
            let seen = Arc::new(AtomicU64::new(u64::MAX));
            let event = Event::new();
            assert!(event.is_complete(), "a new event counts as completed");

            let c = Arc::clone(&cell);
            a.enqueue(Box::new(move || {
                std::thread::sleep(Duration::from_millis(10));
                c.store(42, Ordering::Relaxed);
                Ok(())
            }));
            event.record(Some(&a));
            event.wait_on(Some(&b));
            let (c, s) = (Arc::clone(&cell), Arc::clone(&seen));
            b.enqueue(Box::new(move || {
                s.store(c.load(Ordering::Relaxed), Ordering::Relaxed);
                Ok(())
            }));
            b.synchronize().unwrap();
            assert_eq!(seen.load(Ordering::Relaxed), 42);
            assert!(event.is_complete());
            a.synchronize().unwrap();
        }
    }

    #[test]
    fn event_synchronize_and_default_stream() {
        let stream = Stream::new(0).unwrap();
        let event = Event::new();
        event.synchronize(); // new: already complete
        let cell = Arc::new(AtomicU64::new(0));
        let c = Arc::clone(&cell);
        stream.enqueue(Box::new(move || {
            std::thread::sleep(Duration::from_millis(10));
            c.store(5, Ordering::Relaxed);
            Ok(())
        }));
        event.record(Some(&stream));
        event.synchronize();
        assert_eq!(cell.load(Ordering::Relaxed), 5);

        // Recording on the default stream completes at once; waiting on the
        // default stream blocks the caller until the recorded work is done.
        event.record(None);
        assert!(event.is_complete());
        let c = Arc::clone(&cell);
        stream.enqueue(Box::new(move || {
            std::thread::sleep(Duration::from_millis(10));
            c.store(6, Ordering::Relaxed);
            Ok(())
        }));
        event.record(Some(&stream));
        event.wait_on(None);
        assert_eq!(cell.load(Ordering::Relaxed), 6);
    }

    #[test]
    fn a_wait_covers_only_records_made_before_it() {
        let a = Stream::new(0).unwrap();
        let b = Stream::new(0).unwrap();
        let event = Event::new();
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        event.record(Some(&a));
        a.synchronize().unwrap();
        // B waits for the (complete) first record: it must not block on the
        // second record, which A cannot reach until B's job opens the gate.
        event.wait_on(Some(&b));
        let g = Arc::clone(&gate);
        a.enqueue(Box::new(move || {
            let (lock, cv) = &*g;
            let mut open = lock.lock().unwrap();
            while !*open {
                open = cv.wait(open).unwrap();
            }
            Ok(())
        }));
        event.record(Some(&a));
        let g = Arc::clone(&gate);
        b.enqueue(Box::new(move || {
            *g.0.lock().unwrap() = true;
            g.1.notify_all();
            Ok(())
        }));
        b.synchronize().unwrap();
        a.synchronize().unwrap();
        assert!(event.is_complete());
    }
}
