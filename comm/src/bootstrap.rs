//! Starting a job's communication in one call: [`init`] reads who this rank
//! is from the launcher's environment, joins the rendezvous store, picks a
//! transport, and returns a [`Job`]: the world [`Communicator`] (reached
//! through `Deref`) plus the store it keeps alive until a clean shutdown.
//!
//! Environment variables read:
//!
//! * the launcher's: `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`,
//!   `MASTER_ADDR`, `MASTER_PORT` (torchrun, `polychip launch`), or Open
//!   MPI's `OMPI_COMM_WORLD_*`, or Slurm's `SLURM_*` (see [`crate::env`]).
//!   Rank 0 serves the store on `MASTER_ADDR:MASTER_PORT`.
//! * `POLYCHIP_COMM_TIMEOUT_SECS`: seconds (fractions allowed) that
//!   connecting the store, connecting the transport, each collective and the
//!   shutdown may take before failing with a timeout; 60 when unset.
//! * `POLYCHIP_TRANSPORT`: `shm`, `tcp`, `verbs` or `auto` (the default).
//!   `auto` picks shared memory when every rank is on this machine
//!   (`LOCAL_WORLD_SIZE == WORLD_SIZE`), else RDMA verbs when the `verbs`
//!   feature is built and an RDMA device is present, else TCP. The ranks
//!   then agree through the store: if any rank's pick is weaker (one node
//!   without RDMA), every rank uses the weakest (tcp < verbs < shm); a
//!   disagreement involving an explicit choice is a `Mismatch` error.
//! * `POLYCHIP_COMM_ADDR`: the IP address the TCP transport listens on and
//!   publishes to its peers (127.0.0.1 when unset; set it for multi-machine
//!   jobs over TCP).
//! * `POLYCHIP_RDMA_DEVICE`, `POLYCHIP_RDMA_GID_INDEX`, `POLYCHIP_RDMA_PORT`:
//!   the verbs transport's device, GID index and port
//!   (see [`crate::verbs::options`]).
//!
//! Shutdown (dropping the [`Job`] or [`Job::finish`]): every rank passes a
//! final store barrier, drops its transport, and rank 0 waits for the
//! others to close their store connections before stopping the server. A
//! rank whose communicator failed (or that calls [`Job::abandon`], or whose
//! thread is panicking) skips the barrier and announces at it that it will
//! not come: the ranks waiting there, and any arriving later, fail at once
//! naming it and its error, as they do when their transport hears of a
//! peer's failure while they wait. Sub-communicators made with
//! [`Communicator::split`] hold the store too: drop them first.

use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::time::Duration;

use crate::collectives::{Communicator, default_timeout};
use crate::env::{self, RankInfo};
use crate::error::{CommError, Result};
use crate::shm::ShmTransport;
use crate::store::Store;
use crate::tcp::{TcpOptions, TcpTransport};
use crate::tcp_store::{TcpStore, announce_failure, barrier_watching};
use crate::transport::Transport;
use crate::verbs::{RdmaAvailability, VerbsOptions, rdma_availability};

/// Environment variable choosing the transport.
pub const TRANSPORT_ENV: &str = "POLYCHIP_TRANSPORT";

/// A transport kind, weakest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum TransportKind {
    /// TCP over the network (works everywhere).
    Tcp,
    /// RDMA verbs (InfiniBand / RoCE).
    Verbs,
    /// Shared memory (every rank on one machine).
    Shm,
}

impl TransportKind {
    /// `tcp`, `verbs` or `shm`.
    pub fn name(self) -> &'static str {
        match self {
            TransportKind::Tcp => "tcp",
            TransportKind::Verbs => "verbs",
            TransportKind::Shm => "shm",
        }
    }

    /// Parses a `POLYCHIP_TRANSPORT` value: `None` for `auto` (or empty).
    pub fn parse(value: &str) -> Result<Option<TransportKind>> {
        match value.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => Ok(None),
            "shm" => Ok(Some(TransportKind::Shm)),
            "tcp" => Ok(Some(TransportKind::Tcp)),
            "verbs" | "rdma" => Ok(Some(TransportKind::Verbs)),
            _ => Err(CommError::Environment(format!(
                "{TRANSPORT_ENV}={} is not one of shm, tcp, verbs, auto",
                crate::text::quoted(value)
            ))),
        }
    }
}

/// How [`init_with`] sets up the job.
#[derive(Debug, Clone)]
pub struct InitOptions {
    /// The transport; `None` picks one (see the module documentation).
    pub transport: Option<TransportKind>,
    /// Deadline for connecting, for each collective and for the shutdown.
    pub timeout: Duration,
    /// TCP transport settings.
    pub tcp: TcpOptions,
    /// Verbs transport settings.
    pub verbs: VerbsOptions,
    /// What asked for `transport`, named in messages about it:
    /// [`TRANSPORT_ENV`] (the default) or a command-line flag such as
    /// `--transport`.
    pub requested_by: String,
}

impl InitOptions {
    /// The settings from `POLYCHIP_TRANSPORT`, `POLYCHIP_COMM_TIMEOUT_SECS`,
    /// `POLYCHIP_COMM_ADDR` and the `POLYCHIP_RDMA_*` variables.
    pub fn from_env() -> Result<InitOptions> {
        let transport = match std::env::var(TRANSPORT_ENV) {
            Ok(v) => TransportKind::parse(&v)?,
            Err(_) => None,
        };
        Ok(InitOptions {
            transport,
            timeout: default_timeout()?,
            tcp: TcpOptions::from_env()?,
            verbs: VerbsOptions::from_env()?,
            requested_by: TRANSPORT_ENV.into(),
        })
    }
}

/// Picks this rank's transport and says why. `rdma` is asked only when the
/// ranks span machines and no transport was requested.
pub fn choose(
    requested: Option<TransportKind>,
    info: &RankInfo,
    rdma: impl FnOnce() -> RdmaAvailability,
) -> Result<(TransportKind, String)> {
    choose_requested_by(requested, TRANSPORT_ENV, info, rdma)
}

/// `by` asking for `kind`, as the user wrote it: `POLYCHIP_TRANSPORT=tcp`
/// for a variable, `--transport tcp` for a flag.
fn asked(by: &str, kind: &str) -> String {
    match by.starts_with('-') {
        true => format!("{by} {kind}"),
        false => format!("{by}={kind}"),
    }
}

/// [`choose`], naming `by` (a variable or a flag) as what requested the
/// transport.
pub fn choose_requested_by(
    requested: Option<TransportKind>,
    by: &str,
    info: &RankInfo,
    rdma: impl FnOnce() -> RdmaAvailability,
) -> Result<(TransportKind, String)> {
    let one_machine = info.local_world_size == info.world_size;
    match requested {
        Some(TransportKind::Shm) if !one_machine => Err(CommError::Usage(format!(
            "{} but the ranks span machines (LOCAL_WORLD_SIZE {} < WORLD_SIZE {})",
            asked(by, "shm"),
            info.local_world_size,
            info.world_size
        ))),
        Some(TransportKind::Verbs) if !cfg!(feature = "verbs") => Err(CommError::Unavailable {
            transport: "verbs",
            reason: format!(
                "{} but polychip-comm was built without the `verbs` feature",
                asked(by, "verbs")
            ),
        }),
        Some(kind) => Ok((kind, format!("requested by {by}"))),
        None if one_machine => Ok((
            TransportKind::Shm,
            format!("all {} ranks are on this machine", info.world_size),
        )),
        None => match rdma() {
            RdmaAvailability::Available { devices } if cfg!(feature = "verbs") => Ok((
                TransportKind::Verbs,
                format!("ranks span machines; RDMA devices {}", devices.join(", ")),
            )),
            RdmaAvailability::Available { .. } => Ok((
                TransportKind::Tcp,
                "ranks span machines; built without the `verbs` feature".into(),
            )),
            RdmaAvailability::Unavailable { reason } => {
                Ok((TransportKind::Tcp, format!("ranks span machines; {reason}")))
            }
        },
    }
}

/// The transport every rank uses, given each rank's (pick, explicit): the
/// weakest pick; an explicit pick that differs from it is a mismatch.
pub fn agree(rank: usize, picks: &[(TransportKind, bool)]) -> Result<TransportKind> {
    let weakest = picks
        .iter()
        .map(|p| p.0)
        .min()
        .unwrap_or(TransportKind::Tcp);
    let describe = || {
        let all: Vec<String> = picks
            .iter()
            .enumerate()
            .map(|(r, (k, explicit))| {
                let how = if *explicit { "requested" } else { "auto" };
                format!("rank {r}: {} ({how})", k.name())
            })
            .collect();
        all.join(", ")
    };
    if picks.iter().any(|(k, explicit)| *explicit && *k != weakest) {
        return Err(CommError::Mismatch {
            rank,
            op: "choose transport".into(),
            message: format!("the ranks disagree: {}", describe()),
        });
    }
    Ok(weakest)
}

/// A running job: the world communicator (through `Deref`), the rendezvous
/// store it keeps alive, and this rank's place. Dropping it shuts down
/// cleanly (see the module documentation).
pub struct Job {
    comm: Option<Communicator>,
    store: Arc<TcpStore>,
    info: RankInfo,
    transport: TransportKind,
    reason: String,
    timeout: Duration,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("comm", &self.comm)
            .field("info", &self.info)
            .field("transport", &self.transport)
            .finish_non_exhaustive()
    }
}

/// Reads the environment and starts the job (see the module documentation).
pub fn init() -> Result<Job> {
    init_with(env::from_env()?, InitOptions::from_env()?)
}

/// Starts the job as `info` says, with `options`.
pub fn init_with(info: RankInfo, options: InitOptions) -> Result<Job> {
    let (rank, world, timeout) = (info.rank, info.world_size, options.timeout);
    // Refused here, before the rendezvous: the communicator built at the
    // end would refuse it only after every rank had waited for the others.
    if world > crate::collectives::MAX_WORLD {
        return Err(CommError::Usage(format!(
            "world size {world} (from {}) is more than the {} ranks a communicator takes",
            info.launcher,
            crate::collectives::MAX_WORLD
        )));
    }
    let store = Arc::new(TcpStore::connect(&info, timeout)?);
    let (pick, why) = choose_requested_by(
        options.transport,
        &options.requested_by,
        &info,
        rdma_availability,
    )?;
    // One process per rank: a second one given the same rank (a launcher's
    // mistake) joined too, and waited in its first collective until the
    // job ended, then blamed a lost peer.
    let claims = store.add(&format!("polychip/rank/{rank}"), 1)?;
    if claims > 1 {
        return Err(CommError::Usage(format!(
            "rank {rank} joined the job twice: another process of this job (rendezvous {}:{}) \
             already has rank {rank}; give each process a rank of its own ({})",
            crate::text::shown(&info.master_addr),
            info.master_port,
            info.launcher
        )));
    }
    let explicit = options.transport.is_some();
    store.set(
        &format!("polychip/transport/{rank}"),
        format!("{} {} {world}", pick.name(), u8::from(explicit)).as_bytes(),
    )?;
    let mut picks = Vec::with_capacity(world);
    for peer in 0..world {
        let key = format!("polychip/transport/{peer}");
        let raw = store.get(&key, timeout).map_err(|e| match e {
            CommError::Timeout { after, .. } => CommError::Timeout {
                rank,
                op: "init".into(),
                after,
                waiting_for: format!("rank {peer} of {world} to join the job (store key {key:?})"),
            },
            e => e,
        })?;
        let text = String::from_utf8_lossy(&raw);
        let mut words = text.split(' ');
        let (name, flag) = (words.next().unwrap_or(""), words.next().unwrap_or("0"));
        // Every rank must be of one world: a rank started with another
        // size waited for ranks that never came, and timed out naming none.
        if let Some(theirs) = words.next().and_then(|w| w.parse::<usize>().ok())
            && theirs != world
        {
            return Err(CommError::Usage(format!(
                "rank {peer} was started with a world of {theirs} ranks, this rank (rank {rank}) \
                 with {world} ({}): every rank of a job must be given the same world size",
                info.launcher
            )));
        }
        let kind = TransportKind::parse(name)?.unwrap_or(TransportKind::Tcp);
        picks.push((kind, flag == "1"));
    }
    let kind = agree(rank, &picks)?;
    let reason = if kind == pick {
        why
    } else {
        let weaker: Vec<usize> = (0..world).filter(|&r| picks[r].0 == kind).collect();
        format!("ranks {weaker:?} can only use {} ({why} here)", kind.name())
    };
    log::info!("rank {rank}: transport {}: {reason}", kind.name());
    let dyn_store: Arc<dyn Store> = store.clone();
    let transport: Arc<dyn Transport> = match kind {
        TransportKind::Shm => Arc::new(ShmTransport::new(&*store, rank, world, timeout)?),
        TransportKind::Tcp => {
            let mut tcp = options.tcp;
            // The secret the store took (perhaps given, not from this
            // process's environment) is the one the mesh proves.
            tcp.auth.get_or_insert_with(|| store.auth().clone());
            if std::env::var_os(crate::tcp::ADDR_ENV).is_none() && tcp.bind_addr.is_loopback() {
                // Peers on other machines cannot reach 127.0.0.1: listen on
                // the address this machine reaches rank 0's from.
                if let Some(local) = crate::tcp::route_to(&info.master_addr, info.master_port) {
                    if !local.is_loopback() {
                        log::info!(
                            "rank {rank}: tcp: listening on {local}, the address that reaches \
                             MASTER_ADDR {} (set {} to choose another)",
                            info.master_addr,
                            crate::tcp::ADDR_ENV
                        );
                        tcp.bind_addr = local;
                    }
                }
            }
            Arc::new(TcpTransport::with_options(
                dyn_store.clone(),
                rank,
                world,
                timeout,
                tcp,
            )?)
        }
        TransportKind::Verbs => verbs(dyn_store.clone(), &info, timeout, options.verbs)?,
    };
    let mut comm = Communicator::new(transport)?;
    comm.set_timeout(timeout);
    comm.set_store(dyn_store);
    Ok(Job {
        comm: Some(comm),
        store,
        info,
        transport: kind,
        reason,
        timeout,
    })
}

#[cfg(feature = "verbs")]
fn verbs(
    store: Arc<dyn Store>,
    info: &RankInfo,
    timeout: Duration,
    options: VerbsOptions,
) -> Result<Arc<dyn Transport>> {
    let t = crate::verbs::VerbsTransport::new(store, info.rank, info.world_size, timeout, options)?;
    Ok(Arc::new(t))
}

#[cfg(not(feature = "verbs"))]
fn verbs(
    _store: Arc<dyn Store>,
    _info: &RankInfo,
    _timeout: Duration,
    _options: VerbsOptions,
) -> Result<Arc<dyn Transport>> {
    Err(CommError::Unavailable {
        transport: "verbs",
        reason: "polychip-comm was built without the `verbs` feature".into(),
    })
}

/// The store keys of the job's exit barrier.
const EXIT: &str = "polychip/job/exit";

impl Job {
    /// This rank's place in the job.
    pub fn info(&self) -> &RankInfo {
        &self.info
    }

    /// The transport in use and why it was chosen.
    pub fn transport_choice(&self) -> (TransportKind, &str) {
        (self.transport, &self.reason)
    }

    /// The rendezvous store.
    pub fn store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }

    /// Shuts down now, returning what went wrong (dropping does the same
    /// and only logs).
    pub fn finish(mut self) -> Result<()> {
        self.shutdown()
    }

    /// Leaves the job after a local failure: no exit barrier (the other
    /// ranks would only time out waiting for this one there), so the
    /// process can report its error and exit at once. Its communicator is
    /// aborted ([`Communicator::abort`]) unless it already failed, and the
    /// failure announced at the exit barrier: the peers fail at once,
    /// in their current call, their next one, or at their exit barrier.
    pub fn abandon(mut self) {
        if let Some(comm) = self.comm.as_mut() {
            comm.abort("it abandoned the job");
        }
        let _ = self.shutdown();
    }

    fn shutdown(&mut self) -> Result<()> {
        let Some(mut comm) = self.comm.take() else {
            return Ok(());
        };
        let (rank, world) = (self.info.rank, self.info.world_size);
        if std::thread::panicking() {
            comm.abort("its thread panicked");
        }
        // A peer that left without taking a message this rank sent it: the
        // job lost data, which its exit reports (and announces).
        if comm.broken().is_none()
            && let Some(e) = comm.undelivered()
        {
            let why = e.to_string();
            comm.abort(why.strip_prefix(&format!("rank {rank}: ")).unwrap_or(&why));
            let _ = announce_failure(&*self.store, EXIT, rank, &why);
            drop(comm);
            return Err(e);
        }
        let healthy = comm.broken().is_none();
        let passed = match comm.broken() {
            None => {
                // It makes no more calls: a peer still waiting in one for
                // it fails at once naming it, instead of at its deadline
                // (and then fails this barrier too, announcing it).
                comm.leave();
                let transport = comm.transport().clone();
                let watch = move || {
                    let e = transport.peer_lost()?;
                    Some(e.restated(|r| r, |_| "barrier".into()))
                };
                barrier_watching(&*self.store, EXIT, rank, world, self.timeout, &watch)
            }
            Some(why) => {
                // Best effort: the ranks waiting at the barrier learn it
                // there (their transports told them already, if they
                // listen).
                if let Err(e) = announce_failure(&*self.store, EXIT, rank, why) {
                    log::debug!("rank {rank}: could not announce its failure at exit: {e}");
                }
                Ok(())
            }
        };
        drop(comm);
        passed?;
        if rank == 0 && healthy {
            self.store.wait_for_others_to_leave(self.timeout)?;
        }
        Ok(())
    }

    fn comm_ref(&self) -> &Communicator {
        self.comm
            .as_ref()
            .expect("the communicator lives until shutdown")
    }
}

impl Deref for Job {
    type Target = Communicator;
    fn deref(&self) -> &Communicator {
        self.comm_ref()
    }
}

impl DerefMut for Job {
    fn deref_mut(&mut self) -> &mut Communicator {
        self.comm
            .as_mut()
            .expect("the communicator lives until shutdown")
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            log::warn!("rank {}: shutdown: {e}", self.info.rank);
        }
    }
}
