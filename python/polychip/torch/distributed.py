"""``torch.distributed``'s ``polychip`` backend: collectives over polychip's
communication layer, on polychip tensors of any vendor's device and on CPU
tensors.

    import torch.distributed as dist, polychip.torch
    dist.init_process_group("polychip")      # under torchrun or polychip launch
    dist.all_reduce(t)                        # t on polychip:N or the CPU

Supported: all-reduce and reduce (sum, avg, max, min), broadcast,
all-gather (list and tensor forms), reduce-scatter (list and tensor forms),
all-to-all (equal splits, list and tensor forms), gather and scatter (over
all-gather and broadcast), the coalesced forms, barrier, send and recv
(queued until the next wait, collective or batch's end, then run together
as one group, so that ranks sending to each other first do not wait on
each other: ``torch.distributed.pipelining`` works);
``DistributedDataParallel`` runs over it with each rank on a different
vendor's device.

Each rank joins polychip's communicator at a port that rank 0 picks and
publishes through PyTorch's store (the store itself holds ``MASTER_PORT``),
on ``MASTER_ADDR`` (default ``127.0.0.1``); the job's secret for it is
``POLYCHIP_JOB_SECRET`` when set, else one that rank 0 publishes through
PyTorch's store. Collectives run when called and
return completed ``Work`` (``wait()`` returns at once; ``get_future()`` is
already resolved with the tensors; a send's or receive's runs the queue), so ``async_op=True`` is accepted but does
not overlap communication with compute. CPU tensors are staged through the
rank's current polychip device; non-contiguous tensors through a contiguous
copy. A collective waits for its peers at most the process group's
``timeout`` (``init_process_group(timeout=...)``; its default, 30 minutes
as for gloo, gives way to ``POLYCHIP_COMM_TIMEOUT_SECS`` when that is set).
"""

import contextlib
import copy
import os
import secrets
import itertools
import socket
import threading
import weakref
from datetime import timedelta
from typing import Any, Callable, Iterator, List, Optional, Sequence

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future

import polychip

from . import _aten

NAME = "polychip"

_OPS = {
    dist.ReduceOp.SUM: "sum",
    dist.ReduceOp.AVG: "avg",
    dist.ReduceOp.MAX: "max",
    dist.ReduceOp.MIN: "min",
    dist.ReduceOp.PRODUCT: "prod",
    dist.ReduceOp.BAND: "band",
    dist.ReduceOp.BOR: "bor",
    dist.ReduceOp.BXOR: "bxor",
}


def _reduce_op(op: Any) -> str:
    for k, v in _OPS.items():
        if op == k:
            return v
    kind = getattr(op, "op", op)  # a ReduceOp object holds its RedOpType
    name = getattr(kind, "name", str(kind))
    raise ValueError(f"the polychip backend does not reduce with ReduceOp.{name} (it has SUM, AVG, MAX, MIN, PRODUCT, BAND, BOR and BXOR)")


def _done(result: Any) -> Any:
    future: torch.futures.Future = torch.futures.Future()
    future.set_result(result)
    return _create_work_from_future(future)


# What a polychip device holds; a CPU tensor of another dtype is staged as
# its bytes (for a move) or widened (for a reduction).
_HELD = frozenset(_aten._NAMES)
# Integers a reduction widens to int32 and narrows back (sums wrap as in
# the narrow type: the low bits of a sum are the sum of the low bits).
_WIDENED = {torch.int8, torch.int16, torch.uint16}


class _Staged:
    """A polychip view of a tensor for the communicator: the tensor itself
    when it is a contiguous polychip tensor, else a contiguous copy on a
    polychip device that ``finish()`` writes back. A tensor of a dtype the
    device's operators do not take (on the CPU, or stored on the device as
    its bytes) travels as its bytes (``reduces`` False) or,
    for a reduction, widened to int32 (int8, int16, uint16; others are
    refused, naming the dtype)."""

    def __init__(self, t: torch.Tensor, writes: bool, reduces: bool = False) -> None:
        if writes and torch._debug_has_internal_overlap(t) == 1:
            # Refused before any rank communicates (gloo and NCCL refuse it
            # too): the result could not be written back.
            raise RuntimeError(
                f"the polychip backend cannot write a collective's result into a tensor of shape "
                f"{list(t.shape)} and strides {list(t.stride())}: it holds some elements more than "
                "once (an expanded view); pass a contiguous tensor (.contiguous() or .clone())"
            )
        self.tensor = t
        self.writes = writes
        self.as_bytes = False
        if t.device.type == NAME and t.is_contiguous() and t.dtype in _HELD:
            self.staged = t
        else:
            device = t.device if t.device.type == NAME else torch.device(NAME, torch.polychip.current_device())
            flat = t
            if t.dtype not in _HELD:
                if reduces and t.dtype not in _WIDENED:
                    raise ValueError(
                        f"the polychip backend does not reduce {t.dtype} tensors (it reduces float32, float16, "
                        "bfloat16, float64, int32, int64, uint8, bool, and int8, int16 and uint16 widened to int32)"
                    )
                if reduces:
                    flat = t.to(torch.int32)
                else:
                    flat, self.as_bytes = t.reshape(-1).contiguous().view(torch.uint8), True
            self.staged = flat.to(device, copy=True, memory_format=torch.contiguous_format)
        self.view = _aten._pc(self.staged)

    def finish(self) -> None:
        if not self.writes or self.staged is self.tensor:
            return
        if self.as_bytes:
            self.tensor.copy_(self.staged.cpu().view(self.tensor.dtype).view(self.tensor.shape))
        else:
            self.tensor.copy_(self.staged)


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


SECRET_VAR = "POLYCHIP_JOB_SECRET"


def _share_job_secret(store: Any, rank: int, timeout: timedelta) -> None:
    """Gives every rank the job's secret for polychip's rendezvous store:
    ``POLYCHIP_JOB_SECRET`` where the launcher set it, else one that rank 0
    draws and publishes through PyTorch's store, so that a job across
    machines needs no setup. Whoever can reach PyTorch's store can read it,
    and could equally disrupt the job through that store: polychip's store
    is then as safe as PyTorch's own (docs/security.md)."""
    if os.environ.get(SECRET_VAR):
        return
    key = "polychip/job_secret"
    if rank == 0:
        store.set(key, secrets.token_hex(16))
    else:
        store.wait([key], timeout)
    os.environ[SECRET_VAR] = store.get(key).decode()


_TIMEOUT_ENV = "POLYCHIP_COMM_TIMEOUT_SECS"
# The longest timeout the communicator takes (a week).
_MAX_TIMEOUT_SECS = 604_800


@contextlib.contextmanager
def _comm_timeout(timeout: timedelta) -> Iterator[None]:
    """The process group's ``timeout`` as the communicator's (which reads
    ``POLYCHIP_COMM_TIMEOUT_SECS`` when it joins): what
    ``init_process_group(timeout=...)`` says, or its default (30 minutes,
    as for gloo) unless ``POLYCHIP_COMM_TIMEOUT_SECS`` is set."""
    default = getattr(dist.constants, "default_pg_timeout", None)
    if timeout is None or (timeout == default and os.environ.get(_TIMEOUT_ENV)):
        yield
        return
    if timeout.total_seconds() <= 0:
        raise ValueError(f"the process group's timeout must be positive, not {timeout}")
    before = os.environ.get(_TIMEOUT_ENV)
    seconds = min(max(timeout.total_seconds(), 0.001), _MAX_TIMEOUT_SECS)
    os.environ[_TIMEOUT_ENV] = repr(seconds)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(_TIMEOUT_ENV, None)
        else:
            os.environ[_TIMEOUT_ENV] = before


class ProcessGroupPolychip(torch._C._distributed_c10d.Backend):
    """One polychip communicator per process group: a ``Backend`` (what
    ``init_process_group`` puts behind a ``ProcessGroup``), so that
    PyTorch finds the group's name and its backend for a device, as
    ``DeviceMesh`` (and FSDP2, DTensor, tensor parallelism) and
    ``batch_isend_irecv`` ask."""

    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta) -> None:
        super().__init__(rank, size)
        host = os.environ.get("MASTER_ADDR", "127.0.0.1")
        _share_job_secret(store, rank, timeout)
        key = "polychip/communicator"
        if rank == 0:
            port = _free_port("0.0.0.0" if host not in ("127.0.0.1", "localhost") else host)
            store.set(key, f"{host}:{port}")
        else:
            store.wait([key], timeout)
        addr, _, port_text = store.get(key).decode().rpartition(":")
        with _comm_timeout(timeout):
            self._comm = polychip.comm.init(rank, size, addr, int(port_text))
        # Sends and receives queued until the next wait, collective or end
        # of a batch: (kind, staged tensor, peer), and each call's work.
        self._pending: List[Any] = []
        self._pending_works: List["_P2PWork"] = []
        # A work may be waited for on another thread than the one queueing.
        self._queue_lock = threading.RLock()
        self._order = next(_BACKEND_ORDER)
        _BACKENDS.add(self)

    def getBackendName(self) -> str:
        return NAME

    # What PyTorch asks a backend it may use (batch_isend_irecv asks
    # `supports_coalescing`, `init_process_group(device_id=...)`
    # `supports_splitting`): the base class's answers ask the Python object
    # again, without end. Of these this backend coalesces sends and
    # receives (below), and does nothing else.
    supports_coalescing = property(lambda self: True)
    supports_splitting = property(lambda self: False)
    supports_shrinking = property(lambda self: False)
    supports_reconfigure = property(lambda self: False)
    supports_abort_hooks = property(lambda self: False)
    supports_completion_hooks = property(lambda self: False)
    supports_tensor_alloc = property(lambda self: False)
    supports_window = property(lambda self: False)

    def _each(
        self, tensors: Sequence[torch.Tensor], writes: bool, fn: Callable[[Any], None], reduces: bool = False
    ) -> None:
        for t in tensors:
            s = _Staged(t, writes, reduces)
            fn(s.view)
            s.finish()

    def allreduce(self, tensors: List[torch.Tensor], opts: Any) -> Any:
        op = _reduce_op(opts.reduceOp)
        self._each(tensors, True, lambda v: self._comm.all_reduce(v, op), reduces=True)
        return _done(tensors)

    def reduce(self, tensors: List[torch.Tensor], opts: Any) -> Any:
        op = _reduce_op(opts.reduceOp)
        self._each(tensors, True, lambda v: self._comm.reduce(v, op, opts.rootRank), reduces=True)
        return _done(tensors)

    def broadcast(self, tensors: List[torch.Tensor], opts: Any) -> Any:
        self._each(tensors, True, lambda v: self._comm.broadcast(v, opts.rootRank))
        return _done(tensors)

    @staticmethod
    def _apart(input: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
        """``input``, or a copy of it where it shares memory with ``output``:
        FSDP gathers and reduce-scatters in place, its own part of
        ``output`` as ``input``, which the communicator refuses."""
        if input.device == output.device and input.untyped_storage().data_ptr() == output.untyped_storage().data_ptr():
            return input.clone()
        return input

    def _gather_into(self, output: torch.Tensor, input: torch.Tensor) -> None:
        input = self._apart(input, output)
        send = _Staged(input, False)
        recv = _Staged(output, True)
        self._comm.all_gather(send.view, recv.view)
        recv.finish()

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        self._gather_into(output, input)
        return _done([output])

    def allgather(self, output_tensors: List[List[torch.Tensor]], input_tensors: List[torch.Tensor], opts: Any) -> Any:
        for outputs, input in zip(output_tensors, input_tensors):
            flat = torch.empty((self.size() * input.numel(),), dtype=input.dtype, device=_home(input))
            self._gather_into(flat, input)
            for o, part in zip(outputs, flat.chunk(self.size())):
                o.copy_(part.view(o.shape))
        return _done(output_tensors)

    def _scatter_from(self, output: torch.Tensor, input: torch.Tensor, op: str) -> None:
        input = self._apart(input, output)
        send = _Staged(input, False, reduces=True)
        recv = _Staged(output, True, reduces=True)
        self._comm.reduce_scatter(send.view, recv.view, op)
        recv.finish()

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> Any:
        self._scatter_from(output, input, _reduce_op(opts.reduceOp))
        return _done([output])

    def reduce_scatter(self, output_tensors: List[torch.Tensor], input_tensors: List[List[torch.Tensor]], opts: Any) -> Any:
        op = _reduce_op(opts.reduceOp)
        for output, inputs in zip(output_tensors, input_tensors):
            flat = torch.cat([i.reshape(-1).to(_home(output)) for i in inputs])
            self._scatter_from(output, flat, op)
        return _done(output_tensors)

    def alltoall_base(
        self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: List[int], input_split_sizes: List[int], opts: Any
    ) -> Any:
        for splits, t in ((output_split_sizes, output), (input_split_sizes, input)):
            if splits and len(set(splits)) > 1:
                raise ValueError(
                    f"the polychip backend's all_to_all takes equal splits; got {list(splits)} for a tensor of "
                    f"{t.shape[0]} rows"
                )
        send = _Staged(input, False)
        recv = _Staged(output, True)
        self._comm.all_to_all(send.view, recv.view)
        recv.finish()
        return _done([output])

    all_to_all_single = alltoall_base

    def alltoall(self, output_tensors: List[torch.Tensor], input_tensors: List[torch.Tensor], opts: Any) -> Any:
        if len({t.numel() for t in [*output_tensors, *input_tensors]}) > 1:
            raise ValueError("the polychip backend's all_to_all takes equal parts")
        home = _home(input_tensors[0])
        send = torch.cat([t.reshape(-1).to(home) for t in input_tensors])
        recv = torch.empty_like(send)
        self.alltoall_base(recv, send, [], [], opts)
        for o, part in zip(output_tensors, recv.chunk(len(output_tensors))):
            o.copy_(part.view(o.shape))
        return _done(output_tensors)

    def allreduce_coalesced(self, tensors: List[torch.Tensor], opts: Any) -> Any:
        return self.allreduce(tensors, opts)

    def all_gather_single_coalesced(self, outputs: List[torch.Tensor], inputs: List[torch.Tensor], opts: Any = None) -> Any:
        for o, i in zip(outputs, inputs):
            self._gather_into(o, i)
        return _done(outputs)

    def reduce_scatter_single_coalesced(self, outputs: List[torch.Tensor], inputs: List[torch.Tensor], opts: Any) -> Any:
        op = _reduce_op(opts.reduceOp)
        for o, i in zip(outputs, inputs):
            self._scatter_from(o, i, op)
        return _done(outputs)

    def gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> Any:
        # An all-gather whose result only the root keeps.
        flat = torch.empty((self.size() * input.numel(),), dtype=input.dtype, device=_home(input))
        self._gather_into(flat, input)
        if self.rank() == opts.rootRank:
            output.copy_(flat.view(output.shape))
        return _done([output])

    def gather(self, output_tensors: List[List[torch.Tensor]], input_tensors: List[torch.Tensor], opts: Any) -> Any:
        for i, input in enumerate(input_tensors):
            flat = torch.empty((self.size() * input.numel(),), dtype=input.dtype, device=_home(input))
            self._gather_into(flat, input)
            if self.rank() == opts.rootRank:
                for o, part in zip(output_tensors[i], flat.chunk(self.size())):
                    o.copy_(part.view(o.shape))
        return _done(output_tensors)

    def scatter(self, output_tensors: List[torch.Tensor], input_tensors: List[List[torch.Tensor]], opts: Any) -> Any:
        # The root's parts, broadcast, each rank keeping its own.
        for i, output in enumerate(output_tensors):
            home = _home(output)
            if self.rank() == opts.rootRank:
                flat = torch.cat([t.reshape(-1).to(home) for t in input_tensors[i]])
            else:
                flat = torch.empty((self.size() * output.numel(),), dtype=output.dtype, device=home)
            self._each([flat], True, lambda v: self._comm.broadcast(v, opts.rootRank))
            output.copy_(flat.chunk(self.size())[self.rank()].view(output.shape))
        return _done(output_tensors)

    # The names torch.distributed uses since 2.10 and those before.
    all_gather_single = _allgather_base
    reduce_scatter_single = _reduce_scatter_base

    def barrier(self, opts: Any = None) -> Any:
        self._comm.barrier()
        return _done(None)

    def start_coalescing(self) -> None:
        """Starts a coalescing block (``batch_isend_irecv`` runs its
        operations in one). Sends and receives are queued anyway (below);
        ``end_coalescing`` runs what is queued."""

    def end_coalescing(self) -> Any:
        """Runs the sends and receives queued so far (of every group, as a
        wait does); returns a completed ``Work``."""
        _flush_all(self)
        return _done(None)

    def _flush(self) -> None:
        """Runs every queued send and receive as one group
        (``polychip_comm_p2p_group``: whichever can move does, so that
        ranks that each send before they receive do not wait on each
        other); completes their works, or fails them all with its error."""
        with self._queue_lock:
            if not self._pending:
                return
            queued, self._pending = self._pending, []
            works, self._pending_works = self._pending_works, []
            self._run_group(queued, works)

    def _run_group(self, queued: List[Any], works: List["_P2PWork"]) -> None:
        try:
            self._comm.p2p_group([(kind, staged.view, peer) for kind, staged, peer in queued])
            for _, staged, _ in queued:
                staged.finish()
        except BaseException as e:
            # The works keep a copy without the traceback: the traceback's
            # frames hold this backend, and a future holding them through
            # PyTorch's C++ would keep the communicator from closing at
            # destroy_process_group (its peers then wait at their final
            # barrier for the whole timeout).
            kept = _bare(e)
            for work in works:
                work._future.set_exception(kept)
                work._backend = None
            raise
        for work in works:
            work._future.set_result(work._tensors)
            # A finished work needs its backend no more (one a caller keeps
            # must not keep the communicator open).
            work._backend = None

    def _p2p(self, kind: str, tensors: List[torch.Tensor], peer: int) -> Any:
        if len(self._pending) + len(tensors) > _MAX_GROUP:
            # A group takes at most 4,096 operations: run what is queued.
            self._flush()
        # Queued, as NCCL's and gloo's sends and receives return before
        # they are done: the data moves at the next wait, collective or
        # batch's end, all queued operations together. A polychip tensor
        # is sent as it is then (do not change it before the wait, as with
        # any backend); another (a CPU tensor, a strided view) is copied now.
        staged = [(kind, _Staged(t, kind == "recv"), peer) for t in tensors]
        work = _P2PWork(self, tensors)
        with self._queue_lock:
            self._pending.extend(staged)
            self._pending_works.append(work)
        return work

    def send(self, tensors: List[torch.Tensor], dst: int, tag: int = 0) -> Any:
        return self._p2p("send", tensors, dst)

    def recv(self, tensors: List[torch.Tensor], src: int, tag: int = 0) -> Any:
        return self._p2p("recv", tensors, src)

    def recv_anysource(self, tensors: List[torch.Tensor], tag: int = 0) -> Any:
        raise ValueError("the polychip backend receives from a named rank only (recv with src=)")


def _bare(e: BaseException) -> BaseException:
    """A copy of ``e`` without its traceback or chained exceptions."""
    try:
        kept = copy.copy(e)
    except Exception:
        kept = RuntimeError(str(e))
    kept.__traceback__ = kept.__context__ = kept.__cause__ = None
    return kept


# The most operations one group takes (``polychip_comm_p2p_group``).
_MAX_GROUP = 4096

# Every live backend of this process, in the order they were made: a wait
# or a collective on one group runs the queues of all (a send queued on one
# group may be what a peer waits for before it answers on another).
_BACKENDS: "weakref.WeakSet[ProcessGroupPolychip]" = weakref.WeakSet()
_BACKEND_ORDER = itertools.count()


def _flush_all(own: "ProcessGroupPolychip") -> None:
    """Runs every group's queue, ``own``'s raising its error; another
    group's error is its own works' to raise (they hold it)."""
    for backend in sorted(list(_BACKENDS), key=lambda b: b._order):
        if backend is own:
            backend._flush()
            continue
        try:
            backend._flush()
        except Exception:
            pass


class _P2PWork(torch._C._distributed_c10d.Work):
    """A queued send or receive: ``wait()`` (and ``get_future()``) runs
    every operation its backend has queued, as one group, and raises what
    that group raised. ``is_completed()`` says False, as for the backend's
    other works (PyTorch's wrapper does not ask a Python work)."""

    def __init__(self, backend: "ProcessGroupPolychip", tensors: List[torch.Tensor]) -> None:
        super().__init__()
        self._backend: Optional["ProcessGroupPolychip"] = backend
        self._tensors = tensors
        self._future: torch.futures.Future = torch.futures.Future()

    def wait(self, timeout: Any = None) -> bool:
        backend = self._backend  # None once the work is done
        if backend is not None:
            _flush_all(backend)
        self._future.wait()  # raises the group's error
        return True

    def get_future(self) -> torch.futures.Future:
        backend = self._backend  # None once the work is done
        if backend is not None:
            _flush_all(backend)
        return self._future


def _flushing(method: Callable) -> Callable:
    """``method`` after the queued sends and receives (of every group): a
    collective keeps its place after them, as on the other backends."""

    def run(self: "ProcessGroupPolychip", *args: Any, **kwargs: Any) -> Any:
        _flush_all(self)
        return method(self, *args, **kwargs)

    run.__name__, run.__doc__ = method.__name__, method.__doc__
    return run


for _name in (
    "allreduce", "reduce", "broadcast", "_allgather_base", "allgather", "_reduce_scatter_base", "reduce_scatter",
    "alltoall_base", "all_to_all_single", "alltoall", "allreduce_coalesced", "all_gather_single_coalesced",
    "reduce_scatter_single_coalesced", "gather_single", "gather", "scatter", "all_gather_single",
    "reduce_scatter_single", "barrier",
):
    setattr(ProcessGroupPolychip, _name, _flushing(getattr(ProcessGroupPolychip, _name)))


def _home(t: torch.Tensor) -> torch.device:
    """Where a collective assembles its whole from parts of ``t``: ``t``'s
    polychip device, the current one for a CPU tensor the device holds, or
    the CPU for one it does not (staged as bytes or widened, by part)."""
    if t.device.type == NAME:
        return t.device
    if t.dtype not in _HELD:
        return t.device
    return torch.device(NAME, torch.polychip.current_device())


def _create(store: Any, rank: int, size: int, timeout: timedelta) -> ProcessGroupPolychip:
    return ProcessGroupPolychip(store, rank, size, timeout)


def register() -> None:
    """Registers the backend with torch.distributed (once per process;
    ``import polychip.torch`` does it)."""
    if NAME in dist.Backend.backend_list:
        return
    dist.Backend.register_backend(NAME, _create, devices=[NAME, "cpu"])


def device_for_rank(rank: Optional[int] = None, vendors: Optional[Sequence[str]] = None) -> torch.device:
    """A polychip device for this rank: with ``vendors``, the first device of
    ``vendors[rank % len(vendors)]``; else device ``rank % device_count``.
    Also makes it the current device."""
    from . import device_count, device_info

    r = dist.get_rank() if rank is None else rank
    if vendors:
        want = vendors[r % len(vendors)]
        index = next((i for i in range(device_count()) if device_info(i)["vendor"] == want), None)
        if index is None:
            raise ValueError(f"no polychip device of vendor {want!r} in this process")
    else:
        index = r % device_count()
    torch.polychip.set_device(index)
    return torch.device(NAME, index)
