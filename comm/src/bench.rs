//! The collectives benchmark behind `polychip bench comm`, run by every rank
//! of a job: for each operation and size it runs warm-up and timed
//! iterations the way `peers/mpi_allreduce_bench.c` does (about
//! `2e9 / bytes` iterations clamped to 20..=20000, warm-up a tenth of that
//! and at least 5), takes the slowest rank's time, checks one more call
//! against an analytically known result, and reports nccl-tests columns:
//! `algbw = bytes / time`, `busbw = algbw x factor` (`2(n-1)/n` all-reduce,
//! `(n-1)/n` all-gather, reduce-scatter and all-to-all, 1 for broadcast,
//! reduce and send/recv).
//!
//! `size` is the larger buffer of a rank, as in nccl-tests: the output of an
//! all-gather, the input of a reduce-scatter, each rank's whole send buffer
//! for all-to-all, and what each rank sends for send/recv (ranks `2k` and
//! `2k + 1` exchange buffers at once, in pieces of 1 MiB). Sizes must be
//! whole elements, at most [`MAX_SIZE`] (each rank allocates two buffers of
//! the size), and large enough for one element per rank where the operation
//! splits the buffer into `world` blocks; such operations round the size
//! down to a whole number of blocks (the row shows the size measured). See
//! [`BenchOptions::check`]. The barrier is timed once, at size 0. Buffers
//! are allocated once per size and reused by every operation.

use std::fmt::Write as _;
use std::time::Instant;

use half::{bf16, f16};

use crate::collectives::{Communicator, DType, P2p, ReduceOp, SLOT};
use crate::error::{CommError, Result};

/// An operation the benchmark can time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    /// [`Communicator::all_reduce_into`] (out of place).
    AllReduce,
    /// [`Communicator::all_gather`].
    AllGather,
    /// [`Communicator::reduce_scatter`].
    ReduceScatter,
    /// [`Communicator::broadcast`] from rank 0.
    Broadcast,
    /// [`Communicator::reduce`] to rank 0 (in place).
    Reduce,
    /// [`Communicator::all_to_all`].
    AllToAll,
    /// Ranks `2k` and `2k + 1` exchange buffers: one
    /// [`Communicator::p2p_group`] of a send and a receive.
    SendRecv,
    /// The same exchange with blocking [`Communicator::send`] and
    /// [`Communicator::recv`] taking turns a 1 MiB piece at a time (what
    /// fits in the peer's slots): the baseline of `sendrecv`.
    SendRecvBlocking,
    /// [`Communicator::barrier`] latency (size 0).
    Barrier,
}

impl Op {
    /// Every operation, in table order.
    pub const ALL: [Op; 9] = [
        Op::AllReduce,
        Op::AllGather,
        Op::ReduceScatter,
        Op::Broadcast,
        Op::Reduce,
        Op::AllToAll,
        Op::SendRecv,
        Op::SendRecvBlocking,
        Op::Barrier,
    ];

    /// The name used on the command line and in the table.
    pub fn name(self) -> &'static str {
        match self {
            Op::AllReduce => "all_reduce",
            Op::AllGather => "all_gather",
            Op::ReduceScatter => "reduce_scatter",
            Op::Broadcast => "broadcast",
            Op::Reduce => "reduce",
            Op::AllToAll => "all_to_all",
            Op::SendRecv => "sendrecv",
            Op::SendRecvBlocking => "sendrecv_blocking",
            Op::Barrier => "barrier",
        }
    }

    /// The nccl-tests bus-bandwidth factor for `world` ranks.
    pub fn bus_factor(self, world: usize) -> f64 {
        let n = world as f64;
        match self {
            Op::AllReduce => 2.0 * (n - 1.0) / n,
            Op::AllGather | Op::ReduceScatter | Op::AllToAll => (n - 1.0) / n,
            Op::Broadcast | Op::Reduce | Op::SendRecv | Op::SendRecvBlocking => 1.0,
            Op::Barrier => 0.0,
        }
    }

    fn reduces(self) -> bool {
        matches!(self, Op::AllReduce | Op::ReduceScatter | Op::Reduce)
    }

    /// Whether the operation splits its buffer into `world` blocks.
    fn blocked(self) -> bool {
        matches!(self, Op::AllGather | Op::ReduceScatter | Op::AllToAll)
    }
}

/// Parses a comma-separated operation list (`all` for every one); `_`, `-`
/// and nothing are accepted between words (`all_reduce`, `allreduce`,
/// `all-reduce`). Order and duplicates are normalised to table order.
pub fn parse_ops(list: &str) -> Result<Vec<Op>> {
    let mut ops = Vec::new();
    for word in list.split(',').map(str::trim).filter(|w| !w.is_empty()) {
        let key: String = word
            .chars()
            .filter(|c| !matches!(c, '_' | '-'))
            .collect::<String>()
            .to_ascii_lowercase();
        if key == "all" {
            ops.extend(Op::ALL);
            continue;
        }
        let op = Op::ALL
            .into_iter()
            .find(|op| op.name().replace('_', "") == key)
            .ok_or_else(|| {
                let names: Vec<&str> = Op::ALL.iter().map(|o| o.name()).collect();
                CommError::Usage(format!(
                    "unknown operation {}: expected `all` or some of {}",
                    crate::text::quoted(word),
                    names.join(", ")
                ))
            })?;
        ops.push(op);
    }
    ops.sort();
    ops.dedup();
    if ops.is_empty() {
        return Err(CommError::Usage("the operation list is empty".into()));
    }
    Ok(ops)
}

/// The largest buffer size accepted (`--sizes`), 1 GiB: each rank
/// allocates two buffers of the size (send and receive), so a rank needs
/// 2 GiB and `-n 8` ranks 16 GiB at this size.
pub const MAX_SIZE: usize = 1 << 30;

/// The most timed iterations per row accepted (`--iters`): five times the
/// most the default rule picks.
pub const MAX_ITERS: usize = 100_000;

/// Parses a comma-separated size list: plain bytes or with a suffix
/// `K`/`KiB`, `M`/`MiB`, `G`/`GiB` (powers of 1024; `B` allowed), each at
/// most [`MAX_SIZE`].
pub fn parse_sizes(list: &str) -> Result<Vec<usize>> {
    let mut sizes = Vec::new();
    for word in list.split(',').map(str::trim).filter(|w| !w.is_empty()) {
        let lower = word.to_ascii_lowercase();
        let digits = lower.trim_end_matches(|c: char| c.is_ascii_alphabetic());
        let unit = match lower[digits.len()..].trim_end_matches('b') {
            "" => 1,
            "k" | "ki" => 1 << 10,
            "m" | "mi" => 1 << 20,
            "g" | "gi" => 1 << 30,
            _ => usize::MAX,
        };
        let size = digits
            .trim()
            .parse::<usize>()
            .ok()
            .filter(|_| unit != usize::MAX)
            .and_then(|n| n.checked_mul(unit))
            .ok_or_else(|| {
                CommError::Usage(format!(
                    "--sizes: bad size {}: give bytes, optionally with K, M or G (powers \
                     of 1024), at most 1G",
                    crate::text::quoted(word)
                ))
            })?;
        if size > MAX_SIZE {
            return Err(CommError::Usage(format!(
                "--sizes: {word} is {size} bytes, more than the limit of {MAX_SIZE} (1 GiB) per \
                 buffer (every rank allocates a send and a receive buffer of the size)"
            )));
        }
        sizes.push(size);
    }
    if sizes.is_empty() {
        return Err(CommError::Usage("--sizes: the size list is empty".into()));
    }
    Ok(sizes)
}

/// Parses a dtype name: `f32`/`float`, `f16`/`half`, `bf16`/`bfloat16`,
/// `i32`/`int32`, `i64`/`int64`, `f64`/`double`, `u8`/`uint8`, `bool`.
pub fn parse_dtype(name: &str) -> Result<DType> {
    match name.trim().to_ascii_lowercase().as_str() {
        "f32" | "float" | "float32" => Ok(DType::F32),
        "f16" | "half" | "float16" => Ok(DType::F16),
        "bf16" | "bfloat16" => Ok(DType::BF16),
        "i32" | "int" | "int32" => Ok(DType::I32),
        "i64" | "int64" => Ok(DType::I64),
        "f64" | "double" | "float64" => Ok(DType::F64),
        "u8" | "uint8" => Ok(DType::U8),
        "bool" => Ok(DType::Bool),
        other => Err(CommError::Usage(format!(
            "unknown dtype {}: expected f32, f16, bf16, i32, i64, f64, u8 or bool",
            crate::text::quoted(other)
        ))),
    }
}

/// The sizes timed when none are given: 4 KiB, 64 KiB, 1 MiB, 16 MiB, 64 MiB.
pub const DEFAULT_SIZES: [usize; 5] = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20];

/// What to time.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Operations, timed in this order for each size.
    pub ops: Vec<Op>,
    /// Buffer sizes in bytes.
    pub sizes: Vec<usize>,
    /// Element type (reductions use [`ReduceOp::Sum`]).
    pub dtype: DType,
    /// Timed iterations per row; `None` follows the MPI peer's rule.
    pub iters: Option<usize>,
}

impl Default for BenchOptions {
    fn default() -> BenchOptions {
        BenchOptions {
            ops: Op::ALL.to_vec(),
            sizes: DEFAULT_SIZES.to_vec(),
            dtype: DType::F32,
            iters: None,
        }
    }
}

impl BenchOptions {
    /// Refuses options that would measure nothing or something other than
    /// asked, for a job of `world` ranks, naming the flag: `--iters` 0 or
    /// above [`MAX_ITERS`]; a size above [`MAX_SIZE`], of 0, or not a
    /// whole number of elements; a size too small to give each rank one
    /// element of an operation that splits the buffer into `world` blocks.
    pub fn check(&self, world: usize) -> Result<()> {
        match self.iters {
            Some(0) => {
                return Err(CommError::Usage(
                    "--iters is 0: give at least 1 timed iteration per row".into(),
                ));
            }
            Some(n) if n > MAX_ITERS => {
                return Err(CommError::Usage(format!(
                    "--iters is {n}, more than the {MAX_ITERS} accepted"
                )));
            }
            _ => {}
        }
        let timed: Vec<Op> = self
            .ops
            .iter()
            .copied()
            .filter(|o| *o != Op::Barrier)
            .collect();
        if timed.is_empty() {
            return Ok(());
        }
        let es = self.dtype.size();
        let name = self.dtype.name();
        for &size in &self.sizes {
            if size > MAX_SIZE {
                return Err(CommError::Usage(format!(
                    "--sizes: {size} bytes is more than the limit of {MAX_SIZE} (1 GiB) per buffer"
                )));
            }
            if size == 0 {
                return Err(CommError::Usage(format!(
                    "--sizes: a size of 0 bytes measures nothing for {} (the barrier is timed \
                     without a size)",
                    timed[0].name()
                )));
            }
            if size % es != 0 {
                return Err(CommError::Usage(format!(
                    "--sizes: {size} bytes is not a whole number of {name} elements ({es} bytes \
                     each, --dtype); give a multiple of {es}"
                )));
            }
            let world = world.max(1);
            if let Some(op) = timed.iter().find(|o| o.blocked())
                && size < world * es
            {
                return Err(CommError::Usage(format!(
                    "--sizes: {size} bytes measures nothing for {} with {world} ranks: it splits \
                     the buffer into {world} blocks of whole {name} elements, so it needs at \
                     least {} bytes; give a larger size or leave {} out of --ops",
                    op.name(),
                    world * es,
                    op.name()
                )));
            }
        }
        Ok(())
    }
}

/// One line of the table (the same on every rank).
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// The operation.
    pub op: Op,
    /// Ranks in the job.
    pub world: usize,
    /// Bytes (see the module documentation for which buffer).
    pub bytes: usize,
    /// Elements in `bytes`.
    pub count: usize,
    /// Element type.
    pub dtype: DType,
    /// The reduction, for operations that reduce.
    pub redop: Option<ReduceOp>,
    /// Timed iterations.
    pub iters: usize,
    /// Seconds per iteration, the slowest rank's.
    pub time: f64,
    /// `bytes / time` in GB/s (1e9 B/s).
    pub algbw: f64,
    /// `algbw x` the operation's bus factor, in GB/s.
    pub busbw: f64,
    /// Wrong elements in the checked call, summed over ranks.
    pub wrong: u64,
}

/// The timed iterations for `bytes`: `2e9 / bytes` clamped to 20..=20000.
pub fn iterations(bytes: usize) -> usize {
    if bytes == 0 {
        return 20000;
    }
    ((2e9 / bytes as f64) as usize).clamp(20, 20000)
}

/// The warm-up iterations before `iters` timed ones: `max(iters / 10, 5)`.
pub fn warmup(iters: usize) -> usize {
    (iters / 10).max(5)
}

/// Runs the benchmark on this rank; every rank of `comm` must call it with
/// the same options. Returns the rows (identical on every rank), grouped by
/// operation in [`Op::ALL`] order, sizes in the order given.
pub fn run(comm: &mut Communicator, options: &BenchOptions) -> Result<Vec<Row>> {
    options.check(comm.world_size())?;
    let mut rows = Vec::new();
    let timed: Vec<Op> = options
        .ops
        .iter()
        .copied()
        .filter(|o| *o != Op::Barrier)
        .collect();
    if !timed.is_empty() {
        for &size in &options.sizes {
            let mut bufs = Buffers::new(size, options.dtype)?;
            for &op in &timed {
                if let Some(row) = bench_one(comm, &mut bufs, op, options)? {
                    rows.push(row);
                }
            }
        }
    }
    if options.ops.contains(&Op::Barrier) {
        let mut bufs = Buffers::new(0, options.dtype)?;
        rows.extend(bench_one(comm, &mut bufs, Op::Barrier, options)?);
    }
    rows.sort_by_key(|r| r.op);
    Ok(rows)
}

/// A rank's two buffers for one size.
struct Buffers {
    size: usize,
    dtype: DType,
    send: Vec<u8>,
    recv: Vec<u8>,
}

impl Buffers {
    /// `size` rounded down to whole elements; every operation's buffers
    /// fit in it (an all-gather's send and a reduce-scatter's recv use a
    /// `1 / world` prefix). A failed allocation is an error, not an abort.
    fn new(size: usize, dtype: DType) -> Result<Buffers> {
        let es = dtype.size();
        let size = size / es * es;
        let zeroed = || -> Result<Vec<u8>> {
            let mut v = Vec::new();
            v.try_reserve_exact(size).map_err(|e| {
                CommError::Usage(format!(
                    "--sizes: cannot allocate a buffer of {size} bytes: {e}"
                ))
            })?;
            v.resize(size, 0);
            Ok(v)
        };
        Ok(Buffers {
            size,
            dtype,
            send: zeroed()?,
            recv: zeroed()?,
        })
    }
}

/// The small integer element `i` of a rank's data holds: `base + i % 7`.
fn value(base: i64, i: usize) -> i64 {
    base + (i % 7) as i64
}

/// Writes the integer `v` as one element of `dtype` into `out`.
fn encode(dtype: DType, v: i64, out: &mut [u8]) {
    match dtype {
        DType::F32 => out.copy_from_slice(&(v as f32).to_ne_bytes()),
        DType::F16 => out.copy_from_slice(&f16::from_f32(v as f32).to_ne_bytes()),
        DType::BF16 => out.copy_from_slice(&bf16::from_f32(v as f32).to_ne_bytes()),
        DType::I32 => out.copy_from_slice(&(v as i32).to_ne_bytes()),
        DType::I64 => out.copy_from_slice(&v.to_ne_bytes()),
        DType::F64 => out.copy_from_slice(&(v as f64).to_ne_bytes()),
        DType::U8 => out[0] = v as u8,
        // The values are never negative: a sum or maximum is non-zero
        // where any value is (or), a minimum where all are (and).
        DType::Bool => out[0] = (v != 0) as u8,
    }
}

/// Fills `buf` with `f(i)` for element `i`.
fn fill(dtype: DType, buf: &mut [u8], f: impl Fn(usize) -> i64) {
    let es = dtype.size();
    for (i, e) in buf.chunks_exact_mut(es).enumerate() {
        encode(dtype, f(i), e);
    }
}

/// Counts the elements of `buf` that differ (bitwise) from `f(i)`.
fn count_wrong(dtype: DType, buf: &[u8], f: impl Fn(usize) -> i64) -> u64 {
    let es = dtype.size();
    let mut want = [0u8; 8];
    let mut wrong = 0;
    for (i, e) in buf.chunks_exact(es).enumerate() {
        encode(dtype, f(i), &mut want[..es]);
        if e != &want[..es] {
            wrong += 1;
        }
    }
    wrong
}

/// Times `op` at the buffers' size; `None` when the size rounds to nothing.
fn bench_one(
    comm: &mut Communicator,
    bufs: &mut Buffers,
    op: Op,
    options: &BenchOptions,
) -> Result<Option<Row>> {
    let (me, n, dtype) = (comm.rank(), comm.world_size(), bufs.dtype);
    let es = dtype.size();
    let bytes = match op {
        Op::Barrier => 0,
        _ if op.blocked() => bufs.size / (n * es) * (n * es),
        _ => bufs.size,
    };
    if bytes == 0 && op != Op::Barrier {
        return Ok(None);
    }
    let count = bytes / es;
    let block = bytes / n;
    let redop = op.reduces().then_some(ReduceOp::Sum);
    let iters = options.iters.unwrap_or_else(|| iterations(bytes));
    let partner = (me ^ 1 < n).then_some(me ^ 1);
    let rank_base = (me + 1) as i64;
    let ranks_sum = (n * (n + 1) / 2) as i64;
    let nn = n as i64;

    // Inputs, set before the timed calls and again before the checked one
    // (in-place operations overwrite them).
    let prepare = |b: &mut Buffers| {
        let (send, recv) = (&mut b.send[..bytes], &mut b.recv[..bytes]);
        match op {
            Op::AllReduce | Op::ReduceScatter | Op::Reduce => {
                fill(dtype, send, |i| value(rank_base, i));
                recv.fill(0);
                if op == Op::Reduce {
                    recv.copy_from_slice(send);
                }
            }
            Op::AllGather => {
                fill(dtype, &mut send[..block], |i| value(rank_base, i));
                recv.fill(0);
            }
            Op::Broadcast => {
                let base = if me == 0 { 1 } else { 100 };
                fill(dtype, recv, |i| value(base, i));
            }
            Op::AllToAll => {
                let per = block / es;
                fill(dtype, send, |i| {
                    value(((me * n + i / per) % 64) as i64, i % per)
                });
                recv.fill(0);
            }
            Op::SendRecv | Op::SendRecvBlocking => {
                fill(dtype, send, |i| value(rank_base, i));
                recv.fill(0);
            }
            Op::Barrier => {}
        }
    };
    let call = |c: &mut Communicator, b: &mut Buffers| -> Result<()> {
        let (send, recv) = (&b.send[..bytes], &mut b.recv[..bytes]);
        match op {
            Op::AllReduce => c.all_reduce_into(send, recv, dtype, ReduceOp::Sum),
            Op::AllGather => c.all_gather(&send[..block], recv),
            Op::ReduceScatter => c.reduce_scatter(send, &mut recv[..block], dtype, ReduceOp::Sum),
            Op::Broadcast => c.broadcast(recv, 0),
            Op::Reduce => c.reduce(recv, dtype, ReduceOp::Sum, 0),
            Op::AllToAll => c.all_to_all(send, recv),
            Op::SendRecv => match partner {
                Some(p) => c.p2p_group(&mut [P2p::Send(send, p), P2p::Recv(recv, p)]),
                None => Ok(()),
            },
            Op::SendRecvBlocking => match partner {
                Some(p) => exchange(c, send, recv, p),
                None => Ok(()),
            },
            Op::Barrier => c.barrier(),
        }
    };

    prepare(bufs);
    for _ in 0..warmup(iters) {
        call(comm, bufs)?;
    }
    comm.barrier()?;
    let start = Instant::now();
    for _ in 0..iters {
        call(comm, bufs)?;
    }
    let mine = start.elapsed().as_secs_f64() / iters as f64;

    // The checked call.
    prepare(bufs);
    call(comm, bufs)?;
    let recv = &bufs.recv[..bytes];
    let wrong = match op {
        Op::AllReduce => count_wrong(dtype, recv, |i| ranks_sum + nn * (i % 7) as i64),
        Op::ReduceScatter => count_wrong(dtype, &recv[..block], |i| {
            ranks_sum + nn * ((me * (block / es) + i) % 7) as i64
        }),
        Op::Reduce if me == 0 => count_wrong(dtype, recv, |i| ranks_sum + nn * (i % 7) as i64),
        Op::Reduce => count_wrong(dtype, recv, |i| value(rank_base, i)),
        Op::AllGather => {
            let per = block / es;
            count_wrong(dtype, recv, |i| value((i / per + 1) as i64, i % per))
        }
        Op::Broadcast => count_wrong(dtype, recv, |i| value(1, i)),
        Op::AllToAll => {
            let per = block / es;
            count_wrong(dtype, recv, |i| {
                value((((i / per) * n + me) % 64) as i64, i % per)
            })
        }
        Op::SendRecv | Op::SendRecvBlocking => match partner {
            Some(p) => count_wrong(dtype, recv, |i| value((p + 1) as i64, i)),
            None => 0,
        },
        Op::Barrier => 0,
    };

    // Slowest rank's time (picoseconds fit an i64 for 100 days) and the
    // wrong elements of all ranks.
    let mut stats = ((mine * 1e12) as i64).to_ne_bytes();
    comm.all_reduce(&mut stats, DType::I64, ReduceOp::Max)?;
    let time = i64::from_ne_bytes(stats) as f64 * 1e-12;
    let mut stats = (wrong as i64).to_ne_bytes();
    comm.all_reduce(&mut stats, DType::I64, ReduceOp::Sum)?;
    let wrong = i64::from_ne_bytes(stats) as u64;

    let algbw = if time > 0.0 {
        bytes as f64 / time / 1e9
    } else {
        0.0
    };
    Ok(Some(Row {
        op,
        world: n,
        bytes,
        count,
        dtype,
        redop,
        iters,
        time,
        algbw,
        busbw: algbw * op.bus_factor(n),
        wrong,
    }))
}

/// Bytes exchanged per step of [`exchange`]: what a sender may leave
/// unconsumed without blocking (4 slots).
const EXCHANGE_PIECE: usize = 4 * SLOT;

/// Both partners send `send` and receive into `recv` at once: each step
/// sends one piece that fits in the peer's slots, then receives one.
fn exchange(c: &mut Communicator, send: &[u8], recv: &mut [u8], peer: usize) -> Result<()> {
    for (s, r) in send
        .chunks(EXCHANGE_PIECE)
        .zip(recv.chunks_mut(EXCHANGE_PIECE))
    {
        c.send(s, peer)?;
        c.recv(r, peer)?;
    }
    Ok(())
}

/// The nccl-tests name of a dtype.
fn type_name(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "float",
        DType::F16 => "half",
        DType::BF16 => "bfloat16",
        DType::I32 => "int32",
        DType::I64 => "int64",
        DType::F64 => "double",
        DType::U8 => "uint8",
        DType::Bool => "bool",
    }
}

/// The table header (one line, no newline).
pub fn header() -> String {
    format!(
        "{:>12} {:>10} {:>8} {:>6} {:>7} {:>11} {:>11} {:>11} {:>7}",
        "size(B)",
        "count",
        "type",
        "redop",
        "iters",
        "time(us)",
        "algbw(GB/s)",
        "busbw(GB/s)",
        "#wrong"
    )
}

/// One row of the table (no newline).
pub fn format_row(row: &Row) -> String {
    format!(
        "{:>12} {:>10} {:>8} {:>6} {:>7} {:>11.2} {:>11.3} {:>11.3} {:>7}",
        row.bytes,
        row.count,
        type_name(row.dtype),
        row.redop.map_or("none", ReduceOp::name),
        row.iters,
        row.time * 1e6,
        row.algbw,
        row.busbw,
        row.wrong
    )
}

/// The whole table: the header, then for each operation a `# op` line and
/// its rows, aligned in nccl-tests columns.
pub fn format_table(rows: &[Row]) -> String {
    let mut out = header();
    out.push('\n');
    let mut current = None;
    for row in rows {
        if current != Some(row.op) {
            current = Some(row.op);
            let _ = writeln!(out, "# {}, {} ranks", row.op.name(), row.world);
        }
        out.push_str(&format_row(row));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lists() {
        assert_eq!(
            parse_ops("all_reduce, allgather,Broadcast").unwrap(),
            vec![Op::AllReduce, Op::AllGather, Op::Broadcast]
        );
        assert_eq!(parse_ops("all").unwrap(), Op::ALL.to_vec());
        assert!(parse_ops("allreduse").is_err());
        assert_eq!(
            parse_sizes("4096,64K,1MiB,16m,1GB").unwrap(),
            vec![4096, 64 << 10, 1 << 20, 16 << 20, 1 << 30]
        );
        assert!(parse_sizes("4x").is_err());
        assert_eq!(parse_sizes("1G").unwrap(), vec![MAX_SIZE]);
        for big in ["18446744073709551615", "1000G", "16G", "1073741825"] {
            let e = parse_sizes(big).unwrap_err().to_string();
            assert!(e.contains("--sizes") && e.contains("limit"), "{big}: {e}");
        }
        assert!(parse_sizes("").is_err());
        assert_eq!(parse_dtype("bf16").unwrap(), DType::BF16);
    }

    #[test]
    fn options_that_measure_nothing_are_refused() {
        let with = |ops: &str, sizes: &str, iters: Option<usize>| BenchOptions {
            ops: parse_ops(ops).unwrap(),
            sizes: parse_sizes(sizes).unwrap(),
            dtype: DType::F32,
            iters,
        };
        let refused = |o: BenchOptions, world: usize, needles: &[&str]| {
            let e = o.check(world).unwrap_err().to_string();
            for n in needles {
                assert!(e.contains(n), "{n:?} not in {e:?}");
            }
        };
        refused(with("all", "4K", Some(0)), 2, &["--iters", "0"]);
        refused(
            with("all", "4K", Some(usize::MAX)),
            2,
            &["--iters", "100000"],
        );
        refused(
            with("all_reduce", "1001", None),
            2,
            &["--sizes", "1001", "f32"],
        );
        refused(
            with("all_gather", "4", None),
            2,
            &["--sizes", "all_gather", "8 bytes"],
        );
        refused(with("all_reduce", "0", None), 2, &["--sizes", "0 bytes"]);
        with("all_reduce", "4", Some(1)).check(2).unwrap();
        with("all", "8,1G", Some(MAX_ITERS)).check(2).unwrap();
        with("barrier", "0", None).check(64).unwrap();
    }

    #[test]
    fn iteration_rule_matches_the_mpi_peer() {
        assert_eq!(iterations(4096), 20000);
        assert_eq!(iterations(1 << 20), 1907);
        assert_eq!(iterations(64 << 20), 29);
        assert_eq!(iterations(1 << 30), 20);
        assert_eq!(warmup(20), 5);
        assert_eq!(warmup(1907), 190);
    }

    #[test]
    fn one_rank_is_right() {
        let store = crate::store::MemoryStore::new();
        let mut comm = Communicator::shm(&store, 0, 1).unwrap();
        let options = BenchOptions {
            sizes: vec![4096, 3 << 20],
            iters: Some(2),
            ..BenchOptions::default()
        };
        let rows = run(&mut comm, &options).unwrap();
        assert_eq!(rows.len(), 2 * 8 + 1);
        assert!(rows.iter().all(|r| r.wrong == 0), "{rows:?}");
        let table = format_table(&rows);
        assert!(table.starts_with(&header()));
        assert!(table.contains("# reduce_scatter, 1 ranks"));
    }
}
