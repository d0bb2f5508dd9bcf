//! Sub-communicators, like `MPI_Comm_split`: [`Communicator::split`] groups
//! the ranks of a communicator by color, orders each group by (key, old
//! rank) and connects a fresh transport of the parent's kind for each group
//! (data-parallel and pipeline groups are made this way).
//!
//! Every rank of the parent calls `split`, in the same order relative to its
//! other collectives. The ranks exchange (color, key) with an all-gather on
//! the parent; parent rank 0 also draws a split number from the store
//! (`polychip/split/next`), so every group gets store keys of its own:
//! `polychip/split/<n>/<color>/...` (the shared-memory job name, the TCP
//! addresses, the verbs queue pair records). The parent must have a store
//! recorded ([`Communicator::set_store`]; `bootstrap::init` does it).
//!
//! A group's failure (an error of one of its calls, which the failing rank
//! announces over the group's transport) fails its other members' waits at
//! once; it does not abort the parent, which stays usable: the ranks decide
//! there what to do next. Dropping a group closes its transport. Over TCP a peer may still be
//! returning the slot credits of the group's last collective, and its write
//! to a closed connection fails: pass a barrier on the parent before
//! dropping a group that others may still be finishing.

use std::sync::Arc;

use crate::collectives::Communicator;
use crate::error::{CommError, Result};
use crate::shm::{ShmTransport, unique_job_name};
use crate::store::Store;
use crate::tcp::{TcpOptions, TcpTransport};
use crate::transport::Transport;

/// Bytes each rank contributes to the exchange: color, key, split number.
const ENTRY: usize = 16;

/// The members of `rank`'s group, in new-rank order, given every rank's
/// (color, key): the old ranks with `rank`'s color ordered by (key, old
/// rank).
pub fn group_of(colors_keys: &[(u32, u32)], rank: usize) -> Vec<usize> {
    let color = colors_keys[rank].0;
    let mut members: Vec<(u32, usize)> = colors_keys
        .iter()
        .enumerate()
        .filter(|(_, (c, _))| *c == color)
        .map(|(old, (_, k))| (*k, old))
        .collect();
    members.sort_unstable();
    members.into_iter().map(|(_, old)| old).collect()
}

impl Communicator {
    /// Splits this communicator into groups of the ranks that pass the same
    /// `color`, ordered by (`key`, rank here), and returns this rank's group
    /// as a new communicator over a new transport of the same kind, with
    /// this one's timeout, determinism setting and store. A collective call:
    /// every rank of this communicator calls it. The parent stays usable.
    pub fn split(&mut self, color: u32, key: u32) -> Result<Communicator> {
        let store = self.store().cloned().ok_or_else(|| {
            CommError::Usage(format!(
                "rank {}: split: this communicator has no store to set up groups through; \
                 make it with bootstrap::init or call Communicator::set_store",
                self.rank()
            ))
        })?;
        let (rank, world) = (self.rank(), self.world_size());
        let number = if rank == 0 {
            store.add("polychip/split/next", 1)?
        } else {
            0
        };
        let mut mine = [0u8; ENTRY];
        mine[0..4].copy_from_slice(&color.to_le_bytes());
        mine[4..8].copy_from_slice(&key.to_le_bytes());
        mine[8..16].copy_from_slice(&number.to_le_bytes());
        let mut all = vec![0u8; ENTRY * world];
        self.all_gather(&mine, &mut all)?;
        let word = |e: &[u8], at: usize| u32::from_le_bytes(e[at..at + 4].try_into().expect("4"));
        let colors_keys: Vec<(u32, u32)> = all
            .chunks_exact(ENTRY)
            .map(|e| (word(e, 0), word(e, 4)))
            .collect();
        let number = i64::from_le_bytes(all[8..16].try_into().expect("8 bytes"));
        let members = group_of(&colors_keys, rank);
        let new_rank = members.iter().position(|&r| r == rank).expect("member");
        let prefix = format!("polychip/split/{number}/{color}");
        log::debug!(
            "rank {rank}: split color {color} key {key}: rank {new_rank} of group {members:?}"
        );
        let transport = self.group_transport(store.clone(), &prefix, new_rank, members.len())?;
        let mut group = Communicator::new(transport)?;
        group.set_timeout(self.timeout());
        group.set_deterministic(self.deterministic());
        group.set_store(store);
        Ok(group)
    }

    /// Connects a transport of this communicator's kind among one group.
    fn group_transport(
        &self,
        store: Arc<dyn Store>,
        prefix: &str,
        rank: usize,
        size: usize,
    ) -> Result<Arc<dyn Transport>> {
        let timeout = self.timeout();
        match self.transport().name() {
            "shm" => {
                let key = format!("{prefix}/shm/job");
                let job = if rank == 0 {
                    let job = unique_job_name();
                    store.set(&key, job.as_bytes())?;
                    job
                } else {
                    String::from_utf8_lossy(&store.get(&key, timeout)?).into_owned()
                };
                Ok(Arc::new(ShmTransport::with_job_name(
                    &job, rank, size, timeout,
                )?))
            }
            "tcp" => {
                let mut options = TcpOptions::from_env()?;
                options.key_prefix = format!("{prefix}/tcp");
                // Where this rank's peers already reach it (127.0.0.1 by
                // default would fail across machines).
                if let Some(addr) = self.transport().listen_addr() {
                    options.bind_addr = addr;
                }
                // The secret the world's ranks proved (which the store took,
                // perhaps not from this process's environment).
                if let Some(auth) = self.transport().job_auth() {
                    options.auth = Some(auth);
                }
                Ok(Arc::new(TcpTransport::with_options(
                    store, rank, size, timeout, options,
                )?))
            }
            #[cfg(feature = "verbs")]
            "verbs" => {
                let mut options = crate::verbs::VerbsOptions::from_env()?;
                options.key_prefix = format!("{prefix}/verbs");
                Ok(Arc::new(crate::verbs::VerbsTransport::new(
                    store, rank, size, timeout, options,
                )?))
            }
            other => Err(CommError::Usage(format!(
                "rank {}: split: cannot make groups over the {other:?} transport",
                self.rank()
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::group_of;

    #[test]
    fn groups_are_ordered_by_key_then_rank() {
        let ck = [(0, 5), (1, 0), (0, 5), (1, 9), (0, 1)];
        assert_eq!(group_of(&ck, 0), vec![4, 0, 2]);
        assert_eq!(group_of(&ck, 3), vec![1, 3]);
    }
}
