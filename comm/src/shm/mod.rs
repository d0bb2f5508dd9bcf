//! Shared-memory [`Transport`] for ranks on one machine (processes or
//! threads). Every rank owns one file per registered region and a control
//! segment (pid, closed flag, 256 signal counters) under `/dev/shm`, named
//! `polychip-<job>-r<rank>-<id>`; every rank maps every rank's files, so a
//! `write` is a `memcpy` into the peer's mapping followed by a release
//! increment of the peer's counter (`write_parts` copies several pieces,
//! such as a header and a payload, with one increment). The mappings are
//! found without a lock. `wait` spins, then yields, then sleeps on
//! a futex, checks the peers' liveness about every 100 ms and fails at its
//! deadline. All unsafe code of the communication layer lives in this module
//! (the mappings and the futex in `map.rs`).

mod map;

use std::fs;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub use map::RegionView;
use map::{Map, futex};

use crate::error::{CommError, Result};
use crate::store::Store;
use crate::transport::{RegionId, SignalId, Transport};

/// Number of signal counters per rank.
pub const SIGNALS: usize = 256;
const SIG_STRIDE: usize = 64;
const SIG_BASE: usize = 4096;
const CTL_LEN: usize = SIG_BASE + SIGNALS * SIG_STRIDE;
// Control header words (u64 index): pid, closed flag, number of sleepers.
const PID: usize = 0;
/// Busy-wait iterations before `wait` starts yielding the CPU.
const SPINS: usize = 256;
/// How long `wait` yields the CPU before it sleeps on a futex.
const YIELD_FOR: Duration = Duration::from_millis(5);
const CLOSED: usize = 1;
const WAITERS: usize = 2;

/// The shared-memory transport.
#[derive(Debug)]
pub struct ShmTransport {
    rank: usize,
    world: usize,
    job: String,
    timeout: Duration,
    ctl: Vec<Map>,
    regions: Regions,
    pids: Vec<libc::pid_t>,
}

// SAFETY: the raw mappings are shared memory meant for concurrent access through atomics and the signal protocol.
unsafe impl Send for ShmTransport {}
// SAFETY: as above; mutable state is behind a Mutex.
unsafe impl Sync for ShmTransport {}

/// The registered regions (every rank's mapping of each), read by `write`
/// without a lock: an append-only list in segments of 1, 2, 4... entries,
/// each entry set once. Registration holds `count`'s lock.
#[derive(Debug, Default)]
struct Regions {
    count: Mutex<usize>,
    segments: [OnceLock<Segment>; 32],
}

/// Every rank's mapping of one region, by rank.
type Maps = Box<[Map]>;
/// Entries `2^k - 1 .. 2^(k+1) - 1` of [`Regions`].
type Segment = Box<[OnceLock<Maps>]>;

impl Regions {
    /// (segment, index in it) of region `id`.
    fn locate(id: usize) -> (usize, usize) {
        let k = (usize::BITS - 1 - (id + 1).leading_zeros()) as usize;
        (k, id + 1 - (1 << k))
    }

    fn get(&self, id: usize) -> Option<&[Map]> {
        let (k, i) = Regions::locate(id);
        let entry = self.segments.get(k)?.get()?.get(i)?;
        entry.get().map(|maps| &**maps)
    }

    /// Stores region `id`, the next one (the caller holds `count`'s lock).
    fn set(&self, id: usize, maps: Vec<Map>) -> Result<()> {
        let (k, i) = Regions::locate(id);
        let segment = self
            .segments
            .get(k)
            .ok_or_else(|| CommError::Usage(format!("shm: too many registered regions ({id})")))?;
        let segment = segment.get_or_init(|| (0..1usize << k).map(|_| OnceLock::new()).collect());
        let stored = segment[i].set(maps.into_boxed_slice());
        assert!(stored.is_ok(), "shm region {id} registered twice");
        Ok(())
    }
}

fn path(job: &str, rank: usize, what: &str) -> String {
    format!("/dev/shm/polychip-{job}-r{rank}-{what}")
}

/// A job name unique on this machine.
pub fn unique_job_name() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    format!(
        "{:x}-{:x}-{}",
        std::process::id(),
        nanos,
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

fn open_peer(
    path: &str,
    len: usize,
    rank: usize,
    deadline: Instant,
    timeout: Duration,
    what: &str,
) -> Result<Map> {
    let mut pause = Duration::from_micros(20);
    loop {
        if fs::metadata(path).is_ok() {
            return Map::open(path, len, false, rank);
        }
        if Instant::now() >= deadline {
            return Err(CommError::Timeout {
                rank,
                op: "shm connect".into(),
                after: timeout,
                waiting_for: format!("{what} ({path})"),
            });
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(5));
    }
}

impl ShmTransport {
    /// Connects `rank` of `world`: rank 0 makes a unique job name and
    /// publishes it in `store`; the others read it. Waits at most `timeout`.
    pub fn new(
        store: &dyn Store,
        rank: usize,
        world: usize,
        timeout: Duration,
    ) -> Result<ShmTransport> {
        let job = if rank == 0 {
            let job = unique_job_name();
            store.set("polychip/shm/job", job.as_bytes())?;
            job
        } else {
            String::from_utf8_lossy(&store.get("polychip/shm/job", timeout)?).into_owned()
        };
        ShmTransport::with_job_name(&job, rank, world, timeout)
    }

    /// Connects `rank` of `world` under an agreed job name, without a store.
    pub fn with_job_name(
        job: &str,
        rank: usize,
        world: usize,
        timeout: Duration,
    ) -> Result<ShmTransport> {
        if rank >= world || job.contains('/') {
            return Err(CommError::Usage(format!(
                "shm: bad rank {rank} of {world} or job name {job:?}"
            )));
        }
        let deadline = Instant::now() + timeout;
        let own = Map::open(&path(job, rank, "ctl"), CTL_LEN, true, rank)?;
        own.word(PID)
            .store(u64::from(std::process::id()), Ordering::Release);
        let mut ctl = Vec::with_capacity(world);
        let mut pids = Vec::with_capacity(world);
        let mut own = Some(own);
        for peer in 0..world {
            let map = match peer == rank {
                true => own.take().expect("own control segment"),
                false => open_peer(
                    &path(job, peer, "ctl"),
                    CTL_LEN,
                    rank,
                    deadline,
                    timeout,
                    &format!("rank {peer} to start"),
                )?,
            };
            let mut pid = map.word(PID).load(Ordering::Acquire);
            while pid == 0 && Instant::now() < deadline {
                std::thread::yield_now();
                pid = map.word(PID).load(Ordering::Acquire);
            }
            pids.push(pid as libc::pid_t);
            ctl.push(map);
        }
        let regions = Regions::default();
        Ok(ShmTransport {
            rank,
            world,
            job: job.to_string(),
            timeout,
            ctl,
            regions,
            pids,
        })
    }

    /// The job name the ranks agreed on.
    pub fn job_name(&self) -> &str {
        &self.job
    }

    fn signal(&self, rank: usize, signal: SignalId) -> &AtomicU64 {
        assert!(
            (signal.0 as usize) < SIGNALS,
            "signal {} out of range",
            signal.0
        );
        self.ctl[rank].word((SIG_BASE + signal.0 as usize * SIG_STRIDE) / 8)
    }

    /// `Some(why)` when `peer` closed its transport or its process is gone.
    fn lost(&self, peer: usize) -> Option<String> {
        if self.ctl[peer].word(CLOSED).load(Ordering::Acquire) != 0 {
            return Some("it closed its transport".into());
        }
        let pid = self.pids[peer];
        // SAFETY: kill with signal 0 only checks that the process exists.
        let failed = pid > 0 && unsafe { libc::kill(pid, 0) } != 0;
        if failed && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
            return Some(format!("its process {pid} has exited"));
        }
        None
    }
}

impl Transport for ShmTransport {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world
    }

    fn name(&self) -> &'static str {
        "shm"
    }

    fn register(&self, len: usize) -> Result<(RegionId, *mut u8)> {
        let mut count = self.regions.count.lock().unwrap_or_else(|e| e.into_inner());
        let id = *count;
        let deadline = Instant::now() + self.timeout;
        let own = Map::open(
            &path(&self.job, self.rank, &id.to_string()),
            len,
            true,
            self.rank,
        )?;
        let mut maps = Vec::with_capacity(self.world);
        let mut own = Some(own);
        for peer in 0..self.world {
            maps.push(match peer == self.rank {
                true => own.take().expect("own region"),
                false => open_peer(
                    &path(&self.job, peer, &id.to_string()),
                    len,
                    self.rank,
                    deadline,
                    self.timeout,
                    &format!("rank {peer} to register region {id}"),
                )?,
            });
        }
        let ptr = maps[self.rank].ptr;
        self.regions.set(id, maps)?;
        *count += 1;
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
        self.write_parts(peer, region, offset, &[data], signal)
    }

    fn write_parts(
        &self,
        peer: usize,
        region: RegionId,
        offset: usize,
        parts: &[&[u8]],
        signal: SignalId,
    ) -> Result<()> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if len > 0 {
            let map = self
                .regions
                .get(region.0 as usize)
                .and_then(|m| m.get(peer));
            let map = map.ok_or_else(|| {
                CommError::Usage(format!("shm write: no region {} on rank {peer}", region.0))
            })?;
            if offset.checked_add(len).is_none_or(|end| end > map.len) {
                return Err(CommError::Usage(format!(
                    "shm write: {offset}+{len} past region {} of {} bytes",
                    region.0, map.len
                )));
            }
            let mut at = offset;
            for part in parts {
                // SAFETY: destination in bounds (the parts' total is checked) of a live mapping; the source is a distinct, valid slice.
                unsafe {
                    std::ptr::copy_nonoverlapping(part.as_ptr(), map.ptr.add(at), part.len())
                };
                at += part.len();
            }
        }
        let counter = self.signal(peer, signal);
        counter.fetch_add(1, Ordering::SeqCst);
        if self.ctl[peer].word(WAITERS).load(Ordering::SeqCst) != 0 {
            futex(counter, libc::FUTEX_WAKE, i32::MAX as u32, None);
        }
        Ok(())
    }

    fn writes_parts_in_place(&self) -> bool {
        true
    }

    fn wait(&self, signal: SignalId, value: u64, deadline: Instant) -> Result<()> {
        let counter = self.signal(self.rank, signal);
        // Spin briefly: long spins starve a descheduled peer when the
        // machine has more runnable threads than cores.
        for _ in 0..SPINS {
            if counter.load(Ordering::Acquire) >= value {
                return Ok(());
            }
            std::hint::spin_loop();
        }
        let start = Instant::now();
        let mut next_check = start;
        loop {
            let seen = counter.load(Ordering::Acquire);
            if seen >= value {
                return Ok(());
            }
            let now = Instant::now();
            if now >= next_check {
                next_check = now + Duration::from_millis(100);
                if let Some((peer, why)) = (0..self.world)
                    .filter(|&p| p != self.rank)
                    .find_map(|p| self.lost(p).map(|w| (p, w)))
                {
                    if counter.load(Ordering::Acquire) >= value {
                        return Ok(());
                    }
                    return Err(CommError::PeerLost {
                        rank: self.rank,
                        op: "wait".into(),
                        peer,
                        why,
                    });
                }
            }
            if now >= deadline {
                let waiting_for = format!("signal {} to reach {value} (at {seen})", signal.0);
                return Err(CommError::Timeout {
                    rank: self.rank,
                    op: "wait".into(),
                    after: now - start,
                    waiting_for,
                });
            }
            if now - start < YIELD_FOR {
                std::thread::yield_now();
                continue;
            }
            let waiters = self.ctl[self.rank].word(WAITERS);
            waiters.fetch_add(1, Ordering::SeqCst);
            let seen = counter.load(Ordering::SeqCst);
            if seen < value {
                let nap = deadline
                    .min(next_check)
                    .saturating_duration_since(now)
                    .max(Duration::from_micros(50));
                futex(counter, libc::FUTEX_WAIT, seen as u32, Some(nap));
            }
            waiters.fetch_sub(1, Ordering::SeqCst);
        }
    }

    fn signal_value(&self, signal: SignalId) -> u64 {
        self.signal(self.rank, signal).load(Ordering::Acquire)
    }
}

impl Drop for ShmTransport {
    fn drop(&mut self) {
        // Peers see the flag within their next liveness check (about 100 ms).
        self.ctl[self.rank].word(CLOSED).store(1, Ordering::SeqCst);
        let n = *self
            .regions
            .count
            .get_mut()
            .unwrap_or_else(|e| e.into_inner());
        for id in 0..n {
            let _ = fs::remove_file(path(&self.job, self.rank, &id.to_string()));
        }
        let _ = fs::remove_file(path(&self.job, self.rank, "ctl"));
    }
}
