//! [`VerbsTransport`]: the one-sided [`Transport`] over RDMA verbs. A write
//! is copied into this rank's registered staging slots for the peer (so the
//! caller's slice need not be registered and may be reused on return) and
//! sent as RDMA WRITEs of at most one slot each; the last is an RDMA WRITE
//! WITH IMMEDIATE whose immediate names the signal. Reliable-connected
//! queue pairs deliver in order, so when the receiver's CQ reports that
//! immediate every byte before it has landed. A progress thread polls the
//! CQ (freeing slots, raising signals, reposting receives); `wait` polls it
//! too while it spins.
//!
//! Failure and departure notices ([`Transport::abort`],
//! [`Transport::leave`]) go through the rendezvous store (see
//! [`super::notices`]), read by a thread of their own every 100 ms: a peer
//! whose communicator failed fails every wait and later call naming it; a
//! departed peer fails waits for more than its final counter values and
//! collectives after its last, and writes to it are discarded (its queue
//! pair is gone; their failed completions are no loss), as over TCP. A
//! dropped transport lets its posted writes complete (at most a second)
//! before its queue pairs go.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use ibverbs_sys as ffi;

use super::connect::{self, access};
use super::notices::Notices;
use super::options::VerbsOptions;
use super::state::{MAX_SIGNALS, Peer, Shared};
use super::sys::Registered;
use super::wire::{RemoteRegion, WorkId, chunks, encode_imm};
use crate::error::{CommError, Result};
use crate::store::Store;
use crate::transport::{RegionId, SignalId, Transport};

/// A one-sided [`Transport`] over RDMA verbs (InfiniBand or RoCE): one RC
/// queue pair per pair of ranks.
pub struct VerbsTransport {
    shared: Arc<Shared>,
    store: Arc<dyn Store>,
    base: String,
    timeout: Duration,
    spin: Duration,
    register_lock: std::sync::Mutex<()>,
    progress: Option<JoinHandle<()>>,
    /// Staging slots per peer (all free once every write completed).
    slots: usize,
}

impl std::fmt::Debug for VerbsTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsTransport")
            .field("rank", &self.shared.rank)
            .field("world_size", &self.shared.world_size)
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

impl VerbsTransport {
    /// Connects every rank of the job: every rank calls this with the same
    /// store, `world_size`, `timeout` and key prefix. Fails with
    /// [`CommError::Unavailable`] when this machine has no usable RDMA
    /// device (pick another transport then).
    pub fn new(
        store: Arc<dyn Store>,
        rank: usize,
        world_size: usize,
        timeout: Duration,
        options: VerbsOptions,
    ) -> Result<VerbsTransport> {
        if world_size == 0 || rank >= world_size {
            return Err(CommError::Usage(format!(
                "verbs: rank {rank} is not in a world of {world_size}"
            )));
        }
        options.validate()?;
        let dev = connect::open(&options)?;
        let mesh = connect::connect(&dev, store.as_ref(), rank, world_size, timeout, &options)?;
        let mut peers = Vec::with_capacity(world_size);
        for qp in mesh.qps {
            let Some(qp) = qp else {
                peers.push(None);
                continue;
            };
            let local = ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE;
            let staging = Registered::new(&mesh.pd, options.slots * options.chunk_bytes, local)
                .map_err(|e| CommError::Io {
                    rank,
                    op: "verbs register staging".into(),
                    message: e.to_string(),
                })?;
            peers.push(Some(Peer {
                qp,
                staging,
                chunk: options.chunk_bytes,
                free: std::sync::Mutex::new((0..options.slots as u32).rev().collect()),
                send: std::sync::Mutex::new(()),
                remote: std::sync::Mutex::new(Vec::new()),
            }));
        }
        log::debug!(
            "verbs rank {rank}: connected {world_size} ranks on {} (GID index {})",
            dev.name,
            dev.gid_index
        );
        // Failure and departure notices travel through the store (RDMA
        // has no frames to carry them); a thread of their own reads them.
        let notices = Arc::new(Notices::new(store.clone(), &mesh.base, rank, world_size));
        let reader = Arc::clone(&notices);
        std::thread::Builder::new()
            .name(format!("verbs-notices-{rank}"))
            .spawn(move || reader.run())
            .map_err(|e| CommError::Io {
                rank,
                op: "verbs spawn notices".into(),
                message: e.to_string(),
            })?;
        let shared = Arc::new(Shared::new(
            rank, world_size, peers, mesh.cq, mesh.pd, dev.ctx, notices,
        ));
        let thread_shared = Arc::clone(&shared);
        let progress = std::thread::Builder::new()
            .name(format!("verbs-progress-{rank}"))
            .spawn(move || {
                while !thread_shared.closing.load(Ordering::Acquire) {
                    if thread_shared.progress() == 0 {
                        std::thread::sleep(Duration::from_micros(50));
                    }
                }
            })
            .map_err(|e| CommError::Io {
                rank,
                op: "verbs spawn progress".into(),
                message: e.to_string(),
            })?;
        Ok(VerbsTransport {
            shared,
            store,
            base: mesh.base,
            timeout,
            spin: options.spin,
            register_lock: std::sync::Mutex::new(()),
            progress: Some(progress),
            slots: options.slots,
        })
    }

    fn usage(&self, what: String) -> CommError {
        CommError::Usage(format!("verbs {what}"))
    }

    /// Takes a free staging slot of `p`, polling until one frees up.
    fn slot(&self, peer: usize, p: &Peer, deadline: Instant) -> Result<u32> {
        loop {
            if let Some(slot) = p.free.lock().unwrap_or_else(|e| e.into_inner()).pop() {
                return Ok(slot);
            }
            self.shared.check("write")?;
            if Instant::now() >= deadline {
                return Err(CommError::Timeout {
                    rank: self.shared.rank,
                    op: "verbs write".into(),
                    after: self.timeout,
                    waiting_for: format!("RDMA writes to rank {peer} to complete"),
                });
            }
            if self.shared.progress() == 0 {
                std::thread::yield_now();
            }
        }
    }
}

impl Transport for VerbsTransport {
    fn rank(&self) -> usize {
        self.shared.rank
    }

    fn world_size(&self) -> usize {
        self.shared.world_size
    }

    fn name(&self) -> &'static str {
        "verbs"
    }

    fn register(&self, len: usize) -> Result<(RegionId, *mut u8)> {
        let shared = &self.shared;
        let rank = shared.rank;
        let _one = self.register_lock.lock().unwrap_or_else(|e| e.into_inner());
        let region = Registered::new(&shared.pd, len, access()).map_err(|e| CommError::Io {
            rank,
            op: "verbs register".into(),
            message: format!("{len} bytes: {e}"),
        })?;
        let id = shared
            .regions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len();
        let mine = RemoteRegion {
            addr: region.ptr() as u64,
            len: len as u64,
            rkey: region.rkey(),
        };
        self.store.set(
            &format!("{}/region/{id}/{rank}", self.base),
            &mine.to_bytes(),
        )?;
        let deadline = Instant::now() + self.timeout;
        let mut theirs = Vec::with_capacity(shared.world_size);
        for peer in (0..shared.world_size).filter(|&p| p != rank) {
            let left = deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1));
            let raw = self
                .store
                .get(&format!("{}/region/{id}/{peer}", self.base), left)?;
            let remote = RemoteRegion::from_bytes(&raw).map_err(|why| CommError::Mismatch {
                rank,
                op: "verbs register".into(),
                message: format!("rank {peer} published a bad region: {why}"),
            })?;
            if remote.len != len as u64 {
                return Err(CommError::Mismatch {
                    rank,
                    op: "verbs register".into(),
                    message: format!(
                        "region {id}: rank {peer} registered {} bytes, this rank {len}",
                        remote.len
                    ),
                });
            }
            theirs.push((peer, remote));
        }
        for (peer, remote) in theirs {
            let p = shared.peers[peer]
                .as_ref()
                .expect("every other rank has a peer entry");
            p.remote
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(remote);
        }
        let ptr = region.ptr();
        shared
            .regions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(region);
        Ok((RegionId(id as u32), ptr))
    }

    fn write(
        &self,
        peer: usize,
        region: RegionId,
        offset: usize,
        data: &[u8],
        signal: SignalId,
    ) -> Result<()> {
        let shared = &self.shared;
        if peer >= shared.world_size {
            return Err(self.usage(format!(
                "write: peer {peer} is not in a world of {}",
                shared.world_size
            )));
        }
        let imm = match encode_imm(signal.0) {
            Some(imm) if (signal.0 as usize) < MAX_SIGNALS => imm,
            _ => {
                return Err(self.usage(format!(
                    "write: signal {} is not below {MAX_SIGNALS}",
                    signal.0
                )));
            }
        };
        let (len, base) = {
            let regions = shared.regions.lock().unwrap_or_else(|e| e.into_inner());
            let r = regions.get(region.0 as usize).ok_or_else(|| {
                self.usage(format!("write: region {} is not registered", region.0))
            })?;
            (r.len(), r.ptr())
        };
        if offset.checked_add(data.len()).is_none_or(|end| end > len) {
            return Err(self.usage(format!(
                "write: {} bytes at offset {offset} overflow region {} of {len} bytes",
                data.len(),
                region.0
            )));
        }
        shared.check("write")?;
        if let Some(e) = shared.notices.failure("verbs write") {
            return Err(e);
        }
        if shared.notices.departed(peer).is_some() {
            // A peer that left can no longer receive: discard (as TCP).
            return Ok(());
        }
        let Some(p) = &shared.peers[peer] else {
            // SAFETY: the range is inside this rank's copy (checked above);
            // by the transport contract nobody else touches it until
            // `signal` is raised.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), base.add(offset), data.len()) };
            shared.raise(signal.0);
            return Ok(());
        };
        let remote = *p
            .remote
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(region.0 as usize)
            .ok_or_else(|| {
                self.usage(format!(
                    "write: rank {peer} has not registered region {}",
                    region.0
                ))
            })?;
        let deadline = Instant::now() + self.timeout;
        let _in_order = p.send.lock().unwrap_or_else(|e| e.into_inner());
        for piece in chunks(offset, data.len(), p.chunk) {
            let slot = self.slot(peer, p, deadline)?;
            let staged = slot as usize * p.chunk;
            // SAFETY: the slot is free (its last write completed) and lies
            // inside the staging registration; `piece` lies inside `data`.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    data.as_ptr().add(piece.src),
                    p.staging.ptr().add(staged),
                    piece.len,
                )
            };
            let mut sge = ffi::ibv_sge {
                // SAFETY: inside the staging registration.
                addr: unsafe { p.staging.ptr().add(staged) } as u64,
                length: piece.len as u32,
                lkey: p.staging.lkey(),
            };
            let mut wr = ffi::ibv_send_wr {
                wr_id: WorkId::Send {
                    peer: peer as u32,
                    slot,
                }
                .encode(),
                sg_list: &raw mut sge,
                num_sge: i32::from(piece.len > 0),
                opcode: if piece.last {
                    ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM
                } else {
                    ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE
                },
                send_flags: ffi::ibv_send_flags::IBV_SEND_SIGNALED.0,
                ..Default::default()
            };
            wr.wr.rdma = ffi::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
                remote_addr: remote.addr + piece.dst as u64,
                rkey: remote.rkey,
            };
            if piece.last {
                wr.__bindgen_anon_1.imm_data = imm.to_be();
            }
            // SAFETY: the slot stays owned by this write until its completion
            // returns it to `free`; posts to this QP are serialized by `send`.
            if let Err(e) = unsafe { p.qp.post_send(&mut wr) } {
                p.free.lock().unwrap_or_else(|e| e.into_inner()).push(slot);
                shared.fail(shared.lost(peer, format!("ibv_post_send failed: {e}")));
                return shared.check("write");
            }
        }
        Ok(())
    }

    fn wait(&self, signal: SignalId, value: u64, deadline: Instant) -> Result<()> {
        let shared = &self.shared;
        let counter = shared.counter(signal).ok_or_else(|| {
            self.usage(format!(
                "wait: signal {} is not below {MAX_SIGNALS}",
                signal.0
            ))
        })?;
        let start = Instant::now();
        loop {
            if counter.load(Ordering::Acquire) >= value {
                return Ok(());
            }
            let busy = shared.progress() > 0;
            if counter.load(Ordering::Acquire) >= value {
                return Ok(());
            }
            shared.check("wait")?;
            // A peer's notice (one load each when there is none).
            if let Some(e) = shared.notices.failure("verbs wait") {
                return Err(e);
            }
            if let Some(e) = shared.notices.left_short("verbs wait", signal, value) {
                return Err(e);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(CommError::Timeout {
                    rank: shared.rank,
                    op: "verbs wait".into(),
                    after: start.elapsed(),
                    waiting_for: format!(
                        "signal {} to reach {value} (it is at {})",
                        signal.0,
                        counter.load(Ordering::Acquire)
                    ),
                });
            }
            if busy || now - start < self.spin {
                std::hint::spin_loop();
            } else {
                std::thread::sleep(Duration::from_micros(20));
            }
        }
    }

    fn signal_value(&self, signal: SignalId) -> u64 {
        self.shared
            .counter(signal)
            .map_or(0, |c| c.load(Ordering::Acquire))
    }

    /// Posts the failure notice through the store (bounded: about a
    /// second, see [`super::notices`]).
    fn abort(&self, why: &str) {
        self.shared.notices.announce_failure(why);
    }

    /// Posts the departure notice through the store (bounded, as abort).
    fn leave(&self, note: &dyn Fn(usize) -> crate::transport::Departure) {
        self.shared.notices.announce_departure(note);
    }

    fn departures(&self) -> usize {
        self.shared.notices.departures()
    }

    fn departed(&self, peer: usize) -> Option<u64> {
        self.shared.notices.departed(peer)
    }

    fn finals(&self, peer: usize) -> Vec<(SignalId, u64)> {
        self.shared.notices.finals(peer)
    }

    fn peer_failure(&self) -> Option<CommError> {
        self.shared.notices.failure("wait")
    }

    fn peer_lost(&self) -> Option<CommError> {
        self.peer_failure()
            .or_else(|| self.shared.check("wait").err())
    }
}

impl Drop for VerbsTransport {
    fn drop(&mut self) {
        self.shared.notices.close();
        // Let the writes already posted complete (land at the peers)
        // before the queue pairs go, for at most a second.
        let until = Instant::now() + Duration::from_secs(1);
        let idle = |p: &Option<super::state::Peer>| {
            p.as_ref().is_none_or(|p| {
                p.free.lock().unwrap_or_else(|e| e.into_inner()).len() >= self.slots
            })
        };
        while Instant::now() < until
            && self.shared.check("close").is_ok()
            && !self.shared.peers.iter().all(idle)
        {
            if self.shared.progress() == 0 {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
        self.shared.closing.store(true, Ordering::Release);
        if let Some(handle) = self.progress.take() {
            let _ = handle.join();
        }
    }
}
