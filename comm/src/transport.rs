//! The one-sided transport interface every collective is written over,
//! shaped like RDMA: each rank registers memory regions that its peers may
//! write into, a write is followed by a signal (like an RDMA write with
//! immediate data), and a rank waits for its own signal counters to reach a
//! value. Shared memory, TCP and RDMA verbs implement it.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use crate::error::Result;

/// A region registered on every rank by a collective call of
/// [`Transport::register`]: the same id names each rank's own copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RegionId(pub u32);

/// A signal counter of the local rank that peers increment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SignalId(pub u32);

/// Most counters one departing rank declares final to one peer
/// ([`Departure::finals`]).
pub const MAX_FINALS: usize = 4;

/// What a rank leaving cleanly tells one peer ([`Transport::leave`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Departure {
    /// How many collective calls it made (its last call's number).
    pub calls: u64,
    /// The final value of each of the peer's counters it raised (at most
    /// [`MAX_FINALS`]; more are ignored): nothing will raise them further.
    pub finals: Vec<(SignalId, u64)>,
}

/// Whether `finals` makes `signal`'s counter stop below `value`: a wait
/// for it can never end.
pub(crate) fn short_of(finals: &[(SignalId, u64)], signal: SignalId, value: u64) -> bool {
    finals.iter().any(|&(s, v)| s == signal && v < value)
}

/// What a rank knows of the peers whose communicators left cleanly: how
/// many collective calls each made and the final values of this rank's
/// counters it declared. One per transport that carries leave notices
/// (TCP's frames, verbs' store notices).
#[derive(Debug)]
pub(crate) struct Departures {
    /// Per peer: 0, or 1 + its number of collective calls once it left.
    left_at: Box<[AtomicU64]>,
    /// How many peers left (one load for a call beginning).
    count: AtomicUsize,
    /// Per peer: the final values of this rank's counters it declared.
    finals: Mutex<Vec<Vec<(SignalId, u64)>>>,
}

impl Departures {
    /// None of `world` ranks has left.
    pub fn new(world: usize) -> Departures {
        Departures {
            left_at: (0..world).map(|_| AtomicU64::new(0)).collect(),
            count: AtomicUsize::new(0),
            finals: Mutex::new(vec![Vec::new(); world]),
        }
    }

    /// Records that `peer` left after `calls` calls, declaring `finals`;
    /// false when it was recorded already.
    pub fn record(&self, peer: usize, calls: u64, finals: Vec<(SignalId, u64)>) -> bool {
        let mut all = self.finals.lock().unwrap_or_else(|e| e.into_inner());
        if self.left_at[peer].load(Ordering::SeqCst) != 0 {
            return false;
        }
        all[peer] = finals;
        drop(all);
        self.left_at[peer].store(calls.saturating_add(1), Ordering::SeqCst);
        self.count.fetch_add(1, Ordering::SeqCst);
        true
    }

    /// How many peers left.
    pub fn count(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }

    /// `peer`'s number of collective calls, if it left.
    pub fn calls(&self, peer: usize) -> Option<u64> {
        self.left_at
            .get(peer)?
            .load(Ordering::Acquire)
            .checked_sub(1)
    }

    /// The final values of this rank's counters `peer` declared as it left
    /// (empty while it has not).
    pub fn finals(&self, peer: usize) -> Vec<(SignalId, u64)> {
        let all = self.finals.lock().unwrap_or_else(|e| e.into_inner());
        all.get(peer).cloned().unwrap_or_default()
    }

    /// A departed peer whose final value of `signal` is below `value`: a
    /// wait for it can never end. One load when no peer left.
    pub fn short_peer(&self, signal: SignalId, value: u64) -> Option<usize> {
        if self.count() == 0 {
            return None;
        }
        let all = self.finals.lock().unwrap_or_else(|e| e.into_inner());
        (0..all.len()).find(|&p| short_of(&all[p], signal, value))
    }
}

/// A one-sided transport between the ranks of one job.
///
/// Ordering: a signal a peer raises after a write is seen only after the
/// written bytes are visible in the region. Writes from one peer to one
/// region are applied in order.
pub trait Transport: Send + Sync {
    /// This rank.
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn world_size(&self) -> usize;
    /// A short name: `shm`, `tcp` or `verbs`.
    fn name(&self) -> &'static str;
    /// Registers a region of `len` bytes on every rank (a collective call:
    /// every rank calls it with the same `len`, in the same order) and
    /// returns its id and this rank's copy. The memory stays registered and
    /// valid for the transport's lifetime.
    fn register(&self, len: usize) -> Result<(RegionId, *mut u8)>;
    /// Copies `data` into `peer`'s copy of `region` at `offset`, then adds one
    /// to `peer`'s counter `signal`. May return before the bytes arrive.
    fn write(
        &self,
        peer: usize,
        region: RegionId,
        offset: usize,
        data: &[u8],
        signal: SignalId,
    ) -> Result<()>;
    /// Copies `parts`, one after another, into `peer`'s copy of `region`
    /// from `offset`, then adds one to `peer`'s counter `signal`: a
    /// [`Transport::write`] of their concatenation. The default joins them
    /// in a new buffer; transports for which
    /// [`Transport::writes_parts_in_place`] is true copy each part directly.
    fn write_parts(
        &self,
        peer: usize,
        region: RegionId,
        offset: usize,
        parts: &[&[u8]],
        signal: SignalId,
    ) -> Result<()> {
        self.write(peer, region, offset, &parts.concat(), signal)
    }
    /// Whether [`Transport::write_parts`] costs no more than one
    /// [`Transport::write`] (no joining copy): then a message's header and
    /// payload are written straight from where they are.
    fn writes_parts_in_place(&self) -> bool {
        false
    }
    /// Waits until this rank's counter `signal` reaches at least `value`, or
    /// fails at `deadline` or when a peer is lost.
    fn wait(&self, signal: SignalId, value: u64, deadline: Instant) -> Result<()>;
    /// The current value of this rank's counter `signal`.
    fn signal_value(&self, signal: SignalId) -> u64;
    /// Starts (`true`) or ends (`false`) a stretch in which the caller
    /// polls [`Transport::signal_value`] and calls [`Transport::progress`]
    /// instead of waiting (a group of sends and receives): a transport
    /// whose progress needs driving (TCP) then leaves the driving to it.
    fn polling(&self, _on: bool) {}
    /// Moves what is queued and reads what has arrived, without waiting,
    /// inside [`Transport::polling`]. Nothing to do where writes land
    /// straight in the peers' memory.
    fn progress(&self) {}
    /// Tells every peer, out of band and at once, that this rank's
    /// communicator failed for `why` (its error's words, cut to
    /// [`crate::error::MAX_ABORT_REASON`] bytes): a peer blocked in any wait
    /// then fails with [`crate::CommError::PeerLost`] naming this rank and
    /// `why` (see [`crate::CommError::peer_failed`]), instead of waiting out
    /// its deadline, and so does every later wait of theirs. Best effort,
    /// bounded (about a second in all, however many peers: a peer whose
    /// connection has not taken it by then has the connection closed
    /// instead), idempotent: only the first call announces.
    fn abort(&self, _why: &str) {}

    /// Tells every peer, out of band, that this rank's communicator is
    /// leaving cleanly (it was destroyed, or the job is finishing) and will
    /// raise nothing more: `note(peer)` is what `peer` is told, the number
    /// of collective calls this rank made and the final value of each
    /// counter it raised on `peer` (at most [`MAX_FINALS`] of them). A peer
    /// waiting for more than a final value then fails at once with
    /// [`crate::CommError::PeerLost`] naming this rank ("it left",
    /// [`crate::error::PEER_LEFT`]), instead of waiting out its deadline;
    /// a wait the departed rank's writes satisfy still succeeds. Best
    /// effort, bounded, only the first call counts. Verbs carries it
    /// through the rendezvous store (read every 100 ms, see
    /// [`crate::verbs::notices`]); a transport that cannot tell ignores it.
    fn leave(&self, _note: &dyn Fn(usize) -> Departure) {}

    /// How many peers announced with [`Transport::leave`] that they left
    /// (one load): what a call checks as it begins.
    fn departures(&self) -> usize {
        0
    }

    /// The number of collective calls `peer` made before it left, if it
    /// announced with [`Transport::leave`] that it did.
    fn departed(&self, _peer: usize) -> Option<u64> {
        None
    }

    /// The final values of this rank's counters that `peer` declared as
    /// it left ([`Departure::finals`]); empty while it has not left, or
    /// where the transport cannot tell.
    fn finals(&self, _peer: usize) -> Vec<(SignalId, u64)> {
        Vec::new()
    }

    /// The failure a peer announced with [`Transport::abort`], if one did,
    /// as the error of a wait (`PeerLost`, op "wait"). Cheap (an atomic
    /// load when none did): checked when every operation begins.
    fn peer_failure(&self) -> Option<crate::CommError> {
        None
    }

    /// [`Transport::peer_failure`], or else a peer known to be lost (its
    /// process gone without closing its transport, its connection ended
    /// without a goodbye): what a rank waiting outside the transport (at
    /// the job's exit barrier) checks now and then. A peer that left
    /// cleanly is no failure here. May cost system calls.
    fn peer_lost(&self) -> Option<crate::CommError> {
        self.peer_failure()
    }

    /// The address this rank listens on for its peers, for a transport
    /// over a network (TCP): the groups split from it listen there too, as
    /// it is one its peers can reach (the world's may have been chosen by
    /// its route to rank 0, not by `POLYCHIP_COMM_ADDR`). `None` otherwise.
    fn listen_addr(&self) -> Option<std::net::IpAddr> {
        None
    }

    /// The job's secret its ranks proved to each other when it connected
    /// (TCP): the groups split from it prove the same one. `None` otherwise.
    fn job_auth(&self) -> Option<crate::auth::JobAuth> {
        None
    }
}
