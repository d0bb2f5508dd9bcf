//! How one call moves its tensors: device-direct tensors become host slices
//! over their (host-visible) device memory; staged tensors are copied
//! through the [`StagingPool`] with their plugin's `memcpy_d2h` /
//! `memcpy_h2d` on the default stream (complete when the copy returns), on
//! the caller's stream ([`DeviceComm::on_stream`], waited for after each
//! copy), or on the copy threads' own streams (below).
//!
//! Chunkable operations (all-reduce, reduce, broadcast, send/recv) run as
//! one host collective per chunk of [`DeviceComm::chunk_bytes`] on every
//! rank, whatever its path, so the ranks' call sequences always agree (and
//! the ranks agree on the whole call first: see the parent module). When a
//! tensor is staged and there is more than one chunk, a loader thread copies
//! chunk `k + 1` device-to-host and a storer thread copies chunk `k - 1`
//! host-to-device while this thread runs the collective on chunk `k`, each
//! copy thread on streams of its own (the ABI asks callers to serialize one
//! stream's calls); the chunks circulate through [`DEPTH`] staging slots.
//! With the caller's stream the chunks go one after another on this thread
//! instead: one stream's calls are serialized.

use std::ffi::c_void;
use std::ops::Range;
use std::sync::mpsc;
use std::thread;

use polychip_files::threads::{ThreadRefused, spawn_scoped};
use polychip_host::{HostError, Stream, Tensor};

use super::{DeviceComm, Path, StagingPool};
use crate::collectives::Communicator;
use crate::error::{CommError, Result};

/// Staging slots in flight in a pipelined call.
pub const DEPTH: usize = 4;

/// A staging slot: (source half, destination half).
type Slot<'p> = (&'p mut [u8], &'p mut [u8]);

/// The rank and operation that errors name.
#[derive(Debug, Clone, Copy)]
pub(super) struct Ctx {
    pub rank: usize,
    pub op: &'static str,
}

impl Ctx {
    fn host(self, what: &str, e: HostError) -> CommError {
        CommError::Io {
            rank: self.rank,
            op: format!("{} ({what})", self.op),
            message: e.to_string(),
        }
    }
}

fn addr(t: &Tensor, at: usize) -> *mut c_void {
    let start = t.byte_offset() as usize + at;
    t.buffer().ptr().cast::<u8>().wrapping_add(start).cast()
}

/// Copies bytes `at..at + out.len()` of compact tensor `t` to `out`, on
/// `stream` or the default stream (complete when this returns).
pub(super) fn d2h(
    ctx: Ctx,
    t: &Tensor,
    at: usize,
    out: &mut [u8],
    stream: Option<&Stream>,
) -> Result<()> {
    t.read_range(at, out, stream)
        .map_err(|e| ctx.host("device-to-host staging copy", e))
}

/// Copies `data` to bytes `at..at + data.len()` of compact tensor `t`.
pub(super) fn h2d(
    ctx: Ctx,
    t: &Tensor,
    at: usize,
    data: &[u8],
    stream: Option<&Stream>,
) -> Result<()> {
    t.write_range(at, data, stream)
        .map_err(|e| ctx.host("host-to-device staging copy", e))
}

/// The first `bytes` bytes of `t`'s elements, as host memory.
///
/// # Safety
/// `t` is on a host-visible device and compact, `bytes` does not pass the
/// end of its buffer, and while the slice lives nothing else (another
/// argument of the call, device work, another thread) uses that memory.
#[expect(
    clippy::mut_from_ref,
    reason = "the memory is the device's, not the Tensor handle's; exclusive use is the caller's contract"
)]
pub(super) unsafe fn host_slice(t: &Tensor, bytes: usize) -> &mut [u8] {
    if bytes == 0 {
        return &mut [];
    }
    // SAFETY: the caller's contract: host-visible memory of `bytes` bytes
    // inside a live allocation that `t` keeps alive, used by nothing else.
    unsafe { std::slice::from_raw_parts_mut(addr(t, 0).cast(), bytes) }
}

/// [`host_slice`] to read: others may read the memory meanwhile (two sends
/// of one tensor).
///
/// # Safety
/// As [`host_slice`], except that the memory may be read, not written, by
/// others while the slice lives.
pub(super) unsafe fn host_slice_ref(t: &Tensor, bytes: usize) -> &[u8] {
    if bytes == 0 {
        return &[];
    }
    // SAFETY: the caller's contract: host-visible memory of `bytes` bytes
    // inside a live allocation that `t` keeps alive, written by nothing.
    unsafe { std::slice::from_raw_parts(addr(t, 0).cast::<u8>(), bytes) }
}

pub(super) fn staged(t: Option<&Tensor>) -> Option<&Tensor> {
    t.filter(|t| Path::of(t.device()) == Path::Staged)
}

/// One chunkable call: `src` is read, `dst` read first when `load` and
/// written back when `store` (a staged `dst` that is only read, as on a
/// non-root rank of a reduce, is not copied back), both `bytes` long; `op`
/// runs the host collective on a chunk.
pub(super) struct Chunked<'t> {
    pub src: Option<&'t Tensor>,
    pub dst: Option<&'t Tensor>,
    pub load: bool,
    pub store: bool,
    pub bytes: usize,
}

type ChunkOp<'o> =
    dyn FnMut(&mut Communicator, Option<&[u8]>, Option<&mut [u8]>) -> Result<()> + 'o;

impl DeviceComm<'_> {
    /// Runs a chunkable call (see the module documentation).
    pub(super) fn chunked(&mut self, ctx: Ctx, a: Chunked<'_>, op: &mut ChunkOp<'_>) -> Result<()> {
        let (bytes, chunk) = (a.bytes, self.chunk);
        let chunks = bytes.div_ceil(chunk).max(1);
        let range = move |k: usize| (k * chunk).min(bytes)..((k + 1) * chunk).min(bytes);
        let (src_st, dst_st) = (staged(a.src), staged(a.dst));
        // SAFETY: `check` verified compactness and extent; the callers
        // reject overlapping arguments; the API documents that the tensors
        // are not in use elsewhere during the call.
        let src_host = a
            .src
            .filter(|_| src_st.is_none())
            .map(|t| &*unsafe { host_slice(t, bytes) });
        // SAFETY: as above.
        let mut dst_host = a
            .dst
            .filter(|_| dst_st.is_none())
            .map(|t| unsafe { host_slice(t, bytes) });
        let comm = &mut *self.comm;
        if src_st.is_none() && dst_st.is_none() {
            for k in 0..chunks {
                let d = dst_host.as_deref_mut().map(|d| &mut d[range(k)]);
                op(comm, src_host.map(|s| &s[range(k)]), d)?;
            }
            return Ok(());
        }
        // The staged tensors each thread copies: the loader the source and
        // a destination it reads first, the storer the destination.
        let load_st = [src_st, dst_st.filter(|_| a.load)];
        let store_st = dst_st.filter(|_| a.store);
        // `on`: the streams of `load_st`'s copies.
        let load = move |k: usize, slot: &mut Slot<'_>, on: [Option<&Stream>; 2]| -> Result<()> {
            let r = range(k);
            if let Some(t) = load_st[0] {
                d2h(ctx, t, r.start, &mut slot.0[..r.len()], on[0])?;
            }
            match load_st[1] {
                Some(t) => d2h(ctx, t, r.start, &mut slot.1[..r.len()], on[1]),
                None => Ok(()),
            }
        };
        let store = move |k: usize, slot: &Slot<'_>, on: Option<&Stream>| -> Result<()> {
            let r = range(k);
            store_st.map_or(Ok(()), |t| h2d(ctx, t, r.start, &slot.1[..r.len()], on))
        };
        let mut run = |k: usize, slot: &mut Slot<'_>| -> Result<()> {
            let r = range(k);
            let s = match src_st {
                Some(_) => Some(&slot.0[..r.len()]),
                None => src_host.map(|s| &s[r.clone()]),
            };
            let d = match dst_st {
                Some(_) => Some(&mut slot.1[..r.len()]),
                None => dst_host.as_deref_mut().map(|d| &mut d[r.clone()]),
            };
            op(comm, s, d)
        };
        // One chunk has nothing to overlap; copies on the caller's stream
        // stay on this thread (one stream's calls are serialized), chunk
        // after chunk through one slot.
        let stream = self.stream;
        let in_turn = chunks == 1 || stream.is_some();
        let slots = slots(
            &mut self.pool,
            if in_turn { 1 } else { chunks.min(DEPTH) },
            bytes.min(chunk),
            src_st.is_some(),
            dst_st.is_some(),
        );
        if in_turn {
            let mut slot = slots.into_iter().next().expect("one slot");
            for k in 0..chunks {
                load(k, &mut slot, [stream, stream])?;
                run(k, &mut slot)?;
                store(k, &slot, stream)?;
            }
            return Ok(());
        }
        // The loader and the storer copy at the same time, each on streams
        // of its own (the ABI asks callers to serialize one stream's calls,
        // the default stream's too).
        let loader = Copier {
            streams: move || Ok([stream_for(ctx, load_st[0])?, stream_for(ctx, load_st[1])?]),
            copy: move |k: usize, slot: &mut Slot<'_>, on: &[Option<Stream>; 2]| {
                load(k, slot, [on[0].as_ref(), on[1].as_ref()])
            },
        };
        let storer = Copier {
            streams: move || stream_for(ctx, store_st),
            copy: move |k: usize, slot: &mut Slot<'_>, on: &Option<Stream>| {
                store(k, slot, on.as_ref())
            },
        };
        pipeline(ctx, chunks, slots, loader, &mut run, storer)
    }

    /// Runs a call that is not chunked (all-gather, reduce-scatter,
    /// all-to-all): `src`
    /// (`sb` bytes) is read and `dst` (`db` bytes) written, each staged whole
    /// when its device is not host-visible.
    pub(super) fn whole(
        &mut self,
        ctx: Ctx,
        (src, sb): (&Tensor, usize),
        (dst, db): (&Tensor, usize),
        op: impl FnOnce(&mut Communicator, &[u8], &mut [u8]) -> Result<()>,
    ) -> Result<()> {
        let (src_st, dst_st) = (staged(Some(src)).is_some(), staged(Some(dst)).is_some());
        let mut bufs = self
            .pool
            .take(&[if src_st { sb } else { 0 }, if dst_st { db } else { 0 }]);
        let (b1, b0) = (bufs.pop().expect("two"), bufs.pop().expect("two"));
        let s: &[u8] = if src_st {
            d2h(ctx, src, 0, b0, self.stream)?;
            b0
        } else {
            // SAFETY: `check` verified compactness and extent; the caller
            // rejected overlap with `dst`; the API documents exclusive use.
            unsafe { host_slice(src, sb) }
        };
        let d: &mut [u8] = if dst_st {
            b1
        } else {
            // SAFETY: as above.
            unsafe { host_slice(dst, db) }
        };
        op(self.comm, s, d)?;
        match dst_st {
            true => h2d(ctx, dst, 0, d, self.stream),
            false => Ok(()),
        }
    }
}

/// `n` staging slots of `len` bytes per staged half.
fn slots(pool: &mut StagingPool, n: usize, len: usize, src: bool, dst: bool) -> Vec<Slot<'_>> {
    let sizes: Vec<usize> = (0..2 * n)
        .map(|i| {
            if (i % 2 == 0 && src) || (i % 2 == 1 && dst) {
                len
            } else {
                0
            }
        })
        .collect();
    let mut bufs = pool.take(&sizes).into_iter();
    (0..n)
        .map(|_| (bufs.next().expect("2n"), bufs.next().expect("2n")))
        .collect()
}

/// A copy thread's work: `streams` makes what its copies go on (on the
/// thread itself), `copy(k, slot, streams)` copies chunk `k`.
struct Copier<S, C> {
    streams: S,
    copy: C,
}

/// A stream of `t`'s device for a copy thread, when `t` is staged.
fn stream_for(ctx: Ctx, t: Option<&Tensor>) -> Result<Option<Stream>> {
    t.map(|t| {
        t.device()
            .stream()
            .map_err(|e| ctx.host("a staging copy stream", e))
    })
    .transpose()
}

/// The overlapped loop: loader thread, this thread, storer thread.
fn pipeline<'p, LS, L, SS, S>(
    ctx: Ctx,
    chunks: usize,
    slots: Vec<Slot<'p>>,
    loader: Copier<impl FnOnce() -> Result<LS> + Send, L>,
    run: &mut dyn FnMut(usize, &mut Slot<'p>) -> Result<()>,
    storer: Copier<impl FnOnce() -> Result<SS> + Send, S>,
) -> Result<()>
where
    L: Fn(usize, &mut Slot<'p>, &LS) -> Result<()> + Send,
    S: Fn(usize, &mut Slot<'p>, &SS) -> Result<()> + Send,
{
    thread::scope(|s| {
        let (free_tx, free_rx) = mpsc::channel::<Slot<'p>>();
        let (full_tx, full_rx) = mpsc::channel::<Result<Slot<'p>>>();
        let (done_tx, done_rx) = mpsc::channel::<(usize, Slot<'p>)>();
        for slot in slots {
            free_tx.send(slot).expect("the receiver is here");
        }
        // Refused, the scope's channels drop with this closure: a loader
        // already started finds its slots' channels closed and ends.
        let refused = |e: ThreadRefused| CommError::Io {
            rank: ctx.rank,
            op: ctx.op.into(),
            message: e.to_string(),
        };
        spawn_scoped(s, "load staged chunks", move || {
            let streams = match (loader.streams)() {
                Ok(streams) => streams,
                Err(e) => {
                    let _ = full_tx.send(Err(e));
                    return;
                }
            };
            for k in 0..chunks {
                let Ok(mut slot) = free_rx.recv() else { return };
                let loaded = (loader.copy)(k, &mut slot, &streams).map(|()| slot);
                let failed = loaded.is_err();
                if full_tx.send(loaded).is_err() || failed {
                    return;
                }
            }
        })
        .map_err(refused)?;
        let storer = spawn_scoped(s, "store staged chunks", move || -> Result<()> {
            let streams = (storer.streams)()?;
            while let Ok((k, mut slot)) = done_rx.recv() {
                (storer.copy)(k, &mut slot, &streams)?;
                // The loader may have finished: a closed channel is fine.
                let _ = free_tx.send(slot);
            }
            Ok(())
        })
        .map_err(refused)?;
        let result = (|| -> Result<()> {
            for k in 0..chunks {
                let mut slot = full_rx.recv().map_err(|_| stopped(ctx))??;
                run(k, &mut slot)?;
                done_tx.send((k, slot)).map_err(|_| stopped(ctx))?;
            }
            Ok(())
        })();
        drop((done_tx, full_rx));
        let stored = storer.join().unwrap_or_else(|_| Err(stopped(ctx)));
        stored.and(result)
    })
}

fn stopped(ctx: Ctx) -> CommError {
    CommError::Io {
        rank: ctx.rank,
        op: ctx.op.into(),
        message: "a staging copy thread stopped early".into(),
    }
}

/// Whether the byte ranges of two compact tensors share memory.
pub(super) fn overlap(a: &Tensor, ab: usize, b: &Tensor, bb: usize) -> bool {
    let span = |t: &Tensor, n: usize| -> Range<u64> { t.byte_offset()..t.byte_offset() + n as u64 };
    let (x, y) = (span(a, ab), span(b, bb));
    std::sync::Arc::ptr_eq(a.buffer(), b.buffer())
        && ab > 0
        && bb > 0
        && x.start < y.end
        && y.start < x.end
}
