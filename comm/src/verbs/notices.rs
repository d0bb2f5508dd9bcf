//! The out-of-band notices of the verbs transport, through the rendezvous
//! store: RDMA has no frames of its own to carry them (TCP sends ABORT and
//! FINALS frames, shared memory marks the peers' control segments), so a
//! rank whose communicator fails ([`Transport::abort`]) or leaves cleanly
//! ([`Transport::leave`]) writes its notice under the transport's store
//! namespace and bumps a change counter; every rank's notice thread reads
//! the counter every [`POLL_EVERY`] and, when it moved, the notices of the
//! peers it has not heard from. A waiter then sees the notice with one
//! atomic load, as over TCP: a peer's announced failure fails every wait
//! and later call naming it, a departure fails waits for more than its
//! final counter values and collectives after its last.
//!
//! Keys (under `{base}`, the transport's namespace): `count` (the change
//! counter), `failed/{rank}` (the reason, UTF-8, at most
//! [`MAX_ABORT_REASON`] bytes), `left/{rank}` (a departure, see
//! [`encode_departure`]).
//!
//! Store failures are no failure of the job (the store's host may have
//! finished first): a poll that fails is retried later, an announcement
//! that fails or takes longer than [`ANNOUNCE_WITHIN`] is given up (the
//! peers then learn what they would have without it: a lost peer when its
//! queue pair fails, a timeout otherwise). Needs no RDMA hardware: the
//! tests exercise it over a memory store.
//!
//! [`Transport::abort`]: crate::transport::Transport::abort
//! [`Transport::leave`]: crate::transport::Transport::leave

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use crate::error::{CommError, MAX_ABORT_REASON, Result};
use crate::store::Store;
use crate::transport::{Departure, Departures, MAX_FINALS, SignalId};

/// How often a rank's notice thread reads the change counter.
pub const POLL_EVERY: Duration = Duration::from_millis(100);
/// How long an announcement may take (a store that does not answer is
/// given up on after that).
pub const ANNOUNCE_WITHIN: Duration = Duration::from_secs(1);

/// A departure's record: the number of collective calls (8 bytes, little
/// endian), the world size (8 bytes), then per peer [`MAX_FINALS`] pairs
/// of (signal + 1, final value), 16 bytes each, (0, 0) when unused.
pub fn encode_departure(world: usize, note: &dyn Fn(usize) -> Departure) -> Vec<u8> {
    let calls = (0..world).map(|p| note(p).calls).next().unwrap_or(0);
    let mut b = Vec::with_capacity(16 + world * MAX_FINALS * 16);
    b.extend_from_slice(&calls.to_le_bytes());
    b.extend_from_slice(&(world as u64).to_le_bytes());
    for peer in 0..world {
        let d = note(peer);
        let mut finals = d.finals.iter().take(MAX_FINALS);
        for _ in 0..MAX_FINALS {
            let (signal, value) = finals
                .next()
                .map_or((0, 0), |&(s, v)| (u64::from(s.0) + 1, v));
            b.extend_from_slice(&signal.to_le_bytes());
            b.extend_from_slice(&value.to_le_bytes());
        }
    }
    b
}

/// What [`encode_departure`] recorded for `rank` of a world of `world`:
/// the departed rank's number of calls and the final values of `rank`'s
/// counters it declared. An error (never a panic) for a record of another
/// world size or length.
pub fn decode_departure(
    raw: &[u8],
    rank: usize,
    world: usize,
) -> Result<(u64, Vec<(SignalId, u64)>), String> {
    let long =
        |i: usize| -> Option<u64> { Some(u64::from_le_bytes(raw.get(i..i + 8)?.try_into().ok()?)) };
    let (Some(calls), Some(theirs)) = (long(0), long(8)) else {
        return Err(format!("a departure of {} bytes", raw.len()));
    };
    if theirs != world as u64 {
        return Err(format!(
            "a departure from a world of {theirs}, this one has {world}"
        ));
    }
    if rank >= world || raw.len() != 16 + world * MAX_FINALS * 16 {
        return Err(format!(
            "a departure of {} bytes for a world of {world}",
            raw.len()
        ));
    }
    let at = 16 + rank * MAX_FINALS * 16;
    let finals = (0..MAX_FINALS)
        .filter_map(|k| {
            let signal = long(at + 16 * k)?.checked_sub(1)?;
            let value = long(at + 16 * k + 8)?;
            Some((SignalId(u32::try_from(signal).ok()?), value))
        })
        .collect();
    Ok((calls, finals))
}

/// One rank's view of its peers' notices, and its own announcements.
pub struct Notices {
    store: Arc<dyn Store>,
    base: String,
    rank: usize,
    world: usize,
    /// The change counter when last read.
    seen: AtomicI64,
    /// Whether a peer's failure notice arrived (one load for a waiter).
    failed: AtomicBool,
    /// The first peer failure that arrived: the peer and its reason.
    failure: Mutex<Option<(usize, String)>>,
    /// The peers that left.
    departures: Departures,
    /// Whether this rank announced its failure or departure (once).
    announced: AtomicBool,
    /// The notice thread's sleep, cut short when the transport closes.
    closing: Mutex<bool>,
    wake: Condvar,
}

impl std::fmt::Debug for Notices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notices")
            .field("base", &self.base)
            .field("rank", &self.rank)
            .field("departures", &self.departures.count())
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

impl Notices {
    /// The notices of `rank` of `world` under the store namespace `base`.
    pub fn new(store: Arc<dyn Store>, base: &str, rank: usize, world: usize) -> Notices {
        Notices {
            store,
            base: format!("{base}/notice"),
            rank,
            world,
            seen: AtomicI64::new(0),
            failed: AtomicBool::new(false),
            failure: Mutex::new(None),
            departures: Departures::new(world),
            announced: AtomicBool::new(false),
            closing: Mutex::new(false),
            wake: Condvar::new(),
        }
    }

    fn key(&self, what: &str) -> String {
        format!("{}/{what}", self.base)
    }

    /// Posts `value` under `what` and bumps the change counter, on a
    /// thread of its own, waiting for it at most [`ANNOUNCE_WITHIN`].
    /// Returns whether it was posted in time.
    fn post(&self, what: String, value: Vec<u8>) -> bool {
        let (store, key, count) = (self.store.clone(), self.key(&what), self.key("count"));
        let (tx, rx) = std::sync::mpsc::channel();
        let posting = std::thread::Builder::new()
            .name(format!("verbs-notice-{}", self.rank))
            .spawn(move || {
                let r = store.set(&key, &value).and_then(|()| store.add(&count, 1));
                let _ = tx.send(r);
            });
        if let Err(e) = posting {
            log::debug!("verbs rank {}: cannot post {what}: {e}", self.rank);
            return false;
        }
        match rx.recv_timeout(ANNOUNCE_WITHIN) {
            Ok(Ok(_)) => true,
            Ok(Err(e)) => {
                log::debug!("verbs rank {}: cannot post {what}: {e}", self.rank);
                false
            }
            Err(_) => {
                log::debug!(
                    "verbs rank {}: the store took {what} too long: given up",
                    self.rank
                );
                false
            }
        }
    }

    /// Announces that this rank's communicator failed for `why` (only the
    /// first announcement, of either kind, counts). Bounded by
    /// [`ANNOUNCE_WITHIN`]; returns whether it was posted.
    pub fn announce_failure(&self, why: &str) -> bool {
        if self.announced.swap(true, Ordering::SeqCst) {
            return false;
        }
        let why = crate::error::abort_reason(why).as_bytes().to_vec();
        self.post(format!("failed/{}", self.rank), why)
    }

    /// Announces that this rank's communicator leaves cleanly, `note(peer)`
    /// being what `peer` is told (only the first announcement counts).
    /// Bounded by [`ANNOUNCE_WITHIN`]; returns whether it was posted.
    pub fn announce_departure(&self, note: &dyn Fn(usize) -> Departure) -> bool {
        if self.announced.swap(true, Ordering::SeqCst) {
            return false;
        }
        let record = encode_departure(self.world, note);
        self.post(format!("left/{}", self.rank), record)
    }

    /// Reads the change counter and, when it moved, the notices of every
    /// peer not heard from yet. Returns whether anything new arrived; a
    /// store that fails is an error (the caller tries again later).
    pub fn poll(&self) -> Result<bool> {
        let count = self.store.add(&self.key("count"), 0)?;
        if count == self.seen.load(Ordering::Acquire) {
            return Ok(false);
        }
        let mut news = false;
        for peer in (0..self.world).filter(|&p| p != self.rank) {
            if self.departed(peer).is_some() || self.failed_peer() == Some(peer) {
                continue;
            }
            if let Some(why) = self.read(&format!("failed/{peer}"))? {
                let why = String::from_utf8_lossy(&why[..why.len().min(MAX_ABORT_REASON)]);
                self.peer_failed(peer, why.into_owned());
                news = true;
                continue;
            }
            if let Some(raw) = self.read(&format!("left/{peer}"))? {
                match decode_departure(&raw, self.rank, self.world) {
                    Ok((calls, finals)) => self.peer_departed(peer, calls, finals),
                    Err(why) => log::warn!(
                        "verbs rank {}: rank {peer}'s departure notice is unreadable: {why}",
                        self.rank
                    ),
                }
                news = true;
            }
        }
        // Only once every notice the count covers was read.
        self.seen.store(count, Ordering::Release);
        Ok(news)
    }

    /// The value at `what`, if it exists (no wait).
    fn read(&self, what: &str) -> Result<Option<Vec<u8>>> {
        match self.store.get(&self.key(what), Duration::ZERO) {
            Ok(v) => Ok(Some(v)),
            Err(CommError::Timeout { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn peer_failed(&self, peer: usize, why: String) {
        let mut first = self.failure.lock().unwrap_or_else(|e| e.into_inner());
        if first.is_none() {
            log::debug!("verbs rank {}: peer rank {peer} failed: {why}", self.rank);
            *first = Some((peer, why));
            self.failed.store(true, Ordering::Release);
        }
    }

    fn peer_departed(&self, peer: usize, calls: u64, finals: Vec<(SignalId, u64)>) {
        if self.departures.record(peer, calls, finals) {
            log::debug!(
                "verbs rank {}: peer rank {peer} left after {calls} calls",
                self.rank
            );
        }
    }

    fn failed_peer(&self) -> Option<usize> {
        if !self.failed.load(Ordering::Acquire) {
            return None;
        }
        let first = self.failure.lock().unwrap_or_else(|e| e.into_inner());
        first.as_ref().map(|(p, _)| *p)
    }

    /// The failure a peer announced, as the error of operation `op` (one
    /// load when none did).
    pub fn failure(&self, op: &str) -> Option<CommError> {
        if !self.failed.load(Ordering::Acquire) {
            return None;
        }
        let first = self.failure.lock().unwrap_or_else(|e| e.into_inner());
        let (peer, why) = first.as_ref()?;
        Some(CommError::peer_failed(self.rank, op, *peer, why))
    }

    /// How many peers announced that they left (one load).
    pub fn departures(&self) -> usize {
        self.departures.count()
    }

    /// `peer`'s number of collective calls, if it left.
    pub fn departed(&self, peer: usize) -> Option<u64> {
        self.departures.calls(peer)
    }

    /// The final values of this rank's counters `peer` declared as it left.
    pub fn finals(&self, peer: usize) -> Vec<(SignalId, u64)> {
        self.departures.finals(peer)
    }

    /// A departed peer whose final value of `signal` is below `value`, as
    /// the error of a wait (`op`): the wait can never end. One load when
    /// no peer left.
    pub fn left_short(&self, op: &str, signal: SignalId, value: u64) -> Option<CommError> {
        let peer = self.departures.short_peer(signal, value)?;
        Some(CommError::peer_left(self.rank, op, peer, ""))
    }

    /// Polls every [`POLL_EVERY`] until [`Notices::close`]; a store that
    /// fails is tried again a second later (its host may have finished).
    pub fn run(&self) {
        let mut pause = POLL_EVERY;
        loop {
            {
                let closing = self.closing.lock().unwrap_or_else(|e| e.into_inner());
                let (closing, _) = self
                    .wake
                    .wait_timeout_while(closing, pause, |c| !*c)
                    .unwrap_or_else(|e| e.into_inner());
                if *closing {
                    return;
                }
            }
            pause = match self.poll() {
                Ok(_) => POLL_EVERY,
                Err(e) => {
                    log::debug!("verbs rank {}: notices: {e}", self.rank);
                    Duration::from_secs(1)
                }
            };
        }
    }

    /// Ends [`Notices::run`] at once.
    pub fn close(&self) {
        *self.closing.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.wake.notify_all();
    }
}
