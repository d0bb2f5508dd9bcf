//! The state a TCP transport shares between its callers and its background
//! progress thread: registered regions (page-aligned, zeroed, pre-faulted
//! memory owned here), the signal counters with the condition variable
//! waiters that are not reading the sockets block on, the eventfd that wakes
//! a reader blocked in `poll`, the bookkeeping that tells the progress thread
//! when callers are driving the sockets themselves, and the first failure (a
//! lost peer or a protocol violation), which every later call reports.

use std::alloc::Layout;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::error::{CommError, Result};
use crate::transport::{Departures, RegionId, SignalId};

/// Number of signal counters per rank: ids `0..MAX_SIGNALS`.
pub const MAX_SIGNALS: usize = 4096;

pub(crate) const PAGE: usize = 4096;

/// Peer states: connected, left cleanly (sent GOODBYE), or gone otherwise.
const ALIVE: u8 = 0;
const LEFT: u8 = 1;
const GONE: u8 = 2;
/// It announced that its communicator failed (an ABORT frame).
const ABORTED: u8 = 3;

/// What a wait failing because of a clean departure reports.
pub(crate) const LEFT_THE_JOB: &str = "left the job";

/// One rank's copy of a registered region.
#[derive(Debug)]
pub(crate) struct Region {
    ptr: NonNull<u8>,
    len: usize,
    layout: Layout,
}

// SAFETY: the region is plain heap memory owned by the transport; which
// thread touches which bytes when is governed by the transport contract
// (a range is written by one peer and read only after its signal).
unsafe impl Send for Region {}
// SAFETY: as above; the struct itself is never mutated after creation.
unsafe impl Sync for Region {}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `alloc_zeroed(self.layout)` and is freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

/// Why the transport failed.
#[derive(Debug, Clone)]
enum Failure {
    Lost {
        peer: usize,
        why: String,
    },
    Protocol {
        peer: usize,
        message: String,
    },
    /// The peer announced its communicator's failure, for `why`.
    Aborted {
        peer: usize,
        why: String,
    },
}

/// State shared between the transport and its receiver threads.
#[derive(Debug)]
pub(crate) struct Shared {
    pub rank: usize,
    pub world_size: usize,
    pub timeout: Duration,
    /// Set by `Drop`, so readers seeing the connections end on shutdown
    /// record no failure.
    pub closing: AtomicBool,
    regions: Mutex<Vec<Region>>,
    counters: Box<[AtomicU64]>,
    failed: AtomicBool,
    failure: Mutex<Option<Failure>>,
    /// Whether this rank announced its own failure (once).
    pub aborted: AtomicBool,
    /// Whether this rank's communicator announced that it left (once).
    pub leaving: AtomicBool,
    /// Per peer: [`ALIVE`], [`LEFT`] (it said goodbye) or [`GONE`] (its
    /// receiver thread ended without a goodbye).
    peers: Box<[AtomicU8]>,
    /// How many peers said goodbye.
    departed: AtomicUsize,
    /// The peers whose communicators left cleanly (a FINALS frame).
    departures: Departures,
    /// Threads blocked on `wake` (waiters that are not reading sockets).
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
    /// Threads blocked in `poll` on the sockets and `kick`: a signal raised
    /// or a failure recorded by another thread must wake them.
    pollers: AtomicUsize,
    kick: OwnedFd,
    /// A tiny write was queued for later (`write`'s deferral) since the
    /// progress thread last flushed: it must not sleep long in `poll`.
    deferred: AtomicBool,
    /// Callers inside `wait` or a blocked `write` (they read the sockets
    /// themselves, so the progress thread stays parked).
    pub active: AtomicUsize,
    /// When a caller last left `wait` or `write`, in ns since `epoch`.
    last_active: AtomicU64,
    epoch: Instant,
    /// Where the progress thread parks (woken on close, and by the last
    /// caller to leave while it is parked for them).
    park_lock: Mutex<()>,
    park: Condvar,
    /// The progress thread is parked until no caller drives the sockets.
    progress_parked: AtomicBool,
}

impl Shared {
    pub fn new(rank: usize, world_size: usize, timeout: Duration) -> std::io::Result<Shared> {
        // SAFETY: plain syscall; the result is checked before use.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor owned by nobody else.
        let kick = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Shared {
            rank,
            world_size,
            timeout,
            closing: AtomicBool::new(false),
            regions: Mutex::new(Vec::new()),
            counters: (0..MAX_SIGNALS).map(|_| AtomicU64::new(0)).collect(),
            failed: AtomicBool::new(false),
            failure: Mutex::new(None),
            aborted: AtomicBool::new(false),
            leaving: AtomicBool::new(false),
            peers: (0..world_size).map(|_| AtomicU8::new(ALIVE)).collect(),
            departed: AtomicUsize::new(0),
            departures: Departures::new(world_size),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            pollers: AtomicUsize::new(0),
            kick,
            deferred: AtomicBool::new(false),
            active: AtomicUsize::new(0),
            last_active: AtomicU64::new(0),
            epoch: Instant::now(),
            park_lock: Mutex::new(()),
            park: Condvar::new(),
            progress_parked: AtomicBool::new(false),
        })
    }

    /// The eventfd that wakes threads blocked in `poll`.
    pub fn kick_fd(&self) -> RawFd {
        self.kick.as_raw_fd()
    }

    /// Wakes the threads blocked in `poll`, if any.
    pub fn kick(&self) {
        if self.pollers.load(Ordering::SeqCst) > 0 {
            let one = 1u64;
            // SAFETY: writes 8 bytes from a live u64 to the eventfd; a full
            // counter (EAGAIN) already means "readable".
            let _ = unsafe { libc::write(self.kick.as_raw_fd(), (&raw const one).cast(), 8) };
        }
    }

    /// Consumes pending kicks (after `poll` saw the eventfd readable).
    pub fn clear_kick(&self) {
        let mut value = 0u64;
        // SAFETY: reads 8 bytes into a live u64 from the non-blocking eventfd.
        let _ = unsafe { libc::read(self.kick.as_raw_fd(), (&raw mut value).cast(), 8) };
    }

    /// Notes that a tiny write was queued for later and wakes a progress
    /// thread blocked in `poll`. SeqCst pairs with [`Shared::polling`]:
    /// either the poller sees the flag before it blocks, or this sees the
    /// poller and kicks.
    pub fn note_deferred(&self) {
        self.deferred.store(true, Ordering::SeqCst);
        self.kick();
    }

    /// Whether a write was queued for later since [`Shared::take_deferred`].
    pub fn has_deferred(&self) -> bool {
        self.deferred.load(Ordering::SeqCst)
    }

    /// Clears the flag (before flushing every queue).
    pub fn take_deferred(&self) -> bool {
        self.deferred.swap(false, Ordering::SeqCst)
    }

    /// Counts a thread entering (`true`) or leaving `poll`. SeqCst pairs
    /// with `kick`: either the poller re-checks after the change it waits
    /// for, or the changer sees the poller and kicks.
    pub fn polling(&self, entering: bool) {
        if entering {
            self.pollers.fetch_add(1, Ordering::SeqCst);
        } else {
            self.pollers.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// A caller starts driving the sockets (waiting, or blocked sending).
    pub fn enter(&self) {
        self.active.fetch_add(1, Ordering::SeqCst);
    }

    /// A caller stops driving the sockets.
    pub fn leave(&self) {
        self.last_active
            .store(self.epoch.elapsed().as_nanos() as u64, Ordering::Relaxed);
        let was = self.active.fetch_sub(1, Ordering::SeqCst);
        // A waiter blocked on the condition variable may now read itself.
        self.wake_all();
        // SeqCst pairs with `park_while_active`: either the progress thread
        // sees no caller before it blocks, or this sees it parked.
        if was == 1 && self.progress_parked.load(Ordering::SeqCst) {
            drop(self.park_lock.lock().unwrap_or_else(|e| e.into_inner()));
            self.park.notify_all();
        }
    }

    /// The progress thread: parks for up to `at_most` unless the
    /// transport is closing (`close` wakes it).
    pub fn nap(&self, at_most: Duration) {
        let guard = self.park_lock.lock().unwrap_or_else(|e| e.into_inner());
        if !self.closing.load(Ordering::SeqCst) {
            drop(self.park.wait_timeout(guard, at_most));
        }
    }

    /// The progress thread: blocks while a caller drives the sockets
    /// (it has nothing to do then), until the last one leaves, the
    /// transport closes, or `at_most` passes.
    pub fn park_while_active(&self, at_most: Duration) {
        let guard = self.park_lock.lock().unwrap_or_else(|e| e.into_inner());
        self.progress_parked.store(true, Ordering::SeqCst);
        if self.active.load(Ordering::SeqCst) > 0 && !self.closing.load(Ordering::SeqCst) {
            drop(self.park.wait_timeout(guard, at_most));
        } else {
            drop(guard);
        }
        self.progress_parked.store(false, Ordering::SeqCst);
    }

    /// How long no caller has been driving the sockets (zero while one is).
    pub fn idle_for(&self) -> Duration {
        if self.active.load(Ordering::SeqCst) > 0 {
            return Duration::ZERO;
        }
        let last = Duration::from_nanos(self.last_active.load(Ordering::Relaxed));
        self.epoch.elapsed().saturating_sub(last)
    }

    pub fn io(&self, op: &str, e: impl std::fmt::Display) -> CommError {
        CommError::Io {
            rank: self.rank,
            op: format!("tcp {op}"),
            message: e.to_string(),
        }
    }

    pub fn register(&self, len: usize) -> Result<(RegionId, *mut u8)> {
        let layout = Layout::from_size_align(len.max(1).next_multiple_of(PAGE), PAGE)
            .map_err(|e| CommError::Usage(format!("tcp register: {len} bytes: {e}")))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) })
            .ok_or_else(|| self.io("register", format!("cannot allocate {len} bytes")))?;
        // Fault every page in now, not during the first transfer.
        for page in (0..layout.size()).step_by(PAGE) {
            // SAFETY: `page` is inside the allocation of `layout.size()` bytes.
            unsafe { ptr.as_ptr().add(page).write_volatile(0) };
        }
        let mut regions = self.regions.lock().unwrap_or_else(|e| e.into_inner());
        let id = u32::try_from(regions.len())
            .map_err(|_| CommError::Usage("tcp register: too many regions".into()))?;
        regions.push(Region { ptr, len, layout });
        drop(regions);
        // A reader may have stopped at a write to this region.
        self.kick();
        Ok((RegionId(id), ptr.as_ptr()))
    }

    /// The length and base of a registered region.
    pub fn region(&self, id: RegionId) -> Option<(usize, *mut u8)> {
        let regions = self.regions.lock().unwrap_or_else(|e| e.into_inner());
        regions.get(id.0 as usize).map(|r| (r.len, r.ptr.as_ptr()))
    }

    /// Marks the transport closing and wakes the progress thread.
    pub fn close(&self) {
        self.closing.store(true, Ordering::SeqCst);
        drop(self.park_lock.lock().unwrap_or_else(|e| e.into_inner()));
        self.park.notify_all();
        self.kick();
    }

    pub fn counter(&self, signal: SignalId) -> Option<&AtomicU64> {
        self.counters.get(signal.0 as usize)
    }

    /// Adds one to `signal` (after the payload is in place) and wakes waiters.
    pub fn raise(&self, signal: SignalId) {
        // SeqCst pairs with the sleeper count in `block_until`: either the
        // sleeper sees the new value or this sees the sleeper.
        self.counters[signal.0 as usize].fetch_add(1, Ordering::SeqCst);
        self.wake_all();
        self.kick();
    }

    fn wake_all(&self) {
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            drop(self.lock.lock().unwrap_or_else(|e| e.into_inner()));
            self.wake.notify_all();
        }
    }

    pub fn fail_lost(&self, peer: usize, why: String) {
        self.fail(Failure::Lost { peer, why });
    }

    /// Records that `peer` said goodbye: it can no longer receive, and
    /// nothing more will come from it. Not a failure (logged at debug).
    pub fn peer_left(&self, peer: usize) {
        if self.peers[peer]
            .compare_exchange(ALIVE, LEFT, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            log::debug!("tcp rank {}: peer rank {peer} left the job", self.rank);
            self.departed.fetch_add(1, Ordering::SeqCst);
            drop(self.lock.lock().unwrap_or_else(|e| e.into_inner()));
            self.wake.notify_all();
            self.kick();
        }
    }

    /// Records that `peer`'s communicator left cleanly after `calls`
    /// collective calls, raising this rank's counters no further than
    /// `finals` (every frame it sent before has been applied): wakes every
    /// waiter, so one waiting for more fails at once.
    pub fn peer_departing(&self, peer: usize, calls: u64, finals: Vec<(SignalId, u64)>) {
        if !self.departures.record(peer, calls, finals) {
            return;
        }
        log::debug!(
            "tcp rank {}: peer rank {peer} left after {calls} calls",
            self.rank
        );
        drop(self.lock.lock().unwrap_or_else(|e| e.into_inner()));
        self.wake.notify_all();
        self.kick();
    }

    /// How many peers' communicators left.
    pub fn leavers(&self) -> usize {
        self.departures.count()
    }

    /// `peer`'s number of collective calls, if its communicator left.
    pub fn departed(&self, peer: usize) -> Option<u64> {
        self.departures.calls(peer)
    }

    /// The final values of this rank's counters `peer` declared as its
    /// communicator left (empty while it has not).
    pub fn finals_of(&self, peer: usize) -> Vec<(SignalId, u64)> {
        self.departures.finals(peer)
    }

    /// A peer whose communicator left with `signal` final below `value`,
    /// as a wait's error: the wait can never end.
    pub fn left_short(&self, signal: SignalId, value: u64) -> Option<CommError> {
        let peer = self.departures.short_peer(signal, value)?;
        Some(CommError::peer_left(self.rank, "tcp wait", peer, ""))
    }

    /// Records that `peer` announced its communicator's failure: every
    /// later wait and write fails naming it (its goodbye, which follows,
    /// is no clean departure).
    pub fn peer_aborted(&self, peer: usize, why: String) {
        log::debug!("tcp rank {}: peer rank {peer} failed: {why}", self.rank);
        let _ =
            self.peers[peer].compare_exchange(ALIVE, ABORTED, Ordering::SeqCst, Ordering::SeqCst);
        self.fail(Failure::Aborted { peer, why });
    }

    /// Records that `peer`'s connection ended without a goodbye.
    pub fn peer_gone(&self, peer: usize) {
        let _ = self.peers[peer].compare_exchange(ALIVE, GONE, Ordering::SeqCst, Ordering::SeqCst);
    }

    /// Whether `peer` said goodbye.
    pub fn has_left(&self, peer: usize) -> bool {
        self.peers[peer].load(Ordering::SeqCst) == LEFT
    }

    /// Whether `peer`'s connection ended without a goodbye.
    pub fn is_gone(&self, peer: usize) -> bool {
        self.peers[peer].load(Ordering::SeqCst) == GONE
    }

    /// The first peer that left cleanly, if any.
    fn first_departed(&self) -> Option<usize> {
        if self.departed.load(Ordering::SeqCst) == 0 {
            return None;
        }
        (0..self.world_size).find(|&p| self.has_left(p))
    }

    /// A wait's error when a departed peer may be the reason it cannot be
    /// satisfied: immediately when every peer has left (nobody can raise a
    /// signal any more), and at the deadline when any has.
    pub fn departure_error(&self, at_deadline: bool) -> Option<CommError> {
        let departed = self.departed.load(Ordering::SeqCst);
        let everyone = departed > 0 && departed + 1 >= self.world_size;
        if !(everyone || at_deadline) {
            return None;
        }
        let peer = self.first_departed()?;
        Some(CommError::PeerLost {
            rank: self.rank,
            op: "tcp wait".into(),
            peer,
            why: LEFT_THE_JOB.into(),
        })
    }

    pub fn fail_protocol(&self, peer: usize, message: String) {
        self.fail(Failure::Protocol { peer, message });
    }

    fn fail(&self, failure: Failure) {
        if self.closing.load(Ordering::SeqCst) {
            return;
        }
        let mut first = self.failure.lock().unwrap_or_else(|e| e.into_inner());
        if first.is_none() {
            log::warn!("tcp rank {}: {failure:?}", self.rank);
            *first = Some(failure);
            self.failed.store(true, Ordering::SeqCst);
        }
        drop(first);
        drop(self.lock.lock().unwrap_or_else(|e| e.into_inner()));
        self.wake.notify_all();
        self.kick();
    }

    /// The first failure, as an error of operation `op`.
    pub fn failure_error(&self, op: &str) -> Option<CommError> {
        let first = self.failure.lock().unwrap_or_else(|e| e.into_inner());
        let op = format!("tcp {op}");
        Some(match first.clone()? {
            Failure::Lost { peer, why } => CommError::PeerLost {
                rank: self.rank,
                op,
                peer,
                why,
            },
            Failure::Protocol { peer, message } => CommError::Mismatch {
                rank: self.rank,
                op,
                message: format!("peer rank {peer} broke the protocol: {message}"),
            },
            Failure::Aborted { peer, why } => CommError::peer_failed(self.rank, op, peer, &why),
        })
    }

    /// The failure a peer announced, if it is the first failure (one load
    /// when there is none).
    pub fn announced_failure(&self, op: &str) -> Option<CommError> {
        if !self.failed.load(Ordering::Acquire) {
            return None;
        }
        let first = self.failure.lock().unwrap_or_else(|e| e.into_inner());
        match first.as_ref()? {
            Failure::Aborted { peer, why } => Some(CommError::peer_failed(
                self.rank,
                format!("tcp {op}"),
                *peer,
                why,
            )),
            _ => None,
        }
    }

    /// Fails with the first failure, if any.
    pub fn check(&self, op: &str) -> Result<()> {
        if self.failed.load(Ordering::Acquire) {
            return Err(self.failure_error(op).expect("failed is set after failure"));
        }
        Ok(())
    }

    /// Blocks until `counter >= value`, a failure or `until` (whichever is
    /// first; the caller checks which).
    pub fn block_briefly(&self, counter: &AtomicU64, value: u64, until: Instant) {
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        let mut guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let now = Instant::now();
            if counter.load(Ordering::SeqCst) >= value
                || self.failed.load(Ordering::SeqCst)
                || now >= until
            {
                break;
            }
            guard = self
                .wake
                .wait_timeout(guard, until - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        drop(guard);
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
    }
}
