"""polychip for Python: load every vendor's AI chip plugin into one process,
make tensors on any vendor's device, move them between vendors, run every
operator of the op table (``polychip.ops``), exchange tensors with NumPy and
PyTorch through DLPack, and run collectives across ranks (``polychip.comm``).

    import polychip
    for d in polychip.devices():
        print(d)
    a = polychip.tensor([[1.0, 2.0], [3.0, 4.0]], device=0)
    b = a.to(1)                      # another vendor's device
    out = polychip.empty((2, 2), device=1)
    polychip.ops.matmul(b, b, out)
    print(out.numpy())

Devices are numbered across vendors in the order ``polychip devices``
lists them. The plugins are the bundled ones (beside the native module) and
those ``POLYCHIP_PLUGIN_PATH`` names; ``polychip.runtime(...)`` makes a
runtime with other settings.
"""

import operator
import sys as _sys
from typing import Any, Optional, Sequence, Tuple, Union

from . import _native, errors
from ._native import Event, Stream  # noqa: F401 - re-exported

ops = _native.ops
_sys.modules[__name__ + ".ops"] = ops

__all__ = [
    "Device",
    "Event",
    "Stream",
    "Tensor",
    "comm",
    "device",
    "devices",
    "empty",
    "errors",
    "from_dlpack",
    "ops",
    "runtime",
    "stream",
    "tensor",
    "zeros",
]

DTYPES = ("float32", "float16", "bfloat16", "float64", "int32", "int64", "uint8", "bool")
_ALIASES = {"float": "float32", "half": "float16", "double": "float64", "int": "int64", "long": "int64"}

_runtime: Optional[_native.Runtime] = None


def runtime(
    plugin_path: Optional[str] = None, bundled: bool = True, strict: bool = False
) -> _native.Runtime:
    """The process's runtime: made on first use (or now, with these
    settings; later calls with settings make a new one and make it the
    default)."""
    global _runtime
    if _runtime is None or plugin_path is not None or not bundled or strict:
        _runtime = _native.Runtime(plugin_path, bundled, strict)
    return _runtime


def _dtype(dtype: Any) -> str:
    """The polychip name of a dtype: a name, a NumPy dtype or a torch dtype."""
    if isinstance(dtype, str):
        name = dtype
    elif hasattr(dtype, "name") and isinstance(dtype.name, str):  # numpy.dtype
        name = dtype.name
    else:
        name = str(dtype)
    name = name.removeprefix("torch.")
    name = _ALIASES.get(name, name)
    if name not in DTYPES:
        raise TypeError(f"{dtype!r} is not a polychip dtype (one of {', '.join(DTYPES)})")
    return name


class Device:
    """One device of one vendor, by its index across all vendors."""

    def __init__(self, index: int, rt: Optional[_native.Runtime] = None):
        self._runtime = rt or runtime()
        self.index = index
        self.info = self._runtime.device_info(index)

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["info"][name]
        except KeyError:
            raise AttributeError(name) from None

    def __index__(self) -> int:
        return self.index

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Device) and other.index == self.index and other._runtime is self._runtime

    def __hash__(self) -> int:
        return hash(self.index)

    def __repr__(self) -> str:
        i = self.info
        return (
            f"Device({self.index}: {i['vendor']} {i['name']}, {i['memory_bytes'] / 2**30:.2f} GiB"
            f"{', host-visible' if i['host_visible'] else ''}, {i['ops_implemented']}/{i['ops_total']} ops)"
        )


def devices() -> list:
    """Every device of every loaded plugin."""
    rt = runtime()
    return [Device(i, rt) for i in range(rt.device_count())]


def device(index: Union[int, Device]) -> Device:
    """Device ``index``."""
    return index if isinstance(index, Device) else Device(_index(index))


def _index(device: Union[int, Device, None]) -> int:
    """A device argument as an index of the default runtime, checked: a
    float, a string or an index no device has is refused, not truncated or
    wrapped."""
    if device is None:
        return 0
    if isinstance(device, Device):
        if device._runtime is not runtime():
            raise errors.InvalidArgument(
                f"{device!r} belongs to an earlier runtime than the default one "
                "(polychip.runtime(...) made a new one); its index may name another device here"
            )
        return device.index
    try:
        if isinstance(device, bool):
            raise TypeError  # True is an int, but names no device
        index = operator.index(device)
    except TypeError:
        raise TypeError(
            f"device must be a device index (an int) or a polychip.Device, not {type(device).__name__}"
        ) from None
    count = runtime().device_count()
    if not 0 <= index < count:
        raise errors.InvalidArgument(
            f"device {index} does not exist: the runtime has {count} device(s), 0 to {count - 1}"
        )
    return index


Tensor = _native.Tensor


def _shape(shape: Union[int, Sequence[int]]) -> list:
    """A shape argument as a list: an int (a NumPy integer too) is one
    extent; anything else must be a sequence. A float, None or a bool was
    refused with "'float' object is not iterable", which named no argument."""
    if isinstance(shape, bool):
        raise TypeError("shape must be an int or a sequence of ints, not bool")
    try:
        return [operator.index(shape)]
    except TypeError:
        pass
    if isinstance(shape, (str, bytes)):
        raise TypeError(f"shape must be an int or a sequence of ints, not {type(shape).__name__}")
    try:
        return list(shape)
    except TypeError:
        raise TypeError(f"shape must be an int or a sequence of ints, not {type(shape).__name__}") from None


def empty(shape: Union[int, Sequence[int]], dtype: Any = "float32", device: Union[int, Device, None] = None) -> Tensor:
    """An uninitialised tensor on ``device`` (default device 0)."""
    shape = _shape(shape)
    return runtime().tensor(_index(device), _dtype(dtype), shape, False)


def zeros(shape: Union[int, Sequence[int]], dtype: Any = "float32", device: Union[int, Device, None] = None) -> Tensor:
    """A tensor of zeros on ``device`` (default device 0)."""
    shape = _shape(shape)
    return runtime().tensor(_index(device), _dtype(dtype), shape, True)


def tensor(data: Any, dtype: Any = None, device: Union[int, Device, None] = None) -> Tensor:
    """A tensor holding a copy of ``data`` (nested lists, a NumPy array, or
    anything ``numpy.asarray`` takes) on ``device`` (default device 0)."""
    import numpy as np

    array = np.asarray(data, dtype=None if dtype is None else _dtype(dtype))
    if array.dtype == np.float64 and dtype is None and not isinstance(data, np.ndarray):
        array = array.astype(np.float32)
    # Row-major and native byte order (a big-endian array's bytes are not
    # the device's); np.ascontiguousarray would also make a 0-d array 1-d.
    array = np.asarray(array, dtype=array.dtype.newbyteorder("="), order="C")
    t = empty(array.shape, array.dtype, device)
    t.write_bytes(array.tobytes())
    return t


def from_dlpack(obj: Any, device: Union[int, Device, None] = None) -> Tensor:
    """A polychip tensor from any DLPack producer (a NumPy array, a torch
    tensor, a polychip tensor or a capsule): the same memory when it is on a
    polychip device, else a copy on ``device`` (default device 0)."""
    return _native.from_dlpack(runtime(), obj, None if device is None else _index(device))


def stream(device: Union[int, Device, None] = None) -> Stream:
    """A new stream on ``device``."""
    return Stream(runtime(), _index(device))


class _CommModule:
    """``polychip.comm``: the communication layer."""

    Comm = _native.Comm

    def init(
        self,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        master_addr: Optional[str] = None,
        master_port: int = 0,
    ) -> _native.Comm:
        """Joins the job the launcher's environment describes (torchrun,
        ``polychip launch``, mpirun, srun), or the one the arguments describe."""
        return _native.Comm(rank, world_size, master_addr, master_port)


comm = _CommModule()
_sys.modules[__name__ + ".comm"] = comm  # type: ignore[assignment]


def _version() -> Tuple[int, int]:
    return _native.api_version()


api_version = _version()
