//! Splitting work over the rayon pool: how many pieces a job is worth
//! (nothing below [`PAR_THRESHOLD`] leaves the calling thread), running the
//! pieces, and a pointer wrapper that may cross threads.

use std::error::Error;

use rayon::prelude::*;

/// Work (elements times per-element weight) below which kernels stay on the
/// calling thread.
pub(crate) const PAR_THRESHOLD: usize = 1 << 16;
/// Smallest amount of work worth handing to another thread.
const MIN_CHUNK_WORK: usize = 1 << 14;

/// The threads kernels may split work over: the pool the caller runs in
/// (a test's, or rayon's global pool), or 1 when the global pool could not
/// be started. Rayon starts its global pool on first use and, when the
/// system refuses one of its threads (a process limit), panics on that use
/// and on every later one ("The global thread pool has not been
/// initialized"): every kernel large enough to split would fail. Started
/// here instead, once, a refusal leaves every kernel on its calling
/// thread, slower but right.
pub(crate) fn threads() -> usize {
    use std::sync::OnceLock;
    if rayon::current_thread_index().is_some() {
        return rayon::current_num_threads();
    }
    static GLOBAL: OnceLock<usize> = OnceLock::new();
    *GLOBAL.get_or_init(|| match rayon::ThreadPoolBuilder::new().build_global() {
        Ok(()) => rayon::current_num_threads(),
        // Started by someone else before: usable if it did start.
        Err(e) if e.source().is_none() => {
            std::panic::catch_unwind(rayon::current_num_threads).unwrap_or(1)
        }
        // A thread the system refused: the pool stays unusable.
        Err(_) => 1,
    })
}

/// How many pieces to cut `work` units of work into (1 = stay serial).
#[inline]
pub(crate) fn chunk_count(items: usize, weight: usize) -> usize {
    let work = items.saturating_mul(weight.max(1));
    if work < PAR_THRESHOLD || items < 2 {
        return 1;
    }
    let threads = threads();
    if threads <= 1 {
        return 1;
    }
    (work / MIN_CHUNK_WORK).clamp(1, threads * 4).min(items)
}

/// Calls `f(start, len)` over `0..items` (not at all when it is empty), in
/// parallel pieces when the work (`items * weight`) is large.
#[inline]
pub(crate) fn for_each_range<F>(items: usize, weight: usize, f: F)
where
    F: Fn(usize, usize) + Sync,
{
    if items == 0 {
        return;
    }
    let chunks = chunk_count(items, weight);
    if chunks <= 1 {
        f(0, items);
        return;
    }
    (0..chunks).into_par_iter().for_each(|c| {
        let start = split_point(items, c, chunks);
        let end = split_point(items, c + 1, chunks);
        if end > start {
            f(start, end - start);
        }
    });
}

fn split_point(total: usize, c: usize, chunks: usize) -> usize {
    (total as u128 * c as u128 / chunks as u128) as usize
}

/// A raw pointer that may cross threads. Kernels only write disjoint parts of
/// their output from different threads, as the safety contract demands.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SyncPtr(*mut u8);

// SAFETY: the pointer is only dereferenced inside `unsafe` kernels whose
// callers guarantee validity; distinct threads touch disjoint output elements.
unsafe impl Send for SyncPtr {}
// SAFETY: as above; sharing the address itself is harmless.
unsafe impl Sync for SyncPtr {}

impl SyncPtr {
    pub(crate) fn new(p: *mut u8) -> Self {
        Self(p)
    }

    /// The address (a method, so closures capture the whole `Sync` wrapper).
    #[inline(always)]
    pub(crate) fn get(self) -> *mut u8 {
        self.0
    }
}
