//! The point-to-point links between a rank's pipeline stage and its
//! neighbours, and the sender thread that lets a stage go on computing
//! while its activations and gradients travel.
//!
//! Each pair of neighbouring stages gets two communicators of their own,
//! one per direction (activations down, their gradients up), made once per
//! job by [`Links::connect`]. A rank therefore sends only on its two
//! outgoing communicators and receives only on its two incoming ones, so a
//! sender thread may own the first pair while the main thread receives on
//! the second: no communicator is ever used by two threads.
//!
//! With sends asynchronous (the default), [`Links::step`] runs a step's
//! passes beside a sender thread: a send queues the tensor (a reference to
//! its device memory, which nothing writes again) and returns at once;
//! the thread sends queued tensors in order, a staged device's copies on a
//! stream of its own (the ABI asks callers to serialize one stream's
//! calls, and the main thread keeps the default stream). A stage then never
//! waits for its receiver, nor for its device-to-host copy; the transport
//! already writes into the receiver's memory while the receiver computes
//! (one-sided, up to its slots' 1 MiB), so receives cost the receiver only
//! the copy out. Each link carries the same messages in the same order as
//! blocking sends would, so a run gives the same bits either way.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread;

use polychip_comm::collectives::Communicator;
use polychip_comm::device::{DeviceComm, Path, StagingPool};
use polychip_files::threads::{ThreadRefused, spawn_scoped};
use polychip_host::{Device, Stream, Tensor};

use crate::error::{Result, TrainError};
use crate::plan::Role;
use crate::trace::{SENDER_CAT, Span, Tracer, now_us};

/// This rank's end of a link: the pair's communicator, the peer's rank
/// in it (the lower stage is rank 0 of each pair), the pair's world ranks
/// and the link's name, for errors.
#[derive(Debug)]
struct End {
    comm: Communicator,
    peer: usize,
    members: [usize; 2],
    name: String,
}

impl End {
    /// The end of `comm`, whose ranks 0 and 1 are world ranks `members`
    /// (the lower stage first), carrying `what` from world rank `from` to
    /// `to`.
    fn new(comm: Communicator, members: [usize; 2], (from, to): (usize, usize), what: &str) -> End {
        let me = comm.rank();
        let peer = 1 - me;
        let name = format!("the pipeline link carrying {what} from rank {from} to rank {to}");
        End {
            comm,
            peer,
            members,
            name,
        }
    }

    fn error(&self, e: polychip_comm::CommError) -> TrainError {
        TrainError::Comm(e.in_group(&self.members, &self.name))
    }
}

/// The communicators this rank sends on, and what their copies need.
#[derive(Debug, Default)]
struct Outgoing {
    to_next: Option<End>,
    to_prev: Option<End>,
    pool: StagingPool,
    /// The sender thread's copy stream, for a staged device.
    stream: Option<Stream>,
}

/// The communicators this rank receives on.
#[derive(Debug, Default)]
struct Incoming {
    from_prev: Option<End>,
    from_next: Option<End>,
    pool: StagingPool,
}

/// Which neighbour a message goes to or comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    /// The previous stage (gradients go to it, activations come from it).
    Prev,
    /// The next stage (activations go to it, gradients come from it).
    Next,
}

fn end(ends: [&mut Option<End>; 2], peer: Peer, rank: usize) -> Result<&mut End> {
    let [prev, next] = ends;
    let side = match peer {
        Peer::Prev => prev,
        Peer::Next => next,
    };
    side.as_mut().ok_or_else(|| {
        TrainError::Plan(format!(
            "rank {rank}: no pipeline link to the {} stage",
            match peer {
                Peer::Prev => "previous",
                Peer::Next => "next",
            }
        ))
    })
}

impl End {
    /// Runs `f(comm, peer)` on this link's communicator, staging through
    /// `pool`, a staged device's copies on `stream` when given; an error
    /// names the link in world ranks.
    fn transfer(
        &mut self,
        pool: &mut StagingPool,
        stream: Option<&Stream>,
        f: impl FnOnce(&mut DeviceComm<'_>, usize) -> polychip_comm::Result<()>,
    ) -> Result<()> {
        let mut dc = DeviceComm::with_pool(&mut self.comm, std::mem::take(pool));
        if let Some(s) = stream {
            dc = dc.on_stream(s);
        }
        let r = f(&mut dc, self.peer);
        *pool = dc.into_pool();
        r.map_err(|e| self.error(e))
    }
}

impl Outgoing {
    fn send(&mut self, t: &Tensor, peer: Peer, rank: usize) -> Result<()> {
        let end = end([&mut self.to_prev, &mut self.to_next], peer, rank)?;
        end.transfer(&mut self.pool, self.stream.as_ref(), |dc, to| {
            dc.send(t, to)
        })
    }

    /// What a send to `peer` that failed on purpose returns (the test hook
    /// of [`Links::fail_next_step`]).
    fn fail(&mut self, peer: Peer, rank: usize) -> Result<()> {
        let end = end([&mut self.to_prev, &mut self.to_next], peer, rank)?;
        let e = polychip_comm::CommError::Io {
            rank: end.comm.rank(),
            op: "send".into(),
            message: "failed on purpose (POLYCHIP_TRAIN_FAIL_SEND_AT, a test hook)".into(),
        };
        Err(end.error(e))
    }
}

impl Incoming {
    fn recv(&mut self, t: &Tensor, peer: Peer, rank: usize) -> Result<()> {
        let end = end([&mut self.from_prev, &mut self.from_next], peer, rank)?;
        end.transfer(&mut self.pool, None, |dc, from| dc.recv(t, from))
    }
}

/// A rank's links to its neighbouring stages.
#[derive(Debug)]
pub struct Links {
    rank: usize,
    out: Outgoing,
    inc: Incoming,
    asynchronous: bool,
    /// The next step's first queued send fails (a test hook:
    /// [`Links::fail_next_step`]).
    fail: bool,
}

/// A queued send: the tensor, where it goes, and its name in the trace.
type Message = (Tensor, Peer, String);

/// What a step's passes send and receive through.
#[derive(Debug)]
pub struct Io<'l> {
    rank: usize,
    inc: &'l mut Incoming,
    out: Out<'l>,
}

#[derive(Debug)]
enum Out<'l> {
    /// Sends on the calling thread.
    Direct(&'l mut Outgoing),
    /// Sends queued for the sender thread.
    Queued(mpsc::Sender<Message>),
}

impl Io<'_> {
    /// Sends `t` to the neighbour `peer`; with the sender thread, queues it
    /// and returns at once (`name` names the transfer in the trace).
    pub fn send(
        &mut self,
        t: &Tensor,
        peer: Peer,
        name: impl FnOnce() -> String,
        tracer: &mut Tracer,
    ) -> Result<()> {
        match &mut self.out {
            Out::Direct(out) => {
                let rank = self.rank;
                tracer.span(name, "p2p", || out.send(t, peer, rank))
            }
            // A sender that stopped has its error to report at the end.
            Out::Queued(tx) => {
                let _ = tx.send((t.clone(), peer, name()));
                Ok(())
            }
        }
    }

    /// Receives into `t` from the neighbour `peer`.
    pub fn recv(&mut self, t: &Tensor, peer: Peer) -> Result<()> {
        self.inc.recv(t, peer, self.rank)
    }
}

impl Links {
    /// No links: a job whose pipelines have one stage each.
    pub fn none(rank: usize) -> Links {
        Links {
            rank,
            out: Outgoing::default(),
            inc: Incoming::default(),
            asynchronous: false,
            fail: false,
        }
    }

    /// Makes the next step's first queued send fail as a send can (for
    /// tests of what a failed send does: `POLYCHIP_TRAIN_FAIL_SEND_AT`).
    pub fn fail_next_step(&mut self) {
        self.fail = true;
    }

    /// Connects `roles[rank]`'s stage (on `device`) to its neighbours over
    /// sub-communicators of `world`, sending from a thread of its own when
    /// `asynchronous`. A collective call: every rank of `world` calls it
    /// with the same roles. Four splits of `world` whatever the job's size
    /// (links of even and of odd lower stages, each direction), none when
    /// no pipeline has two stages.
    pub fn connect(
        world: &mut Communicator,
        roles: &[Role],
        device: &Device,
        asynchronous: bool,
    ) -> Result<Links> {
        let rank = world.rank();
        let mut links = Links::none(rank);
        if !roles.iter().any(|r| r.next.is_some()) {
            return Ok(links);
        }
        let me = &roles[rank];
        let solo = |r: usize| (1 + roles.len() + r) as u32;
        for parity in 0..2 {
            // This rank is the lower end of its link to the next stage in
            // one parity and the upper end of its link from the previous
            // stage in the other; each link's color is its lower rank.
            let lower = me.next.is_some() && me.stage % 2 == parity;
            let upper = me.prev.is_some() && (me.stage + 1) % 2 == parity;
            let (color, key) = match (lower, upper, me.prev) {
                (true, _, _) => (1 + rank as u32, 0),
                (false, true, Some(prev)) => (1 + prev as u32, 1),
                _ => (solo(rank), 0),
            };
            let down = world.split(color, key)?;
            let up = world.split(color, key)?;
            if (lower || upper) && (down.world_size() != 2 || up.world_size() != 2) {
                return Err(TrainError::Plan(format!(
                    "rank {rank}: a pipeline link's communicator has {} ranks, not 2: the ranks \
                     disagree about the plan",
                    down.world_size()
                )));
            }
            if let (true, Some(next)) = (lower, me.next) {
                let pair = [rank, next];
                let (down_link, up_link) = ((rank, next), (next, rank));
                links.out.to_next = Some(End::new(down, pair, down_link, "activations"));
                links.inc.from_next = Some(End::new(up, pair, up_link, "gradients"));
            } else if let (true, Some(prev)) = (upper, me.prev) {
                let pair = [prev, rank];
                let (down_link, up_link) = ((prev, rank), (rank, prev));
                links.inc.from_prev = Some(End::new(down, pair, down_link, "activations"));
                links.out.to_prev = Some(End::new(up, pair, up_link, "gradients"));
            }
        }
        links.asynchronous = asynchronous;
        if asynchronous && Path::of(device) == Path::Staged {
            links.out.stream = Some(device.stream()?);
        }
        Ok(links)
    }

    /// Sends and receives on the calling thread (the validation passes).
    pub fn direct(&mut self) -> Io<'_> {
        Io {
            rank: self.rank,
            inc: &mut self.inc,
            out: Out::Direct(&mut self.out),
        }
    }

    /// Runs one step's passes, `passes(io, tracer)`, with their sends on
    /// the sender thread when the links are asynchronous (its spans go to
    /// `tracer` on a row of their own). Returns once every send is done;
    /// a failed send's error before the passes' (which it caused: see
    /// below). A failed send closes the rank's outgoing links, so that the
    /// peers waiting on them fail at once instead of at their timeout.
    pub fn step<T>(
        &mut self,
        tracer: &mut Tracer,
        passes: impl FnOnce(&mut Io<'_>, &mut Tracer) -> Result<T>,
    ) -> Result<T> {
        let rank = self.rank;
        if !self.asynchronous {
            return passes(&mut self.direct(), tracer);
        }
        let stop = AtomicBool::new(false);
        let fail = std::mem::take(&mut self.fail);
        let (inc, out) = (&mut self.inc, &mut self.out);
        let (result, joined) = thread::scope(|scope| {
            let (tx, rx) = mpsc::channel::<Message>();
            let stop = &stop;
            // Refused, the rank fails with the sentence (its process ends,
            // closing its links, as when a send fails).
            let sender = spawn_scoped(scope, "send activations and gradients", move || {
                let mut spans = Vec::new();
                let mut result = Ok(());
                for (t, peer, name) in rx {
                    // After a failure the rest is dropped unsent: the
                    // step is over.
                    if stop.load(Ordering::Relaxed) {
                        continue;
                    }
                    let start = now_us();
                    let r = match fail && spans.is_empty() {
                        true => out.fail(peer, rank),
                        false => out.send(&t, peer, rank),
                    };
                    spans.push(Span {
                        name,
                        cat: SENDER_CAT,
                        start_us: start,
                        dur_us: now_us() - start,
                    });
                    if let Err(e) = r {
                        stop.store(true, Ordering::Relaxed);
                        // Said now: once the links close, the peers fail
                        // and a launcher may stop this rank before its
                        // error comes back up.
                        eprintln!(
                            "polychip train: {e} (the cause; closing this rank's outgoing links)"
                        );
                        // Close this rank's outgoing links: a peer waiting
                        // for what will now never come learns it at once
                        // (its peer closed the transport), not at its
                        // timeout, and fails; so does this rank's wait for
                        // what that peer would have sent.
                        (out.to_next, out.to_prev) = (None, None);
                        result = Err(e);
                    }
                }
                (result, spans)
            })?;
            let mut io = Io {
                rank,
                inc,
                out: Out::Queued(tx),
            };
            let result = passes(&mut io, tracer);
            if result.is_err() {
                stop.store(true, Ordering::Relaxed);
            }
            drop(io);
            let joined = tracer.span(|| "sends drain".into(), "p2p", || sender.join());
            Ok::<_, ThreadRefused>((result, joined))
        })
        .map_err(|e| {
            TrainError::Comm(polychip_comm::CommError::Io {
                rank,
                op: "pipeline sends".into(),
                message: e.to_string(),
            })
        })?;
        let (sent, spans) = joined.map_err(|_| {
            TrainError::Comm(polychip_comm::CommError::Io {
                rank,
                op: "pipeline sends".into(),
                message: "the sender thread panicked".into(),
            })
        })?;
        for s in spans {
            tracer.push(s);
        }
        // A failed send is the cause when both failed: after the passes
        // stop, the sender starts no send, so its error came first, and the
        // passes' is what it left them waiting for.
        sent?;
        result
    }
}
