//! The state a verbs transport shares with its progress thread: per peer the
//! queue pair, the registered staging slots and the peer's regions; the
//! local regions; the signal counters; the first failure; and the CQ poller
//! that turns completions into freed slots, raised signals, reposted
//! receives or a lost peer. Fields are declared in teardown order.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use ibverbs_sys as ffi;

use super::notices::Notices;
use super::sys::{Context, Cq, Pd, Qp, Registered, wc_status_str};
use super::wire::{RemoteRegion, WorkId, decode_imm};
use crate::error::{CommError, Result};
use crate::transport::SignalId;

/// Number of signal counters per rank: ids `0..MAX_SIGNALS`.
pub const MAX_SIGNALS: usize = 4096;

/// What this rank keeps per peer.
#[derive(Debug)]
pub(crate) struct Peer {
    pub qp: Qp,
    /// `slots` pieces of `chunk` bytes each, registered for local reads.
    pub staging: Registered,
    pub chunk: usize,
    /// Staging slots whose last write has completed.
    pub free: Mutex<Vec<u32>>,
    /// Held for a whole write, so its pieces are posted in order.
    pub send: Mutex<()>,
    /// The peer's copies of the registered regions, by region id.
    pub remote: Mutex<Vec<RemoteRegion>>,
}

#[derive(Debug)]
pub(crate) struct Shared {
    pub rank: usize,
    pub world_size: usize,
    pub peers: Vec<Option<Peer>>,
    pub regions: Mutex<Vec<Registered>>,
    cq: Mutex<Cq>,
    pub pd: Pd,
    _ctx: Context,
    counters: Box<[AtomicU64]>,
    failed: AtomicBool,
    failure: Mutex<Option<CommError>>,
    pub closing: AtomicBool,
    /// The peers' failure and departure notices (through the store).
    pub notices: std::sync::Arc<Notices>,
}

impl Shared {
    pub fn new(
        rank: usize,
        world_size: usize,
        peers: Vec<Option<Peer>>,
        cq: Cq,
        pd: Pd,
        ctx: Context,
        notices: std::sync::Arc<Notices>,
    ) -> Shared {
        Shared {
            rank,
            world_size,
            peers,
            regions: Mutex::new(Vec::new()),
            cq: Mutex::new(cq),
            pd,
            _ctx: ctx,
            counters: (0..MAX_SIGNALS).map(|_| AtomicU64::new(0)).collect(),
            failed: AtomicBool::new(false),
            failure: Mutex::new(None),
            closing: AtomicBool::new(false),
            notices,
        }
    }

    pub fn counter(&self, signal: SignalId) -> Option<&AtomicU64> {
        self.counters.get(signal.0 as usize)
    }

    pub fn raise(&self, signal: u32) {
        self.counters[signal as usize].fetch_add(1, Ordering::AcqRel);
    }

    /// Records the first failure; later calls fail with it.
    pub fn fail(&self, error: CommError) {
        if self.closing.load(Ordering::Acquire) {
            return;
        }
        let mut first = self.failure.lock().unwrap_or_else(|e| e.into_inner());
        if first.is_none() {
            log::warn!("verbs rank {}: {error}", self.rank);
            *first = Some(error);
            self.failed.store(true, Ordering::Release);
        }
    }

    pub fn lost(&self, peer: usize, why: String) -> CommError {
        CommError::PeerLost {
            rank: self.rank,
            op: "verbs".into(),
            peer,
            why,
        }
    }

    /// Fails with the first failure, if any, renamed to operation `op`.
    pub fn check(&self, op: &str) -> Result<()> {
        if !self.failed.load(Ordering::Acquire) {
            return Ok(());
        }
        let first = self.failure.lock().unwrap_or_else(|e| e.into_inner());
        Err(match first.clone().expect("failed is set after failure") {
            CommError::PeerLost {
                rank, peer, why, ..
            } => CommError::PeerLost {
                rank,
                op: format!("verbs {op}"),
                peer,
                why,
            },
            other => other,
        })
    }

    /// Polls the CQ once (unless another thread is polling it) and handles
    /// what completed. Returns the number of completions handled.
    pub fn progress(&self) -> usize {
        let Ok(cq) = self.cq.try_lock() else { return 0 };
        let mut wcs = [ffi::ibv_wc::default(); 32];
        let n = match cq.poll(&mut wcs) {
            Ok(n) => n,
            Err(e) => {
                self.fail(CommError::Io {
                    rank: self.rank,
                    op: "verbs poll".into(),
                    message: e.to_string(),
                });
                return 0;
            }
        };
        for wc in &wcs[..n] {
            self.complete(wc);
        }
        n
    }

    fn complete(&self, wc: &ffi::ibv_wc) {
        let (peer, slot) = match WorkId::decode(wc.wr_id()) {
            WorkId::Send { peer, slot } => (peer as usize, Some(slot)),
            WorkId::Recv { peer } => (peer as usize, None),
        };
        let Some(Some(p)) = self.peers.get(peer) else {
            log::warn!(
                "verbs rank {}: completion for unknown peer {peer}",
                self.rank
            );
            return;
        };
        if let Some(slot) = slot {
            p.free.lock().unwrap_or_else(|e| e.into_inner()).push(slot);
        }
        if let Some((status, vendor)) = wc.error() {
            if self.notices.departed(peer).is_some() {
                // A peer that left tore its queue pair down: the writes
                // to it (its last credits) go nowhere, which is no loss.
                log::debug!(
                    "verbs rank {}: a work request to rank {peer}, which left, failed",
                    self.rank
                );
                return;
            }
            let what = if slot.is_some() {
                "RDMA write"
            } else {
                "receive"
            };
            let why = if status == ffi::ibv_wc_status::IBV_WC_WR_FLUSH_ERR {
                format!("{what} flushed: the queue pair is in the error state")
            } else {
                format!(
                    "{what} failed: {} (vendor error {vendor:#x})",
                    wc_status_str(status)
                )
            };
            return self.fail(self.lost(peer, why));
        }
        if slot.is_some() {
            return;
        }
        if wc.opcode() != ffi::ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM {
            return self
                .fail(self.protocol(peer, format!("unexpected receive opcode {}", wc.opcode())));
        }
        let signal = match wc.imm_data().map(|imm| decode_imm(u32::from_be(imm))) {
            Some(Ok(s)) if (s as usize) < MAX_SIGNALS => s,
            Some(Ok(s)) => {
                return self
                    .fail(self.protocol(peer, format!("signal {s} is not below {MAX_SIGNALS}")));
            }
            Some(Err(why)) => return self.fail(self.protocol(peer, why)),
            None => {
                return self.fail(
                    self.protocol(peer, "a receive completed without immediate data".into()),
                );
            }
        };
        // The receive is consumed: put another in its place before raising
        // the signal, so the peer never runs the queue dry by our doing.
        if let Err(e) =
            p.qp.post_empty_recv(WorkId::Recv { peer: peer as u32 }.encode())
        {
            self.fail(self.lost(peer, format!("cannot repost a receive: {e}")));
        }
        self.raise(signal);
    }

    fn protocol(&self, peer: usize, message: String) -> CommError {
        CommError::Mismatch {
            rank: self.rank,
            op: "verbs".into(),
            message: format!("peer rank {peer} broke the protocol: {message}"),
        }
    }
}
