//! The whole-call check of a call that runs as several collectives (a
//! device tensor moved in chunks, see `device/`): each collective's header
//! describes only its own part, so ranks whose whole calls differ would
//! agree on the first parts and part ways later, one rank returning with a
//! partial result while another waits for parts that never come.

use super::channel::Header;
use super::{Communicator, DType, MAX_WORLD, ReduceOp};
use crate::error::Result;

impl Communicator {
    /// Makes every rank agree on a whole call (its `kind`, element `count`,
    /// `dtype`, `op` and `root`) before its first part runs: every rank
    /// sends its call's description to every other and reads theirs (one
    /// header-only message each way per pair of ranks). Every rank then
    /// holds every call, so a rank whose call differs from another's fails
    /// at once with [`crate::error::CommError::Mismatch`] naming both, on every rank,
    /// however the parts would have gone on.
    pub(crate) fn agree(
        &mut self,
        kind: &'static str,
        dtype: Option<DType>,
        op: Option<ReduceOp>,
        root: usize,
        count: usize,
    ) -> Result<()> {
        let h = Header {
            whole: true,
            ..self.begin(kind, dtype, op, root, count, true)?
        };
        for peer in self.peers() {
            self.put(0, peer, &h, &[])?;
        }
        let mine = h.words(0);
        let mut calls = [[0u64; 4]; MAX_WORLD];
        calls[self.rank] = mine;
        for peer in self.peers() {
            calls[peer] = self.take_header(0, peer, &h)?;
        }
        // Any disagreement is one with this rank's call (were every other
        // call equal to this one, all would be equal): name the first rank
        // whose call differs.
        let Some(peer) = (0..self.world).find(|&r| calls[r] != mine) else {
            return Ok(());
        };
        Err(self.mismatch(kind, peer, &calls[peer], &mine))
    }
}
