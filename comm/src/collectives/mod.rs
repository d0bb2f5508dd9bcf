//! Collectives on host memory, written once over the one-sided
//! [`Transport`]. Setup registers one staging region per rank (2 message
//! classes x world senders x 4 slots of 256 KiB + a 64-byte header); it is
//! reused by every call, nothing is allocated per call.
//!
//! Messages: a sender writes a header (operation, dtype, op, root, count,
//! call number, length) and a payload into its slot on the receiver and
//! raises the receiver's data signal for (class, sender); the receiver checks
//! the header (a disagreement between ranks is [`CommError::Mismatch`]),
//! consumes the payload in place and returns a credit. Slots form a ring of
//! four per (class, sender), so up to four messages are in flight.
//!
//! Algorithms (see `ops.rs`): all-reduce up to 32 KiB sends the whole buffer
//! to every peer and each rank reduces locally; above, a pipelined direct
//! reduce-scatter + all-gather in chunks of `world x 256 KiB`: rank `j`
//! reduces segment `j` of every chunk and sends it back to all (the same
//! traffic as a ring, in two steps instead of `2(n-1)`). A short chunk (the
//! only one of a mid-sized buffer, or the last) is split evenly.
//!
//! Determinism: every reduction combines the ranks' inputs in rank order
//! (`((x0 op x1) op x2)...`) and each element is reduced by exactly one rank,
//! whichever algorithm runs, so results are bit-identical between runs and
//! across ranks. [`Communicator::set_deterministic`] records the request;
//! there is no faster non-deterministic path today.
//!
//! After any error the communicator is unusable (the ranks' message
//! sequences may disagree): later calls fail at once. The error is also
//! announced to every peer ([`Transport::abort`]), so a peer waiting in any
//! call, or starting one later, fails at once naming this rank and its
//! error rather than waiting out its deadline (an error that was itself a
//! peer's announcement is not announced again).
//!
//! A communicator dropped healthy leaves cleanly ([`Communicator::leave`]):
//! it tells every peer how many collectives it made and how many messages
//! it sent each and took from each. A peer's collective begun after the
//! departed rank's last one, a wait for a message or credit it never sent,
//! and a send to it fail at once naming it ("peer rank 2 is gone: it left
//! (destroyed its communicator) before this call"), while calls its last
//! messages satisfy go on: ranks that all finish do not notice. A send
//! made before the notice arrived (over TCP it comes as a frame, read when
//! this rank next reads its connections) returns as if delivered; a
//! departed rank that never took it is found out by the first call that
//! begins, or returns from a wait, after the notice arrived, which fails
//! naming it ("... before this call: it never took 1 message this rank
//! sent it"), as does every later call ([`Communicator::undelivered`]).

mod agree;
mod channel;
mod movement;
mod ops;
mod reduce;

use std::sync::Arc;
use std::time::{Duration, Instant};

pub use movement::P2p;
pub use reduce::{DType, ReduceOp};

use crate::error::{CommError, Result};
use crate::shm::{RegionView, ShmTransport};
use crate::store::Store;
use crate::transport::{RegionId, SignalId, Transport};
use channel::Header;

/// Payload bytes per staging slot (also the pipeline's segment size).
pub const SLOT: usize = 256 << 10;
const HDR: usize = 64;
const NSLOT: u64 = 4;
const CLASSES: usize = 2;
/// Largest world the signal layout supports.
pub const MAX_WORLD: usize = 63;
const SCRATCH: SignalId = SignalId(255);

/// How a mismatch error describes a message header a peer wrote (four
/// words, any values): what the fuzz target `frames` checks never panics.
#[doc(hidden)]
pub fn describe_peer_header(words: &[u64; 4]) -> String {
    Header::describe(words)
}

/// A group of ranks running collectives over one transport.
pub struct Communicator {
    transport: Arc<dyn Transport>,
    rank: usize,
    world: usize,
    region: RegionId,
    view: RegionView,
    sent: Vec<[u64; CLASSES]>,
    received: Vec<[u64; CLASSES]>,
    seq: u64,
    timeout: Duration,
    deterministic: bool,
    broken: Option<String>,
    op: &'static str,
    /// The current operation's deadline, set by its first wait that blocks.
    deadline: Option<Instant>,
    scratch: Vec<u8>,
    /// Whether the transport writes a header and a payload without joining
    /// them first ([`Transport::writes_parts_in_place`]).
    in_place: bool,
    store: Option<Arc<dyn Store>>,
    /// Whether it told its peers it left ([`Communicator::leave`]).
    left: bool,
    /// How many departures ([`Transport::departures`]) it has checked for
    /// messages the departed never took ([`Communicator::undelivered`]).
    departures_seen: usize,
}

impl Drop for Communicator {
    fn drop(&mut self) {
        // Unwinding out of a rank's work: its peers would otherwise wait
        // for it until their deadlines.
        if self.broken.is_none() && std::thread::panicking() {
            self.abort("its thread panicked");
        }
        // A healthy communicator leaves cleanly: a peer that still waits
        // for it fails at once instead of at its deadline.
        self.leave();
    }
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let t = self.transport.name();
        write!(
            f,
            "Communicator {{ {t}, rank {} of {}, calls {}, broken {:?} }}",
            self.rank, self.world, self.seq, self.broken
        )
    }
}

/// The default deadline: `POLYCHIP_COMM_TIMEOUT_SECS` or 60 s. A value that
/// is not a positive number of seconds (at most a week) is an error naming
/// the variable (see [`crate::env::parse_timeout`]).
pub fn default_timeout() -> Result<Duration> {
    crate::env::timeout_from_env()
}

impl Communicator {
    /// Builds a communicator over a connected transport (a collective call:
    /// every rank registers its staging region).
    pub fn new(transport: Arc<dyn Transport>) -> Result<Communicator> {
        let (rank, world) = (transport.rank(), transport.world_size());
        if world == 0 || world > MAX_WORLD {
            return Err(CommError::Usage(format!(
                "communicator: world size {world} not in 1..={MAX_WORLD}"
            )));
        }
        let len = CLASSES * world * NSLOT as usize * (HDR + SLOT);
        let (region, ptr) = transport.register(len)?;
        // SAFETY: the transport keeps its regions mapped for its lifetime, and we hold an Arc to it.
        let view = unsafe { RegionView::new(ptr, len) };
        let timeout = default_timeout()?;
        let in_place = transport.writes_parts_in_place();
        let (sent, received) = (vec![[0; CLASSES]; world], vec![[0; CLASSES]; world]);
        Ok(Communicator {
            transport,
            rank,
            world,
            region,
            view,
            sent,
            received,
            seq: 0,
            timeout,
            deterministic: false,
            broken: None,
            op: "setup",
            deadline: None,
            scratch: vec![0; HDR + channel::SMALL_WRITE],
            in_place,
            store: None,
            left: false,
            departures_seen: 0,
        })
    }

    /// Connects `rank` of `world` on this machine over shared memory, the
    /// job name agreed through `store`.
    pub fn shm(store: &dyn Store, rank: usize, world: usize) -> Result<Communicator> {
        Communicator::new(Arc::new(ShmTransport::new(
            store,
            rank,
            world,
            default_timeout()?,
        )?))
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub fn world_size(&self) -> usize {
        self.world
    }

    /// The transport underneath.
    pub fn transport(&self) -> &Arc<dyn Transport> {
        &self.transport
    }

    /// Records the rendezvous store the ranks connected through, so that
    /// [`Communicator::split`] can set up sub-communicators.
    pub fn set_store(&mut self, store: Arc<dyn Store>) {
        self.store = Some(store);
    }

    /// Why the communicator is unusable (after an error), if it is.
    pub fn broken(&self) -> Option<&str> {
        self.broken.as_deref()
    }

    /// The rendezvous store recorded with [`Communicator::set_store`].
    pub fn store(&self) -> Option<&Arc<dyn Store>> {
        self.store.as_ref()
    }

    /// Sets the deadline of every later operation.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// The deadline of each operation.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Requests bit-identical results between runs. Every algorithm here
    /// already reduces in a fixed rank order, so this only records the
    /// request (see the module documentation).
    pub fn set_deterministic(&mut self, on: bool) {
        self.deterministic = on;
    }

    /// Whether deterministic results were requested.
    pub fn deterministic(&self) -> bool {
        self.deterministic
    }

    /// Starts an operation: checks the communicator is usable, clears the
    /// deadline and returns the call's header.
    fn begin(
        &mut self,
        kind: &'static str,
        dtype: Option<DType>,
        op: Option<ReduceOp>,
        root: usize,
        count: usize,
        collective: bool,
    ) -> Result<Header> {
        if let Some(why) = &self.broken {
            return Err(CommError::Usage(format!(
                "rank {}: {kind}: communicator unusable after an earlier error: {why}",
                self.rank
            )));
        }
        if root >= self.world {
            return Err(CommError::Usage(format!(
                "rank {}: {kind}: rank {root} out of range (world {})",
                self.rank, self.world
            )));
        }
        if self.left {
            return Err(CommError::Usage(format!(
                "rank {}: {kind}: communicator unusable: it left the job",
                self.rank
            )));
        }
        self.op = kind;
        // A peer announced its failure: one load when none did.
        if let Some(e) = self.transport.peer_failure() {
            return Err(self.fail(e.restated(|r| r, |_| kind.to_string())));
        }
        // A peer left without taking what this rank sent it (a send made
        // before its notice arrived): one load when no peer left since the
        // last look.
        self.check_undelivered()?;
        // A peer left before this collective (every collective involves
        // every rank): one load when none did.
        if collective && self.transport.departures() > 0 {
            let call = self.seq + 1;
            let gone = (0..self.world)
                .filter(|&p| p != self.rank)
                .filter_map(|p| Some((p, self.transport.departed(p)?)))
                .find(|&(_, calls)| calls < call);
            if let Some((peer, calls)) = gone {
                let detail = format!(" (its last collective was call #{calls}, this is #{call})");
                let e = CommError::peer_left(self.rank, kind, peer, &detail);
                return Err(self.fail(e));
            }
        }
        // The clock starts at the operation's first wait that blocks (see
        // `channel.rs`): reading it costs as much as a tenth of a small
        // all-reduce.
        self.deadline = None;
        let seq = if collective {
            self.seq += 1;
            self.seq
        } else {
            0
        };
        Ok(Header {
            kind,
            dtype,
            op,
            root,
            count,
            seq,
            whole: false,
        })
    }

    fn fail(&mut self, e: CommError) -> CommError {
        // Name the collective too when the transport's step failed.
        let within = |op: String| match op == self.op {
            true => op,
            false => format!("{}: {op}", self.op),
        };
        let e = e.restated(|r| r, within);
        let why = e.to_string();
        if !e.is_peer_failure() && self.broken.is_none() {
            self.transport.abort(&why);
        }
        self.broken = Some(why);
        e
    }

    /// Fails this communicator on purpose (like `ncclCommAbort`): later
    /// calls fail, and every peer's current or next wait fails at once
    /// naming this rank and `why`. Nothing happens if it already failed
    /// (its failure was announced then).
    pub fn abort(&mut self, why: &str) {
        if self.broken.is_some() {
            return;
        }
        let why = format!("rank {}: {why}", self.rank);
        self.transport.abort(&why);
        self.broken = Some(why);
    }

    /// Fails the current call if `peer` left ([`Transport::leave`]): a
    /// send to it could never be received.
    fn check_not_left(&mut self, peer: usize) -> Result<()> {
        if self.transport.departures() == 0 || self.transport.departed(peer).is_none() {
            return Ok(());
        }
        let e = CommError::peer_left(self.rank, self.op, peer, "");
        Err(self.fail(e))
    }

    /// Fails the current call if a peer that left ([`Transport::leave`])
    /// never took messages this rank sent it (see
    /// [`Communicator::undelivered`]); one load when no peer left since the
    /// last look.
    pub(crate) fn check_undelivered(&mut self) -> Result<()> {
        let departures = self.transport.departures();
        if departures == self.departures_seen {
            return Ok(());
        }
        self.departures_seen = departures;
        match self.undelivered() {
            Some(e) => Err(self.fail(e)),
            None => Ok(()),
        }
    }

    /// A departed peer that never took some of the messages this rank sent
    /// it, as the error of the current call: the count it declared taking
    /// as it left (the final value of this rank's credit counter for it) is
    /// below the count this rank sent. A send made before the peer's notice
    /// arrived returned as if delivered; this is when it is found out, at
    /// the latest in the first call that begins or waits after the notice
    /// arrived. `None` when every departed peer took everything (or its
    /// transport cannot tell).
    pub fn undelivered(&self) -> Option<CommError> {
        if self.transport.departures() == 0 {
            return None;
        }
        (0..self.world)
            .filter(|&p| p != self.rank && self.transport.departed(p).is_some())
            .find_map(|peer| {
                let finals = self.transport.finals(peer);
                let lost: u64 = (0..CLASSES)
                    .map(|class| {
                        let credit = SignalId((128 + class * 64 + peer) as u32);
                        finals
                            .iter()
                            .find(|(s, _)| *s == credit)
                            .map_or(0, |&(_, taken)| {
                                self.sent[peer][class].saturating_sub(taken)
                            })
                    })
                    .sum();
                let plural = if lost == 1 { "" } else { "s" };
                let detail = format!(
                    ": it never took {lost} message{plural} this rank sent it (a send to it \
                     went nowhere)"
                );
                (lost > 0).then(|| CommError::peer_left(self.rank, self.op, peer, &detail))
            })
    }

    /// Tells every peer this communicator leaves cleanly and makes no more
    /// calls ([`Transport::leave`]): how many collectives it made and how
    /// many messages it sent each peer and took from it, so that a peer
    /// still waiting for it fails at once naming this rank, while one
    /// whose wait this rank's last messages satisfy goes on. Done when a
    /// healthy communicator is dropped, and by a job as it begins its exit
    /// barrier; nothing happens after an error (it was announced then) or a
    /// second time. Later calls fail.
    pub fn leave(&mut self) {
        if self.left || self.broken.is_some() {
            return;
        }
        self.left = true;
        if let Some(e) = self.undelivered() {
            log::warn!("{e}");
        }
        let me = self.rank;
        let (sent, received, calls) = (&self.sent, &self.received, self.seq);
        let note = |peer: usize| crate::transport::Departure {
            calls,
            finals: (0..CLASSES)
                .flat_map(|class| {
                    [
                        (SignalId((class * 64 + me) as u32), sent[peer][class]),
                        (
                            SignalId((128 + class * 64 + me) as u32),
                            received[peer][class],
                        ),
                    ]
                })
                .collect(),
        };
        self.transport.leave(&note);
    }

    fn usage(&self, message: String) -> CommError {
        CommError::Usage(format!("rank {}: {}: {message}", self.rank, self.op))
    }
}
