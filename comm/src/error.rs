//! Communication errors. Every failure names the rank that saw it, the peer
//! involved when there is one, and the operation; nothing hangs: every wait
//! has a deadline.

use std::time::Duration;

/// Why a communication call failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CommError {
    /// The launcher's environment is missing or inconsistent.
    #[error("rendezvous: {0}")]
    Environment(String),
    /// A deadline passed while waiting.
    #[error("rank {rank}: {op}: timed out after {after:?} waiting for {waiting_for}")]
    Timeout {
        /// The rank that waited.
        rank: usize,
        /// The operation.
        op: String,
        /// How long it waited.
        after: Duration,
        /// What it waited for (a peer, a key, a signal).
        waiting_for: String,
    },
    /// A peer is gone (its connection closed or its process died).
    #[error("rank {rank}: {op}: peer rank {peer} is gone: {why}")]
    PeerLost {
        /// The rank that noticed.
        rank: usize,
        /// The operation.
        op: String,
        /// The lost peer.
        peer: usize,
        /// What was seen.
        why: String,
    },
    /// The ranks disagree about a collective (size, dtype, operation).
    #[error("rank {rank}: {op}: {message}")]
    Mismatch {
        /// The rank that noticed.
        rank: usize,
        /// The operation.
        op: String,
        /// What differs.
        message: String,
    },
    /// A system call or socket failed.
    #[error("rank {rank}: {op}: {message}")]
    Io {
        /// The rank.
        rank: usize,
        /// The operation.
        op: String,
        /// The OS's words.
        message: String,
    },
    /// The caller passed something unusable.
    #[error("{0}")]
    Usage(String),
    /// A transport cannot be used on this machine (e.g. no RDMA device or
    /// no kernel support): not a failure of the job; pick another transport.
    #[error("{reason}")]
    Unavailable {
        /// The transport's short name (`verbs`).
        transport: &'static str,
        /// Why, in words.
        reason: String,
    },
}

/// The communication layer's result type.
pub type Result<T, E = CommError> = std::result::Result<T, E>;
