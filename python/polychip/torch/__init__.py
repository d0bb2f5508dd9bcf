"""PyTorch on every vendor's chip: the ``polychip`` device.

    import torch, polychip.torch
    x = torch.randn(4, 4).to("polychip:0")      # the first loaded device
    y = (x @ x).relu().to("polychip:1")         # another vendor's device
    print(polychip.torch.device_info(1), y.cpu())
    print(polychip.torch.fallback_report())     # aten ops that ran on the CPU

``polychip:0``, ``polychip:1``, ... are the devices of every loaded plugin
in ``polychip devices`` order. The operators polychip's op table has run on
the plugin (``registered_ops()``); every other aten operator runs through a
CPU fallback that is counted per operator (``fallback_report()``) and that
``strict()`` turns into an error naming the operator. ``torch.distributed``
gains a ``polychip`` backend (``polychip.torch.distributed``).

Importing this module (PyTorch also does it on ``import torch``, through
its backend-autoload entry point) builds the C++ half against the installed
torch on first use; see ``_build``.
"""

import atexit
import importlib.abc
import importlib.util
import os
import sys
import time
from types import ModuleType
from typing import Any, Dict, List, Optional, Tuple

import torch

import polychip

from . import _build

__all__ = [
    "device_count",
    "device_info",
    "fallback_report",
    "kernel_report",
    "max_memory_allocated",
    "memory_allocated",
    "profile",
    "registered_ops",
    "reset_fallback_report",
    "reset_kernel_report",
    "reset_peak_memory_stats",
    "strict",
]

_NAME = "polychip"


def _bind() -> Any:
    current = torch._C._get_privateuse1_backend_name()
    if current not in ("privateuseone", _NAME):
        raise ImportError(
            f"polychip.torch: PyTorch's PrivateUse1 device is already named {current!r} "
            "by another backend; one process can have only one"
        )
    native = _build.load()
    runtime = polychip.runtime()
    native.init(runtime._handle, runtime.device_count())
    if current != _NAME:
        torch.utils.rename_privateuse1_backend(_NAME)
        torch._register_device_module(_NAME, _device_module(native))
        torch.utils.generate_methods_for_privateuse1_backend(
            for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True
        )
    return native, runtime


def _device_module(native: Any) -> ModuleType:
    """``torch.polychip``: what PyTorch asks of a device's module."""
    m = ModuleType("torch.polychip")
    m.__doc__ = "The polychip device (see polychip.torch)."

    def is_available() -> bool:
        return native.device_count() > 0

    def synchronize(device: Any = None) -> None:
        # Every polychip call returns when its work is done.
        return None

    def manual_seed(seed: int) -> None:
        native.default_generator(native.current_device()).manual_seed(seed)

    def manual_seed_all(seed: int) -> None:
        for i in range(native.device_count()):
            native.default_generator(i).manual_seed(seed)

    def get_rng_state(device: Any = _NAME) -> torch.Tensor:
        return native.default_generator(_index(device)).get_state()

    def set_rng_state(state: torch.Tensor, device: Any = _NAME) -> None:
        native.default_generator(_index(device)).set_state(state)

    def _index(device: Any) -> int:
        d = torch.device(device) if not isinstance(device, int) else torch.device(_NAME, device)
        if d.type != _NAME:
            raise ValueError(f"Expected a polychip device, but got: {d}")
        return native.current_device() if d.index is None else d.index

    def set_device(device: Any) -> None:
        native.set_device(_index(device))

    class device:
        """Context manager making ``polychip:index`` the current device
        (``torch.polychip.device(1)``, or a ``torch.device``)."""

        def __init__(self, which: Any) -> None:
            self.index = which if isinstance(which, int) else _index(which)

        def __enter__(self) -> "device":
            self.previous = native.current_device()
            if self.index is not None and self.index >= 0:
                native.set_device(self.index)
            return self

        def __exit__(self, *exc: Any) -> None:
            native.set_device(self.previous)

    # The memory functions device-generic code calls on an accelerator's
    # module (torch.cuda's names).
    def memory_allocated(device: Any = None) -> int:
        return native.memory_stats(_index(_NAME if device is None else device))[0]

    def max_memory_allocated(device: Any = None) -> int:
        return native.memory_stats(_index(_NAME if device is None else device))[1]

    def reset_peak_memory_stats(device: Any = None) -> None:
        native.reset_peak(_index(_NAME if device is None else device))

    def empty_cache() -> None:
        # No cache: freed memory goes back to the plugin at once.
        return None

    def get_device_name(device: Any = None) -> str:
        info = device_info(_index(_NAME if device is None else device))
        return f"{info['vendor']} {info['name']}"

    def is_bf16_supported(including_emulation: bool = True) -> bool:
        return True

    # Streams and events under torch.cuda's names, which device-generic code
    # (distributed checkpointing, FSDP) calls on the current accelerator's
    # module. Polychip streams complete their work before each call
    # returns, so they order nothing, but they are real torch.Stream
    # objects of the device.
    def _device(device: Any) -> torch.device:
        return torch.device(_NAME, _index(_NAME if device is None else device))

    def current_stream(device: Any = None) -> torch.Stream:
        return torch.accelerator.current_stream(_device(device))

    def default_stream(device: Any = None) -> torch.Stream:
        return torch.Stream(device=_device(device), priority=0)

    def Stream(device: Any = None, priority: int = 0, **_: Any) -> torch.Stream:  # noqa: N802 - torch.cuda's name
        return torch.Stream(device=_device(device), priority=priority)

    def Event(enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> torch.Event:  # noqa: N802
        return torch.Event(device=_device(None), enable_timing=enable_timing, blocking=blocking, interprocess=interprocess)

    def set_stream(stream: torch.Stream) -> None:
        torch.accelerator.set_stream(stream)

    class stream:  # noqa: N801 - torch.cuda's name
        """Context manager making ``s`` its device's current stream (None:
        no change)."""

        def __init__(self, s: Any) -> None:
            self.s = s

        def __enter__(self) -> Any:
            if self.s is not None:
                self.previous = torch.accelerator.current_stream(self.s.device)
                torch.accelerator.set_stream(self.s)
            return self.s

        def __exit__(self, *exc: Any) -> None:
            if self.s is not None:
                torch.accelerator.set_stream(self.previous)

    for f in (
        is_available, synchronize, manual_seed, manual_seed_all, get_rng_state, set_rng_state, device,
        memory_allocated, max_memory_allocated, reset_peak_memory_stats, empty_cache, get_device_name,
        is_bf16_supported, current_stream, default_stream, Stream, Event, set_stream, stream,
    ):
        setattr(m, f.__name__, f)
    m.memory_reserved = memory_allocated
    m.max_memory_reserved = max_memory_allocated
    m.default_generators = tuple(native.default_generator(i) for i in range(native.device_count()))
    m.device_count = native.device_count
    m.current_device = native.current_device
    m.set_device = set_device
    m.is_initialized = lambda: True
    # What activation checkpointing looks at before it saves and restores
    # the device's random state (as torch.cuda._initialized).
    m._initialized = True
    m._lazy_init = lambda: None
    m._is_in_bad_fork = lambda: False
    m.get_amp_supported_dtype = lambda: [torch.float16, torch.bfloat16]
    return m


_native_backend, _runtime = _bind()


def _let_autograd_threads_finish() -> None:
    """At exit, before the interpreter finalizes: releases the GIL for a
    moment. PyTorch runs a device's backward pass on a thread of its own,
    and that thread may drop the finished graph's last reference (which
    holds Python objects, so it takes the GIL) just after ``backward()``
    has returned. Were it still waiting for the GIL when finalization
    starts, CPython would end the thread inside a C++ destructor and the
    process would abort ("terminate called without an active exception").
    The wait lets a thread already queued on the GIL finish first: 50 ms,
    as a loaded machine can keep that thread off a core for more than the
    10 ms this once was."""
    for _ in range(25):
        time.sleep(0.002)


atexit.register(_let_autograd_threads_finish)


INDUCTOR_MESSAGE = (
    "polychip: torch.compile's default backend (Inductor) generates kernels of its own, which "
    "cannot run on a polychip device; compile with torch.compile(model, backend=\"aot_eager\") "
    "(the traced graph then runs on the plugins' operators) or leave the model uncompiled"
)


def _refuse_inductor(common: ModuleType) -> None:
    """Registers ``polychip`` with Inductor (its codegen registry,
    ``common``) so that compiling a graph of polychip tensors stops with
    ``INDUCTOR_MESSAGE`` instead of ``KeyError: 'polychip'``."""

    class _Refusing(type):
        # Whatever Inductor asks of the scheduling or wrapper class first.
        def __getattr__(cls, name: str) -> Any:
            raise RuntimeError(INDUCTOR_MESSAGE)

    class _NoKernels(metaclass=_Refusing):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            raise RuntimeError(INDUCTOR_MESSAGE)

    if common.get_scheduling_for_device(_NAME) is None:
        common.register_device_op_overrides(_NAME, common.DeviceOpOverrides())
        common.register_backend_for_device(_NAME, _NoKernels, _NoKernels)


def _admit_to_hub_kernels(kernelize: ModuleType) -> None:
    """Lets the ``kernels`` library (Hugging Face's hub kernels, which
    transformers 5 depends on) take ``polychip`` as a device type.

    ``from_pretrained(..., device_map="polychip:0")`` kernelizes the loaded
    model for its device's type by name, and ``kernels`` checks that name
    against the device types it knows (``cuda``, ``mps``, ...): every
    polychip device map failed with ``ValueError: Unsupported device type
    'polychip'``. Admitted, ``polychip`` is a device type for which no hub
    kernel exists, so each layer keeps its PyTorch forward (transformers
    asks for the fallback), as on any device a kernel was not built for.
    ``kernels``' own check is kept for every other name."""
    validate = getattr(kernelize, "_validate_device_type", None)
    if validate is None or getattr(validate, "_admits_polychip", False):
        return

    def _validate_device_type(device_type: str) -> None:
        if device_type != _NAME:
            validate(device_type)

    _validate_device_type._admits_polychip = True  # type: ignore[attr-defined]
    kernelize._validate_device_type = _validate_device_type  # type: ignore[attr-defined]


class _ImportHook(importlib.abc.MetaPathFinder):
    """Adapts a module of another package to the ``polychip`` device when
    it is first imported (importing it here would add its import time to
    every import of this module): Inductor's codegen registry
    (``_refuse_inductor``) and the ``kernels`` library's ``kernelize``
    (``_admit_to_hub_kernels``). A failure there leaves the module as it
    was."""

    PATCHES = {
        "torch._inductor.codegen.common": _refuse_inductor,
        "kernels._internals.layer.kernelize": _admit_to_hub_kernels,
    }

    def __init__(self, pending: Dict[str, Any]) -> None:
        self.pending = pending

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        patch = self.pending.pop(fullname, None)
        if patch is None:
            return None
        if not self.pending:
            sys.meta_path.remove(self)
        # The other finders find it (this one no longer answers for it).
        spec = importlib.util.find_spec(fullname)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            try:
                patch(module)
            except Exception:  # noqa: BLE001 - never break the module for other devices
                pass

        loader.exec_module = exec_module
        return spec


def _install_import_hook() -> None:
    pending = {}
    for name, patch in _ImportHook.PATCHES.items():
        if name in sys.modules:
            try:
                patch(sys.modules[name])
            except Exception:  # noqa: BLE001 - as in _ImportHook
                pass
        else:
            pending[name] = patch
    if pending:
        sys.meta_path.insert(0, _ImportHook(pending))


_install_import_hook()


def device_count() -> int:
    """How many ``polychip:N`` devices there are."""
    return _native_backend.device_count()


def device_info(index: int) -> Dict[str, Any]:
    """Which vendor and device ``polychip:index`` is (``vendor``, ``name``,
    ``plugin_device``, memory, host visibility, ...)."""
    if not isinstance(index, int) or not 0 <= index < device_count():
        raise IndexError(
            f"polychip:{index} does not exist: this process has {device_count()} polychip devices"
        )
    return _runtime.device_info(index)


class FallbackReport(dict):
    """CPU fallbacks since the last reset: aten operator → calls;
    ``seconds`` maps each to the time spent in its fallbacks (copies to
    and from the CPU included). ``str()`` is a table, most frequent first;
    ``total`` is the number of calls."""

    def __init__(self, counts: Dict[str, Any]) -> None:
        super().__init__({k: v[0] for k, v in counts.items() if v[0]})
        self.seconds: Dict[str, float] = {k: v[1] for k, v in counts.items() if v[0]}

    @property
    def total(self) -> int:
        return sum(self.values())

    @property
    def total_seconds(self) -> float:
        return sum(self.seconds.values())

    def __str__(self) -> str:
        if not self:
            return "no aten operator fell back to the CPU"
        width = max(len(k) for k in self)
        rows = sorted(self.items(), key=lambda kv: (-kv[1], kv[0]))
        lines = [f"{'aten operator':<{width}}  calls  seconds"]
        lines += [f"{k:<{width}}  {v:>5}  {self.seconds[k]:>7.4f}" for k, v in rows]
        lines.append(f"{'total':<{width}}  {self.total:>5}  {self.total_seconds:>7.4f}")
        return "\n".join(lines)


def fallback_report() -> FallbackReport:
    """The aten operators that ran on the CPU instead of a plugin, how
    often and for how long, since the process started or
    ``reset_fallback_report()``."""
    return FallbackReport(_native_backend.fallback_counts())


def reset_fallback_report() -> None:
    """Clears the fallback counts."""
    _native_backend.reset_fallback_counts()


class strict:
    """Strict mode: an aten operator without a polychip kernel raises
    (naming it) instead of running on the CPU. ``strict()`` or
    ``strict(True)`` turns it on now; ``strict(False)`` off; as a context
    manager the previous setting comes back on exit. ``POLYCHIP_TORCH_STRICT=1``
    turns it on at import."""

    def __init__(self, on: bool = True) -> None:
        self._previous = _native_backend.strict()
        _native_backend.set_strict(bool(on))

    def __enter__(self) -> "strict":
        return self

    def __exit__(self, *exc: Any) -> None:
        _native_backend.set_strict(self._previous)

    @staticmethod
    def enabled() -> bool:
        """Whether strict mode is on."""
        return bool(_native_backend.strict())


if os.environ.get("POLYCHIP_TORCH_STRICT", "") not in ("", "0"):
    _native_backend.set_strict(True)


def memory_allocated(device: Any = None) -> int:
    """Bytes of polychip device memory PyTorch holds on ``device`` (an
    index, ``"polychip:N"`` or a ``torch.device``; the current one if
    None)."""
    return torch.polychip.memory_allocated(device)


def max_memory_allocated(device: Any = None) -> int:
    """The peak of ``memory_allocated`` since start or ``reset_peak_memory_stats``."""
    return torch.polychip.max_memory_allocated(device)


def reset_peak_memory_stats(device: Any = None) -> None:
    torch.polychip.reset_peak_memory_stats(device)


def kernel_report() -> Dict[str, Tuple[int, float]]:
    """Each registered aten kernel that ran: (calls, seconds); seconds
    accumulate only inside ``profile()``."""
    from . import _aten

    return {k: (n, _aten.SECONDS[k]) for k, n in _aten.CALLS.items() if n}


def reset_kernel_report() -> None:
    from . import _aten

    for k in _aten.CALLS:
        _aten.CALLS[k] = 0
        _aten.SECONDS[k] = 0.0
    for k in _aten.TOTALS:
        _aten.TOTALS[k] = 0.0


class profile:
    """Times every registered kernel while on (``kernel_report()``)."""

    def __enter__(self) -> "profile":
        from . import _aten

        self._previous = _aten.PROFILING[0]
        _aten.PROFILING[0] = True
        return self

    def __exit__(self, *exc: Any) -> None:
        from . import _aten

        _aten.PROFILING[0] = self._previous


def registered_ops() -> List[str]:
    """The aten operators (``name.overload``) registered to run on the
    plugins, besides the tensor basics (empty, views, copies, fill)."""
    from . import _aten

    return sorted(_aten.REGISTERED)


from . import _aten  # noqa: E402,F401 - registers the plugin kernels
from . import _aten_1_4  # noqa: E402,F401 - and those of ABI 1.4's operators
from . import distributed  # noqa: E402

distributed.register()
