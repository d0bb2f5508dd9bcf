"""The aten operators that run on the plugins.

Each kernel below is registered for PyTorch's PrivateUse1 key (the
``polychip`` device) under the aten names in its ``@_impl(...)``; autograd's
formulas call the same aten operators, so backward passes land here too.
A kernel takes typed views of its tensors (``_pc``: no copy, any strides),
allocates outputs on the device, and calls ``polychip.ops.<op>`` once or a
few times. Where the plugins cannot do a case (a dtype outside the
operator's ``polychip.ops.DTYPES``, an option the operator lacks), the kernel
says so through ``_fallback``: the call runs on the CPU, counted under the
aten operator's name, or raises under strict mode. Nothing else falls back.

``REGISTERED`` lists every aten name registered here; ``BASICS`` those the
C++ half registers (allocation, views, copies and casts, fill, scalar
reads). The test suite's per-operator test is generated from both.
``ADJUSTED`` lists operators composed here of other operators, with no
plugin operator of their own: those CUDA has that the CPU lacks or refuses
for these inputs (integer histograms, synchronized batch norm's
statistics), dropout, whose mask is drawn from the device's generator,
batch norm, run under the name whose schema says it updates the running
statistics, and det and slogdet, whose fallback hands the CPU a matrix as
contiguous as the device's (their backward depends on it).
"""

import itertools
import math
import numbers
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch.utils._pytree import tree_map

from polychip import _native, errors, ops

from . import _native_backend as _C
from . import _runtime as _RT

aten = torch.ops.aten

REGISTERED: set = set()
ADJUSTED: set = set()
BASICS = (
    "empty.memory_format",
    "empty_strided",
    "as_strided",
    "resize_",
    "_reshape_alias",
    "_copy_from",
    "_copy_from_and_resize",
    "_local_scalar_dense",
    "set_.source_Tensor",
    "set_.source_Storage",
    "set_.source_Storage_storage_offset",
    "view",
    "fill_.Scalar",
    "fill_.Tensor",
    "zero_",
    "_has_compatible_shallow_copy_type",
)

_lib = torch.library.Library("aten", "IMPL")  # noqa: TOR901 - a backend's kernels
_DEVICE = "polychip"

_NAMES = {
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float64: "float64",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.uint8: "uint8",
    torch.bool: "bool",
}
_FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


# Calls of each registered kernel, and (while ``profile`` is on) seconds;
# TOTALS: time in outermost kernels (a kernel may call others), and the
# C++ half's plugin time within them.
CALLS: Dict[str, int] = {}
SECONDS: Dict[str, float] = {}
TOTALS = {"kernels": 0.0, "kernels_plugin": 0.0}
PROFILING = [False]
_DEPTH = [0]


def _counted(name: str, fn: Callable) -> Callable:
    CALLS[name] = 0
    SECONDS[name] = 0.0

    def kernel(*args: Any, **kwargs: Any) -> Any:
        CALLS[name] += 1
        if not PROFILING[0]:
            return fn(*args, **kwargs)
        outermost = _DEPTH[0] == 0
        _DEPTH[0] += 1
        plugin = _C.plugin_seconds() if outermost else 0.0
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            took = time.perf_counter() - start
            _DEPTH[0] -= 1
            SECONDS[name] += took
            if outermost:
                TOTALS["kernels"] += took
                TOTALS["kernels_plugin"] += _C.plugin_seconds() - plugin

    kernel.__name__ = fn.__name__
    return kernel


def _impl(*names: str, key: str = "PrivateUse1") -> Callable[[Callable], Callable]:
    def register(fn: Callable) -> Callable:
        for name in names:
            _lib.impl(name, _counted(name, fn), key)
            REGISTERED.add(name)
        return fn

    return register


def _adjust(*names: str) -> Callable[[Callable], Callable]:
    def register(fn: Callable) -> Callable:
        for name in names:
            _lib.impl(name, fn, "PrivateUse1")
            ADJUSTED.add(name)
        return fn

    return register


# ------------------------------------------------------------------ helpers


def _pc(t: torch.Tensor) -> Any:
    """A polychip view of a polychip tensor (shares its memory)."""
    return _native.Tensor._adopt(_RT, _C.handle(t))


def _ok(op: str, *tensors: torch.Tensor) -> bool:
    """Whether every tensor's dtype is one ``op`` takes for ``T``."""
    allowed = ops.DTYPES[op]
    return all(_NAMES.get(t.dtype) in allowed for t in tensors)


def _on_device(*xs: Any) -> bool:
    return all(isinstance(x, torch.Tensor) and x.device.type == _DEVICE for x in xs)


def _empty(shape: Sequence[int], dtype: torch.dtype, like: torch.Tensor) -> torch.Tensor:
    return torch.empty(tuple(shape), dtype=dtype, device=like.device)


def _like(shape: Sequence[int], dtype: torch.dtype, *inputs: Any) -> torch.Tensor:
    """An elementwise operator's output: laid out as its first input of the
    output's shape when that one is not contiguous but dense (channels-last,
    transposed), as PyTorch's kernels lay it out, so that views taken of the
    result (``permute(...).view``) work as on the CPU; else contiguous."""
    for x in inputs:
        if isinstance(x, torch.Tensor) and tuple(x.shape) == tuple(shape):
            # Contiguous (the common case) first: it is dense, and cheap to ask.
            if x.is_contiguous():
                break
            if _dense(x):
                return torch.empty_like(x, dtype=dtype)
    return _empty(shape, dtype, inputs[0])


def _dense(x: torch.Tensor) -> bool:
    """Whether ``x``'s elements fill a block of memory once each (no
    zero-stride or overlapping dimension, no gaps), in any order."""
    order = sorted((s, n) for s, n in zip(x.stride(), x.shape) if n != 1)
    expected = 1
    for s, n in order:
        if s != expected:
            return False
        expected *= n
    return True


def _label(op: Any) -> str:
    name = op._schema.name
    overload = op._schema.overload_name
    return f"{name}.{overload}" if overload else name


# (device index, plugin operator) pairs whose op-table entry is NULL: a
# plugin of an older ABI minor (1.1 has no `gelu_erf`, `sigmoid`, ...), or
# one that left the operator out. Learnt from the first call's
# ``Unimplemented`` naming the NULL entry (the host raises it before the
# plugin runs anything); the aten operator then falls back, counted, as
# for a dtype the operator lacks.
_MISSING: set = set()


def _runs(name: str, device: torch.device, call: Callable[[], Any]) -> bool:
    """Calls ``call`` (one ``polychip.ops.<name>`` call on ``device``);
    False, and nothing written, when that device's plugin lacks ``name``
    (remembered) or refuses this call as unimplemented (not remembered)."""
    key = (device.index, name)
    if key in _MISSING:
        return False
    try:
        call()
    except errors.Unimplemented as e:
        if "op-table entry is NULL" in str(e):
            _MISSING.add(key)
        return False
    return True


def _one_device(args: Any) -> None:
    """PyTorch's rule: an operator's tensors are on one device (0-d CPU
    tensors aside). Raises its message otherwise, before anything runs."""
    seen: List[torch.device] = []

    def visit(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and not (x.device.type == "cpu" and x.dim() == 0):
            if x.device not in seen:
                seen.append(x.device)
        return x

    tree_map(visit, args)
    if len(seen) > 1:
        raise RuntimeError(
            f"Expected all tensors to be on the same device, but found at least two devices, {seen[0]} and {seen[1]}!"
        )


def _fallback(op: Any, *args: Any, **kwargs: Any) -> Any:
    """Runs ``op`` on the CPU (counted under its name; an error under
    strict mode): polychip tensors go to the CPU and results come back to
    the device of the first one; arguments the operator writes are written
    back. Tensors on two devices are refused as PyTorch refuses them."""
    _one_device((args, kwargs))
    label = _label(op)
    _C.count_fallback(label)
    start = time.perf_counter()
    try:
        return _on_cpu(op, args, kwargs)
    finally:
        _C.add_fallback_time(label, time.perf_counter() - start)


def _on_cpu(op: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
    device = None

    def to_cpu(x: Any) -> Any:
        nonlocal device
        if isinstance(x, torch.Tensor) and x.device.type == _DEVICE:
            device = device or x.device
            return x.cpu()
        return x

    cpu_args, cpu_kwargs = tree_map(to_cpu, (args, kwargs))
    result = op(*cpu_args, **cpu_kwargs)
    written: Dict[int, torch.Tensor] = {}
    for i, arg in enumerate(op._schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        if i < len(args) and not arg.kwarg_only:
            orig, cpu = args[i], cpu_args[i]
        elif arg.name in kwargs:
            orig, cpu = kwargs[arg.name], cpu_kwargs[arg.name]
        else:
            continue
        pairs = zip(orig, cpu) if isinstance(orig, (list, tuple)) else [(orig, cpu)]
        for o, c in pairs:
            if isinstance(o, torch.Tensor) and o is not c:
                if o.shape != c.shape:
                    o.resize_(c.shape)  # an out= the CPU kernel resized
                o.copy_(c)
                written[id(c)] = o

    def back(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            if id(x) in written:
                return written[id(x)]
            return x.to(device) if device is not None else x
        return x

    return tree_map(back, result)


_CONSTANTS: Dict[Tuple[Any, ...], torch.Tensor] = {}


def _constant(value: float, dtype: torch.dtype, like: torch.Tensor) -> torch.Tensor:
    """A 0-dimensional device tensor holding ``value`` (cached: kernels only
    read it)."""
    # The sign too: -0.0 == 0.0, and both hash alike.
    key = (like.device.index, dtype, value, math.copysign(1.0, value))
    t = _CONSTANTS.get(key) if value == value else None
    if t is None:
        t = torch.empty((), dtype=dtype, device=like.device)
        ops.fill(_pc(t), float(value))
        if len(_CONSTANTS) < 4096 and value == value:
            _CONSTANTS[key] = t
    return t


def _is_scalar(x: Any) -> bool:
    return isinstance(x, numbers.Number) or (
        isinstance(x, torch.Tensor) and x.dim() == 0 and x.device.type != _DEVICE
    )


def _is_bool(x: Any) -> bool:
    return isinstance(x, bool) or (isinstance(x, torch.Tensor) and x.dtype == torch.bool)


def _scalar(x: Any) -> Any:
    return x.item() if isinstance(x, torch.Tensor) else x


def _result_type(a: torch.Tensor, b: Any) -> torch.dtype:
    """torch.result_type, with the common cases (same dtype; a float or int
    scalar with a floating tensor) answered without its tens of
    microseconds."""
    if isinstance(b, torch.Tensor):
        if b.dtype == a.dtype:
            return a.dtype
    elif type(b) in (int, float) and a.dtype in _FLOATS:
        return a.dtype
    return torch.result_type(a, b)


def _broadcast(a: Sequence[int], b: Sequence[int]) -> Tuple[int, ...]:
    """NumPy broadcasting of two shapes (torch.broadcast_shapes is Python
    through torch._refs and costs tens of microseconds a call)."""
    if tuple(a) == tuple(b):
        return tuple(a)
    n = max(len(a), len(b))
    a = (1,) * (n - len(a)) + tuple(a)
    b = (1,) * (n - len(b)) + tuple(b)
    out = []
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y and x != 1 and y != 1:
            # PyTorch's words (the sizes are a's and b's, padded on the left).
            raise RuntimeError(
                f"The size of tensor a ({x}) must match the size of tensor b ({y}) at non-singleton dimension {i}"
            )
        out.append(y if x == 1 else x)
    return tuple(out)


# PyTorch's names of dtypes in its messages (c10::ScalarType).
_SCALAR_TYPE_NAMES = {
    torch.float32: "Float",
    torch.float64: "Double",
    torch.float16: "Half",
    torch.bfloat16: "BFloat16",
    torch.int64: "Long",
    torch.int32: "Int",
    torch.int16: "Short",
    torch.int8: "Char",
    torch.uint8: "Byte",
    torch.bool: "Bool",
}


def _write_into(out: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """The ``out=`` convention: resize ``out`` to the result, then copy.
    As PyTorch's elementwise operators do, a result whose dtype cannot be
    cast safely to ``out``'s (a float result into an integer ``out``) is
    refused rather than truncated."""
    if not torch.can_cast(value.dtype, out.dtype):
        raise RuntimeError(
            f"result type {_SCALAR_TYPE_NAMES.get(value.dtype, value.dtype)} can't be cast to the "
            f"desired output type {_SCALAR_TYPE_NAMES.get(out.dtype, out.dtype)}"
        )
    if out.shape != value.shape:
        out.resize_(value.shape)
    out.copy_(value)
    return out


# -------------------------------------------------------------- elementwise

# The operators are looked up in polychip.ops at each call (so a profiler
# that wraps them sees every call).
_BINARY = ("add", "sub", "mul", "div")


def _binary(name: str, a: Any, b: Any, alpha: Any = 1, inplace: bool = False) -> Any:
    """``a OP b`` with PyTorch's type promotion and broadcasting; ``a`` is
    a polychip tensor, ``b`` a polychip tensor or a scalar."""
    op = {
        ("add", False): aten.add.Tensor,
        ("add", True): aten.add_.Tensor,
        ("sub", False): aten.sub.Tensor,
        ("sub", True): aten.sub_.Tensor,
        ("mul", False): aten.mul.Tensor,
        ("mul", True): aten.mul_.Tensor,
        ("div", False): aten.div.Tensor,
        ("div", True): aten.div_.Tensor,
    }[(name, inplace)]
    extra = {"alpha": alpha} if name in ("add", "sub") and alpha != 1 else {}
    if name == "sub" and (_is_bool(a) or _is_bool(b)):
        return _fallback(op, a, b, **extra)  # PyTorch refuses `-` with a bool: its message
    if not isinstance(a, torch.Tensor):
        # A number as ``self`` (torch.add(0.3, t, alpha=0.6), torch.div(1.0,
        # t)): the dispatcher hands the wrapped number over as a Python
        # number, and ``b`` is the device tensor.
        # (The CPU rounds such a number to the tensor's dtype first, as a
        # constant of that dtype does: a bf16 `0.1 * t` is not `t * 0.1`.)
        if name == "add" and alpha == 1:
            return _binary(name, b, a)  # commutative: the scalar's own path
        dtype = torch.result_type(b, a)
        if (
            dtype not in _FLOATS
            or _NAMES[dtype] not in ops.DTYPES[name]
            or isinstance(a, complex)
            or isinstance(alpha, complex)
        ):
            return _fallback(op, a, b, **extra)
        a = _constant(a, dtype, b)
    scalar = _is_scalar(b)
    bv = _scalar(b) if scalar else b
    # A 0-d CPU tensor promotes as a tensor, not as a number: an integer
    # tensor plus a 0-d bf16 tensor is bf16 (a Python float would give f32).
    dtype = _result_type(a, b)
    if inplace and dtype != a.dtype and not torch.can_cast(dtype, a.dtype):
        return _fallback(op, a, b, **extra)
    # In place into a narrower dtype (bf16 += f32) PyTorch computes in the
    # promoted dtype and rounds once into ``a``: so does the copy below.
    # Integers (ABI 1.3): add, sub and mul on i32 and i64, wrapping as
    # PyTorch does, with an integer alpha and scalars the dtype holds.
    integer = dtype in _INTEGER_BINARY and name in ("add", "sub", "mul")
    if integer:
        if not _integer_operands(dtype, alpha, bv if scalar else None):
            return _fallback(op, a, b, **extra)
    elif dtype not in _FLOATS or _NAMES[dtype] not in ops.DTYPES[name]:
        return _fallback(op, a, b, **extra)
    if isinstance(alpha, complex) or (scalar and isinstance(bv, complex)):
        return _fallback(op, a, b, **extra)
    if inplace:
        _check_overlap(a, b)
    if scalar and inplace and name == "mul" and a.dtype == dtype and _NAMES[dtype] in ops.DTYPES["scale"]:
        # x *= c in place is the optimizer's `scale` (no constant tensor).
        ops.scale(_pc(a), float(bv))
        return a
    if (
        scalar
        and dtype in (torch.float16, torch.bfloat16)
        and a.dtype == dtype
        and name in ("mul", "div")
        and _NAMES[dtype] in ops.DTYPES["add"]
        and (not inplace or _NAMES[dtype] in ops.DTYPES["scale"])
    ):
        # PyTorch multiplies and divides a half-precision tensor by a
        # scalar in f32, rounding once: the scalar is not rounded to the
        # tensor's dtype first (0.1 in bf16 is 0.10009765625; its add and
        # sub do round it, as below). Multiplying goes to the operators' f64
        # `alpha`, which they apply in f32: `-0 + c a` (-0 is the identity
        # of addition for every value, -0 included); dividing does too where
        # 1/c is exact (a power of two), else it runs in f32.
        c = float(bv)
        if name == "div":
            m = math.frexp(c)[0] if math.isfinite(c) else 0.0
            if abs(m) != 0.5:
                r = _binary("div", a.to(torch.float32), c).to(dtype)
                return a.copy_(r) if inplace else r
            c = 1.0 / c
        if inplace:
            ops.scale(_pc(a), c)
            return a
        bt = a
        a, alpha, name = _constant(-0.0, dtype, a), c, "add"
    elif scalar:
        bt = _constant(bv, dtype, a)
    else:
        if not _on_device(b) or b.device != a.device:
            if b.dim() == 0:
                bt = b.to(device=a.device, dtype=dtype)
            else:
                return _fallback(op, a, b, **extra)
        else:
            bt = b if b.dtype == dtype else b.to(dtype)
    at = a if a.dtype == dtype else a.to(dtype)
    shape = _broadcast(at.shape, bt.shape)
    if inplace:
        if tuple(shape) != tuple(a.shape):
            raise RuntimeError(
                f"output with shape {list(a.shape)} doesn't match the broadcast shape {list(shape)}"
            )
        out = a
        if at is not a:
            tmp = _empty(shape, dtype, a)
            getattr(ops, name)(_pc(at), _pc(bt), _pc(tmp), float(alpha))
            a.copy_(tmp)
            return a
        if _overlaps_partially(out, bt):
            bt = bt.clone()
    else:
        out = _like(shape, dtype, at, bt)
    if integer:
        # A plugin older than ABI 1.3 is refused integers (as not
        # implemented) before anything runs: the CPU computes instead.
        call = lambda: getattr(ops, name)(_pc(at), _pc(bt), _pc(out), float(alpha))  # noqa: E731
        if not _runs_dtype(call):
            return _fallback(op, a, b, **extra)
        return out
    getattr(ops, name)(_pc(at), _pc(bt), _pc(out), float(alpha))
    return out


# The integer dtypes of ABI 1.3's add, sub and mul.
_INTEGER_BINARY = (torch.int32, torch.int64)


def _integer_operands(dtype: torch.dtype, alpha: Any, scalar: Any) -> bool:
    """Whether an integer add, sub or mul can run on the plugin: alpha a
    Python integer of at most 2^53 (the ABI's rule), and a scalar operand
    an integer the dtype holds (of at most 2^53: it travels as a double)."""
    if type(alpha) is not int or abs(alpha) > 2**53:
        return False
    if scalar is None:
        return True
    if type(scalar) is not int or abs(scalar) > 2**53:
        return False
    lo, hi = _INT_RANGES[dtype]
    return lo <= scalar <= hi


def _runs_dtype(call: Callable[[], Any]) -> bool:
    """Calls ``call``; False, nothing written, when the host refuses it as
    not implemented (a dtype newer than the plugin's ABI minor)."""
    try:
        call()
    except errors.Unimplemented:
        return False
    return True


def _check_overlap(out: torch.Tensor, *inputs: Any, exact_too: bool = False) -> None:
    """Raises PyTorch's CPU's RuntimeError, before anything is written,
    where ``out`` writes one element twice (an expanded view) or a device
    tensor among ``inputs`` lies partly over it without being exactly it
    (``a[1:].add_(a[:-1])``, ``torch.neg(a[:-1], out=a[1:])``): the device
    computed those as if the input were cloned until hostile sweep 6.
    Exactly the same memory (``a.add_(a)``) is allowed, as on the CPU,
    unless ``exact_too`` (``scatter_add_`` refuses its own source)."""
    same = [t for t in inputs if isinstance(t, torch.Tensor) and t.device == out.device]
    _C.check_overlap(out, same, exact_too)


def _overlaps_partially(out: torch.Tensor, x: torch.Tensor) -> bool:
    """Whether ``x`` shares memory with ``out`` without being exactly it
    (operators allow only exact aliases)."""
    if x.untyped_storage().data_ptr() != out.untyped_storage().data_ptr():
        return False
    same = (
        x.storage_offset() == out.storage_offset()
        and tuple(x.shape) == tuple(out.shape)
        and x.stride() == out.stride()
    )
    return not same


def _register_binary(name: str) -> None:
    def functional(self: torch.Tensor, other: Any, alpha: Any = 1) -> torch.Tensor:
        return _binary(name, self, other, alpha)

    def inplace(self: torch.Tensor, other: Any, alpha: Any = 1) -> torch.Tensor:
        return _binary(name, self, other, alpha, inplace=True)

    def out(self: torch.Tensor, other: Any, alpha: Any = 1, *, out: torch.Tensor) -> torch.Tensor:
        _check_overlap(out, self, other)
        return _write_into(out, _binary(name, self, other, alpha))

    if name in ("add", "sub"):
        _impl(f"{name}.Tensor", f"{name}.Scalar")(functional)
        _impl(f"{name}_.Tensor", f"{name}_.Scalar")(inplace)
        _impl(f"{name}.out")(out)
    else:

        def functional2(self: torch.Tensor, other: Any) -> torch.Tensor:
            return _binary(name, self, other)

        def inplace2(self: torch.Tensor, other: Any) -> torch.Tensor:
            return _binary(name, self, other, inplace=True)

        def out2(self: torch.Tensor, other: Any, *, out: torch.Tensor) -> torch.Tensor:
            return _write_into(out, _binary(name, self, other))

        _impl(f"{name}.Tensor", f"{name}.Scalar")(functional2)
        _impl(f"{name}_.Tensor", f"{name}_.Scalar")(inplace2)
        _impl(f"{name}.out")(out2)


for _name in _BINARY:
    _register_binary(_name)


@_impl("rsub.Tensor", "rsub.Scalar")
def _rsub(self: torch.Tensor, other: Any, alpha: Any = 1) -> torch.Tensor:
    # other - alpha * self
    if _is_scalar(other):
        dtype = _result_type(self, other)
        if (
            dtype in _FLOATS
            and _NAMES[dtype] in ops.DTYPES["sub"]
            and not _is_bool(self)
            and not _is_bool(other)
            and not isinstance(alpha, complex)
        ):
            s = self if self.dtype == dtype else self.to(dtype)
            out = _like(s.shape, dtype, s)
            ops.sub(_pc(_constant(_scalar(other), dtype, s)), _pc(s), _pc(out), float(alpha))
            return out
        op = aten.rsub.Tensor if isinstance(other, torch.Tensor) else aten.rsub.Scalar
        return _fallback(op, self, other, alpha=alpha)
    return _binary("sub", other, self, alpha)


# ``sin`` and ``cos`` came with ABI 1.3: on a plugin of an older minor (its
# table has no entry for them) they fall back, as a dtype the operator
# lacks does.
_UNARY = ("neg", "exp", "log", "sqrt", "rsqrt", "tanh", "relu", "silu", "sin", "cos")


def _unary(name: str, x: torch.Tensor, op: Any, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    if not _ok(name, x):
        return _fallback(op, x) if out is None else _fallback(op, x, out=out)
    if out is None:
        result = _like(x.shape, x.dtype, x)
    elif out is x:
        result = x
    else:
        _check_overlap(out, x)
        return _write_into(out, _unary(name, x, op))
    if not _runs(name, x.device, lambda: getattr(ops, name)(_pc(x), _pc(result))):
        # The in-place operator (``sin_``) takes no ``out``.
        takes_out = out is not None and op._schema.overload_name == "out"
        return _fallback(op, x, out=out) if takes_out else _fallback(op, x)
    return result


def _register_unary(name: str) -> None:
    functional_op = getattr(aten, name).default
    inplace_op = getattr(aten, name + "_").default

    def functional(self: torch.Tensor) -> torch.Tensor:
        return _unary(name, self, functional_op)

    def inplace(self: torch.Tensor) -> torch.Tensor:
        if not _ok(name, self):
            return _fallback(inplace_op, self)
        return _unary(name, self, inplace_op, out=self)

    def out(self: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
        return _unary(name, self, getattr(aten, name).out, out=out)

    _impl(f"{name}")(functional)
    _impl(f"{name}_")(inplace)
    _impl(f"{name}.out")(out)


for _name in _UNARY:
    _register_unary(_name)


# ------------------------------------------- selection and comparison (ABI 1.3)

# The ranges an integer dtype holds: a value outside them is refused by
# PyTorch's masked_fill (and wraps in a comparison's scalar), so such calls
# go to the CPU rather than to the ABI's saturating conversion.
_INT_RANGES = {
    torch.int32: (-(2**31), 2**31 - 1),
    torch.int64: (-(2**63), 2**63 - 1),
    torch.uint8: (0, 255),
}


def _scalar_fits(value: Any, dtype: torch.dtype) -> bool:
    """Whether the Python number ``value`` converts to ``dtype`` as the
    ABI's `fill` converts it and as PyTorch does (no complex; an integer
    dtype takes only finite values inside its range; the ABI carries the
    value as an f64, so an integer it does not hold exactly, such as
    2^53 + 1, is not taken: it was rounded, and `x == 2**53 + 1` or
    `masked_fill(m, 2**62 + 1)` gave other results than the CPU's)."""
    if isinstance(value, complex):
        return False
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            if float(value) != value:
                return False
        except OverflowError:
            return False
    bounds = _INT_RANGES.get(dtype)
    if bounds is None:
        return True
    if isinstance(value, float) and not math.isfinite(value):
        return False
    return bounds[0] <= value <= bounds[1]


def _float_fits(value: Any, dtype: torch.dtype) -> bool:
    """Whether PyTorch's masked_fill takes ``value`` into the floating
    ``dtype``: a finite value beyond the dtype's largest is refused there
    ("value cannot be converted to type c10::Half without overflow"),
    where the ABI's conversion rounds it to infinity or to the largest
    (65519 into f16 gave 65504 on the device); infinities and NaN are
    taken."""
    if dtype not in _FLOATS or dtype == torch.float64 or isinstance(value, complex):
        return True
    v = float(value)
    return not math.isfinite(v) or abs(v) <= torch.finfo(dtype).max


def _to_device_dtype(x: torch.Tensor, like: torch.Tensor, dtype: torch.dtype) -> Optional[torch.Tensor]:
    """``x`` as a tensor of ``dtype`` on ``like``'s device (a conversion is
    the plugin's `convert`, ABI 1.3, or a counted fallback of its own), or
    None where that takes more than a 0-d CPU tensor's move."""
    if _on_device(x):
        if x.device != like.device:
            return None
    elif x.dim() != 0:
        return None
    return x.to(device=like.device, dtype=dtype)


def _broadcast3(a: Sequence[int], b: Sequence[int], c: Sequence[int]) -> Tuple[int, ...]:
    return _broadcast(_broadcast(a, b), c)


@_impl("where.self")
def _where(condition: torch.Tensor, self: Any, other: Any) -> torch.Tensor:
    # cond ? self : other, the three broadcast: one `select` (ABI 1.3).
    op = aten.where.self
    if (
        not isinstance(self, torch.Tensor)
        or not isinstance(other, torch.Tensor)
        or condition.dtype != torch.bool
        or not _on_device(condition)
    ):
        return _fallback(op, condition, self, other)
    dtype = torch.result_type(self, other)
    if _NAMES.get(dtype) not in ops.DTYPES["select"]:
        return _fallback(op, condition, self, other)
    a = _to_device_dtype(self, condition, dtype)
    b = _to_device_dtype(other, condition, dtype)
    if a is None or b is None:
        return _fallback(op, condition, self, other)
    shape = _broadcast3(condition.shape, a.shape, b.shape)
    out = _like(shape, dtype, a, b, condition)
    call = lambda: ops.select(_pc(condition), _pc(a), _pc(b), _pc(out))  # noqa: E731
    if not _runs("select", condition.device, call):
        return _fallback(op, condition, self, other)
    return out


@_impl("where.self_out")
def _where_out(condition: torch.Tensor, self: Any, other: Any, *, out: torch.Tensor) -> torch.Tensor:
    return _write_into(out, _where(condition, self, other))


def _masked_fill(op: Any, self: torch.Tensor, mask: torch.Tensor, value: Any, inplace: bool) -> torch.Tensor:
    # mask ? value : self, the mask broadcast to self: one `masked_fill`
    # (ABI 1.3), in place for masked_fill_. The value is converted as the
    # ABI's `fill` converts it, which is PyTorch's conversion wherever
    # PyTorch accepts the value.
    v = value
    if isinstance(v, torch.Tensor):
        if v.dim() != 0:
            return _fallback(op, self, mask, value)
        v = v.item()
    if (
        mask.dtype != torch.bool
        or not _on_device(self, mask)
        or mask.device != self.device
        or _NAMES.get(self.dtype) not in ops.DTYPES["masked_fill"]
        or not _scalar_fits(v, self.dtype)
        or not _float_fits(v, self.dtype)
    ):
        return _fallback(op, self, mask, value)
    shape = tuple(self.shape)
    try:
        if _broadcast(mask.shape, shape) != shape:
            return _fallback(op, self, mask, value)
    except RuntimeError:
        return _fallback(op, self, mask, value)
    if inplace:
        out = self
        if _overlaps_partially(out, mask) or out.untyped_storage().data_ptr() == mask.untyped_storage().data_ptr():
            mask = mask.clone()
    else:
        out = _like(shape, self.dtype, self)
    call = lambda: ops.masked_fill(_pc(self), _pc(mask), _pc(out), float(v))  # noqa: E731
    if not _runs("masked_fill", self.device, call):
        return _fallback(op, self, mask, value)
    return out


@_impl("masked_fill.Scalar")
def _masked_fill_scalar(self: torch.Tensor, mask: torch.Tensor, value: Any) -> torch.Tensor:
    return _masked_fill(aten.masked_fill.Scalar, self, mask, value, False)


@_impl("masked_fill_.Scalar")
def _masked_fill_scalar_(self: torch.Tensor, mask: torch.Tensor, value: Any) -> torch.Tensor:
    return _masked_fill(aten.masked_fill_.Scalar, self, mask, value, True)


@_impl("masked_fill.Tensor")
def _masked_fill_tensor(self: torch.Tensor, mask: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    return _masked_fill(aten.masked_fill.Tensor, self, mask, value, False)


@_impl("masked_fill_.Tensor")
def _masked_fill_tensor_(self: torch.Tensor, mask: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    return _masked_fill(aten.masked_fill_.Tensor, self, mask, value, True)


# arange's output dtypes whose values PyTorch's CPU kernel computes as the
# ABI's `arange` does: the integers, exactly. Its floating kernel adds the
# step to a vector's base in the output's dtype (lanes `base + j * step`),
# which differs from the ABI's `start + i * step` rounded once in the last
# bits, so floating ranges stay on the CPU (counted).
_ARANGE = (torch.int32, torch.int64, torch.uint8)


@_impl("arange.start_out")
def _arange_out(start: Any, end: Any, step: Any = 1, *, out: torch.Tensor) -> torch.Tensor:
    # out[i] = start + i * step: one `arange` (ABI 1.3). The size as
    # PyTorch computes it: ceil((end - start) / step) in double (exactly
    # in integers for int64), with its refusals left to the CPU.
    op = aten.arange.start_out
    values = (start, end, step)
    if (
        not _on_device(out)
        or not all(type(v) in (int, float) for v in values)
        or not all(math.isfinite(v) for v in values)
        or step == 0
        or (end - start) * step < 0
    ):
        return _fallback(op, start, end, step, out=out)
    if out.dtype == torch.int64:
        n = -((start - end) // step)
    else:
        q = (float(end) - float(start)) / float(step)
        if not math.isfinite(q):
            return _fallback(op, start, end, step, out=out)  # the CPU's refusal
        n = math.ceil(q)
    n = max(int(n), 0)
    if n >= 2**63:
        return _fallback(op, start, end, step, out=out)
    # The range's memory is taken on the device first, so that a range the
    # device cannot hold is refused as out of its memory before a CPU
    # fallback builds it in host memory (`torch.arange(2**31 + 1, 2**31 + 1
    # + 2**29, device=d)` on a 256 MiB device held 4.6 GB of the host for
    # 9 s until 2026-12-06).
    if out.numel() != n:
        out.resize_((n,))
    if out.dtype not in _ARANGE or max(abs(start), abs(end), abs(step)) > 2**31:
        return _fallback(op, start, end, step, out=out)
    integral = out.dtype not in _FLOATS
    if integral and not all(type(v) is int for v in values):
        return _fallback(op, start, end, step, out=out)
    if integral:
        last = start + (n - 1) * step if n else start
        lo, hi = _INT_RANGES[out.dtype]
        if not (lo <= start <= hi and lo <= last <= hi):
            return _fallback(op, start, end, step, out=out)
    if out.dim() != 1:
        return _fallback(op, start, end, step, out=out)
    call = lambda: ops.arange(_pc(out), float(start), float(step))  # noqa: E731
    if not _runs("arange", out.device, call):
        return _fallback(op, start, end, step, out=out)
    return out


_COMPARE = ("eq", "ne", "lt", "le", "gt", "ge")


def _compare(name: str, op: Any, a: torch.Tensor, b: Any) -> torch.Tensor:
    # a OP b (bool), with PyTorch's promotion and broadcasting: one
    # comparison (ABI 1.3) where both sides already have, or cast between
    # floating dtypes to, the promoted dtype.
    if not isinstance(a, torch.Tensor) or not _on_device(a):
        return _fallback(op, a, b)
    dtype = _result_type(a, b)
    if _NAMES.get(dtype) not in ops.DTYPES[name]:
        return _fallback(op, a, b)
    if _is_scalar(b):
        v = _scalar(b)
        if isinstance(v, bool) or not _scalar_fits(v, dtype):
            return _fallback(op, a, b)
        bt = _constant(v, dtype, a)
    else:
        bt = _to_device_dtype(b, a, dtype)
        if bt is None:
            return _fallback(op, a, b)
    at = a if a.dtype == dtype else a.to(dtype)
    shape = _broadcast(at.shape, bt.shape)
    out = _like(shape, torch.bool, at, bt)
    call = lambda: getattr(ops, name)(_pc(at), _pc(bt), _pc(out))  # noqa: E731
    if not _runs(name, a.device, call):
        return _fallback(op, a, b)
    return out


def _register_compare(name: str) -> None:
    tensor_op = getattr(aten, name).Tensor
    scalar_op = getattr(aten, name).Scalar

    def on_tensor(self: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        return _compare(name, tensor_op, self, other)

    def on_scalar(self: torch.Tensor, other: Any) -> torch.Tensor:
        return _compare(name, scalar_op, self, other)

    def tensor_out(self: torch.Tensor, other: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
        return _write_into(out, _compare(name, tensor_op, self, other))

    def scalar_out(self: torch.Tensor, other: Any, *, out: torch.Tensor) -> torch.Tensor:
        return _write_into(out, _compare(name, scalar_op, self, other))

    _impl(f"{name}.Tensor")(on_tensor)
    _impl(f"{name}.Scalar")(on_scalar)
    _impl(f"{name}.Tensor_out")(tensor_out)
    _impl(f"{name}.Scalar_out")(scalar_out)


for _name in _COMPARE:
    _register_compare(_name)


# aten's GELU forms: "tanh" is the ABI's `gelu`, "none" (nn.GELU's
# default, BERT's) its `gelu_erf` (ABI 1.2).
_GELU = {"tanh": "gelu", "none": "gelu_erf"}


@_impl("gelu")
def _gelu(self: torch.Tensor, *, approximate: str = "none") -> torch.Tensor:
    name = _GELU.get(approximate)
    if name is None or not _ok(name, self):
        return _fallback(aten.gelu.default, self, approximate=approximate)
    out = _like(self.shape, self.dtype, self)
    if not _runs(name, self.device, lambda: getattr(ops, name)(_pc(self), _pc(out))):
        return _fallback(aten.gelu.default, self, approximate=approximate)
    return out


@_impl("pow.Tensor_Scalar")
def _pow(self: torch.Tensor, exponent: Any) -> torch.Tensor:
    dtype = _result_type(self, exponent)
    if dtype != self.dtype or not _ok("pow_scalar", self) or isinstance(exponent, complex):
        return _fallback(aten.pow.Tensor_Scalar, self, exponent)
    out = _like(self.shape, self.dtype, self)
    ops.pow_scalar(_pc(self), _pc(out), float(exponent))
    return out


@_impl("pow_.Scalar")
def _pow_(self: torch.Tensor, exponent: Any) -> torch.Tensor:
    if not _ok("pow_scalar", self) or isinstance(exponent, complex):
        return _fallback(aten.pow_.Scalar, self, exponent)
    ops.pow_scalar(_pc(self), _pc(self), float(exponent))
    return self


def _activation_backward(
    name: str, op: Any, grad: torch.Tensor, x: torch.Tensor, **kwargs: Any
) -> torch.Tensor:
    # ``kwargs``: the operator's own arguments (gelu's ``approximate``),
    # passed on to the CPU when the call falls back. ``x`` is the
    # activation's input, or its output for the operators that take it
    # (`sigmoid_backward`, `tanh_backward`).
    if grad.dtype != x.dtype or grad.shape != x.shape or not _ok(name, grad):
        return _fallback(op, grad, x, **kwargs)
    out = _like(x.shape, x.dtype, grad, x)
    if not _runs(name, x.device, lambda: getattr(ops, name)(_pc(grad), _pc(x), _pc(out))):
        return _fallback(op, grad, x, **kwargs)
    return out


@_impl("threshold_backward")
def _threshold_backward(grad: torch.Tensor, self: torch.Tensor, threshold: Any) -> torch.Tensor:
    # relu's backward: autograd passes relu's output, positive exactly
    # where its input was.
    if threshold != 0:
        return _fallback(aten.threshold_backward.default, grad, self, threshold)
    if grad.dtype != self.dtype or grad.shape != self.shape or not _ok("relu_backward", grad):
        return _fallback(aten.threshold_backward.default, grad, self, threshold)
    out = _like(self.shape, self.dtype, grad, self)
    ops.relu_backward(_pc(grad), _pc(self), _pc(out))
    return out


@_impl("tanh_backward")
def _tanh_backward(grad: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
    # grad * (1 - y^2), from tanh's output y: one `tanh_backward` (ABI 1.2);
    # on a plugin without it, as before, three arithmetic calls.
    # (`mul` takes integers since ABI 1.3: the floating check is explicit.)
    if grad.dtype != output.dtype or grad.shape != output.shape or grad.dtype not in _FLOATS or not _ok("mul", grad):
        return _fallback(aten.tanh_backward.default, grad, output)
    if _ok("tanh_backward", grad):
        out = _like(output.shape, output.dtype, grad, output)
        call = lambda: ops.tanh_backward(_pc(grad), _pc(output), _pc(out))  # noqa: E731
        if _runs("tanh_backward", output.device, call):
            return out
    out = _empty(output.shape, output.dtype, output)
    ops.mul(_pc(output), _pc(output), _pc(out))
    ops.sub(_pc(_constant(1.0, output.dtype, output)), _pc(out), _pc(out))
    ops.mul(_pc(grad), _pc(out), _pc(out))
    return out


@_impl("silu_backward")
def _silu_backward(grad: torch.Tensor, self: torch.Tensor) -> torch.Tensor:
    return _activation_backward("silu_backward", aten.silu_backward.default, grad, self)


@_impl("gelu_backward")
def _gelu_backward(grad: torch.Tensor, self: torch.Tensor, *, approximate: str = "none") -> torch.Tensor:
    name = _GELU.get(approximate)
    if name is None:
        return _fallback(aten.gelu_backward.default, grad, self, approximate=approximate)
    return _activation_backward(
        name + "_backward", aten.gelu_backward.default, grad, self, approximate=approximate
    )


def _f32_on_device(*xs: torch.Tensor, ops_used: Sequence[str]) -> bool:
    """Whether ``xs`` (one device, f32 or 16-bit) can be computed in f32
    with ``ops_used`` (the result rounded once to their dtype, as PyTorch's
    CPU kernels do for 16-bit inputs)."""
    return (
        _on_device(*xs)
        and len({x.device for x in xs}) == 1
        and len({x.dtype for x in xs}) == 1
        and xs[0].dtype in (torch.float32, torch.bfloat16, torch.float16)
        and all("float32" in ops.DTYPES[o] for o in ops_used)
    )


@_impl("sigmoid")
def _sigmoid(self: torch.Tensor) -> torch.Tensor:
    # One `sigmoid` (ABI 1.2). On a plugin without it: e^min(x, 0) / (1 +
    # e^-|x|) in f32, where neither exponent overflows and no difference of
    # near-equal numbers loses the negative tail (sigmoid(-20) is 2.06e-9,
    # not 0).
    if _on_device(self) and _ok("sigmoid", self):
        out = _like(self.shape, self.dtype, self)
        if _runs("sigmoid", self.device, lambda: ops.sigmoid(_pc(self), _pc(out))):
            return out
    if not _f32_on_device(self, ops_used=("exp", "relu", "neg", "mul", "sqrt", "add", "div")):
        return _fallback(aten.sigmoid.default, self)
    x = self.float()
    below = torch.exp(-torch.relu(-x))
    return (below / (torch.exp(-torch.sqrt(x * x)) + 1.0)).to(self.dtype)


@_impl("sigmoid_backward")
def _sigmoid_backward(grad: torch.Tensor, output: torch.Tensor) -> torch.Tensor:
    # grad * y (1 - y), from the sigmoid's output y: one `sigmoid_backward`
    # (ABI 1.2), or on a plugin without it the same in f32 arithmetic.
    if (
        _on_device(grad, output)
        and grad.device == output.device
        and grad.dtype == output.dtype
        and grad.shape == output.shape
        and _ok("sigmoid_backward", grad)
    ):
        out = _like(output.shape, output.dtype, grad, output)
        call = lambda: ops.sigmoid_backward(_pc(grad), _pc(output), _pc(out))  # noqa: E731
        if _runs("sigmoid_backward", output.device, call):
            return out
    if not _f32_on_device(grad, output, ops_used=("mul", "sub")):
        return _fallback(aten.sigmoid_backward.default, grad, output)
    y = output.float()
    return (grad.float() * y * (1.0 - y)).to(grad.dtype)


# ------------------------------------------------------------------- matmul


def _matmul_ok(*ts: torch.Tensor) -> bool:
    return _on_device(*ts) and len({t.dtype for t in ts}) == 1 and len({t.device for t in ts}) == 1 and _ok("matmul", *ts)


@_impl("mm")
def _mm(self: torch.Tensor, mat2: torch.Tensor) -> torch.Tensor:
    if not _matmul_ok(self, mat2):
        return _fallback(aten.mm.default, self, mat2)
    out = _empty((self.shape[0], mat2.shape[1]), self.dtype, self)
    ops.matmul(_pc(self), _pc(mat2), _pc(out))
    return out


@_impl("bmm")
def _bmm(self: torch.Tensor, mat2: torch.Tensor) -> torch.Tensor:
    if not _matmul_ok(self, mat2):
        return _fallback(aten.bmm.default, self, mat2)
    out = _empty((self.shape[0], self.shape[1], mat2.shape[2]), self.dtype, self)
    ops.matmul(_pc(self), _pc(mat2), _pc(out))
    return out


def _matmul_out(op: Any, fn: Callable, ndim: int, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    # ``torch.mm(a, b, out=rows_of_a_buffer)``, as Hugging Face's grouped
    # expert matmul runs each expert's rows: the product on the plugin,
    # copied into ``out`` (a view of a larger buffer, any strides). A
    # wrong-sized ``out`` is resized by the CPU's kernel, with its warning.
    shape = (*a.shape[:-1], b.shape[-1])
    plain = a.dim() == b.dim() == ndim and a.shape[-1] == b.shape[-2] and a.shape[:-2] == b.shape[:-2]
    if not plain or not _matmul_ok(a, b, out) or tuple(out.shape) != shape or _shares_memory(out, a, b):
        return _fallback(op, a, b, out=out)
    out.copy_(fn(a, b))
    return out


def _shares_memory(out: torch.Tensor, *xs: torch.Tensor) -> bool:
    return any(x.untyped_storage().data_ptr() == out.untyped_storage().data_ptr() for x in xs)


@_impl("mm.out")
def _mm_out(self: torch.Tensor, mat2: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
    return _matmul_out(aten.mm.out, _mm, 2, self, mat2, out)


@_impl("bmm.out")
def _bmm_out(self: torch.Tensor, mat2: torch.Tensor, *, out: torch.Tensor) -> torch.Tensor:
    return _matmul_out(aten.bmm.out, _bmm, 3, self, mat2, out)


def _addmm_like(op: Any, bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, beta: Any, alpha: Any) -> torch.Tensor:
    if not _matmul_ok(bias, a, b) or isinstance(beta, complex) or isinstance(alpha, complex):
        return _fallback(op, bias, a, b, beta=beta, alpha=alpha)
    shape = (*a.shape[:-1], b.shape[-1])
    out = _empty(shape, a.dtype, a)
    if beta != 0:
        out.copy_(bias.expand(shape))
    ops.matmul(_pc(a), _pc(b), _pc(out), float(alpha), float(beta))
    return out


@_impl("addmm")
def _addmm(self: torch.Tensor, mat1: torch.Tensor, mat2: torch.Tensor, *, beta: Any = 1, alpha: Any = 1) -> torch.Tensor:
    return _addmm_like(aten.addmm.default, self, mat1, mat2, beta, alpha)


@_impl("baddbmm")
def _baddbmm(self: torch.Tensor, b1: torch.Tensor, b2: torch.Tensor, *, beta: Any = 1, alpha: Any = 1) -> torch.Tensor:
    return _addmm_like(aten.baddbmm.default, self, b1, b2, beta, alpha)


# --------------------------------------------------------------- reductions


def _dims(dim: Any, ndim: int) -> List[int]:
    if dim is None:
        return list(range(ndim))
    if isinstance(dim, int):
        dim = [dim]
    dims = [d + ndim if d < 0 else d for d in dim]
    return list(range(ndim)) if not dims else dims


def _reduce(name: str, op: Any, x: torch.Tensor, dims: List[int], keepdim: bool, *args: Any, **kwargs: Any) -> torch.Tensor:
    """``name`` (sum, mean or max) over ``dims``, one dimension at a time."""
    if not _ok(name, x) or (x.dim() == 0):
        return _fallback(op, x, *args, **kwargs)
    if len(set(dims)) != len(dims) or any(not 0 <= d < x.dim() for d in dims):
        return _fallback(op, x, *args, **kwargs)
    fn = getattr(ops, name)
    big = [d for d in dims if x.shape[d] > 1]
    if name != "max" and len(big) > 1:
        # A sum over several dimensions rounds once, as PyTorch's does: the
        # reduced dimensions are moved last and merged into one (a copy
        # unless they already are), then summed in one pass. One at a time,
        # a bf16 mean over (0, 2) rounded in between and came out an ulp off.
        keep = [d for d in range(x.dim()) if d not in dims]
        moved = x.permute(keep + sorted(dims)).contiguous()
        merged = moved.reshape([x.shape[d] for d in keep] + [-1])
        out = _empty([x.shape[d] for d in keep] + [1], x.dtype, x)
        fn(_pc(merged), _pc(out), len(keep), True)
        if keepdim:
            return out.reshape([1 if d in dims else s for d, s in enumerate(x.shape)])
        return out.reshape([x.shape[d] for d in keep])
    current = x
    for d in sorted(dims, reverse=True):
        shape = list(current.shape)
        shape[d] = 1
        out = _empty(shape, current.dtype, current)
        fn(_pc(current), _pc(out), d, True)
        current = out
    if not keepdim:
        current = current.reshape([s for i, s in enumerate(current.shape) if i not in dims])
    return current


def _register_sum_like(name: str) -> None:
    """``sum`` and ``mean``: over some dimensions (``.dim*``) or all, in the
    input's floating dtype or the one ``dtype=`` asks for."""
    by_dim = getattr(aten, name).dim_IntList if name == "sum" else aten.mean.dim
    every = getattr(aten, name).default

    def prepared(self: torch.Tensor, dtype: Optional[torch.dtype]) -> Optional[torch.Tensor]:
        target = dtype or self.dtype
        if target not in _FLOATS or self.dim() == 0:
            return None
        return self if target == self.dtype else self.to(target)

    def over(self: torch.Tensor, dim: Any, keepdim: bool = False, *, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        x = prepared(self, dtype)
        if x is None:
            return _fallback(by_dim, self, dim, keepdim, dtype=dtype)
        return _reduce(name, by_dim, x, _dims(dim, x.dim()), keepdim, dim, keepdim)

    def full(self: torch.Tensor, *, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        x = prepared(self, dtype)
        if x is None:
            return _fallback(every, self, dtype=dtype)
        return _reduce(name, every, x, _dims(None, x.dim()), False)

    _impl(by_dim._schema.name.removeprefix("aten::") + "." + by_dim._schema.overload_name)(over)
    _impl(name)(full)


_register_sum_like("sum")
_register_sum_like("mean")


@_impl("amax")
def _amax(self: torch.Tensor, dim: Any = (), keepdim: bool = False) -> torch.Tensor:
    if self.numel() == 0:
        return _fallback(aten.amax.default, self, dim, keepdim)
    return _reduce("max", aten.amax.default, self, _dims(dim, self.dim()), keepdim, dim, keepdim)


@_impl("max.dim")
def _max_dim(self: torch.Tensor, dim: int, keepdim: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
    if not _ok("max", self) or self.dim() == 0 or self.shape[dim] == 0:
        return _fallback(aten.max.dim, self, dim, keepdim)
    d = dim + self.dim() if dim < 0 else dim
    shape = [s for i, s in enumerate(self.shape) if i != d or keepdim]
    if keepdim:
        shape[d] = 1
    values = _empty(shape, self.dtype, self)
    indices = _empty(shape, torch.int64, self)
    ops.max(_pc(self), _pc(values), d, keepdim)
    ops.argmax(_pc(self), _pc(indices), d, keepdim)
    return values, indices


@_impl("argmax")
def _argmax(self: torch.Tensor, dim: Optional[int] = None, keepdim: bool = False) -> torch.Tensor:
    if not _ok("argmax", self) or self.numel() == 0 or self.dim() == 0:
        return _fallback(aten.argmax.default, self, dim, keepdim)
    if dim is None:
        flat = self.reshape(-1)
        out = _empty((), torch.int64, self)
        ops.argmax(_pc(flat), _pc(out), 0, False)
        return out.reshape([1] * self.dim()) if keepdim else out
    d = dim + self.dim() if dim < 0 else dim
    shape = [s for i, s in enumerate(self.shape) if i != d or keepdim]
    if keepdim:
        shape[d] = 1
    out = _empty(shape, torch.int64, self)
    ops.argmax(_pc(self), _pc(out), d, keepdim)
    return out


@_impl("linalg_vector_norm")
def _vector_norm(
    self: torch.Tensor, ord: Any = 2, dim: Any = None, keepdim: bool = False, *, dtype: Optional[torch.dtype] = None
) -> torch.Tensor:
    # The 2-norm of every element (gradient clipping); other forms fall back.
    if ord != 2 or (dim is not None and len(_dims(dim, self.dim())) != self.dim()) or not _ok("sum_squares", self) or keepdim:
        return _fallback(aten.linalg_vector_norm.default, self, ord, dim, keepdim, dtype=dtype)
    squares = _empty((), torch.float32, self)
    ops.sum_squares(_pc(self), _pc(squares))
    out_dtype = dtype or self.dtype
    norm = _empty((), torch.float32, self)
    ops.sqrt(_pc(squares), _pc(norm))
    return norm if out_dtype == torch.float32 else norm.to(out_dtype)


@_adjust("histc")
def _histc(self: torch.Tensor, bins: int = 100, min: Any = 0, max: Any = 0) -> torch.Tensor:
    # CUDA counts integer inputs (Hugging Face's mixture-of-experts routing
    # does, in int32) where the CPU's kernel takes only floats: integers
    # are counted as float64 (exact below 2^53, and the same bins, as a
    # bin is floor((x - min) * bins / (max - min))) and the counts
    # returned in the input's dtype, as CUDA returns them.
    if self.is_floating_point() or self.dtype == torch.bool:
        return _fallback(aten.histc.default, self, bins, min, max)
    counts = _fallback(aten.histc.default, self.to(torch.float64), bins, min, max)
    return counts.to(self.dtype)


# ------------------------------------------------------------ determinants


def _same_contiguity_on_cpu(a: torch.Tensor) -> torch.Tensor:
    """``a`` on the CPU, contiguous exactly when ``a`` is. (A non-dense
    view, such as a slice of a wider matrix, comes back contiguous from
    ``.cpu()``; given in column-major order it stays non-contiguous.)"""
    c = a.cpu()
    if a.is_contiguous() or not c.is_contiguous() or a.dim() < 2:
        return c
    return c.mT.contiguous().mT


def _determinant(op: Any, A: torch.Tensor, **outs: torch.Tensor) -> Any:
    # PyTorch's det and slogdet factor A^T in place of A when A is
    # contiguous (det(A^T) = det(A), and A^T is then the column-major
    # matrix LAPACK takes without a copy), and their backward decides
    # which of the two the saved LU is by asking the same of A: of the
    # device's A here. The fallback's CPU copy of a strided view (a slice
    # of a wider matrix) was contiguous where the device's A was not, so
    # the CPU factored A^T, the backward took that for A's factors, and
    # the gradient came out transposed. The CPU gets A as contiguous as
    # the device's is.
    if not _on_device(A):
        return _fallback(op, A, **outs)
    _one_device((A, outs))
    label = _label(op)
    _C.count_fallback(label)
    start = time.perf_counter()
    try:
        return _on_cpu(op, (_same_contiguity_on_cpu(A),), outs)
    finally:
        _C.add_fallback_time(label, time.perf_counter() - start)


@_adjust("_linalg_det.result")
def _linalg_det_out(A: torch.Tensor, *, result: torch.Tensor, LU: torch.Tensor, pivots: torch.Tensor) -> Any:
    return _determinant(aten._linalg_det.result, A, result=result, LU=LU, pivots=pivots)


@_adjust("_linalg_slogdet.sign")
def _linalg_slogdet_out(
    A: torch.Tensor, *, sign: torch.Tensor, logabsdet: torch.Tensor, LU: torch.Tensor, pivots: torch.Tensor
) -> Any:
    return _determinant(aten._linalg_slogdet.sign, A, sign=sign, logabsdet=logabsdet, LU=LU, pivots=pivots)


# ------------------------------------------------------------------ softmax


def _last(x: torch.Tensor, dim: int) -> torch.Tensor:
    return x if dim in (-1, x.dim() - 1) else x.movedim(dim, -1)


def _softmax_like(name: str, op: Any, self: torch.Tensor, dim: int, half_to_float: bool) -> torch.Tensor:
    if half_to_float or not _ok(name, self) or self.dim() == 0:
        return _fallback(op, self, dim, half_to_float)
    out = torch.empty_like(self, memory_format=torch.contiguous_format)
    getattr(ops, name)(_pc(_last(self, dim)), _pc(_last(out, dim)))
    return out


@_impl("_softmax")
def _softmax(self: torch.Tensor, dim: int, half_to_float: bool) -> torch.Tensor:
    return _softmax_like("softmax", aten._softmax.default, self, dim, half_to_float)


@_impl("_log_softmax")
def _log_softmax(self: torch.Tensor, dim: int, half_to_float: bool) -> torch.Tensor:
    return _softmax_like("log_softmax", aten._log_softmax.default, self, dim, half_to_float)


def _softmax_backward_like(name: str, op: Any, grad: torch.Tensor, output: torch.Tensor, dim: int, input_dtype: torch.dtype) -> torch.Tensor:
    if input_dtype != output.dtype or grad.dtype != output.dtype or grad.shape != output.shape or not _ok(name, output) or output.dim() == 0:
        return _fallback(op, grad, output, dim, input_dtype)
    out = torch.empty_like(output, memory_format=torch.contiguous_format)
    getattr(ops, name)(_pc(_last(output, dim)), _pc(_last(grad, dim)), _pc(_last(out, dim)))
    return out


@_impl("_softmax_backward_data")
def _softmax_backward(grad: torch.Tensor, output: torch.Tensor, dim: int, input_dtype: torch.dtype) -> torch.Tensor:
    return _softmax_backward_like("softmax_backward", aten._softmax_backward_data.default, grad, output, dim, input_dtype)


@_impl("_log_softmax_backward_data")
def _log_softmax_backward(grad: torch.Tensor, output: torch.Tensor, dim: int, input_dtype: torch.dtype) -> torch.Tensor:
    return _softmax_backward_like("log_softmax_backward", aten._log_softmax_backward_data.default, grad, output, dim, input_dtype)


# ------------------------------------------------------------ normalization


def _or_constant(t: Optional[torch.Tensor], value: float, input: torch.Tensor) -> torch.Tensor:
    """A norm's weight or bias, or (absent) ``value`` over the last dimension."""
    return t if t is not None else _constant(value, input.dtype, input).expand(input.shape[-1])


@_impl("native_layer_norm")
def _layer_norm(
    input: torch.Tensor, normalized_shape: Sequence[int], weight: Optional[torch.Tensor], bias: Optional[torch.Tensor], eps: float
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    op = aten.native_layer_norm.default
    # A normalized_shape other than the input's last dimension (a wrong one
    # included: the CPU's kernel says why it refuses it) is not the plugin's.
    if (
        len(normalized_shape) != 1
        or input.dim() < 1
        or input.shape[-1] != normalized_shape[0]
        or not _ok("layer_norm", input)
    ):
        return _fallback(op, input, normalized_shape, weight, bias, eps)
    w = _or_constant(weight, 1.0, input)
    b = _or_constant(bias, 0.0, input)
    if w.dtype != input.dtype or b.dtype != input.dtype:
        return _fallback(op, input, normalized_shape, weight, bias, eps)
    rows = input.shape[:-1]
    out = _empty(input.shape, input.dtype, input)
    mean = _empty(rows, torch.float32, input)
    rstd = _empty(rows, torch.float32, input)
    ops.layer_norm(_pc(input), _pc(w), _pc(b), _pc(out), _pc(mean), _pc(rstd), float(eps))
    stat = (*rows, 1)
    return out, mean.view(stat), rstd.view(stat)


@_impl("native_layer_norm_backward")
def _layer_norm_backward(
    grad_out: torch.Tensor,
    input: torch.Tensor,
    normalized_shape: Sequence[int],
    mean: torch.Tensor,
    rstd: torch.Tensor,
    weight: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    output_mask: Sequence[bool],
) -> Tuple[Optional[torch.Tensor], ...]:
    op = aten.native_layer_norm_backward.default
    args = (grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask)
    if len(normalized_shape) != 1 or not _ok("layer_norm_backward", input, grad_out) or mean.dtype != torch.float32:
        return _fallback(op, *args)
    h = input.shape[-1]
    rows = input.shape[:-1]
    w = _or_constant(weight, 1.0, input)
    gi = _empty(input.shape, input.dtype, input)
    gw = _empty((h,), input.dtype, input)
    gb = _empty((h,), input.dtype, input)
    ops.layer_norm_backward(
        _pc(grad_out), _pc(input), _pc(w), _pc(mean.reshape(rows)), _pc(rstd.reshape(rows)), _pc(gi), _pc(gw), _pc(gb)
    )
    return (
        gi if output_mask[0] else None,
        gw if output_mask[1] and weight is not None else None,
        gb if output_mask[2] and bias is not None else None,
    )


@_impl("_fused_rms_norm")
def _rms_norm(
    input: torch.Tensor, normalized_shape: Sequence[int], weight: Optional[torch.Tensor], eps: Optional[float]
) -> Tuple[torch.Tensor, torch.Tensor]:
    op = aten._fused_rms_norm.default
    if len(normalized_shape) != 1 or input.dim() < 1 or not _ok("rms_norm", input):
        return _fallback(op, input, normalized_shape, weight, eps)
    w = _or_constant(weight, 1.0, input)
    if w.dtype != input.dtype:
        return _fallback(op, input, normalized_shape, weight, eps)
    if eps is None:
        eps = torch.finfo(input.dtype).eps
    rows = input.shape[:-1]
    out = _empty(input.shape, input.dtype, input)
    inv = _empty(rows, torch.float32, input)
    ops.rms_norm(_pc(input), _pc(w), _pc(out), _pc(inv), float(eps))
    return out, inv.view((*rows, 1))


def _rms_norm_backward_composed(
    grad_out: torch.Tensor,
    input: torch.Tensor,
    k: int,
    rstd: torch.Tensor,
    weight: Optional[torch.Tensor],
    output_mask: Sequence[bool],
) -> Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
    """rms_norm's backward over the last ``k`` dimensions, in f32 (f64 for
    f64 inputs): with r = rstd and x^ = x r, dx = r (g w - x^ mean(g w x^))
    and dw = the sum of g x^ over the leading dimensions."""
    acc = torch.float64 if input.dtype == torch.float64 else torch.float32
    lead = input.dim() - k
    x = input.to(acc)
    g = grad_out.to(acc)
    r = rstd.to(acc).reshape(*input.shape[:lead], *([1] * k))
    x_hat = x * r
    gw = g * weight.to(acc) if weight is not None else g
    grad_input = None
    if output_mask[0]:
        dims = tuple(range(lead, input.dim()))
        grad_input = (r * (gw - x_hat * (gw * x_hat).mean(dim=dims, keepdim=True))).to(input.dtype)
    grad_weight = None
    if output_mask[1] and weight is not None:
        grad_weight = (g * x_hat).sum(dim=tuple(range(lead))).to(weight.dtype) if lead else (g * x_hat).to(weight.dtype)
    return grad_input, grad_weight


@_impl("_fused_rms_norm_backward")
def _rms_norm_backward(
    grad_out: torch.Tensor,
    input: torch.Tensor,
    normalized_shape: Sequence[int],
    rstd: torch.Tensor,
    weight: Optional[torch.Tensor],
    output_mask: Sequence[bool],
) -> Tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
    if len(normalized_shape) != 1 or not _ok("rms_norm_backward", input, grad_out) or rstd.dtype != torch.float32:
        # The CPU has no kernel for this operator (CUDA's and Meta's only):
        # its formula in other operators.
        return _rms_norm_backward_composed(grad_out, input, len(normalized_shape), rstd, weight, output_mask)
    h = input.shape[-1]
    rows = input.shape[:-1]
    w = _or_constant(weight, 1.0, input)
    gi = _empty(input.shape, input.dtype, input)
    gw = _empty((h,), input.dtype, input)
    ops.rms_norm_backward(_pc(grad_out), _pc(input), _pc(w), _pc(rstd.reshape(rows)), _pc(gi), _pc(gw))
    return (gi if output_mask[0] else None, gw if output_mask[1] and weight is not None else None)


# ---------------------------------------------------------------- embedding


@_impl("embedding")
def _embedding(
    weight: torch.Tensor, indices: torch.Tensor, padding_idx: int = -1, scale_grad_by_freq: bool = False, sparse: bool = False
) -> torch.Tensor:
    op = aten.embedding.default
    if weight.dim() != 2 or indices.dtype not in (torch.int32, torch.int64) or not _ok("embedding", weight) or not _on_device(indices):
        return _fallback(op, weight, indices, padding_idx, scale_grad_by_freq, sparse)
    out = _empty((*indices.shape, weight.shape[1]), weight.dtype, weight)
    _indices_refused_as_the_cpu(
        lambda: ops.embedding(_pc(weight), _pc(indices), _pc(out)), indices, weight.shape[0], None, lambda v: "index out of range in self"
    )
    return out


def _indices_refused_as_the_cpu(call: Callable[[], Any], indices: torch.Tensor, n: int, ignore: Optional[int], says: Callable[[int], str]) -> None:
    """Runs ``call``; where the plugin refuses an index outside ``[0, n)``
    (other than ``ignore``), raises PyTorch's CPU's IndexError, ``says`` of
    the first such index (`embedding` and `cross_entropy` raised the
    plugin's InvalidArgument, not an IndexError, until hostile sweep 6)."""
    try:
        call()
    except errors.InvalidArgument as e:
        flat = indices.reshape(-1).to("cpu", torch.int64)
        bad = flat[((flat < 0) | (flat >= n)) & (flat != ignore if ignore is not None else True)]
        if bad.numel():
            # The plugin's words (naming the operator) stay as the cause.
            raise IndexError(says(int(bad[0]))) from e
        raise


@_impl("embedding_dense_backward")
def _embedding_backward(
    grad: torch.Tensor, indices: torch.Tensor, num_weights: int, padding_idx: int, scale_grad_by_freq: bool
) -> torch.Tensor:
    op = aten.embedding_dense_backward.default
    if scale_grad_by_freq or indices.dtype not in (torch.int32, torch.int64) or not _ok("embedding_backward", grad):
        return _fallback(op, grad, indices, num_weights, padding_idx, scale_grad_by_freq)
    out = torch.zeros((num_weights, grad.shape[-1]), dtype=grad.dtype, device=grad.device)
    ops.embedding_backward(_pc(grad), _pc(indices), _pc(out))
    if 0 <= padding_idx < num_weights:
        out[padding_idx].fill_(0)
    return out


# ---------------------------------------------------------------- attention


def _sdpa_fused_ok(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any, dropout: float, causal: bool, enable_gqa: bool) -> bool:
    if mask is not None or dropout != 0.0 or q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return False
    if not _on_device(q, k, v) or len({q.dtype, k.dtype, v.dtype}) != 1 or not _ok("attention", q):
        return False
    if k.shape != v.shape or q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        return False
    hq, hk = q.shape[1], k.shape[1]
    if hq != hk and not (enable_gqa and hk > 0 and hq % hk == 0):
        return False
    # PyTorch aligns the causal mask at the top left, the operator at the
    # bottom right: they agree when the lengths do.
    return not causal or q.shape[2] == k.shape[2]


@_impl("_fused_sdp_choice")
def _sdp_choice(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: Optional[torch.Tensor] = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    scale: Optional[float] = None,
    enable_gqa: bool = False,
) -> int:
    from torch.nn.attention import SDPBackend

    if _sdpa_fused_ok(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa):
        return int(SDPBackend.OVERRIDEABLE)
    # The math form: matmuls and softmax, on the plugin as well.
    return int(SDPBackend.MATH)


@_impl("_scaled_dot_product_fused_attention_overrideable")
def _sdpa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_bias: Optional[torch.Tensor] = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    return_debug_mask: bool = False,
    *,
    scale: Optional[float] = None,
) -> Tuple[Any, ...]:
    if not _sdpa_fused_ok(query, key, value, attn_bias, dropout_p, is_causal, True) or return_debug_mask:
        raise RuntimeError(
            "polychip: the fused attention kernel takes 4-D q, k, v of one dtype without a mask or "
            "dropout (PyTorch chose it through _fused_sdp_choice, which should have refused this)"
        )
    b, h, s, d = query.shape
    sc = 1.0 / math.sqrt(d) if scale is None else float(scale)
    out = _empty(query.shape, query.dtype, query)
    lse = _empty((b, h, s), torch.float32, query)
    ops.attention(_pc(query), _pc(key), _pc(value), _pc(out), _pc(lse), sc, bool(is_causal))
    empty = torch.empty((0,), dtype=torch.int64, device=query.device)
    return out, lse, empty, empty, s, key.shape[2], empty, empty, empty


@_impl("_scaled_dot_product_fused_attention_overrideable_backward")
def _sdpa_backward(
    grad_out: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_bias: torch.Tensor,
    grad_input_mask: Sequence[bool],
    out: torch.Tensor,
    logsumexp: torch.Tensor,
    cum_seq_q: torch.Tensor,
    cum_seq_k: torch.Tensor,
    max_q: int,
    max_k: int,
    dropout_p: float,
    is_causal: bool,
    philox_seed: torch.Tensor,
    philox_offset: torch.Tensor,
    *,
    scale: Optional[float] = None,
) -> Tuple[Any, ...]:
    d = query.shape[-1]
    sc = 1.0 / math.sqrt(d) if scale is None else float(scale)
    gq = _empty(query.shape, query.dtype, query)
    gk = _empty(key.shape, key.dtype, key)
    gv = _empty(value.shape, value.dtype, value)
    g = grad_out if grad_out.dtype == query.dtype else grad_out.to(query.dtype)
    ops.attention_backward(
        _pc(query), _pc(key), _pc(value), _pc(out), _pc(logsumexp), _pc(g), _pc(gq), _pc(gk), _pc(gv), sc, bool(is_causal)
    )
    empty = torch.empty((0,), dtype=query.dtype, device=query.device)
    return gq, gk, gv, empty


# --------------------------------------------------------------------- loss


class _CrossEntropy(torch.autograd.Function):
    """Mean cross-entropy over rows of logits, fused on the plugin: the
    forward and backward operators take the logits directly."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, targets: torch.Tensor, ignore_index: int) -> torch.Tensor:
        loss = _empty((), torch.float32, logits)
        _indices_refused_as_the_cpu(
            lambda: ops.cross_entropy(_pc(logits), _pc(targets), _pc(loss), int(ignore_index)),
            targets,
            logits.shape[-1],
            int(ignore_index),
            lambda v: f"Target {v} is out of bounds.",
        )
        ctx.save_for_backward(logits, targets)
        ctx.ignore_index = ignore_index
        return loss if logits.dtype == torch.float32 else loss.to(logits.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[Any, ...]:
        logits, targets = ctx.saved_tensors
        if torch.is_grad_enabled():
            # A backward that is itself differentiated (create_graph=True: a
            # gradient penalty, a Hessian-vector product): the gradient from
            # differentiable operators, so that its own graph reaches the
            # logits (the fused operator's result has none, and the second
            # order term was silently dropped).
            keep = targets != ctx.ignore_index
            p = torch.softmax(logits.float(), dim=-1)
            onehot = torch.nn.functional.one_hot(torch.where(keep, targets, 0).long(), logits.shape[-1])
            scale = grad.float() / keep.sum()
            g = (p - onehot) * (keep.unsqueeze(-1) * scale)
            return g.to(logits.dtype), None, None
        grad_logits = _empty(logits.shape, logits.dtype, logits)
        ops.cross_entropy_backward(_pc(logits), _pc(targets), _pc(grad_logits), float(grad.item()), int(ctx.ignore_index))
        return grad_logits, None, None


_PLAIN = (torch.Tensor, torch.nn.Parameter)


@_impl("cross_entropy_loss", key="AutogradPrivateUse1")
def _cross_entropy_loss(
    self: torch.Tensor,
    target: torch.Tensor,
    weight: Optional[torch.Tensor] = None,
    reduction: int = 1,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    # Tensor subclasses (the fake tensors torch.compile traces with, the
    # functional ones of AOT autograd) have no device memory to hand a
    # plugin, and torch.func's transforms (grad, jacrev, vmap) cannot run
    # the fused Function on this device: they take the decomposition.
    fused = (
        type(self) in _PLAIN
        and type(target) in _PLAIN
        and not torch._C._are_functorch_transforms_active()
        and weight is None
        and label_smoothing == 0.0
        and reduction in (1, 2)
        and self.dim() == 2
        and target.dim() == 1
        # Long targets, as PyTorch's nll_loss takes (int32 ones it refuses,
        # and so does the decomposition below, in its words).
        and target.dtype == torch.int64
        and _on_device(self, target)
        and _ok("cross_entropy", self)
    )
    if fused and self.dtype in (torch.float16, torch.bfloat16) and torch.is_autocast_enabled(_DEVICE):
        # Autocast runs losses in f32: CUDA decomposes this operator into
        # log_softmax and nll_loss, which its policy lists as f32; fused,
        # it is on no list, so the logits are cast here (the cast is in the
        # graph, so their gradient comes back in their own dtype).
        self = self.float()
    if not fused:
        # PyTorch's own decomposition (log_softmax and nll_loss, which run
        # on the plugin or are counted as fallbacks).
        return aten.cross_entropy_loss.default.decompose(self, target, weight, reduction, ignore_index, label_smoothing)
    if reduction == 2:
        # The sum is the mean times the rows counted (the targets are small).
        count = int((target.cpu() != ignore_index).sum())
        if count == 0:
            # A sum over no row is 0 (the mean is NaN, and NaN * 0 is NaN),
            # with a zero gradient, as on the CPU.
            return self[:0].sum()
        return _CrossEntropy.apply(self, target, ignore_index) * count
    return _CrossEntropy.apply(self, target, ignore_index)


@_impl("unfold")
def _unfold(self: torch.Tensor, dimension: int, size: int, step: int) -> torch.Tensor:
    # A view (``Tensor.unfold``, and ``repeat`` inside PyTorch): each window
    # of ``size`` along ``dimension``, ``step`` apart, as a new last dimension.
    ndim = max(self.dim(), 1)  # a 0-d tensor unfolds as one of one element
    d = dimension + ndim if dimension < 0 else dimension
    if not 0 <= d < ndim:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-ndim}, {ndim - 1}], but got {dimension})")
    if self.dim() == 0:
        length, stride = 1, 1
        shape, strides = [], []
    else:
        length, stride = self.shape[d], self.stride(d)
        shape, strides = list(self.shape), list(self.stride())
    # PyTorch's checks, in its order.
    if size < 0:
        raise RuntimeError(f"size is {size} but must be >= 0")
    if size > length:
        raise RuntimeError(f"maximum size for tensor at dimension {d} is {length} but size is {size}")
    if step <= 0:
        raise RuntimeError(f"step is {step} but must be > 0")
    if self.dim() == 0:
        return self.as_strided([size], [1], self.storage_offset())
    shape[d] = (length - size) // step + 1
    strides[d] = stride * step
    return self.as_strided(shape + [size], strides + [stride], self.storage_offset())


# ------------------------------------------------------------- convolution

# PyTorch sends a convolution on a backend it does not know to
# `convolution_overrideable` (whose default raises), so a model with a
# Conv1d/Conv2d/Conv3d (ViT's patches, Whisper's front end, Mamba's causal
# convolution, CNNs) needs these two. They lower the convolution to the
# plugin's matmul: the input's patches are gathered by one strided copy on
# the device (im2col), each group's weights multiply them, and the input's
# gradient is scattered back by strided adds, one per kernel offset (one
# copy when the windows do not overlap). Transposed convolutions and dtypes
# the matmul lacks go to the CPU fallback, counted as `convolution`.


def _conv_lists(nd: int, *params: Sequence[int]) -> List[List[int]]:
    return [list(p) * nd if len(p) == 1 else list(p) for p in params]


def _conv_plain(input: torch.Tensor, weight: torch.Tensor, bias: Any, transposed: bool, *tensors: Any) -> bool:
    live = [t for t in (input, weight, bias, *tensors) if t is not None]
    return (
        not transposed
        and input.dim() == weight.dim() >= 3
        and _matmul_ok(*live)
        and all(t.dtype == input.dtype for t in live)
    )


def _padded(x: torch.Tensor, padding: Sequence[int]) -> torch.Tensor:
    """``x`` with ``padding`` zeros on both sides of each spatial dimension."""
    if not any(padding):
        return x
    spatial = [s + 2 * p for s, p in zip(x.shape[2:], padding)]
    out = torch.zeros((x.shape[0], x.shape[1], *spatial), dtype=x.dtype, device=x.device)
    inner = out
    for i, (s, p) in enumerate(zip(x.shape[2:], padding)):
        inner = inner.narrow(2 + i, p, s)
    inner.copy_(x)
    return out


def _windows(xp: torch.Tensor, k: Sequence[int], o: Sequence[int], stride: Sequence[int], dilation: Sequence[int]) -> torch.Tensor:
    """The view ``(N, C, *k, *o)`` of ``xp`` (padded) whose element
    ``[n, c, *j, *i]`` is ``xp[n, c, *(i * stride + j * dilation)]``."""
    st = xp.stride()
    return xp.as_strided(
        (xp.shape[0], xp.shape[1], *k, *o),
        (st[0], st[1], *[st[2 + d] * dilation[d] for d in range(len(k))], *[st[2 + d] * stride[d] for d in range(len(k))]),
        xp.storage_offset(),
    )


def _conv_geometry(input: torch.Tensor, weight: torch.Tensor, stride: Any, padding: Any, dilation: Any) -> Tuple[List[int], ...]:
    nd = weight.dim() - 2
    stride, padding, dilation = _conv_lists(nd, stride, padding, dilation)
    # What PyTorch's CPU and CUDA kernels check (aten::convolution leaves
    # these to the backend).
    if any(s <= 0 for s in stride):
        raise RuntimeError("non-positive stride is not supported")
    if any(d <= 0 for d in dilation):
        raise RuntimeError("non-positive dilation is not supported")
    if any(p < 0 for p in padding):
        raise RuntimeError("negative padding is not supported")
    k = list(weight.shape[2:])
    o = [(s + 2 * p - d * (kk - 1) - 1) // st + 1 for s, p, d, kk, st in zip(input.shape[2:], padding, dilation, k, stride)]
    return stride, padding, dilation, k, o


def _im2col(input: torch.Tensor, groups: int, geometry: Tuple[List[int], ...]) -> torch.Tensor:
    """``(groups, C / groups * prod(k), N * prod(o))``: each column one
    output position's window."""
    stride, padding, dilation, k, o = geometry
    nd = len(k)
    w = _windows(_padded(input, padding), k, o, stride, dilation)
    # (C, *k, N, *o), laid out so that the matmul's operands are plain views.
    cols = w.permute(1, *range(2, 2 + nd), 0, *range(2 + nd, 2 + 2 * nd)).contiguous()
    return cols.view(groups, -1, input.shape[0] * math.prod(o))


@_impl("convolution_overrideable")
def _convolution(
    input: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
    stride: Any, padding: Any, dilation: Any, transposed: bool, output_padding: Any, groups: int,
) -> torch.Tensor:
    if not _conv_plain(input, weight, bias, transposed):
        return _fallback(aten.convolution.default, input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
    geometry = _conv_geometry(input, weight, stride, padding, dilation)
    o = geometry[4]
    n, out_channels = input.shape[0], weight.shape[0]
    cols = _im2col(input, groups, geometry)
    wm = weight.contiguous().view(groups, out_channels // groups, -1)
    out = torch.bmm(wm, cols)  # (groups, O / groups, N * prod(o))
    out = out.view(out_channels, n, *o).transpose(0, 1).contiguous(memory_format=_conv_layout(input))
    if bias is not None:
        out.add_(bias.view(1, out_channels, *[1] * len(o)))
    return out


def _conv_layout(input: torch.Tensor) -> torch.memory_format:
    """The memory format of a convolution's output and input gradient:
    channels-last when the input is (as PyTorch's kernels keep it)."""
    last = {4: torch.channels_last, 5: torch.channels_last_3d}.get(input.dim())
    if last is not None and not input.is_contiguous() and input.is_contiguous(memory_format=last):
        return last
    return torch.contiguous_format


@_impl("convolution_backward_overrideable")
def _convolution_backward(
    grad_output: torch.Tensor, input: torch.Tensor, weight: torch.Tensor,
    stride: Any, padding: Any, dilation: Any, transposed: bool, output_padding: Any, groups: int,
    output_mask: Sequence[bool],
) -> Tuple[Optional[torch.Tensor], ...]:
    if not _conv_plain(input, weight, None, transposed, grad_output):
        bias_sizes = [weight.shape[1] * groups if transposed else weight.shape[0]]
        return _fallback(
            aten.convolution_backward.default, grad_output, input, weight, bias_sizes,
            stride, padding, dilation, transposed, output_padding, groups, output_mask,
        )
    geometry = _conv_geometry(input, weight, stride, padding, dilation)
    stride, padding, dilation, k, o = geometry
    nd = len(k)
    n, channels, out_channels = input.shape[0], input.shape[1], weight.shape[0]
    # (groups, O / groups, N * prod(o))
    go = grad_output.transpose(0, 1).contiguous().view(groups, out_channels // groups, -1)
    grad_input = grad_weight = grad_bias = None
    if output_mask[2]:
        grad_bias = grad_output.sum([0, *range(2, 2 + nd)])
    if output_mask[1]:
        cols = _im2col(input, groups, geometry)
        grad_weight = torch.bmm(go, cols.transpose(1, 2)).view(weight.shape)
    if output_mask[0]:
        wm = weight.contiguous().view(groups, out_channels // groups, -1)
        # (C, *k, N, *o): each window's gradient, scattered back below.
        dcols = torch.bmm(wm.transpose(1, 2), go).view(channels, *k, n, *o)
        dcols = dcols.permute(nd + 1, 0, *range(1, nd + 1), *range(nd + 2, 2 * nd + 2))  # (N, C, *k, *o)
        spatial = [s + 2 * p for s, p in zip(input.shape[2:], padding)]
        gxp = torch.zeros((n, channels, *spatial), dtype=input.dtype, device=input.device)
        windows = _windows(gxp, k, o, stride, dilation)
        if all(st >= d * (kk - 1) + 1 for st, d, kk in zip(stride, dilation, k)):
            windows.copy_(dcols)  # windows apart: each element written once
        else:
            for j in itertools.product(*[range(kk) for kk in k]):
                at = (slice(None), slice(None), *j)
                windows[at].add_(dcols[at])
        grad_input = gxp
        for i, (s, p) in enumerate(zip(input.shape[2:], padding)):
            grad_input = grad_input.narrow(2 + i, p, s)
        grad_input = grad_input.contiguous(memory_format=_conv_layout(input))
    return grad_input, grad_weight, grad_bias


# ------------------------------------------------------ recurrent cells

# PyTorch's LSTM and GRU take their fused cells on a PrivateUse1 device, as
# on CUDA; the CPU has no such kernels, so the fallback cannot run them.
# Here each is the cell's arithmetic in the registered operators (the
# workspace holds what the backward needs, as CUDA's does).


def _gates(x: torch.Tensor, h: torch.Tensor, bx: Optional[torch.Tensor], bh: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    if bx is not None:
        x = x + bx
    if bh is not None:
        h = h + bh
    return x, h


@_impl("_thnn_fused_lstm_cell")
def _lstm_cell(
    input_gates: torch.Tensor, hidden_gates: torch.Tensor, cx: torch.Tensor,
    input_bias: Optional[torch.Tensor] = None, hidden_bias: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x, h = _gates(input_gates, hidden_gates, input_bias, hidden_bias)
    i, f, g, o = (x + h).chunk(4, 1)
    i, f, g, o = torch.sigmoid(i), torch.sigmoid(f), torch.tanh(g), torch.sigmoid(o)
    cy = f * cx + i * g
    hy = o * torch.tanh(cy)
    return hy, cy, torch.cat([i, f, g, o], 1)


@_impl("_thnn_fused_lstm_cell_backward_impl")
def _lstm_cell_backward(
    grad_hy: Optional[torch.Tensor], grad_cy: Optional[torch.Tensor], cx: torch.Tensor,
    cy: torch.Tensor, workspace: torch.Tensor, has_bias: bool,
) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    i, f, g, o = workspace.chunk(4, 1)
    tc = torch.tanh(cy)
    gcx = torch.zeros_like(cy) if grad_cy is None else grad_cy  # only read below
    if grad_hy is None:
        grad_o = torch.zeros_like(o)
    else:
        gcx = gcx + grad_hy * o * (1.0 - tc * tc)
        grad_o = grad_hy * tc * o * (1.0 - o)
    grad_gates = torch.cat([gcx * g * i * (1.0 - i), gcx * cx * f * (1.0 - f), gcx * i * (1.0 - g * g), grad_o], 1)
    grad_bias = grad_gates.sum(0) if has_bias else None
    return grad_gates, gcx * f, grad_bias


@_impl("_thnn_fused_gru_cell")
def _gru_cell(
    input_gates: torch.Tensor, hidden_gates: torch.Tensor, hx: torch.Tensor,
    input_bias: Optional[torch.Tensor] = None, hidden_bias: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    x, h = _gates(input_gates, hidden_gates, input_bias, hidden_bias)
    xr, xz, xn = x.chunk(3, 1)
    hr, hz, hn = h.chunk(3, 1)
    r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
    n = torch.tanh(xn + r * hn)
    hy = n + z * (hx - n)
    return hy, torch.cat([r, z, n, hx, hn], 1)


@_impl("_thnn_fused_gru_cell_backward")
def _gru_cell_backward(grad_hy: torch.Tensor, workspace: torch.Tensor, has_bias: bool) -> Tuple[Optional[torch.Tensor], ...]:
    r, z, n, hx, hn = workspace.chunk(5, 1)
    grad_n = grad_hy * (1.0 - z) * (1.0 - n * n)  # before the tanh
    grad_z = grad_hy * (hx - n) * z * (1.0 - z)
    grad_r = grad_n * hn * r * (1.0 - r)
    grad_input = torch.cat([grad_r, grad_z, grad_n], 1)
    grad_hidden = torch.cat([grad_r, grad_z, grad_n * r], 1)
    biases = (grad_input.sum(0), grad_hidden.sum(0)) if has_bias else (None, None)
    return grad_input, grad_hidden, grad_hy * z, *biases


# -------------------------------------------------------------------- joins


@_impl("cat")
def _cat(tensors: Sequence[torch.Tensor], dim: int = 0) -> torch.Tensor:
    live = [t for t in tensors if not (t.dim() == 1 and t.numel() == 0)]
    if not live or not _on_device(*live) or len({t.device for t in live}) != 1:
        return _fallback(aten.cat.default, tensors, dim)
    d = _cat_checked(tensors, live, dim)
    # The skipped empty tensors take part in the result's dtype, as on the
    # CPU (torch.cat([torch.tensor([]), x_bf16]) is float32).
    dtype = live[0].dtype
    for t in tensors:
        dtype = torch.promote_types(dtype, t.dtype)
    shape = list(live[0].shape)
    shape[d] = sum(t.shape[d] for t in live)
    out = _empty(shape, dtype, live[0])
    at = 0
    for t in live:
        n = t.shape[d]
        if n:
            out.narrow(d, at, n).copy_(t)
        at += n
    return out


def _cat_checked(tensors: Sequence[torch.Tensor], live: Sequence[torch.Tensor], dim: int) -> int:
    """``dim`` made non-negative, after the CPU's checks, with its
    messages (a wrong size came out as a failed copy into the result,
    naming neither cat nor the tensor)."""
    for i, t in enumerate(tensors):
        if t.dim() == 0:
            raise RuntimeError(f"zero-dimensional tensor (at position {i}) cannot be concatenated")
    ndim = live[0].dim()
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], but got {dim})")
    d = dim + ndim if dim < 0 else dim
    for i, t in enumerate(tensors):
        if t.dim() == 1 and t.numel() == 0:
            continue
        if t.dim() != ndim:
            raise RuntimeError(f"Tensors must have same number of dimensions: got {ndim} and {t.dim()}")
        for k in range(ndim):
            if k != d and t.shape[k] != live[0].shape[k]:
                raise RuntimeError(
                    f"Sizes of tensors must match except in dimension {d}. Expected size {live[0].shape[k]} "
                    f"but got size {t.shape[k]} for tensor number {i} in the list."
                )
    return d


@_impl("stack")
def _stack(tensors: Sequence[torch.Tensor], dim: int = 0) -> torch.Tensor:
    if not tensors:
        return _fallback(aten.stack.default, tensors, dim)
    for i, t in enumerate(tensors[1:], 1):
        if t.shape != tensors[0].shape:
            raise RuntimeError(
                f"stack expects each tensor to be equal size, but got {list(tensors[0].shape)} at entry 0 "
                f"and {list(t.shape)} at entry {i}"
            )
    d = dim + tensors[0].dim() + 1 if dim < 0 else dim
    return _cat([t.unsqueeze(d) for t in tensors], d)


# ---------------------------------------------------------------- optimizer


def _step_value(step: Any) -> int:
    return int(step.item()) if isinstance(step, torch.Tensor) else int(step)


def _fused_adamw(
    op: Any,
    params: Sequence[torch.Tensor],
    grads: Sequence[torch.Tensor],
    exp_avgs: Sequence[torch.Tensor],
    exp_avg_sqs: Sequence[torch.Tensor],
    max_exp_avg_sqs: Sequence[torch.Tensor],
    state_steps: Sequence[torch.Tensor],
    lr: Any,
    beta1: float,
    beta2: float,
    weight_decay: float,
    eps: float,
    amsgrad: bool,
    maximize: bool,
    grad_scale: Optional[torch.Tensor],
    found_inf: Optional[torch.Tensor],
) -> None:
    kwargs = dict(
        lr=lr, beta1=beta1, beta2=beta2, weight_decay=weight_decay, eps=eps, amsgrad=amsgrad,
        maximize=maximize, grad_scale=grad_scale, found_inf=found_inf,
    )
    args = (params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps)
    fits = (
        not amsgrad
        and not maximize
        and grad_scale is None
        and found_inf is None
        and all(
            _on_device(p, g, m, v)
            and p.dtype == g.dtype
            and m.dtype == torch.float32
            and v.dtype == torch.float32
            and p.shape == g.shape == m.shape == v.shape
            and _ok("adamw", p)
            for p, g, m, v in zip(params, grads, exp_avgs, exp_avg_sqs)
        )
    )
    if not fits:
        return _fallback(op, *args, **kwargs)
    rate = float(lr.item()) if isinstance(lr, torch.Tensor) else float(lr)
    for p, g, m, v, s in zip(params, grads, exp_avgs, exp_avg_sqs, state_steps):
        ops.adamw(_pc(p), _pc(g), _pc(m), _pc(v), rate, float(beta1), float(beta2), float(eps), float(weight_decay), _step_value(s))


@_impl("_fused_adamw_")
def _fused_adamw_default(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, lr, beta1, beta2, weight_decay, eps, amsgrad, maximize, grad_scale=None, found_inf=None):  # noqa: E501
    _fused_adamw(aten._fused_adamw_.default, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps,
                 lr, beta1, beta2, weight_decay, eps, amsgrad, maximize, grad_scale, found_inf)


@_impl("_fused_adamw_.tensor_lr")
def _fused_adamw_tensor_lr(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, lr, beta1, beta2, weight_decay, eps, amsgrad, maximize, grad_scale=None, found_inf=None):  # noqa: E501
    _fused_adamw(aten._fused_adamw_.tensor_lr, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps,
                 lr, beta1, beta2, weight_decay, eps, amsgrad, maximize, grad_scale, found_inf)


# The foreach operators the optimizers (foreach path) and gradient clipping
# use: each is the per-tensor operator applied tensor by tensor, so each
# element runs on the plugin where that operator does (or falls back, counted
# under the per-tensor operator's name).
_FOREACH = {
    "_foreach_add_.Scalar": "add_",
    "_foreach_add_.List": "add_",
    "_foreach_add_.Tensor": "add_",
    "_foreach_add.Scalar": "add",
    "_foreach_add.List": "add",
    "_foreach_sub_.Scalar": "sub_",
    "_foreach_mul_.Scalar": "mul_",
    "_foreach_mul_.List": "mul_",
    "_foreach_mul_.Tensor": "mul_",
    "_foreach_mul_.ScalarList": "mul_",
    "_foreach_mul.Scalar": "mul",
    "_foreach_mul.Tensor": "mul",
    "_foreach_mul.List": "mul",
    "_foreach_div_.Scalar": "div_",
    "_foreach_div_.ScalarList": "div_",
    "_foreach_div_.List": "div_",
    "_foreach_div.ScalarList": "div",
    "_foreach_div.List": "div",
    "_foreach_neg": "neg",
    "_foreach_neg_": "neg_",
    "_foreach_sqrt": "sqrt",
    "_foreach_sqrt_": "sqrt_",
    "_foreach_zero_": "zero_",
    "_foreach_lerp_.Scalar": "lerp_",
    "_foreach_addcmul_.Scalar": "addcmul_:value",
    "_foreach_addcmul_.ScalarList": "addcmul_:value",
    "_foreach_addcdiv_.Scalar": "addcdiv_:value",
    "_foreach_addcdiv_.ScalarList": "addcdiv_:value",
    "_foreach_copy_": "copy_",
}


def _register_foreach(name: str, per_tensor: str) -> None:
    """``per_tensor`` is the operator's name, then after ``:`` the keyword
    its last positional argument becomes (``addcmul_:value``)."""
    op_name = name.partition(".")[0]
    single_name, _, keyword = per_tensor.partition(":")
    single = getattr(aten, single_name)
    inplace = op_name.endswith("_")

    def kernel(*args: Any, **kwargs: Any) -> Any:
        n = len(args[0])
        results = []
        for i in range(n):
            item = [a[i] if isinstance(a, (list, tuple)) and len(a) == n else a for a in args]
            extra = dict(kwargs)
            if keyword and len(item) > 3:
                extra[keyword] = item.pop()
            results.append(single(*item, **extra))
        return None if inplace else results

    _impl(name)(kernel)


for _name, _single in _FOREACH.items():
    _register_foreach(_name, _single)


@_impl("_foreach_norm.Scalar")
def _foreach_norm(tensors: Sequence[torch.Tensor], ord: Any = 2, dtype: Optional[torch.dtype] = None) -> List[torch.Tensor]:
    return [torch.linalg.vector_norm(t, ord, dtype=dtype) for t in tensors]


@_impl("lerp_.Scalar")
def _lerp_(self: torch.Tensor, end: torch.Tensor, weight: Any) -> torch.Tensor:
    # self += weight * (end - self)
    _check_overlap(self, end)
    if self.dtype not in _FLOATS or not _ok("sub", self) or end.dtype != self.dtype or not _on_device(end) or isinstance(weight, complex):
        return _fallback(aten.lerp_.Scalar, self, end, weight)
    diff = _empty(_broadcast(self.shape, end.shape), self.dtype, self)
    ops.sub(_pc(end), _pc(self), _pc(diff))
    ops.add(_pc(self), _pc(diff), _pc(self), float(weight))
    return self


def _addc(op_name: str, self: torch.Tensor, t1: torch.Tensor, t2: torch.Tensor, value: Any) -> torch.Tensor:
    op = getattr(aten, op_name).default
    _check_overlap(self, t1, t2)
    if (
        not _on_device(t1, t2)
        or len({self.dtype, t1.dtype, t2.dtype}) != 1
        or self.dtype not in _FLOATS
        or not _ok("mul", self)
        or isinstance(value, complex)
    ):
        return _fallback(op, self, t1, t2, value=value)
    tmp = _empty(_broadcast(t1.shape, t2.shape), self.dtype, self)
    (ops.mul if op_name == "addcmul_" else ops.div)(_pc(t1), _pc(t2), _pc(tmp))
    if tuple(_broadcast(self.shape, tmp.shape)) != tuple(self.shape):
        return _fallback(op, self, t1, t2, value=value)
    ops.add(_pc(self), _pc(tmp), _pc(self), float(value))
    return self


@_impl("addcmul_")
def _addcmul_(self: torch.Tensor, tensor1: torch.Tensor, tensor2: torch.Tensor, *, value: Any = 1) -> torch.Tensor:
    return _addc("addcmul_", self, tensor1, tensor2, value)


@_impl("addcdiv_")
def _addcdiv_(self: torch.Tensor, tensor1: torch.Tensor, tensor2: torch.Tensor, *, value: Any = 1) -> torch.Tensor:
    return _addc("addcdiv_", self, tensor1, tensor2, value)


# ------------------------------------------------------------------ losses


# PyTorch's generic kernel of these two (structured: the reduced output is
# made first) hands the CPU's `.out` kernel an output of the reduced shape,
# which that kernel's first step resizes to the inputs' shape with a
# deprecation warning ("outputs will not be resized" in a future release).
@_adjust("mse_loss")
def _mse_loss(self: torch.Tensor, target: torch.Tensor, reduction: int = 1) -> torch.Tensor:
    # Composed of device operators (reduction: 0 none, 1 mean, 2 sum).
    d = torch.sub(self, target)
    d = torch.mul(d, d)
    return d if reduction == 0 else d.mean() if reduction == 1 else d.sum()


@_adjust("smooth_l1_loss")
def _smooth_l1_loss(self: torch.Tensor, target: torch.Tensor, reduction: int = 1, beta: float = 1.0) -> torch.Tensor:
    # The CPU's own functional kernel, which makes its output itself.
    return _fallback(aten.smooth_l1_loss.default, self, target, reduction, beta)


# ------------------------------------------------------------------ dropout


@_adjust("native_dropout")
def _native_dropout(input: torch.Tensor, p: float, train: Optional[bool]) -> Tuple[torch.Tensor, torch.Tensor]:
    # The CPU kernel's steps, so that its mask is drawn by bernoulli_, which
    # takes a generator: the device's (a CPU kernel without a generator
    # argument would draw from the CPU's, shared with every other thread).
    if input.numel() == 0:
        return input, torch.empty_like(input, dtype=torch.bool)
    if train is not None and not train:
        return input.clone(), torch.ones_like(input, dtype=torch.bool)
    keep = 1.0 - p
    mask = torch.empty_like(input, memory_format=torch.contiguous_format).bernoulli_(keep)
    return (input * mask).mul_(0.0 if keep == 0 else 1.0 / keep), mask.to(torch.bool)


# ------------------------------------------------- synchronized batch norm

# nn.SyncBatchNorm calls five operators CUDA alone has (the CPU has none, so
# the fallback could not run them); here they are PyTorch's formulas in
# ordinary operators, per channel (dimension 1), statistics in f32.


def _channels(x: torch.Tensor) -> Tuple[List[int], List[int]]:
    """The dimensions a statistic reduces over, and the shape a per-channel
    vector broadcasts as."""
    dims = [d for d in range(x.dim()) if d != 1]
    shape = [1] * x.dim()
    shape[1] = x.shape[1]
    return dims, shape


@_adjust("record_stream")
def _record_stream(self: torch.Tensor, stream: Any) -> None:
    # Keeps memory from being reused while another stream may still use
    # it (FSDP calls it): a polychip call's work is complete when it
    # returns, and freed memory goes back to the plugin at once, so there
    # is nothing to keep.
    return None


@_adjust("native_batch_norm")
def _native_batch_norm(
    input: torch.Tensor,
    weight: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    running_mean: Optional[torch.Tensor],
    running_var: Optional[torch.Tensor],
    training: bool,
    momentum: float,
    eps: float,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # CUDA's and the CPU's kernels update the running statistics in place,
    # but this operator's schema does not say it writes them, so the CPU
    # fallback (which writes back what a schema marks written) would lose
    # the update: BatchNorm's running mean and variance would stay at 0
    # and 1. The same computation under the name whose schema marks them.
    if (running_mean is None) != (running_var is None):
        return _fallback(aten.native_batch_norm.default, input, weight, bias, running_mean, running_var, training, momentum, eps)
    if running_mean is None:
        return aten._native_batch_norm_legit.no_stats(input, weight, bias, training, momentum, eps)
    return aten._native_batch_norm_legit.default(input, weight, bias, running_mean, running_var, training, momentum, eps)


@_adjust("batch_norm_stats")
def _batch_norm_stats(input: torch.Tensor, eps: float) -> Tuple[torch.Tensor, torch.Tensor]:
    dims, _ = _channels(input)
    x = input.float()
    mean = x.mean(dims)
    var = x.var(dims, unbiased=False)
    return mean, (var + eps).rsqrt()


@_adjust("batch_norm_gather_stats_with_counts")
def _batch_norm_gather_stats_with_counts(
    input: torch.Tensor,
    mean: torch.Tensor,
    invstd: torch.Tensor,
    running_mean: Optional[torch.Tensor],
    running_var: Optional[torch.Tensor],
    momentum: float,
    eps: float,
    counts: torch.Tensor,
) -> Tuple[torch.Tensor, torch.Tensor]:
    # Each rank's (count, mean, biased variance) combined into the whole
    # batch's; the running statistics take the unbiased variance.
    n = counts.float().reshape(-1, 1)
    total = n.sum()
    all_mean = (n * mean).sum(0) / total
    var_each = invstd.float().pow(-2) - eps
    var = (n * (var_each + (mean - all_mean).pow(2))).sum(0) / total
    if running_mean is not None:
        running_mean.mul_(1 - momentum).add_(all_mean.to(running_mean.dtype), alpha=momentum)
    if running_var is not None:
        unbiased = var * total / (total - 1).clamp(min=1)
        running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype), alpha=momentum)
    return all_mean, (var + eps).rsqrt()


@_adjust("batch_norm_elemt")
def _batch_norm_elemt(
    input: torch.Tensor,
    weight: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    mean: torch.Tensor,
    invstd: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    _, shape = _channels(input)
    y = (input.float() - mean.reshape(shape)) * invstd.reshape(shape)
    if weight is not None:
        y = y * weight.float().reshape(shape)
    if bias is not None:
        y = y + bias.float().reshape(shape)
    return y.to(input.dtype)


@_adjust("batch_norm_backward_reduce")
def _batch_norm_backward_reduce(
    grad_out: torch.Tensor,
    input: torch.Tensor,
    mean: torch.Tensor,
    invstd: torch.Tensor,
    weight: Optional[torch.Tensor],
    input_g: bool,
    weight_g: bool,
    bias_g: bool,
) -> Tuple[torch.Tensor, ...]:
    dims, shape = _channels(input)
    dy = grad_out.float()
    sum_dy = dy.sum(dims)
    sum_dy_xmu = (dy * (input.float() - mean.reshape(shape))).sum(dims)
    empty = torch.empty(0, device=input.device)
    param = weight.dtype if weight is not None else input.dtype
    grad_weight = (sum_dy_xmu * invstd).to(param) if weight_g else empty
    grad_bias = sum_dy.to(param) if bias_g else empty
    if not input_g:
        sum_dy, sum_dy_xmu = empty, empty
    return sum_dy, sum_dy_xmu, grad_weight, grad_bias


@_adjust("batch_norm_backward_elemt")
def _batch_norm_backward_elemt(
    grad_out: torch.Tensor,
    input: torch.Tensor,
    mean: torch.Tensor,
    invstd: torch.Tensor,
    weight: Optional[torch.Tensor],
    sum_dy: torch.Tensor,
    sum_dy_xmu: torch.Tensor,
    count: torch.Tensor,
) -> torch.Tensor:
    _, shape = _channels(input)
    total = count.float().sum()
    mean_dy = (sum_dy / total).reshape(shape)
    mean_dy_xmu = (sum_dy_xmu / total).reshape(shape)
    inv = invstd.reshape(shape)
    x_mu = input.float() - mean.reshape(shape)
    g = (grad_out.float() - mean_dy - x_mu * inv * inv * mean_dy_xmu) * inv
    if weight is not None:
        g = g * weight.float().reshape(shape)
    return g.to(input.dtype)
