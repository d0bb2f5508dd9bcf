//! Shared-memory [`Transport`] for ranks on one machine (processes or
//! threads). Every rank owns one file per registered region and a control
//! segment (pid, closed flag, 256 signal counters) under `/dev/shm`, named
//! `polychip-<job>-r<rank>-<id>`; every rank maps every rank's files, so a
//! `write` is a `memcpy` into the peer's mapping followed by a release
//! increment of the peer's counter (`write_parts` copies several pieces,
//! such as a header and a payload, with one increment). The mappings are
//! found without a lock. `wait` spins, then yields, then sleeps on
//! a futex, checks the peers' liveness about every 100 ms and fails at its
//! deadline. A rank whose communicator fails publishes its reason in its
//! control segment and marks every peer's ([`Transport::abort`]); a waiter
//! sees the mark with one load per turn of its loop and fails at once.
//! Setup (connecting, and each region's registration) ends only once every
//! rank has mapped every rank's files of that step, each rank recording its
//! progress in its control segment: a rank that leaves straight after
//! setup removes its files, which a slower peer must have opened by then.
//! All unsafe code of the communication layer lives in this module (the
//! mappings and the futex in `map.rs`).

mod map;

use std::fs;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub use map::RegionView;
use map::{Map, futex};

use crate::error::{CommError, Result};
use crate::store::Store;
use crate::transport::{Departure, MAX_FINALS, RegionId, SignalId, Transport};

/// Number of signal counters per rank.
pub const SIGNALS: usize = 256;
const SIG_STRIDE: usize = 64;
const SIG_BASE: usize = 4096;
/// Where a departing rank's final counter values for its peers start
/// ([`Transport::leave`]): [`MAX_FINALS`] words per peer (of the first
/// [`FINAL_PEERS`]), each `(signal + 1) << 48 | value`, 0 when unused.
const FINALS: usize = SIG_BASE + SIGNALS * SIG_STRIDE;
const FINAL_PEERS: usize = 64;
const CTL_LEN: usize = FINALS + FINAL_PEERS * MAX_FINALS * 8;
// Control header words (u64 index): pid, closed flag, number of sleepers,
// the abort flag, the notice a peer failed, the abort reason's length, the
// departure, the number of peers that left, the abort reason.
const PID: usize = 0;
/// Busy-wait iterations before `wait` starts yielding the CPU.
const SPINS: usize = 256;
/// How long `wait` yields the CPU before it sleeps on a futex.
const YIELD_FOR: Duration = Duration::from_millis(5);
const CLOSED: usize = 1;
const WAITERS: usize = 2;
/// Whether this rank announced a failure ([`Transport::abort`]): 0 no, 1
/// while it writes its reason, [`PUBLISHED`] once the reason is readable.
const ABORTED: usize = 3;
const PUBLISHED: u64 = 2;
/// 0, or 1 + the rank of the first peer whose announced failure reached
/// this rank (written by that peer): one load tells a waiter.
const NOTICE: usize = 4;
/// The reason's length in bytes, then its bytes from word [`REASON`] on.
const REASON_LEN: usize = 5;
/// 0, or 1 + the number of collective calls this rank made, once it left
/// cleanly and published its final counter values ([`Transport::leave`]).
const LEFT_AT: usize = 6;
/// How many peers left cleanly (each adds one after publishing): one load
/// tells a waiter or a call beginning.
const DEPARTED: usize = 7;
const REASON: usize = 8;
/// How far this rank's setup got: 1 once it mapped every peer's control
/// segment, `2 + id` once it mapped every peer's copy of region `id`. A rank
/// finishes a setup step only when every peer has reached it (so has
/// mapped its files), because a rank that leaves removes its files: a peer
/// still to open them would wait for them until its deadline.
const STAGE: usize = (REASON * 8 + crate::error::MAX_ABORT_REASON).div_ceil(8);
/// The world size this rank was started with (written before its pid, so
/// a peer that sees the pid sees it): ranks of different worlds fail at
/// once naming both sizes instead of waiting for ranks that never come.
const WORLD: usize = STAGE + 1;
const _: () = assert!(WORLD * 8 + 8 <= SIG_BASE);

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

/// 64 bits from the kernel's random source (the clock and a counter when it
/// fails, which only a kernel without getrandom does).
fn random_u64() -> u64 {
    let mut bytes = [0u8; 8];
    // SAFETY: writes at most 8 bytes into `bytes`.
    let got = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if got == 8 {
        return u64::from_ne_bytes(bytes);
    }
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    nanos ^ NEXT.fetch_add(1, Ordering::Relaxed).rotate_left(48)
}

/// A job name unique on this machine and not guessable by another process:
/// rank 0's pid (so a test can find the files of a job it killed) and 64
/// random bits.
pub fn unique_job_name() -> String {
    format!("{:x}-{:016x}", std::process::id(), random_u64())
}

/// Files of this user's jobs whose owning process is gone (killed, or
/// stopped before it could clean up) are removed: every rank's control
/// segment holds its pid, and a control file older than a minute whose pid
/// no longer exists marks all of that rank's files as stale. Run once per
/// process, when its first transport connects.
pub fn sweep_stale_files() -> usize {
    sweep_in(std::path::Path::new("/dev/shm"), Duration::from_secs(60))
}

fn sweep_in(dir: &std::path::Path, min_age: Duration) -> usize {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    let names: Vec<String> = entries
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("polychip-"))
        .collect();
    let mut removed = 0;
    for ctl in names.iter().filter(|n| n.ends_with("-ctl")) {
        let file = dir.join(ctl);
        let Ok(meta) = fs::symlink_metadata(&file) else {
            continue;
        };
        let old = meta
            .modified()
            .ok()
            .and_then(|m| m.elapsed().ok())
            .is_some_and(|age| age >= min_age);
        if !meta.is_file() || meta.uid() != me || !old || meta.len() < 8 {
            continue;
        }
        let Ok(bytes) = fs::read(&file).map(|b| b[..8].to_vec()) else {
            continue;
        };
        let pid = u64::from_ne_bytes(bytes.try_into().unwrap_or([0; 8]));
        let Ok(pid) = libc::pid_t::try_from(pid) else {
            continue;
        };
        // SAFETY: signal 0 only checks that the process exists.
        let gone = pid > 0
            && unsafe { libc::kill(pid, 0) } != 0
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        if !gone {
            continue;
        }
        let prefix = &ctl[..ctl.len() - "ctl".len()];
        for name in names.iter().filter(|n| n.starts_with(prefix)) {
            if fs::remove_file(dir.join(name)).is_ok() {
                removed += 1;
            }
        }
    }
    if removed > 0 {
        log::info!(
            "shm: removed {removed} file(s) of dead jobs from {}",
            dir.display()
        );
    }
    removed
}

thread_local! {
    /// How long this thread's setup steps pause between creating their own
    /// file and opening the peers' (a rank descheduled there): for tests.
    static ATTACH_DELAY: std::cell::Cell<Duration> = const { std::cell::Cell::new(Duration::ZERO) };
}

/// Makes this thread's shared-memory setup steps pause for `delay` after
/// creating this rank's file and before opening the peers' (as a rank
/// descheduled there would): for tests of setup races.
#[doc(hidden)]
pub fn set_attach_delay_for_test(delay: Duration) {
    ATTACH_DELAY.with(|d| d.set(delay));
}

fn attach_delay() {
    let delay = ATTACH_DELAY.with(|d| d.get());
    if !delay.is_zero() {
        std::thread::sleep(delay);
    }
}

fn open_peer(
    path: &str,
    len: usize,
    rank: usize,
    deadline: Instant,
    timeout: Duration,
    what: &str,
    lost: &dyn Fn() -> Option<CommError>,
) -> Result<Map> {
    let mut pause = Duration::from_micros(20);
    loop {
        if fs::metadata(path).is_ok() {
            return Map::open(path, len, false, rank);
        }
        if let Some(e) = lost() {
            // (The file may have come since the look above.)
            if fs::metadata(path).is_ok() {
                continue;
            }
            return Err(e);
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
        static SWEPT: OnceLock<usize> = OnceLock::new();
        SWEPT.get_or_init(sweep_stale_files);
        let deadline = Instant::now() + timeout;
        let own_path = path(job, rank, "ctl");
        let own = Map::open(&own_path, CTL_LEN, true, rank)?;
        // Until the transport exists (whose drop removes it), a failure
        // removes this rank's control file on the way out.
        struct Unlink<'a>(Option<&'a str>);
        impl Drop for Unlink<'_> {
            fn drop(&mut self) {
                if let Some(p) = self.0 {
                    let _ = fs::remove_file(p);
                }
            }
        }
        let mut unlink = Unlink(Some(&own_path));
        own.word(WORLD).store(world as u64, Ordering::Release);
        own.word(PID)
            .store(u64::from(std::process::id()), Ordering::Release);
        let mut ctl = Vec::with_capacity(world);
        let mut pids = Vec::with_capacity(world);
        let mut own = Some(own);
        attach_delay();
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
                    &|| None,
                )?,
            };
            let mut pid = map.word(PID).load(Ordering::Acquire);
            while pid == 0 && Instant::now() < deadline {
                std::thread::yield_now();
                pid = map.word(PID).load(Ordering::Acquire);
            }
            let theirs = map.word(WORLD).load(Ordering::Acquire);
            if pid != 0 && theirs != world as u64 {
                // This rank's file stays a moment, so that the peer (still
                // polling for it, every 5 ms at most) sees this size too
                // and fails as fast, instead of waiting for the removed
                // file until its deadline.
                std::thread::sleep(Duration::from_millis(200).min(timeout));
                return Err(CommError::Mismatch {
                    rank,
                    op: "shm connect".into(),
                    message: format!(
                        "rank {peer} was started with a world of {theirs} ranks, this rank with \
                         {world}: every rank of a job must be given the same world size"
                    ),
                });
            }
            pids.push(pid as libc::pid_t);
            ctl.push(map);
        }
        let t = ShmTransport {
            rank,
            world,
            job: job.to_string(),
            timeout,
            ctl,
            regions: Regions::default(),
            pids,
        };
        unlink.0 = None;
        // Until every peer mapped this rank's control segment, this rank
        // may not leave (its drop would remove the file under them).
        t.reach(1, deadline, "control segment")?;
        Ok(t)
    }

    /// During setup: `peer` closed its transport, or its process is gone,
    /// before it `did` what this rank waits for, as the error.
    fn setup_lost(&self, peer: usize, did: &str) -> Option<CommError> {
        let why = match self.closed(peer) {
            true => "it closed its transport".to_string(),
            false => self.gone(peer)?,
        };
        Some(CommError::PeerLost {
            rank: self.rank,
            op: "shm connect".into(),
            peer,
            why: format!("{why} before it {did}"),
        })
    }

    /// Records that this rank reached setup `stage` (mapped every peer's
    /// file of that step) and waits until every peer has too (mapped this
    /// rank's), failing at `deadline`, or at once when a peer's process
    /// is gone or a peer announced its failure.
    fn reach(&self, stage: u64, deadline: Instant, what: &str) -> Result<()> {
        self.ctl[self.rank]
            .word(STAGE)
            .fetch_max(stage, Ordering::SeqCst);
        let mut pause = Duration::from_micros(20);
        for peer in (0..self.world).filter(|&p| p != self.rank) {
            loop {
                if self.ctl[peer].word(STAGE).load(Ordering::Acquire) >= stage {
                    break;
                }
                if let Some(e) = self.peer_failure() {
                    return Err(e.restated(|r| r, |_| "shm connect".into()));
                }
                let lost = self.setup_lost(peer, &format!("mapped this rank's {what}"));
                // (It may have got there, and left, since the look above.)
                let reached = self.ctl[peer].word(STAGE).load(Ordering::Acquire) >= stage;
                if let Some(e) = lost.filter(|_| !reached) {
                    return Err(e);
                }
                if Instant::now() >= deadline {
                    return Err(CommError::Timeout {
                        rank: self.rank,
                        op: "shm connect".into(),
                        after: self.timeout,
                        waiting_for: format!("rank {peer} to map this rank's {what}"),
                    });
                }
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(5));
            }
        }
        Ok(())
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

    /// Whether `peer` closed its transport: it left the job cleanly.
    fn closed(&self, peer: usize) -> bool {
        self.ctl[peer].word(CLOSED).load(Ordering::Acquire) != 0
    }

    /// `Some(why)` when `peer`'s process is gone without closing its
    /// transport: exited, killed, or a zombie its parent has not reaped
    /// (which `kill(pid, 0)` still finds; a rank that calls `os._exit` under
    /// a launcher that does not wait for it stays one).
    fn gone(&self, peer: usize) -> Option<String> {
        let pid = self.pids[peer];
        process_gone(pid).then(|| format!("its process {pid} has exited"))
    }

    /// What `peer` announced when it aborted, if it published it.
    fn reason(&self, peer: usize) -> String {
        let ctl = &self.ctl[peer];
        if ctl.word(ABORTED).load(Ordering::Acquire) != PUBLISHED {
            return "its communicator failed".into();
        }
        let len = (ctl.word(REASON_LEN).load(Ordering::Relaxed) as usize)
            .min(crate::error::MAX_ABORT_REASON);
        let mut bytes: Vec<u8> = (0..len.div_ceil(8))
            .flat_map(|i| ctl.word(REASON + i).load(Ordering::Relaxed).to_le_bytes())
            .collect();
        bytes.truncate(len);
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// A peer that left ([`Transport::leave`]) with `signal` of this rank
    /// final below `value`: the wait can never end.
    fn left_short(&self, signal: SignalId, value: u64) -> Option<usize> {
        if self.ctl[self.rank].word(DEPARTED).load(Ordering::Acquire) == 0 {
            return None;
        }
        (0..self.world)
            .filter(|&p| p != self.rank)
            .find(|&p| crate::transport::short_of(&self.finals(p), signal, value))
    }

    /// The final values `peer` published for this rank as it left (none
    /// while it has not).
    fn finals(&self, peer: usize) -> Vec<(SignalId, u64)> {
        let ctl = &self.ctl[peer];
        if ctl.word(LEFT_AT).load(Ordering::Acquire) == 0 || self.rank >= FINAL_PEERS {
            return Vec::new();
        }
        (0..MAX_FINALS)
            .map(|k| {
                ctl.word(FINALS / 8 + self.rank * MAX_FINALS + k)
                    .load(Ordering::Relaxed)
            })
            .filter(|&w| w != 0)
            .map(|w| (SignalId(((w >> 48) - 1) as u32), w & ((1 << 48) - 1)))
            .collect()
    }

    /// Wakes every sleeping waiter of `peer` (whichever counter it sleeps on).
    fn wake_all(&self, peer: usize) {
        if self.ctl[peer].word(WAITERS).load(Ordering::SeqCst) != 0 {
            for s in 0..SIGNALS {
                futex(
                    self.signal(peer, SignalId(s as u32)),
                    libc::FUTEX_WAKE,
                    i32::MAX as u32,
                    None,
                );
            }
        }
    }

    /// The peer whose announced failure reached this rank first, if any.
    fn noticed(&self) -> Option<usize> {
        let n = self.ctl[self.rank].word(NOTICE).load(Ordering::Acquire);
        let peer = (n as usize).checked_sub(1)?;
        (peer < self.world && peer != self.rank).then_some(peer)
    }

    /// Why a wait cannot be satisfied any more, if it cannot: a peer that
    /// announced its failure, a peer whose
    /// process is gone without closing its transport (a crash), or every
    /// peer closed (as TCP's goodbyes: a peer that left cleanly is not a
    /// failure while others may still raise the signal; collectives only
    /// wait on a departed peer's credits from its last call).
    fn failure(&self, signal: SignalId, value: u64) -> Option<(usize, String)> {
        if let Some(peer) = self.noticed() {
            let why = format!("{}{}", crate::error::PEER_FAILED, self.reason(peer));
            return Some((peer, why));
        }
        let peers = (0..self.world).filter(|&p| p != self.rank);
        if let Some(lost) = peers
            .clone()
            .filter(|&p| !self.closed(p))
            .find_map(|p| self.gone(p).map(|w| (p, w)))
        {
            return Some(lost);
        }
        if let Some(peer) = self.left_short(signal, value) {
            return Some((peer, crate::error::PEER_LEFT.into()));
        }
        let mut closed = peers.clone().filter(|&p| self.closed(p));
        let first = closed.next()?;
        (closed.count() + 1 == self.world - 1).then(|| (first, "it closed its transport".into()))
    }
}

/// Whether process `pid` has exited: not found, or a zombie (found by
/// `kill(pid, 0)` until its parent reaps it).
fn process_gone(pid: i32) -> bool {
    if pid <= 0 {
        return false;
    }
    // SAFETY: kill with signal 0 only checks that the process exists.
    let failed = unsafe { libc::kill(pid, 0) } != 0;
    if failed && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
        return true;
    }
    // /proc/PID/stat: "pid (comm) state ...", the command in parentheses
    // (which may hold spaces and parentheses itself).
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.trim_start().chars().next());
    matches!(state, Some('Z' | 'X'))
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
        attach_delay();
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
                    // A peer that is gone will not register it.
                    &|| self.setup_lost(peer, &format!("registered region {id}")),
                )?,
            });
        }
        let ptr = maps[self.rank].ptr;
        self.regions.set(id, maps)?;
        *count += 1;
        // This rank may not leave (remove the file) before every peer
        // mapped its copy.
        self.reach(id as u64 + 2, deadline, &format!("region {id}"))?;
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
        let notice = self.ctl[self.rank].word(NOTICE);
        let departed = self.ctl[self.rank].word(DEPARTED);
        let mut departures = departed.load(Ordering::Relaxed);
        loop {
            let seen = counter.load(Ordering::Acquire);
            if seen >= value {
                return Ok(());
            }
            let now = Instant::now();
            // A peer's announced failure or departure is one load away:
            // seen at once.
            let left = departed.load(Ordering::Relaxed);
            if now >= next_check || notice.load(Ordering::Relaxed) != 0 || left != departures {
                next_check = now + Duration::from_millis(100);
                departures = left;
                if let Some((peer, why)) = self.failure(signal, value) {
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

    /// Publishes `why` in this rank's control segment, then marks every
    /// peer's segment (the first mark a peer gets stays) and wakes its
    /// sleeping waiters: a mapping outlives the files' removal, so peers
    /// read it even after this rank closed its transport.
    fn abort(&self, why: &str) {
        let own = &self.ctl[self.rank];
        if own
            .word(ABORTED)
            .compare_exchange(0, 1, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            return;
        }
        let bytes = crate::error::abort_reason(why).as_bytes();
        for (i, chunk) in bytes.chunks(8).enumerate() {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            own.word(REASON + i)
                .store(u64::from_le_bytes(word), Ordering::Relaxed);
        }
        own.word(REASON_LEN)
            .store(bytes.len() as u64, Ordering::Relaxed);
        own.word(ABORTED).store(PUBLISHED, Ordering::SeqCst);
        let mark = self.rank as u64 + 1;
        for peer in (0..self.world).filter(|&p| p != self.rank) {
            let ctl = &self.ctl[peer];
            let _ = ctl
                .word(NOTICE)
                .compare_exchange(0, mark, Ordering::SeqCst, Ordering::SeqCst);
            self.wake_all(peer);
        }
    }

    /// Publishes the final counter values for every peer in this rank's
    /// control segment, then counts the departure in every peer's segment
    /// and wakes its sleeping waiters (the mapping outlives the files'
    /// removal, so peers read it after this rank closed its transport).
    fn leave(&self, note: &dyn Fn(usize) -> Departure) {
        let own = &self.ctl[self.rank];
        if own.word(LEFT_AT).load(Ordering::SeqCst) != 0 {
            return;
        }
        // Peers past the table learn only that it left (they wait as before).
        let calls = note(self.rank).calls;
        for peer in (0..self.world.min(FINAL_PEERS)).filter(|&p| p != self.rank) {
            let d = note(peer);
            let finals = d
                .finals
                .iter()
                .filter(|(s, v)| (s.0 as usize) < SIGNALS && *v < 1 << 48);
            let mut words = finals.map(|&(s, v)| (u64::from(s.0) + 1) << 48 | v);
            for k in 0..MAX_FINALS {
                let w = words.next().unwrap_or(0);
                own.word(FINALS / 8 + peer * MAX_FINALS + k)
                    .store(w, Ordering::Relaxed);
            }
        }
        own.word(LEFT_AT).store(calls + 1, Ordering::SeqCst);
        for peer in (0..self.world).filter(|&p| p != self.rank) {
            self.ctl[peer].word(DEPARTED).fetch_add(1, Ordering::SeqCst);
            self.wake_all(peer);
        }
    }

    fn departures(&self) -> usize {
        self.ctl[self.rank].word(DEPARTED).load(Ordering::Acquire) as usize
    }

    fn departed(&self, peer: usize) -> Option<u64> {
        let at = self.ctl.get(peer)?.word(LEFT_AT).load(Ordering::Acquire);
        at.checked_sub(1)
    }

    fn finals(&self, peer: usize) -> Vec<(SignalId, u64)> {
        if peer >= self.world || peer == self.rank {
            return Vec::new();
        }
        ShmTransport::finals(self, peer)
    }

    fn peer_failure(&self) -> Option<CommError> {
        let peer = self.noticed()?;
        Some(CommError::peer_failed(
            self.rank,
            "wait",
            peer,
            &self.reason(peer),
        ))
    }

    fn peer_lost(&self) -> Option<CommError> {
        if let Some(e) = self.peer_failure() {
            return Some(e);
        }
        let (peer, why) = (0..self.world)
            .filter(|&p| p != self.rank && !self.closed(p))
            .find_map(|p| self.gone(p).map(|w| (p, w)))?;
        Some(CommError::PeerLost {
            rank: self.rank,
            op: "wait".into(),
            peer,
            why,
        })
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::SystemTime;

    /// A peer that exited is gone even while its parent has not reaped it
    /// (a zombie, which `kill(pid, 0)` still finds): a rank that called
    /// `os._exit` under a launcher that does not wait was waited for until
    /// the timeout.
    #[test]
    fn an_exited_process_is_gone_before_it_is_reaped() {
        let mut child = std::process::Command::new("sleep")
            .arg("0.05")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        assert!(!process_gone(pid));
        let until = Instant::now() + Duration::from_secs(10);
        while !process_gone(pid) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(process_gone(pid), "a zombie counts as gone");
        child.wait().unwrap();
        assert!(process_gone(pid));
        assert!(!process_gone(std::process::id() as i32));
    }

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("polychip-shm-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// A control file holding `pid`, last modified `age` ago.
    fn ctl_file(dir: &std::path::Path, name: &str, pid: u32, age: Duration) {
        let path = dir.join(name);
        let mut bytes = u64::from(pid).to_ne_bytes().to_vec();
        bytes.resize(CTL_LEN, 0);
        fs::write(&path, bytes).unwrap();
        let file = fs::File::options().write(true).open(&path).unwrap();
        file.set_modified(SystemTime::now() - age).unwrap();
    }

    fn dead_pid() -> u32 {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        pid
    }

    #[test]
    fn the_sweep_removes_the_files_of_dead_ranks_only() {
        let dir = scratch("sweep");
        let old = Duration::from_secs(120);
        let dead = dead_pid();
        ctl_file(&dir, "polychip-a-r0-ctl", dead, old);
        fs::write(dir.join("polychip-a-r0-0"), b"region").unwrap();
        fs::write(dir.join("polychip-a-r1-0"), b"another rank's").unwrap();
        // Alive, and dead but too young (a rank still starting).
        ctl_file(&dir, "polychip-b-r0-ctl", std::process::id(), old);
        fs::write(dir.join("polychip-b-r0-0"), b"live").unwrap();
        ctl_file(&dir, "polychip-c-r0-ctl", dead, Duration::ZERO);
        fs::write(dir.join("unrelated-r0-ctl"), b"not ours").unwrap();
        assert_eq!(sweep_in(&dir, Duration::from_secs(60)), 2);
        let mut left: Vec<String> = fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                "polychip-a-r1-0",
                "polychip-b-r0-0",
                "polychip-b-r0-ctl",
                "polychip-c-r0-ctl",
                "unrelated-r0-ctl"
            ]
        );
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn files_are_private_and_job_names_unguessable() {
        use std::os::unix::fs::PermissionsExt;
        let (a, b) = (unique_job_name(), unique_job_name());
        assert_ne!(a, b);
        let random = a.rsplit('-').next().unwrap();
        assert_eq!(random.len(), 16, "{a}");
        assert!(a.starts_with(&format!("{:x}-", std::process::id())), "{a}");
        let t = ShmTransport::with_job_name(&a, 0, 1, Duration::from_secs(5)).unwrap();
        let region = t.register(4096).unwrap();
        let _ = region;
        for what in ["ctl", "0"] {
            let mode = fs::metadata(path(&a, 0, what))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600, "{what}: {mode:o}");
        }
        drop(t);
        assert!(fs::metadata(path(&a, 0, "ctl")).is_err(), "removed on drop");
    }

    /// A rank that fails between connecting and registering a region (its
    /// transport dropped): the peer registering fails at once naming it,
    /// where it waited for the region's file until its deadline.
    #[test]
    fn a_peer_that_leaves_during_setup_fails_the_others_at_once() {
        let job = unique_job_name();
        let timeout = Duration::from_secs(20);
        let results: Vec<Result<(), (CommError, Duration)>> = std::thread::scope(|s| {
            let hs: Vec<_> = [4096, 8192]
                .into_iter()
                .enumerate()
                .map(|(rank, len)| {
                    let job = &job;
                    s.spawn(move || {
                        let t = ShmTransport::with_job_name(job, rank, 2, timeout).unwrap();
                        if rank == 1 {
                            // It fails before its registration (here: it
                            // is dropped).
                            std::thread::sleep(Duration::from_millis(100));
                            drop(t);
                            return Ok(());
                        }
                        let start = Instant::now();
                        t.register(len)
                            .map(|_| ())
                            .map_err(|e| (e, start.elapsed()))?;
                        Ok(())
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        eprintln!("{results:?}");
        let (e0, took) = results[0].as_ref().unwrap_err();
        assert!(*took < Duration::from_secs(2), "{took:?}");
        assert!(
            e0.to_string().contains(
                "peer rank 1 is gone: it closed its transport before it registered region 0"
            ),
            "{e0}"
        );
    }

    #[test]
    fn a_planted_symlink_is_neither_followed_nor_written_through() {
        let dir = scratch("symlink");
        let target = dir.join("target");
        fs::write(&target, b"precious").unwrap();
        let job = unique_job_name();
        // A peer's control file planted as a symlink: refused, not mapped.
        std::os::unix::fs::symlink(&target, path(&job, 1, "ctl")).unwrap();
        let e = ShmTransport::with_job_name(&job, 0, 2, Duration::from_secs(2)).unwrap_err();
        assert!(e.to_string().contains(&path(&job, 1, "ctl")), "{e}");
        assert!(
            fs::symlink_metadata(path(&job, 0, "ctl")).is_err(),
            "a failed connect leaves no file behind"
        );
        // This rank's own file planted as a symlink: replaced, not followed.
        std::os::unix::fs::symlink(&target, path(&job, 0, "ctl")).unwrap();
        let t = ShmTransport::with_job_name(&job, 0, 1, Duration::from_secs(2)).unwrap();
        drop(t);
        assert_eq!(fs::read(&target).unwrap(), b"precious");
        let _ = fs::remove_file(path(&job, 1, "ctl"));
        let _ = fs::remove_dir_all(&dir);
    }
}
