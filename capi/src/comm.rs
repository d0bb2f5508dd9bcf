//! The communication layer: a communicator joins a job (from the launcher's
//! environment, as torchrun, srun, mpirun and `polychip launch` set it, or
//! from an explicit rank, world size and rendezvous address), and runs
//! collectives and point-to-point transfers on device tensors of any
//! vendor (device-direct where the memory allows, staged otherwise).

use std::ffi::{CStr, c_char};
use std::sync::Mutex;

use polychip_comm::bootstrap::{self, InitOptions, Job};
use polychip_comm::collectives::{Communicator, ReduceOp};
use polychip_comm::device::{DeviceComm, DeviceP2p, MAX_GROUP, StagingPool};
use polychip_comm::env::RankInfo;

use crate::error::{ApiError, ApiResult, guard, polychip_error_t};
use crate::handle::{Handle, Registry};
use crate::tensor::{polychip_tensor_t, tensor};
use crate::{out_param, struct_prefix};

/// A communicator: this process's place in a job of ranks. Opaque.
#[allow(non_camel_case_types)]
#[derive(Debug)]
pub struct polychip_comm_t {
    _private: [u8; 0],
}

/// A reduction.
pub type polychip_reduce_op_t = u32;
/// Sum.
pub const POLYCHIP_REDUCE_SUM: polychip_reduce_op_t = 0;
/// Sum divided by the number of ranks.
pub const POLYCHIP_REDUCE_AVG: polychip_reduce_op_t = 1;
/// Maximum.
pub const POLYCHIP_REDUCE_MAX: polychip_reduce_op_t = 2;
/// Minimum.
pub const POLYCHIP_REDUCE_MIN: polychip_reduce_op_t = 3;
/// Product (integers wrap). API 1.1.
pub const POLYCHIP_REDUCE_PROD: polychip_reduce_op_t = 4;
/// Bitwise and (integer and bool tensors). API 1.1.
pub const POLYCHIP_REDUCE_BAND: polychip_reduce_op_t = 5;
/// Bitwise or (integer and bool tensors). API 1.1.
pub const POLYCHIP_REDUCE_BOR: polychip_reduce_op_t = 6;
/// Bitwise exclusive or (integer and bool tensors). API 1.1.
pub const POLYCHIP_REDUCE_BXOR: polychip_reduce_op_t = 7;

/// The direction of a `polychip_comm_p2p_t`.
pub type polychip_p2p_kind_t = u32;
/// Sends the tensor to the peer.
pub const POLYCHIP_P2P_SEND: polychip_p2p_kind_t = 0;
/// Receives into the tensor what the peer sends.
pub const POLYCHIP_P2P_RECV: polychip_p2p_kind_t = 1;

/// One send or receive of a `polychip_comm_p2p_group`.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy)]
pub struct polychip_comm_p2p_t {
    /// Size of this struct as the caller knows it (the same in every
    /// element: the array's stride; later minors may append fields).
    pub struct_size: usize,
    /// `POLYCHIP_P2P_SEND` or `POLYCHIP_P2P_RECV`.
    pub kind: polychip_p2p_kind_t,
    /// The rank sent to or received from.
    pub peer: u32,
    /// The tensor sent, or received into (compact).
    pub tensor: *const polychip_tensor_t,
}

/// How to join a job without a launcher's environment.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy)]
pub struct polychip_comm_options_t {
    /// Size of this struct as the caller knows it.
    pub struct_size: usize,
    /// This process's rank, `0..world_size`.
    pub rank: u32,
    /// The number of ranks.
    pub world_size: u32,
    /// Host name or address where rank 0 serves the rendezvous store,
    /// UTF-8, borrowed for the call.
    pub master_addr: *const c_char,
    /// Port of the rendezvous store.
    pub master_port: u16,
}

enum Inner {
    /// The world of a job, with its rendezvous store.
    Job(Job),
    /// A sub-communicator made by `polychip_comm_split`.
    Split(Communicator),
}

struct CommState {
    inner: Inner,
    pool: Option<StagingPool>,
}

/// What a communicator handle holds. Calls on one communicator are
/// serialized by this lock (collectives must be issued in one order on
/// every rank anyway).
pub(crate) struct CommObject {
    state: Mutex<Option<CommState>>,
}

impl std::fmt::Debug for CommObject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommObject").finish_non_exhaustive()
    }
}

pub(crate) static COMMS: Registry<CommObject> = Registry::new(Handle::COMM);

fn give(inner: Inner) -> *mut polychip_comm_t {
    COMMS
        .insert(CommObject {
            state: Mutex::new(Some(CommState { inner, pool: None })),
        })
        .cast()
}

/// Runs `f` with the communicator behind `comm` and a device layer over it.
fn with_comm<T>(
    comm: *const polychip_comm_t,
    f: impl FnOnce(&mut DeviceComm<'_>) -> ApiResult<T>,
) -> ApiResult<T> {
    let object = COMMS.get(comm.cast(), "comm")?;
    let mut guard = object.state.lock().unwrap_or_else(|e| e.into_inner());
    let state = guard
        .as_mut()
        .ok_or_else(|| ApiError::invalid("comm has been destroyed"))?;
    let pool = state.pool.take().unwrap_or_default();
    let communicator = match &mut state.inner {
        Inner::Job(job) => &mut **job,
        Inner::Split(c) => c,
    };
    let mut device = DeviceComm::with_pool(communicator, pool);
    let result = f(&mut device);
    state.pool = Some(device.into_pool());
    result
}

fn reduce_op(op: polychip_reduce_op_t) -> ApiResult<ReduceOp> {
    Ok(match op {
        POLYCHIP_REDUCE_SUM => ReduceOp::Sum,
        POLYCHIP_REDUCE_AVG => ReduceOp::Avg,
        POLYCHIP_REDUCE_MAX => ReduceOp::Max,
        POLYCHIP_REDUCE_MIN => ReduceOp::Min,
        POLYCHIP_REDUCE_PROD => ReduceOp::Prod,
        POLYCHIP_REDUCE_BAND => ReduceOp::BitAnd,
        POLYCHIP_REDUCE_BOR => ReduceOp::BitOr,
        POLYCHIP_REDUCE_BXOR => ReduceOp::BitXor,
        other => {
            return Err(ApiError::invalid(format!(
                "op {other} is not a polychip_reduce_op_t (POLYCHIP_REDUCE_SUM = 0 to POLYCHIP_REDUCE_BXOR = 7)"
            )));
        }
    })
}

/// Joins the job the launcher's environment describes (`RANK`,
/// `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT` as torchrun and `polychip
/// launch` set them; Open MPI's and Slurm's variables; one rank alone when
/// none is set). Every rank of the job must call it.
///
/// Ownership: `*out` is the caller's, freed with `polychip_comm_destroy`.
/// Thread safety: any thread; blocks until every rank has joined or the
/// timeout passes.
///
/// # Safety
/// `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn polychip_comm_init_env(
    out: *mut *mut polychip_comm_t,
) -> *mut polychip_error_t {
    guard("polychip_comm_init_env", || {
        let out = out_param(out, "out")?;
        let job = bootstrap::init()?;
        // SAFETY: checked non-NULL; writable per the contract.
        unsafe { out.write(give(Inner::Job(job))) };
        Ok(())
    })
}

/// Joins a job as `options` say (rank, world size, rendezvous address);
/// the transport and timeouts still follow `POLYCHIP_TRANSPORT` and
/// `POLYCHIP_COMM_TIMEOUT_SECS`.
///
/// Ownership and thread safety: as for `polychip_comm_init_env`.
///
/// # Safety
/// `options` points to a readable struct of its own `struct_size`, with a
/// NUL-terminated `master_addr`; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn polychip_comm_init(
    options: *const polychip_comm_options_t,
    out: *mut *mut polychip_comm_t,
) -> *mut polychip_error_t {
    guard("polychip_comm_init", || {
        let out = out_param(out, "out")?;
        if options.is_null() {
            return Err(ApiError::invalid("options is NULL"));
        }
        let mut o = polychip_comm_options_t {
            struct_size: size_of::<polychip_comm_options_t>(),
            rank: 0,
            world_size: 1,
            master_addr: std::ptr::null(),
            master_port: 0,
        };
        // SAFETY: forwarded contract.
        unsafe { struct_prefix::read(options, &mut o, "options")? };
        if o.world_size == 0 || o.rank >= o.world_size {
            return Err(ApiError::invalid(format!(
                "options->rank {} is not below options->world_size {}",
                o.rank, o.world_size
            )));
        }
        let most = polychip_comm::collectives::MAX_WORLD;
        if o.world_size as usize > most {
            return Err(ApiError::invalid(format!(
                "options->world_size {} is more than the {most} ranks a communicator takes",
                o.world_size
            )));
        }
        let addr = if o.master_addr.is_null() {
            "127.0.0.1".to_owned()
        } else {
            crate::address(o.master_addr, "options->master_addr")?;
            // SAFETY: per the contract, a NUL-terminated string.
            unsafe { CStr::from_ptr(o.master_addr) }
                .to_str()
                .map_err(|_| ApiError::invalid("options->master_addr is not UTF-8"))?
                .to_owned()
        };
        // Refused before the rendezvous, quoted escaped and cut.
        polychip_comm::env::check_host("options->master_addr", &addr).map_err(ApiError::invalid)?;
        let info = RankInfo {
            rank: o.rank as usize,
            world_size: o.world_size as usize,
            local_rank: o.rank as usize,
            local_world_size: o.world_size as usize,
            master_addr: addr,
            master_port: o.master_port,
            launcher: "polychip_comm_init",
        };
        let job = bootstrap::init_with(info, InitOptions::from_env()?)?;
        // SAFETY: checked non-NULL; writable per the contract.
        unsafe { out.write(give(Inner::Job(job))) };
        Ok(())
    })
}

/// This rank and the number of ranks.
///
/// Thread safety: any thread.
///
/// # Safety
/// `rank` and `world_size` are NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn polychip_comm_rank(
    comm: *const polychip_comm_t,
    rank: *mut u32,
    world_size: *mut u32,
) -> *mut polychip_error_t {
    guard("polychip_comm_rank", || {
        let (r, w) = with_comm(comm, |d| {
            let c = d.comm();
            Ok((c.rank() as u32, c.world_size() as u32))
        })?;
        // SAFETY: per the contract, each is NULL or writable.
        unsafe {
            if let Some(p) = rank.as_mut() {
                *p = r;
            }
            if let Some(p) = world_size.as_mut() {
                *p = w;
            }
        }
        Ok(())
    })
}

/// A communicator of the ranks that pass the same `color`, ordered by `key`
/// (then by rank). Every rank of `comm` must call it.
///
/// Ownership: `*out` is the caller's. Thread safety: as for a collective.
///
/// # Safety
/// `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn polychip_comm_split(
    comm: *const polychip_comm_t,
    color: u32,
    key: u32,
    out: *mut *mut polychip_comm_t,
) -> *mut polychip_error_t {
    guard("polychip_comm_split", || {
        let out = out_param(out, "out")?;
        let sub = with_comm(comm, |d| Ok(d.comm().split(color, key)?))?;
        // SAFETY: checked non-NULL; writable per the contract.
        unsafe { out.write(give(Inner::Split(sub))) };
        Ok(())
    })
}

/// Leaves the job: waits at a final barrier with the other ranks (unless
/// the communicator is broken) and closes its connections. A split
/// communicator just closes. NULL is ignored.
///
/// Thread safety: any thread, not concurrently with a call using `comm`.
#[unsafe(no_mangle)]
pub extern "C" fn polychip_comm_destroy(comm: *mut polychip_comm_t) -> *mut polychip_error_t {
    if comm.is_null() {
        return std::ptr::null_mut();
    }
    guard("polychip_comm_destroy", || {
        let object = COMMS.remove(comm.cast(), "comm")?;
        let state = object
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        match state.map(|s| s.inner) {
            Some(Inner::Job(job)) => Ok(job.finish()?),
            Some(Inner::Split(c)) => {
                drop(c);
                Ok(())
            }
            None => Ok(()),
        }
    })
}

/// Refuses a peer rank that `d`'s communicator does not have (the
/// transports index their connections by it).
fn check_peer(d: &mut DeviceComm<'_>, peer: u32, what: &str) -> ApiResult<()> {
    let world = d.comm().world_size();
    if peer as usize >= world {
        return Err(ApiError::invalid(format!(
            "{what} {peer} is not a rank of this communicator (ranks 0 to {})",
            world - 1
        )));
    }
    Ok(())
}

/// Runs a collective inside the panic firewall.
fn collective(
    function: &str,
    comm: *const polychip_comm_t,
    f: impl FnOnce(&mut DeviceComm<'_>) -> ApiResult<()>,
) -> *mut polychip_error_t {
    guard(function, || with_comm(comm, f))
}

// The collectives. Every rank of `comm` calls each, in the same order;
// each returns when this rank's part is done. Thread safety: any thread;
// calls on one communicator are serialized.

/// Reduces `t` across ranks in place.
///
/// Every rank of `comm` calls it, in the same order as the other
/// collectives. Thread safety: any thread; calls on one communicator are
/// serialized.
#[unsafe(no_mangle)]
pub extern "C" fn polychip_comm_all_reduce(
    comm: *const polychip_comm_t,
    t: *const polychip_tensor_t,
    op: polychip_reduce_op_t,
) -> *mut polychip_error_t {
    collective("polychip_comm_all_reduce", comm, |d| {
        Ok(d.all_reduce(&tensor(t, "t")?.tensor, reduce_op(op)?)?)
    })
}

/// Every rank receives the concatenation of every rank's `send` (in rank
/// order) in `recv`, which holds `world_size` times as many elements.
///
/// Every rank of `comm` calls it, in the same order as the other
/// collectives. Thread safety: any thread; calls on one communicator are
/// serialized.
#[unsafe(no_mangle)]
pub extern "C" fn polychip_comm_all_gather(
    comm: *const polychip_comm_t,
    send: *const polychip_tensor_t,
    recv: *const polychip_tensor_t,
) -> *mut polychip_error_t {
    collective("polychip_comm_all_gather", comm, |d| {
        Ok(d.all_gather(&tensor(send, "send")?.tensor, &tensor(recv, "recv")?.tensor)?)
    })
}

/// Reduces `send` across ranks and gives rank `r` the `r`-th of
/// `world_size` equal parts in `recv`.
///
/// Every rank of `comm` calls it, in the same order as the other
/// collectives. Thread safety: any thread; calls on one communicator are
/// serialized.
#[unsafe(no_mangle)]
pub extern "C" fn polychip_comm_reduce_scatter(
    comm: *const polychip_comm_t,
    send: *const polychip_tensor_t,
    recv: *const polychip_tensor_t,
    op: polychip_reduce_op_t,
) -> *mut polychip_error_t {
    collective("polychip_comm_reduce_scatter", comm, |d| {
        Ok(d.reduce_scatter(
            &tensor(send, "send")?.tensor,
            &tensor(recv, "recv")?.tensor,
            reduce_op(op)?,
        )?)
    })
}

/// Copies rank `root`'s `t` into every rank's. A `root` that is no rank of
/// `comm` is refused at once, naming it.
///
/// Every rank of `comm` calls it, in the same order as the other
/// collectives. Thread safety: any thread; calls on one communicator are
/// serialized.
#[unsafe(no_mangle)]
pub extern "C" fn polychip_comm_broadcast(
    comm: *const polychip_comm_t,
    t: *const polychip_tensor_t,
    root: u32,
) -> *mut polychip_error_t {
    collective("polychip_comm_broadcast", comm, |d| {
        check_peer(d, root, "root")?;
        Ok(d.broadcast(&tensor(t, "t")?.tensor, root as usize)?)
    })
}

/// Reduces `t` across ranks into rank `root`'s (the others' are left
/// as they were). A `root` that is no rank of `comm` is refused at once,
/// naming it.
///
/// Every rank of `comm` calls it, in the same order as the other
/// collectives. Thread safety: any thread; calls on one communicator are
/// serialized.
#[unsafe(no_mangle)]
pub extern "C" fn polychip_comm_reduce(
    comm: *const polychip_comm_t,
    t: *const polychip_tensor_t,
    op: polychip_reduce_op_t,
    root: u32,
) -> *mut polychip_error_t {
    collective("polychip_comm_reduce", comm, |d| {
        check_peer(d, root, "root")?;
        Ok(d.reduce(&tensor(t, "t")?.tensor, reduce_op(op)?, root as usize)?)
    })
}

/// Rank `r` sends the `p`-th of `world_size` equal parts of `send` to rank
/// `p`, and receives rank `p`'s `r`-th part into the `p`-th part of `recv`.
///
/// Every rank of `comm` calls it, in the same order as the other
/// collectives. Thread safety: any thread; calls on one communicator are
/// serialized.
#[unsafe(no_mangle)]
pub extern "C" fn polychip_comm_all_to_all(
    comm: *const polychip_comm_t,
    send: *const polychip_tensor_t,
    recv: *const polychip_tensor_t,
) -> *mut polychip_error_t {
    collective("polychip_comm_all_to_all", comm, |d| {
        Ok(d.all_to_all(&tensor(send, "send")?.tensor, &tensor(recv, "recv")?.tensor)?)
    })
}

/// Sends `t` to rank `peer`, which calls `polychip_comm_recv` with a
/// tensor of the same byte size and dtype.
///
/// Every rank of `comm` calls it, in the same order as the other
/// collectives. Thread safety: any thread; calls on one communicator are
/// serialized.
#[unsafe(no_mangle)]
pub extern "C" fn polychip_comm_send(
    comm: *const polychip_comm_t,
    t: *const polychip_tensor_t,
    peer: u32,
) -> *mut polychip_error_t {
    collective("polychip_comm_send", comm, |d| {
        check_peer(d, peer, "peer")?;
        Ok(d.send(&tensor(t, "t")?.tensor, peer as usize)?)
    })
}

/// Receives into `t` what rank `peer` sends: a send of another byte size
/// or dtype is refused, naming both (`POLYCHIP_API_ERROR_INVALID_ARGUMENT`,
/// as for collectives whose ranks disagree).
///
/// Every rank of `comm` calls it, in the same order as the other
/// collectives. Thread safety: any thread; calls on one communicator are
/// serialized.
#[unsafe(no_mangle)]
pub extern "C" fn polychip_comm_recv(
    comm: *const polychip_comm_t,
    t: *const polychip_tensor_t,
    peer: u32,
) -> *mut polychip_error_t {
    collective("polychip_comm_recv", comm, |d| {
        check_peer(d, peer, "peer")?;
        Ok(d.recv(&tensor(t, "t")?.tensor, peer as usize)?)
    })
}

/// Runs `count` sends and receives together, so that ranks that each send
/// before they receive (a swap, a ring, both directions of a pipeline) do
/// not wait on each other, as blocking `polychip_comm_send` and
/// `polychip_comm_recv` of more than 1 MiB would. Operations with the same
/// peer in the same direction are matched in their order in `ops`; a peer
/// takes each send with `polychip_comm_recv` or a group's receive of the
/// same byte size; a send to this rank goes to a receive from this rank, in
/// order. At most 4,096 operations; no receive may share memory with
/// another operation's tensor. Every element's `struct_size` is the same
/// (the array's stride, at least this header's size).
///
/// Thread safety: any thread; calls on one communicator are serialized.
///
/// # Safety
/// `ops` points to `count` readable operations of `ops->struct_size`
/// bytes each (or `count` is 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn polychip_comm_p2p_group(
    comm: *const polychip_comm_t,
    ops: *const polychip_comm_p2p_t,
    count: usize,
) -> *mut polychip_error_t {
    collective("polychip_comm_p2p_group", comm, |d| {
        if count > MAX_GROUP {
            return Err(ApiError::invalid(format!(
                "a group of {count} operations; the most is {MAX_GROUP}"
            )));
        }
        if count > 0 && ops.is_null() {
            return Err(ApiError::invalid(format!("ops is NULL with count {count}")));
        }
        if count > 0 {
            crate::address(ops, "ops")?;
        }
        let mut raw = Vec::with_capacity(count);
        let want = size_of::<polychip_comm_p2p_t>();
        let stride = match count {
            0 => want,
            // SAFETY: the caller's contract: element 0's first field, its
            // `struct_size` (every element's stride), is readable; nothing
            // past it is read before it is checked.
            _ => unsafe { ops.cast::<usize>().read_unaligned() },
        };
        if !(want..=4096).contains(&stride) {
            return Err(ApiError::invalid(format!(
                "ops[0].struct_size is {stride}; this library needs {want} to 4096"
            )));
        }
        for i in 0..count {
            // SAFETY: element `i` of `count` readable elements of `stride`
            // bytes, each starting with this struct's fields.
            let op = unsafe {
                ops.cast::<u8>()
                    .add(i * stride)
                    .cast::<polychip_comm_p2p_t>()
                    .read_unaligned()
            };
            if op.struct_size != stride {
                return Err(ApiError::invalid(format!(
                    "ops[{i}].struct_size is {}, but ops[0]'s is {stride}: every element has the same",
                    op.struct_size
                )));
            }
            raw.push(op);
        }
        let mut handles = Vec::with_capacity(count);
        for (i, op) in raw.iter().enumerate() {
            check_peer(d, op.peer, &format!("ops[{i}].peer"))?;
            handles.push(tensor(op.tensor, &format!("ops[{i}].tensor"))?);
        }
        let group = raw
            .iter()
            .zip(&handles)
            .enumerate()
            .map(|(i, (op, t))| match op.kind {
                POLYCHIP_P2P_SEND => Ok(DeviceP2p::Send(&t.tensor, op.peer as usize)),
                POLYCHIP_P2P_RECV => Ok(DeviceP2p::Recv(&t.tensor, op.peer as usize)),
                other => Err(ApiError::invalid(format!(
                    "ops[{i}].kind is {other}, not a polychip_p2p_kind_t \
                     (POLYCHIP_P2P_SEND = 0, POLYCHIP_P2P_RECV = 1)"
                ))),
            })
            .collect::<ApiResult<Vec<_>>>()?;
        Ok(d.p2p_group(&group)?)
    })
}

/// Waits until every rank has called it.
///
/// Every rank of `comm` calls it, in the same order as the other
/// collectives. Thread safety: any thread; calls on one communicator are
/// serialized.
#[unsafe(no_mangle)]
pub extern "C" fn polychip_comm_barrier(comm: *const polychip_comm_t) -> *mut polychip_error_t {
    collective("polychip_comm_barrier", comm, |d| Ok(d.comm().barrier()?))
}
