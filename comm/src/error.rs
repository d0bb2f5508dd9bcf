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

/// How a [`CommError::PeerLost`] begins its reason when the peer announced
/// its own failure (see [`crate::transport::Transport::abort`]): "peer rank
/// 0 is gone: it failed: rank 0: all_reduce: ...".
pub const PEER_FAILED: &str = "it failed: ";

/// How a [`CommError::PeerLost`] gives its reason when the peer left
/// cleanly (destroyed its communicator, or is finishing the job) before
/// the call that needs it: "peer rank 2 is gone: it left (destroyed its
/// communicator) before this call".
pub const PEER_LEFT: &str = "it left (destroyed its communicator) before this call";

/// Longest reason an announced failure carries (longer ones are cut).
pub const MAX_ABORT_REASON: usize = 2048;

/// `why` cut to at most [`MAX_ABORT_REASON`] bytes on a character boundary.
pub fn abort_reason(why: &str) -> &str {
    let mut end = why.len().min(MAX_ABORT_REASON);
    while !why.is_char_boundary(end) {
        end -= 1;
    }
    &why[..end]
}

impl CommError {
    /// The error a rank reports when `peer` announced that its
    /// communicator failed, for `why` (its own error's words).
    pub fn peer_failed(rank: usize, op: impl Into<String>, peer: usize, why: &str) -> CommError {
        CommError::PeerLost {
            rank,
            op: op.into(),
            peer,
            why: format!("{PEER_FAILED}{why}"),
        }
    }

    /// The error a rank reports when `peer` left cleanly before the call
    /// that needs it; `detail` (may be empty) says more.
    pub fn peer_left(rank: usize, op: impl Into<String>, peer: usize, detail: &str) -> CommError {
        CommError::PeerLost {
            rank,
            op: op.into(),
            peer,
            why: format!("{PEER_LEFT}{detail}"),
        }
    }

    /// Whether this error reports a peer that left cleanly before the call
    /// ([`CommError::peer_left`]).
    pub fn is_peer_departure(&self) -> bool {
        matches!(self, CommError::PeerLost { why, .. } if why.starts_with(PEER_LEFT))
    }

    /// Whether this error reports a failure a peer announced (rather than
    /// one this rank found itself): a rank that learns of a peer's failure
    /// does not announce it again.
    pub fn is_peer_failure(&self) -> bool {
        matches!(self, CommError::PeerLost { why, .. } if why.starts_with(PEER_FAILED))
    }

    /// The same error with its ranks (the one that saw it, and a lost peer)
    /// passed through `rank` and its operation through `op`; the variants
    /// without them are returned as they are.
    pub fn restated(self, rank: impl Fn(usize) -> usize, op: impl Fn(String) -> String) -> Self {
        match self {
            CommError::Timeout {
                rank: r,
                op: o,
                after,
                waiting_for,
            } => CommError::Timeout {
                rank: rank(r),
                op: op(o),
                after,
                waiting_for,
            },
            CommError::PeerLost {
                rank: r,
                op: o,
                peer,
                why,
            } => CommError::PeerLost {
                rank: rank(r),
                op: op(o),
                peer: rank(peer),
                why,
            },
            CommError::Mismatch {
                rank: r,
                op: o,
                message,
            } => CommError::Mismatch {
                rank: rank(r),
                op: op(o),
                message,
            },
            CommError::Io {
                rank: r,
                op: o,
                message,
            } => CommError::Io {
                rank: rank(r),
                op: op(o),
                message,
            },
            other => other,
        }
    }

    /// This error of a sub-communicator's call restated in its parent's
    /// ranks: `members[r]` is group rank `r`'s rank in the parent, and the
    /// operation says it ran on `group` (e.g. "the pipeline link from rank
    /// 1 to rank 2"), so that a job's messages name one numbering. Text
    /// inside the error (what a timeout waited for) keeps the group's.
    pub fn in_group(self, members: &[usize], group: &str) -> CommError {
        self.restated(
            |r| members.get(r).copied().unwrap_or(r),
            |op| format!("{op} on {group}"),
        )
    }
}

/// The communication layer's result type.
pub type Result<T, E = CommError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_groups_error_names_the_parents_ranks_and_the_group() {
        let e = CommError::PeerLost {
            rank: 0,
            op: "send/recv".into(),
            peer: 1,
            why: "it closed its transport".into(),
        };
        let text = e
            .in_group(&[4, 7], "the link from rank 4 to rank 7")
            .to_string();
        assert_eq!(
            text,
            "rank 4: send/recv on the link from rank 4 to rank 7: peer rank 7 is gone: it closed \
             its transport"
        );
        let usage = CommError::Usage("bad".into());
        assert_eq!(usage.clone().in_group(&[3], "g"), usage);
    }
}
