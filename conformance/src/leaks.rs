//! Whether calling an operator again and again keeps taking memory or
//! threads: a kernel that allocates a workspace (a `malloc`, an OpenCL
//! buffer, a cached plan keyed by an address) and never frees it, or starts
//! a thread per call and never joins it, is right on every single call and
//! still ends a long training run out of memory.
//!
//! One case per (operator, dtype), the one also called from several
//! threads at once, is uploaded once and called in two timed phases after
//! a warm-up; the process's resident memory and thread count are read from
//! `/proc/self/status` around each phase, with the bytes in use from
//! `malloc` (glibc's `mallinfo2`: a leak grows them even while the
//! allocator reuses pages it kept, which resident memory misses). Growth counts only when both
//! phases grow past the bound (a cache filled once, an allocator's arena or
//! a pool's threads started late grow in one phase, not in both). A leak
//! of device memory that is not host memory shows only when the plugin's
//! bookkeeping lives in host memory; a leak of under about 16 KiB a call
//! goes unseen.

use std::time::{Duration, Instant};

/// Calls before the phases (caches, pools and arenas fill).
const WARM_UP: usize = 4;
/// The time a phase runs for, at least [`MIN_CALLS`] and at most
/// [`MAX_CALLS`] calls.
const PHASE: Duration = Duration::from_millis(25);
const MIN_CALLS: usize = 4;
const MAX_CALLS: usize = 64;
/// Growth of resident memory in one phase that counts: at least this
/// much, and at least [`PER_CALL`] bytes a call.
const FLOOR: u64 = 512 << 10;
const PER_CALL: u64 = 16 << 10;

/// Resident bytes, threads, and bytes in use from `malloc` (0 where the C
/// library does not tell) of this process, when `/proc` tells.
fn usage() -> Option<(u64, u64, u64)> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = status.lines().find(|l| l.starts_with(name))?;
        line[name.len()..].split_whitespace().next()?.parse().ok()
    };
    let heap = polychip_host::ffi::heap::heap_in_use().unwrap_or(0);
    Some((field("VmRSS:")? * 1024, field("Threads:")?, heap))
}

/// What one phase measured: calls made, and the growth of resident
/// memory, threads and `malloc`ed bytes.
type Phase = (u64, i64, i64, i64);

/// One phase: calls until [`PHASE`] has passed (within the call bounds);
/// the calls made and the growth of memory and threads.
fn phase(call: &mut impl FnMut() -> Result<(), String>) -> Result<Phase, String> {
    let (rss, threads, heap) = usage().ok_or("no /proc")?;
    let started = Instant::now();
    let mut calls = 0u64;
    while (calls as usize) < MAX_CALLS
        && ((calls as usize) < MIN_CALLS || started.elapsed() < PHASE)
    {
        call()?;
        calls += 1;
    }
    let (rss2, threads2, heap2) = usage().ok_or("no /proc")?;
    let grown = |a: u64, b: u64| b as i64 - a as i64;
    Ok((
        calls,
        grown(rss, rss2),
        grown(threads, threads2),
        grown(heap, heap2),
    ))
}

/// What keeps growing when `call` (one call of a case that passed, awaited)
/// is made again and again, in words; `None` when nothing does, when
/// `/proc` is not there, or when a call fails (that case's other checks
/// say why).
pub fn growth(mut call: impl FnMut() -> Result<(), String>) -> Option<String> {
    for _ in 0..WARM_UP {
        call().ok()?;
    }
    let first = phase(&mut call).ok()?;
    let second = phase(&mut call).ok()?;
    judge(first, second)
}

/// The verdict on two phases.
fn judge(first: Phase, second: Phase) -> Option<String> {
    let over = |calls: u64, bytes: i64| bytes > 0 && bytes as u64 >= FLOOR.max(PER_CALL * calls);
    // Resident memory, or memory from malloc (which grows where resident
    // memory does not while the allocator reuses pages it kept).
    let leaks_memory = |(calls, rss, _, heap): Phase| over(calls, rss) || over(calls, heap);
    let leaks_threads = |(calls, _, threads, _): Phase| threads > 0 && threads as u64 * 2 >= calls;
    let calls = first.0 + second.0;
    if leaks_threads(first) && leaks_threads(second) {
        return Some(format!(
            "every call leaves threads behind: {} more threads after {calls} calls of this case \
             (a thread started per call and never joined)",
            first.2 + second.2
        ));
    }
    if leaks_memory(first) && leaks_memory(second) {
        let grown = (first.1.max(first.3) + second.1.max(second.3)) as u64;
        return Some(format!(
            "memory keeps growing with every call: the process's memory (resident, or in use \
             from malloc) grew by {} KiB over {calls} calls of this case ({} KiB a call, in both \
             of two phases), a workspace or buffer allocated per call and never freed",
            grown >> 10,
            (grown / calls) >> 10
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn growth_in_both_phases_is_a_leak_and_in_one_is_not() {
        assert_eq!(judge((32, 0, 0, 0), (32, 4096, 0, 0)), None);
        // A cache filled once: one phase grows.
        assert_eq!(judge((32, 8 << 20, 0, 8 << 20), (32, 0, 0, 0)), None);
        let leak = judge((32, 2 << 20, 0, 0), (32, 2 << 20, 0, 0)).unwrap();
        assert!(leak.contains("64 KiB a call"), "{leak}");
        // Memory from malloc grows while resident memory does not.
        let reused = judge((32, 0, 0, 2 << 20), (32, 0, 0, 2 << 20)).unwrap();
        assert!(reused.contains("64 KiB a call"), "{reused}");
        // Under the per-call bound: 4 KiB a call over 64 calls.
        assert_eq!(judge((64, 256 << 10, 0, 0), (64, 256 << 10, 0, 0)), None);
        let threads = judge((8, 0, 8, 0), (8, 0, 8, 0)).unwrap();
        assert!(
            threads.contains("16 more threads after 16 calls"),
            "{threads}"
        );
        // A pool that started its threads late.
        assert_eq!(judge((8, 0, 4, 0), (8, 0, 0, 0)), None);
    }
}
