"""The aten operators that run on ABI 1.4's operators: ``gather``,
``scatter_add``, ``index_select`` and ``index_add`` (a ``gather`` and a
``scatter_add`` whose index is one line expanded by zero strides),
advanced indexing by integer tensors (``index.Tensor`` and the
accumulating ``index_put_``, as one ``gather`` or ``scatter_add`` along
the indexed dimension), ``cumsum``, ``any``/``all``, ``isneginf``/
``isposinf`` (a 1.3 comparison) and the bitwise operators (``bitwise_not``
as ``xor`` with all ones). On a plugin whose table lacks a slot (ABI 1.3 or
older) each falls back to the CPU, counted, as before."""

from typing import Any, List, Optional, Sequence, Tuple

import torch

from polychip import errors, ops

from ._aten import _NAMES, _broadcast, _check_overlap, _empty, _fallback, _impl, _on_device, _pc, _runs, _write_into

aten = torch.ops.aten

_INDEX = (torch.int32, torch.int64)


def _dim(dim: int, ndim: int) -> int:
    """``dim`` counted from 0, or PyTorch's IndexError naming the range
    (a 0-d tensor takes -1 and 0). A dimension out of range reached the
    plugin, whose refusal was raised as an index out of range, until
    hostile sweep 6."""
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {dim})")
    return dim + n if dim < 0 else dim


def _out_of_bounds(error: type, checks: Sequence[Tuple[torch.Tensor, int, int]], negative: bool) -> None:
    """Raises ``error`` as PyTorch's CPU words it for the first index of
    ``checks`` (index tensor, its dimension, that dimension's size) outside
    ``[0, n)``, or ``[-n, n)`` where ``negative`` indices count from the end."""
    for index, dim, n in checks:
        flat = index.reshape(-1).to("cpu", torch.int64)
        bad = flat[((flat < -n) if negative else (flat < 0)) | (flat >= n)]
        if bad.numel():
            raise error(f"index {int(bad[0])} is out of bounds for dimension {dim} with size {n}")


def _runs_or_refused(
    name: str, device: torch.device, call: Any, error: type, checks: Sequence[Tuple[torch.Tensor, int, int]]
) -> bool:
    """``_runs``, with an index the plugin refuses as out of range raised as
    PyTorch's CPU raises it (``error``: a RuntimeError from ``gather`` and
    ``scatter_add``, an IndexError from indexing, naming the index, the
    dimension and its size): until hostile sweep 6 every one was an
    IndexError quoting the plugin."""
    try:
        return _runs(name, device, call)
    except errors.InvalidArgument as e:
        # Indexing counts negative indices from the end; gather and
        # scatter_add refuse them.
        _out_of_bounds(error, checks, error is IndexError)
        raise IndexError(f"index out of range in self ({e})") from None


# ------------------------------------------------------------ gather, scatter


def _index_fits(data: torch.Tensor, index: torch.Tensor, dim: int) -> bool:
    return index.dim() == data.dim() and all(
        d == dim or i <= n for d, (i, n) in enumerate(zip(index.shape, data.shape))
    )


def _gather(
    self: torch.Tensor, dim: int, index: torch.Tensor, error: type = RuntimeError, checks: Optional[List[Tuple[torch.Tensor, int, int]]] = None
) -> Optional[torch.Tensor]:
    """``self.gather(dim, index)`` on the plugin, or None (nothing run);
    an index out of range raises ``error`` naming the first of ``checks``
    (index tensor, dimension, size) out of range (default: ``index``)."""
    if (
        not _on_device(self, index)
        or index.device != self.device
        or index.dtype not in _INDEX
        or _NAMES.get(self.dtype) not in ops.DTYPES["gather"]
        or self.dim() == 0
        or not _index_fits(self, index, dim)
    ):
        return None
    result = _empty(index.shape, self.dtype, self)
    if result.numel() == 0:
        return result
    call = lambda: ops.gather(_pc(self), _pc(index), _pc(result), dim)  # noqa: E731
    if not _runs_or_refused("gather", self.device, call, error, checks or [(index, dim, self.shape[dim])]):
        return None
    return result


@_impl("gather.out")
def _gather_out(self: torch.Tensor, dim: int, index: torch.Tensor, sparse_grad: bool = False, *, out: torch.Tensor) -> torch.Tensor:
    _check_overlap(out, self, index)
    result = None if sparse_grad else _gather(self, _dim(dim, self.dim()), index)
    if result is None:
        return _fallback(aten.gather.out, self, dim, index, sparse_grad=sparse_grad, out=out)
    return _write_into(out, result)


def _scatter_add_into(
    dst: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor, error: type = RuntimeError, checks: Optional[List[Tuple[torch.Tensor, int, int]]] = None
) -> bool:
    """``dst.scatter_add_(dim, index, src)`` on the plugin (``src`` cut to
    ``index``'s shape, as PyTorch reads it); False, nothing run, where it
    cannot."""
    if (
        not _on_device(dst, index, src)
        or len({dst.device, index.device, src.device}) != 1
        or index.dtype not in _INDEX
        or src.dtype != dst.dtype
        or _NAMES.get(dst.dtype) not in ops.DTYPES["scatter_add"]
        or dst.dim() == 0
        or not _index_fits(dst, index, dim)
        or src.dim() != index.dim()
        or any(i > s for i, s in zip(index.shape, src.shape))
    ):
        return False
    if index.numel() == 0:
        return True
    part = src[tuple(slice(0, n) for n in index.shape)]
    if part.untyped_storage().data_ptr() == dst.untyped_storage().data_ptr():
        part = part.clone()
    call = lambda: ops.scatter_add(_pc(dst), _pc(index), _pc(part), dim)  # noqa: E731
    return _runs_or_refused("scatter_add", dst.device, call, error, checks or [(index, dim, dst.shape[dim])])


@_impl("scatter_add.out")
def _scatter_add_out(self: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
    d = _dim(dim, self.dim())
    if _on_device(self) and self.dim() > 0:
        result = self.clone()
        if _scatter_add_into(result, d, index, src):
            return _write_into(out, result)
    return _fallback(aten.scatter_add.out, self, dim, index, src, out=out)


@_impl("scatter_add_")
def _scatter_add_(self: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    # As the CPU: no source or index over the destination, even exactly
    # (`x.scatter_add_(0, i, x)` was computed from a clone).
    if _on_device(self):
        _check_overlap(self, src, index, exact_too=True)
    if self.dim() > 0 and _scatter_add_into(self, _dim(dim, self.dim()), index, src):
        return self
    return _fallback(aten.scatter_add_.default, self, dim, index, src)


def _line(index: torch.Tensor, dim: int, shape: List[int]) -> torch.Tensor:
    """A 1-D ``index`` laid along ``dim`` of ``shape`` by zero strides: the
    index ``gather`` reads as ``index_select``'s and ``scatter_add`` as
    ``index_add``'s (no copy)."""
    view = [1] * len(shape)
    view[dim] = index.numel()
    return index.reshape(view).expand(*shape)


class _Refused(Exception):
    """An index the plugin refused: nothing was written, and the CPU, run
    instead, raises its own error in its own words (``index_select`` and
    ``index_add`` word theirs by operator and dimension)."""


def _index_select(self: torch.Tensor, dim: int, index: torch.Tensor) -> Optional[torch.Tensor]:
    """``self.index_select(dim, index)`` as one ``gather``, or None (nothing
    run: a 0-d ``self``, an index of more than one dimension, on another
    device or of another dtype, or out of range, go to the CPU, which
    raises as it does)."""
    if self.dim() == 0 or index.dim() > 1 or not _on_device(self, index):
        return None
    d = _dim(dim, self.dim())
    shape = list(self.shape)
    shape[d] = index.numel()
    try:
        return _gather(self, d, _line(index.reshape(-1), d, shape), error=_Refused)
    except _Refused:
        return None


@_impl("index_select")
def _index_select_functional(self: torch.Tensor, dim: int, index: torch.Tensor) -> torch.Tensor:
    result = _index_select(self, dim, index)
    if result is None:
        return _fallback(aten.index_select.default, self, dim, index)
    return result


@_impl("index_select.out")
def _index_select_out(self: torch.Tensor, dim: int, index: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
    _check_overlap(out, self, index, exact_too=True)
    result = _index_select(self, dim, index)
    if result is None:
        return _fallback(aten.index_select.out, self, dim, index, out=out)
    return _write_into(out, result)


@_impl("index_add.out")
def _index_add_out(
    self: torch.Tensor, dim: int, index: torch.Tensor, source: torch.Tensor, *, alpha: Any = 1, out: torch.Tensor
) -> torch.Tensor:
    """``index_add`` (and ``index_add_``, which PyTorch runs through it) as
    one ``scatter_add`` into a copy of ``self``; shapes PyTorch refuses, an
    ``alpha`` other than 1, a 0-d ``self`` and indices out of range go to
    the CPU, which raises as it does."""
    _check_overlap(out, index, source, exact_too=True)
    if _on_device(self, index, source) and self.dim() > 0 and index.dim() <= 1 and isinstance(alpha, (int, float)) and alpha == 1:
        d = _dim(dim, self.dim())
        same_shape = source.dim() == self.dim() and all(
            k == d or source.shape[k] == self.shape[k] for k in range(self.dim())
        )
        if same_shape and source.shape[d] == index.numel():
            result = self.clone()
            line = _line(index.reshape(-1), d, list(source.shape))
            try:
                if _scatter_add_into(result, d, line, source, error=_Refused):
                    return _write_into(out, result)
            except _Refused:
                pass
    return _fallback(aten.index_add.out, self, dim, index, source, alpha=alpha, out=out)


# ------------------------------------------------------------ advanced indexing


def _flat_index(self: torch.Tensor, indices: Sequence[Optional[torch.Tensor]]) -> Optional[Tuple[torch.Tensor, int, torch.Tensor, List[int]]]:
    """Advanced indexing by adjacent integer tensors as one index along one
    dimension: ``(flat, p, index, shape)`` where ``flat`` is a view of
    ``self`` with the indexed dimensions merged into dimension ``p``,
    ``index`` the merged positions (negative ones counted from the end, as
    PyTorch counts them), expanded over ``flat``'s other dimensions, and
    ``shape`` the result's shape. None where that does not apply (bool
    masks, indices apart, a view that cannot merge)."""
    given = [i for i, x in enumerate(indices) if x is not None]
    if not given or given != list(range(given[0], given[-1] + 1)) or len(indices) > self.dim():
        return None
    tensors = [indices[i] for i in given]
    if not all(isinstance(t, torch.Tensor) and t.dtype in _INDEX for t in tensors):
        return None
    if not _on_device(self, *tensors) or len({self.device, *(t.device for t in tensors)}) != 1:
        return None
    p, k = given[0], len(given)
    sizes = list(self.shape[p : p + k])
    if any(n == 0 for n in sizes) or self.numel() == 0:
        return None
    try:
        broadcast = torch.broadcast_tensors(*tensors)
    except RuntimeError:
        return None
    lead, rest = list(self.shape[:p]), list(self.shape[p + k :])
    merged = 1
    for n in sizes:
        merged *= n
    try:
        flat = self.view(lead + [merged] + rest)
    except RuntimeError:
        return None
    if k > 1 and any(bool(((t < -n) | (t >= n)).any()) for t, n in zip(tensors, sizes)):
        # Merged, an index past its own dimension can land inside the
        # merged one (`x[[0], [9]]` of a 3 x 4 `x` read x[2, 1] until
        # hostile sweep 6): refused first, as the CPU refuses it.
        _out_of_bounds(IndexError, _given(self, indices), True)
    position = None
    stride = 1
    for t, n in reversed(list(zip(broadcast, sizes))):
        t = t.to(torch.int64)
        t = torch.where(t < 0, t + n, t)
        term = t * stride if stride != 1 else t
        position = term if position is None else position + term
        stride *= n
    count = position.numel()
    index = position.reshape(-1).view([1] * p + [count] + [1] * len(rest)).expand(lead + [count] + rest)
    return flat, p, index, lead + list(position.shape) + rest


def _given(self: torch.Tensor, indices: Sequence[Optional[torch.Tensor]]) -> List[Tuple[torch.Tensor, int, int]]:
    """(index tensor, its place among the index tensors, the size of the
    dimension it indexes) of each index tensor given: PyTorch's CPU names
    an index out of range by that place ("dimension 0" for ``x[:, i]``)."""
    given = [(t, self.shape[i]) for i, t in enumerate(indices) if t is not None]
    return [(t, k, n) for k, (t, n) in enumerate(given)]


def _on_self(self: torch.Tensor, indices: Sequence[Optional[torch.Tensor]]) -> List[Optional[torch.Tensor]]:
    """The index tensors on ``self``'s device: PyTorch's advanced indexing
    takes CPU indices (``logits[torch.arange(n), labels]``) on any device."""
    if not _on_device(self):
        return list(indices)
    return [t.to(self.device) if isinstance(t, torch.Tensor) and t.device.type == "cpu" else t for t in indices]


@_impl("index.Tensor_out")
def _index_out(self: torch.Tensor, indices: List[Optional[torch.Tensor]], *, out: torch.Tensor) -> torch.Tensor:
    indices = _on_self(self, indices)
    plan = _flat_index(self, indices)
    if plan is not None:
        flat, p, index, shape = plan
        result = _gather(flat, p, index, IndexError, _given(self, indices))
        if result is not None:
            return _write_into(out, result.view(shape))
    return _fallback(aten.index.Tensor_out, self, indices, out=out)


@_impl("_index_put_impl_")
def _index_put_impl_(
    self: torch.Tensor, indices: List[Optional[torch.Tensor]], values: torch.Tensor, accumulate: bool = False, unsafe: bool = False
) -> torch.Tensor:
    # The accumulating form (autograd's backward of indexing): one
    # scatter_add. Assignment (duplicates: one of them wins) stays on the CPU.
    indices = _on_self(self, indices)
    plan = _flat_index(self, indices) if accumulate else None
    if plan is not None and isinstance(values, torch.Tensor) and values.dtype == self.dtype:
        flat, p, index, shape = plan
        try:
            src = values.expand(shape).reshape(index.shape)
        except RuntimeError:
            src = None
        if src is not None and _scatter_add_into(flat, p, index, src.contiguous(), IndexError, _given(self, indices)):
            return self
    return _fallback(aten._index_put_impl_.default, self, indices, values, accumulate, unsafe)


# ------------------------------------------------------------------ cumsum


@_impl("cumsum.out")
def _cumsum_out(self: torch.Tensor, dim: int, dtype: Optional[torch.dtype] = None, *, out: torch.Tensor) -> torch.Tensor:
    op = aten.cumsum.out
    _check_overlap(out, self)
    want = out.dtype
    if not _on_device(self, out) or _NAMES.get(want) not in ops.DTYPES["cumsum"] or (dtype is not None and dtype != want):
        return _fallback(op, self, dim, dtype=dtype, out=out)
    x = self if self.dim() > 0 else self.reshape(1)
    d = _dim(dim, x.dim())
    if self.dtype != want:
        x = x.to(want)
    result = _empty(x.shape, want, x)
    if result.numel() > 0 and not _runs("cumsum", x.device, lambda: ops.cumsum(_pc(x), _pc(result), d)):
        return _fallback(op, self, dim, dtype=dtype, out=out)
    return _write_into(out, result.reshape(self.shape))


# ------------------------------------------------------------------ any, all


def _reduce_bool(name: str, self: torch.Tensor, dims: Optional[Sequence[int]], keepdim: bool) -> Optional[torch.Tensor]:
    """``any``/``all`` of ``self`` over ``dims`` (None: every dimension) on
    the plugin, or None."""
    if not _on_device(self) or _NAMES.get(self.dtype) not in ops.DTYPES[name]:
        return None
    if dims is not None:
        # As the CPU: dims in range, none twice (a repeated dim was reduced
        # once, an empty list reduced every dim where the CPU reduces none,
        # until hostile sweep 6: that case goes to the CPU).
        seen = set()
        for d in dims:
            k = _dim(d, self.dim())
            if k in seen:
                raise RuntimeError(f"dim {k} appears multiple times in the list of dims")
            seen.add(k)
        if not dims:
            return None
    if dims is None or self.dim() == 0:
        x = self.reshape(-1)
        result = _empty((), torch.bool, self)
        call = lambda: getattr(ops, name)(_pc(x), _pc(result), 0, False)  # noqa: E731
        if not _runs(name, self.device, call):
            return None
        return result.reshape([1] * self.dim()) if keepdim else result
    x = self
    for d in sorted({_dim(d, self.dim()) for d in dims}, reverse=True):
        shape = [n for i, n in enumerate(x.shape) if i != d or keepdim]
        if keepdim:
            shape[d] = 1
        result = _empty(shape, torch.bool, x)

        def call(source: torch.Tensor = x, result: torch.Tensor = result, d: int = d) -> None:
            getattr(ops, name)(_pc(source), _pc(result), d, keepdim)

        if not _runs(name, self.device, call):
            return None
        x = result
    return x


def _register_reduce_bool(name: str) -> None:
    by_dim = getattr(aten, name)

    def reduce(self: torch.Tensor, dims: Optional[Sequence[int]], keepdim: bool, out: torch.Tensor) -> Optional[torch.Tensor]:
        # The CPU refuses an ``out`` neither bool nor uint8 (the device
        # wrote 1.0 into a float one until hostile sweep 6).
        if out.dtype not in (torch.bool, torch.uint8):
            return None
        return _reduce_bool(name, self, dims, keepdim)

    def dim_out(self: torch.Tensor, dim: int, keepdim: bool = False, *, out: torch.Tensor) -> torch.Tensor:
        result = reduce(self, [dim], keepdim, out)
        if result is None:
            return _fallback(by_dim.out, self, dim, keepdim, out=out)
        return _write_into(out, result)

    def dims_out(self: torch.Tensor, dim: Optional[List[int]] = None, keepdim: bool = False, *, out: torch.Tensor) -> torch.Tensor:
        result = reduce(self, dim, keepdim, out)
        if result is None:
            return _fallback(by_dim.dims_out, self, dim, keepdim, out=out)
        return _write_into(out, result)

    def all_out(self: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
        result = reduce(self, None, False, out)
        if result is None:
            return _fallback(by_dim.all_out, self, out=out)
        return _write_into(out, result)

    _impl(f"{name}.out")(dim_out)
    _impl(f"{name}.dims_out")(dims_out)
    _impl(f"{name}.all_out")(all_out)


_register_reduce_bool("any")
_register_reduce_bool("all")


# ------------------------------------------------------ isneginf, isposinf


def _register_isinf(name: str, value: float) -> None:
    op = getattr(aten, name).out

    def kernel(self: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
        # A floating tensor against a 0-d infinity: `eq` (ABI 1.3); an
        # integer or bool tensor holds no infinity.
        if not _on_device(self):
            return _fallback(op, self, out=out)
        if self.dtype not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
            if self.dtype not in _NAMES:
                return _fallback(op, self, out=out)
            return _write_into(out, torch.zeros(self.shape, dtype=torch.bool, device=self.device))
        result = _empty(self.shape, torch.bool, self)
        inf = torch.full((), value, dtype=self.dtype, device=self.device)
        if result.numel() > 0 and not _runs("eq", self.device, lambda: ops.eq(_pc(self), _pc(inf), _pc(result))):
            return _fallback(op, self, out=out)
        return _write_into(out, result)

    _impl(f"{name}.out")(kernel)


_register_isinf("isneginf", float("-inf"))
_register_isinf("isposinf", float("inf"))


# ------------------------------------------------------------------ bitwise


def _bitwise(name: str, a: torch.Tensor, b: torch.Tensor) -> Optional[torch.Tensor]:
    """``a OP b`` on the plugin (one dtype, integer or bool), or None."""
    if not _on_device(a, b) or a.device != b.device or a.dtype != b.dtype or _NAMES.get(a.dtype) not in ops.DTYPES[name]:
        return None
    try:
        shape = _broadcast(a.shape, b.shape)
    except RuntimeError:
        return None
    result = _empty(shape, a.dtype, a)
    if result.numel() > 0 and not _runs(name, a.device, lambda: getattr(ops, name)(_pc(a), _pc(b), _pc(result))):
        return None
    return result


def _register_bitwise(name: str) -> None:
    op = getattr(aten, name).Tensor_out

    def kernel(self: torch.Tensor, other: Any, *, out: torch.Tensor) -> torch.Tensor:
        if not isinstance(other, torch.Tensor):
            # A Python number (`x & 3`: the dispatcher hands the wrapped
            # number over as one), which the CPU's kernel takes as a 0-d
            # tensor: it raised "Expected a value of type 'Tensor'" until
            # hostile sweep 6.
            other = torch.tensor(other)
        result = _bitwise(name, self, other)
        if result is None:
            return _fallback(op, self, other, out=out)
        return _write_into(out, result)

    _impl(f"{name}.Tensor_out")(kernel)


for _name in ("bitwise_and", "bitwise_or", "bitwise_xor"):
    _register_bitwise(_name)


@_impl("bitwise_not.out")
def _bitwise_not_out(self: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
    # xor with all ones (-1), or with true for bool.
    result = None
    if _on_device(self) and self.dtype in (torch.int32, torch.int64, torch.uint8, torch.bool):
        ones = torch.full((), True if self.dtype == torch.bool else -1 if self.dtype != torch.uint8 else 255, dtype=self.dtype, device=self.device)
        result = _bitwise("bitwise_xor", self, ones)
    if result is None:
        return _fallback(aten.bitwise_not.out, self, out=out)
    return _write_into(out, result)
