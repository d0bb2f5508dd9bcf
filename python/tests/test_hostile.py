"""Hostile input at the Python package, as a framework with a bug (or a
fuzzer) would pass it: DLPack capsules that lie about their version, device,
dtype, shape, strides or offset, capsules used already or with no deleter,
read-only and non-contiguous NumPy arrays, 0-size and 0-d tensors, sizes
no memory holds, text that is not UTF-8, handles that are no tensor,
streams of another device, several threads at once. Every call either
works or raises an exception naming the argument and the bad value; none
crashes, hangs or aborts the interpreter."""

import ctypes as C
import gc
import threading

import numpy as np
import pytest

import polychip


class DLTensor(C.Structure):
    _fields_ = [
        ("data", C.c_void_p),
        ("device", C.c_int32 * 2),
        ("ndim", C.c_int32),
        ("dtype", C.c_uint8 * 4),
        ("shape", C.POINTER(C.c_int64)),
        ("strides", C.POINTER(C.c_int64)),
        ("byte_offset", C.c_uint64),
    ]


class Versioned(C.Structure):
    pass


class Legacy(C.Structure):
    pass


VERSIONED_DELETER = C.CFUNCTYPE(None, C.POINTER(Versioned))
LEGACY_DELETER = C.CFUNCTYPE(None, C.POINTER(Legacy))
Versioned._fields_ = [
    ("version", C.c_uint32 * 2),
    ("ctx", C.c_void_p),
    ("deleter", VERSIONED_DELETER),
    ("flags", C.c_uint64),
    ("tensor", DLTensor),
]
Legacy._fields_ = [("tensor", DLTensor), ("ctx", C.c_void_p), ("deleter", LEGACY_DELETER)]

_new_capsule = C.pythonapi.PyCapsule_New
_new_capsule.restype, _new_capsule.argtypes = C.py_object, [C.c_void_p, C.c_char_p, C.c_void_p]

# The structs and arrays a forged capsule points to live as long as the test
# module (a capsule with no destructor frees nothing).
_KEEP = []


def _int64s(values):
    if values is None:
        return None
    array = (C.c_int64 * max(len(values), 1))(*values)
    _KEEP.append(array)
    return C.cast(array, C.POINTER(C.c_int64))


def forged(data, shape, strides=None, device=(1, 0), dtype=(2, 32, 1), byte_offset=0, ndim=None,
           version=(1, 0), flags=0, legacy=False, deleter=None):
    """A capsule of a managed tensor made by hand: whatever it says."""
    t = DLTensor(data, device, len(shape) if ndim is None else ndim, (*dtype[:2], dtype[2] & 0xFF, dtype[2] >> 8),
                 _int64s(shape), _int64s(strides), byte_offset)
    if legacy:
        m = Legacy(t, None, deleter or LEGACY_DELETER())
        name = b"dltensor"
    else:
        m = Versioned(version, None, deleter or VERSIONED_DELETER(), flags, t)
        name = b"dltensor_versioned"
    _KEEP.append(m)
    return _new_capsule(C.addressof(m), name, None)


def address(array):
    return array.__array_interface__["data"][0]


@pytest.mark.parametrize(
    "device, says",
    [
        ((2, 0), "kDLCUDA (2)"),
        ((10, 0), "kDLROCM (10)"),
        ((8, 0), "kDLMetal (8)"),
        ((14, 0), "kDLOneAPI (14)"),
        ((-1, 0), "device type -1, which is no DLPack device type"),
        ((1000, 0), "device type 1000"),
    ],
)
def test_another_vendors_device_is_refused_naming_it(device, says):
    host = np.arange(4, dtype=np.float32)
    with pytest.raises(polychip.errors.InvalidArgument, match=r"copy it to the CPU first") as e:
        polychip.from_dlpack(forged(address(host), [4], device=device))
    assert says in str(e.value)


@pytest.mark.parametrize(
    "dtype, says",
    [
        ((0, 16, 1), "int16"),
        ((0, 8, 1), "int8"),
        ((1, 32, 1), "uint32"),
        ((5, 64, 1), "complex64"),
        ((2, 32, 4), "a vector of 4 float32 lanes"),
        ((2, 32, 0), "lanes 0"),
        ((2, 24, 1), "float24"),
        ((99, 32, 1), "type code 99 is not a DLPack type code"),
    ],
)
def test_an_unsupported_dtype_is_refused_naming_it_and_what_polychip_takes(dtype, says):
    host = np.zeros(4, dtype=np.float64)
    with pytest.raises(polychip.errors.InvalidArgument, match="has no polychip dtype") as e:
        polychip.from_dlpack(forged(address(host), [1], dtype=dtype))
    assert says in str(e.value) and "float32, float16, bfloat16" in str(e.value)


def test_numpy_dtypes_polychip_has_not_are_refused_naming_them():
    for dtype, says in [(np.int16, "int16"), (np.uint64, "uint64"), (np.complex128, "complex128")]:
        with pytest.raises(polychip.errors.InvalidArgument, match=says):
            polychip.from_dlpack(np.zeros(3, dtype))


@pytest.mark.parametrize(
    "kwargs, says",
    [
        (dict(shape=[4], ndim=-1), "ndim -1 is out of range"),
        (dict(shape=[4], ndim=-(2**31)), "ndim -2147483648 is out of range"),
        (dict(shape=[1] * 65), "ndim 65 is out of range"),
        (dict(shape=[], ndim=2**31 - 1), "ndim 2147483647 is out of range"),
        (dict(shape=[-4]), "shape [-4] has a negative extent"),
        (dict(shape=[2**40, 2**40], strides=[0, 0]), "overflows 64-bit sizes"),
        (dict(shape=[3, 3], strides=[2**62, 2**62]), "overflows 64-bit sizes"),
        (dict(shape=[3, 3], strides=[-(2**62), 1]), "overflows 64-bit sizes"),
        (dict(shape=[1], byte_offset=2**63), "overflows 64-bit sizes"),
        (dict(shape=[1], byte_offset=2**64 - 4), "overflows 64-bit sizes"),
    ],
)
def test_capsules_with_lying_layouts_are_refused(kwargs, says):
    host = np.zeros(4, dtype=np.float32)
    with pytest.raises(polychip.errors.InvalidArgument) as e:
        polychip.from_dlpack(forged(address(host), **kwargs))
    assert says in str(e.value)


def test_capsules_of_other_dlpack_versions_are_refused_naming_them():
    host = np.zeros(4, dtype=np.float32)
    for version in [(0, 8), (2, 0), (2**32 - 1, 7)]:
        with pytest.raises(polychip.errors.VersionMismatch, match=f"version {version[0]}.{version[1]}"):
            polychip.from_dlpack(forged(address(host), [4], version=version))


def test_device_ids_no_runtime_has_are_refused(ferrite):
    host = np.zeros(4, dtype=np.float32)
    for device_id in (-1, 99, 2**31 - 1):
        with pytest.raises(polychip.errors.InvalidArgument, match=f"device {device_id} does not exist"):
            polychip.from_dlpack(forged(address(host), [4], device=(12, device_id)))
    with pytest.raises(TypeError, match="argument 'device'"):
        polychip._native.from_dlpack(polychip.runtime(), np.zeros(1, np.float32), -1)
    with pytest.raises(TypeError, match="argument 'device'"):
        polychip._native.from_dlpack(polychip.runtime(), np.zeros(1, np.float32), 2**40)


def test_odd_layouts_of_host_memory_import_as_they_say(ferrite, cobalt):
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    for view in (base[::2, ::3], base.T, base[::-1], base[:, ::-2], base[1:3, 2:5], base[:, 1]):
        for device in (ferrite, cobalt):
            assert polychip.from_dlpack(view, device=device).numpy().tolist() == view.tolist()
    # Negative strides from the last element, a byte offset that is no
    # multiple of the element (host memory is copied byte by byte), zero
    # strides.
    host = np.arange(4, dtype=np.float32)
    t = polychip.from_dlpack(forged(address(host), [4], strides=[-1], byte_offset=12))
    assert t.numpy().tolist() == [3.0, 2.0, 1.0, 0.0]
    raw = np.zeros(9, dtype=np.uint8)
    raw[1:5] = np.frombuffer(np.float32(1.5).tobytes(), np.uint8)
    assert polychip.from_dlpack(forged(address(raw), [1], byte_offset=1)).numpy().tolist() == [1.5]
    t = polychip.from_dlpack(forged(address(host), [3, 2], strides=[0, 1]), device=cobalt)
    assert t.numpy().tolist() == [[0.0, 1.0]] * 3


def test_zero_size_and_zero_d_tensors_go_everywhere(ferrite, cobalt):
    for device in (ferrite, cobalt):
        for array in (np.zeros((0, 3), np.float32), np.array(2.5, np.float32), np.zeros((3, 0, 2), np.int64)):
            t = polychip.from_dlpack(array, device=device)
            assert t.shape == list(array.shape)
            assert t.numpy().tolist() == array.tolist()
            back = polychip.from_dlpack(t.__dlpack__(max_version=(1, 0), dl_device=(1, 0)), device=device)
            assert back.shape == list(array.shape)
        t = polychip.zeros([], device=device)
        polychip.ops.add(t, t, t)
        with pytest.raises(TypeError, match="0-d tensor"):
            len(t)
    # A 0-size capsule with no data, on the CPU and on a device.
    for device in ((1, 0), (12, ferrite.index), (12, cobalt.index)):
        assert polychip.from_dlpack(forged(None, [0, 5], device=device)).shape == [0, 5]


def test_a_read_only_array_is_copied_not_written(ferrite):
    a = np.arange(4, dtype=np.float32)
    a.flags.writeable = False
    t = polychip.from_dlpack(a, device=ferrite)
    polychip.ops.fill(t, 7.0)
    assert a.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert t.numpy().tolist() == [7.0] * 4
    # A capsule flagged read-only is copied too, whatever else it flags.
    b = np.arange(2, dtype=np.float32)
    t = polychip.from_dlpack(forged(address(b), [2], flags=1 | 2 | 0xFF00), device=ferrite)
    polychip.ops.fill(t, 9.0)
    assert b.tolist() == [0.0, 1.0]


def test_used_misnamed_and_deleterless_capsules(ferrite):
    a = np.arange(3, dtype=np.float32)
    capsule = a.__dlpack__(max_version=(1, 0))
    polychip.from_dlpack(capsule)
    with pytest.raises(TypeError, match="not an unused DLPack tensor"):
        polychip.from_dlpack(capsule)
    with pytest.raises(TypeError, match="not an unused DLPack tensor"):
        polychip.from_dlpack(_new_capsule(0x1234, b"something_else", None))
    # No deleter: nothing to call, versioned or legacy.
    for legacy in (False, True):
        assert polychip.from_dlpack(forged(address(a), [3], legacy=legacy)).numpy().tolist() == [0.0, 1.0, 2.0]


def test_a_polychip_capsule_is_consumed_once(cobalt):
    """A polychip export's managed tensor, handed in again after an import
    took it (a consumer that copied the pointer out of the capsule), is
    refused: two owners would run its deleter twice and free the memory
    under one of them."""
    t = polychip.tensor([1.0, 2.0], device=cobalt)
    capsule = t.__dlpack__(max_version=(1, 0))
    get = C.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = C.c_void_p, [C.py_object, C.c_char_p]
    pointer = get(capsule, b"dltensor_versioned")
    first = polychip.from_dlpack(capsule)
    again = _new_capsule(pointer, b"dltensor_versioned", None)
    with pytest.raises(polychip.errors.InvalidArgument, match="managed was imported already"):
        polychip.from_dlpack(again)
    # The same pointer, under the legacy name, is the wrong layout.
    wrong = _new_capsule(pointer, b"dltensor", None)
    with pytest.raises(polychip.errors.InvalidArgument, match="managed is a DLPack 1.x"):
        polychip.from_dlpack(wrong)
    del t
    gc.collect()
    assert first.numpy().tolist() == [1.0, 2.0]


def test_dlpack_export_arguments_are_checked(ferrite, cobalt):
    t = polychip.tensor([1.0, 2.0], device=ferrite)
    for kwargs, error, says in [
        (dict(max_version=(-1, 0)), TypeError, "argument 'max_version': -1 is out of range"),
        (dict(max_version=(2**40, 0)), TypeError, "argument 'max_version'"),
        (dict(dl_device=(12, 2**40)), TypeError, "argument 'dl_device'"),
        (dict(dl_device=(2, 0)), BufferError, r"dl_device \(2, 0\) cannot be given"),
        (dict(stream=2**70), BufferError, "stream must be"),
        (dict(stream=1.5), BufferError, "stream must be"),
        (dict(stream=polychip.stream(cobalt), dl_device=(12, 99)), BufferError, "dl_device"),
    ]:
        with pytest.raises(error, match=says):
            t.__dlpack__(**kwargs)
    # A stream of another device only makes the export wait for it.
    capsule = t.__dlpack__(max_version=(1, 0), stream=polychip.stream(cobalt))
    assert polychip.from_dlpack(capsule).numpy().tolist() == [1.0, 2.0]


def test_sizes_no_memory_holds_raise_out_of_memory(ferrite, cobalt):
    rt = polychip.runtime()
    for device in (ferrite, cobalt):
        with pytest.raises(polychip.errors.OutOfMemory, match="4398046511104 bytes"):
            rt.tensor(device.index, "float32", [2**40])
        one = polychip.tensor([1.0], device=device)
        huge = one.view([2**40], [0])
        with pytest.raises(polychip.errors.OutOfMemory, match="4398046511104 bytes"):
            huge.read_bytes()
        with pytest.raises(polychip.errors.OutOfMemory):
            huge.to(cobalt if device is ferrite else ferrite)
        with pytest.raises(BufferError, match="4398046511104 bytes of host memory"):
            huge.__dlpack__(max_version=(1, 0), dl_device=(1, 0), copy=True)
    for shape, says in [([-1], "negative extent -1"), ([2**62], "overflows 64-bit sizes"),
                        ([1] * 65, "ndim 65 is above the 64")]:
        with pytest.raises(polychip.errors.InvalidArgument, match=says):
            rt.tensor(0, "float32", shape)
    with pytest.raises(TypeError, match="argument 'shape': 18446744073709551616 is out of range"):
        rt.tensor(0, "float32", [2**64])


def test_text_that_is_not_utf8_names_its_argument():
    lone = "plugins-\udcff.so"
    with pytest.raises(TypeError, match="argument 'plugin_path': .*is not UTF-8 text"):
        polychip._native.Runtime(lone, False, False)
    rt = polychip.runtime()
    with pytest.raises(TypeError, match="argument 'dtype': .*is not UTF-8 text"):
        rt.tensor(0, "float\udcff", [1])
    t = polychip.tensor([1.0])
    with pytest.raises(TypeError, match="argument 'dtype': .*is not UTF-8 text"):
        t.reinterpret("\udcff", [4], [1])
    with pytest.raises(TypeError, match="argument 'master_addr': .*is not UTF-8 text"):
        polychip.comm.init(rank=0, world_size=1, master_addr="host-\udcff")
    with pytest.raises(ValueError, match="NUL byte"):
        polychip._native.Runtime("a\x00b", False, False)
    # A very long path is listed as a failure, not an error or a hang.
    rt = polychip._native.Runtime("/" + "x" * 100_000, False, False)
    assert rt.device_count() == 0 and len(rt.failures()) == 1


def test_handles_that_are_no_tensor_are_refused(ferrite):
    rt = polychip.runtime()
    s = polychip.stream(ferrite)
    for handle, says in [
        (0, "tensor is NULL"),
        (1, "is not a polychip_tensor_t made by libpolychip"),
        (2**64 - 1, "is not a polychip_tensor_t made by libpolychip"),
        (rt._handle, "tensor is a polychip_runtime_t, not a polychip_tensor_t"),
    ]:
        with pytest.raises(polychip.errors.InvalidArgument, match=says):
            polychip.Tensor._adopt(rt, handle)
    for handle in (-1, 2**64):
        with pytest.raises(TypeError, match="argument 'handle'.*out of range"):
            polychip.Tensor._adopt(rt, handle)
    t = polychip.tensor([1.0])
    h = t._handle
    del t
    gc.collect()
    with pytest.raises(polychip.errors.InvalidArgument, match="it was destroyed"):
        polychip.Tensor._adopt(rt, h)
    del s


def test_ops_with_mismatched_devices_shapes_and_dtypes_name_them(ferrite, cobalt):
    a = polychip.tensor([1.0, 2.0], device=ferrite)
    b = polychip.tensor([1.0, 2.0], device=cobalt)
    out = polychip.empty([2], device=ferrite)
    with pytest.raises(polychip.errors.InvalidArgument, match="b is on Cobalt"):
        polychip.ops.add(a, b, out)
    with pytest.raises(polychip.errors.InvalidArgument, match="a is on Ferrite.* runs on Cobalt"):
        polychip.ops.add(a, a, out, stream=polychip.stream(cobalt))
    with pytest.raises(polychip.errors.ShapeMismatch, match=r"out has shape \[3\]"):
        polychip.ops.add(a, a, polychip.empty([3], device=ferrite))
    with pytest.raises(polychip.errors.DTypeMismatch, match="a is f32 but out is i32"):
        polychip.ops.add(a, a, polychip.empty([2], "int32", device=ferrite))
    with pytest.raises(polychip.errors.InvalidArgument, match="writes some elements more than once"):
        polychip.ops.fill(polychip.tensor([1.0]).view([1024], [0]), 0.0)
    with pytest.raises(TypeError, match="argument 'a'"):
        polychip.ops.add(None, a, out)
    with pytest.raises(TypeError, match="argument 'stream'"):
        polychip.ops.add(a, a, out, stream=3)


def test_a_runtime_dropped_before_its_tensors(ferrite):
    # The tensor holds its runtime (its device indices are that runtime's).
    rt = polychip._native.Runtime(None, True, False)
    t = rt.tensor(ferrite.index, "float32", [3], True)
    del rt
    gc.collect()
    polychip.ops.fill(t, 2.0)
    assert t.numpy().tolist() == [2.0] * 3
    assert polychip.from_dlpack(t.__dlpack__(max_version=(1, 0))).numpy().tolist() == [2.0] * 3


def test_many_threads_at_once(ferrite, cobalt):
    errors = []
    stream = polychip.stream(cobalt)
    shared = polychip.zeros([256], device=cobalt)

    def work(k):
        try:
            for _ in range(50):
                device = (ferrite, cobalt)[k % 2]
                a = polychip.tensor(np.arange(64, dtype=np.float32) + k, device=device)
                b = polychip.empty([64], device=device)
                polychip.ops.add(a, a, b)
                x = polychip.from_dlpack(b.__dlpack__(max_version=(1, 0), dl_device=(1, 0)), device=ferrite)
                assert (x.numpy() == 2 * (np.arange(64) + k)).all()
                a.to((cobalt, ferrite)[k % 2])
                polychip.ops.add(shared, shared, shared, stream=stream)
        except Exception as e:  # noqa: BLE001 - collected for the assertion
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    stream.synchronize()
    assert errors == []


def test_daemon_threads_in_polychip_calls_at_exit_do_not_abort_the_interpreter():
    """Python 3.9 to 3.13 end a daemon thread that takes the GIL after the
    interpreter began to finalize with pthread_exit; its forced unwind
    through the native module's frames aborted the process ("FATAL:
    exception not rethrown", SIGABRT) at the exit of any program whose
    daemon threads were running polychip operators."""
    import os
    import subprocess
    import sys

    program = """
import threading, time, polychip
ferrite = next(d for d in polychip.devices() if d.vendor == "Ferrite")
cobalt = next(d for d in polychip.devices() if d.vendor == "Cobalt")
def work(device):
    a = polychip.zeros([1 << 16], device=device)
    s = polychip.stream(device)
    while True:
        polychip.ops.add(a, a, a, stream=s)
        s.synchronize()
for k in range(4):
    threading.Thread(target=work, args=((ferrite, cobalt)[k % 2],), daemon=True).start()
time.sleep(0.3)
print("exiting", flush=True)
"""
    for _ in range(3):
        done = subprocess.run([sys.executable, "-c", program], env=dict(os.environ), capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, (done.returncode, done.stdout, done.stderr[-2000:])
        assert "exiting" in done.stdout


def test_shape_arguments_name_themselves():
    assert polychip.empty(np.int64(3)).shape == [3]
    assert polychip.zeros((2, np.int32(2))).shape == [2, 2]
    for shape in (3.5, None, True, "abc", object()):
        with pytest.raises(TypeError, match="shape must be an int or a sequence of ints"):
            polychip.empty(shape)
    with pytest.raises(TypeError, match="argument 'shape'"):
        polychip.zeros([1.5])


def test_an_export_of_another_runtime_is_imported_onto_this_runtimes_devices(ferrite):
    """Host-visible memory polychip exported comes back zero-copy only when
    the importing runtime has that device, under its own index there; it
    came back under the exporting runtime's index, which names another
    device (or none) in the importer."""
    from conftest import PLUGIN_PATH

    cobalt_only = PLUGIN_PATH.split(":")[1]
    rt2 = polychip._native.Runtime(cobalt_only, False, False)
    assert [rt2.device_info(i)["vendor"] for i in range(rt2.device_count())] == ["Cobalt"]
    t = polychip.tensor([1.0, 2.0], device=ferrite)
    u = polychip._native.from_dlpack(rt2, t)
    assert u.device_index == 0
    polychip.ops.scale(u, 2.0)
    assert u.numpy().tolist() == [2.0, 4.0] and t.numpy().tolist() == [1.0, 2.0]


# ------------------------------------------------ the PyTorch device (ABI 1.3)


def _torch_devices():
    torch = pytest.importorskip("torch")
    import polychip.torch as pt

    return torch, [torch.device("polychip", i) for i in range(pt.device_count())]


def test_torch_scalars_an_f64_does_not_hold_and_narrowing_conversions_match_the_cpu():
    """The ABI carries a scalar as an f64: an integer past 2^53 compared
    with or filled into an int64 tensor was rounded (`x == 2**53 + 1` was
    true of 2^53, `masked_fill(m, 2**62 + 1)` filled 2^62); integer
    narrowing (int64 to int32 or uint8, int32 to uint8) saturated where
    PyTorch wraps (2^40 to int32 gave 2147483647, -1 to uint8 gave 0):
    the ABI's `convert` keeps the low bits since stop 47."""
    torch, devices = _torch_devices()
    big = torch.tensor([2**53, 2**53 + 1, 2**62 + 3, -(2**63)])
    m = torch.tensor([True, False, True, False])
    ints = torch.tensor([0, 1, -1, 255, 256, 70000, 2**40, -(2**40) - 1])
    cases = {
        "eq 2^53 + 1": lambda t: t(big) == 2**53 + 1,
        "lt 2^53 + 1": lambda t: t(big) < 2**53 + 1,
        "ge 0-d 2^53 + 1": lambda t: t(big) >= torch.tensor(2**53 + 1),
        "masked_fill 2^62 + 1": lambda t: t(big).masked_fill(t(m), 2**62 + 1),
        "masked_fill_ -2^62 - 1": lambda t: t(big.clone()).masked_fill_(t(m), -(2**62) - 1),
        "masked_fill 0-d 2^53 + 1": lambda t: t(big).masked_fill(t(m), torch.tensor(2**53 + 1)),
        "int64 to int32": lambda t: t(ints).to(torch.int32),
        "int64 to uint8": lambda t: t(ints).to(torch.uint8),
        "int32 to uint8": lambda t: t(ints.to(torch.int32)).to(torch.uint8),
        "uint8 to int32": lambda t: t(ints.to(torch.uint8)).to(torch.int32),
    }
    for d in devices:
        for name, f in cases.items():
            want = f(lambda x: x)
            got = f(lambda x: x.to(d)).cpu()
            assert got.dtype == want.dtype and torch.equal(got, want), (d, name, got, want)


def test_torch_masked_fill_values_beyond_a_float_dtype_are_refused_as_on_the_cpu():
    """PyTorch refuses a finite masked_fill value beyond the dtype's range;
    the device filled 65504 (65519 into f16) or infinity (1e300 into f32 or
    bf16). Infinities and NaN are taken, as on the CPU."""
    torch, devices = _torch_devices()
    for d in devices:
        for dtype, v in [(torch.float16, 65519.0), (torch.bfloat16, 1e300), (torch.float32, -1e300)]:
            for dev in ("cpu", d):
                x = torch.ones(2, dtype=dtype, device=dev)
                with pytest.raises(RuntimeError, match="without overflow"):
                    x.masked_fill(torch.tensor([True, False], device=dev), v)
        got = torch.ones(2, dtype=torch.float16, device=d).masked_fill(
            torch.tensor([True, False], device=d), float("-inf")
        )
        assert got.cpu().tolist() == [float("-inf"), 1.0]


def test_torch_arange_takes_its_memory_on_the_device_before_the_host():
    """A range the device cannot hold is refused as out of the device's
    memory before any host memory is taken: an integer range past 2^31 and
    a floating one go to the CPU's kernel, which built the whole range in
    host memory first (4.6 GB for 2^29 int64s, on a 256 MiB device)."""
    torch, devices = _torch_devices()
    import resource

    for d in devices:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        for args in [(2**31 + 1, 2**31 + 1 + 2**40), (0.0, float(2**40))]:
            with pytest.raises(RuntimeError, match="out of memory"):
                torch.arange(*args, device=d)
        # ru_maxrss is in KiB: less than 64 MiB more than before.
        assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 64 << 10
        assert torch.arange(2**31 + 1, 2**31 + 4, device=d).cpu().tolist() == [2**31 + 1, 2**31 + 2, 2**31 + 3]
        assert torch.arange(0, 1, 0.25, device=d).cpu().tolist() == [0.0, 0.25, 0.5, 0.75]


def test_torch_factories_a_device_cannot_hold_are_refused_before_the_host_builds_them():
    """A factory that falls back to the CPU (`eye`, `tril_indices`) built
    its whole result in host memory before moving it to the device: 4 GB
    for 3.5 s (`eye(2**15)`) and 8 GB for 20 s (`tril_indices(2**15,
    2**15)`) on a 256 MiB device, before its refusal. The result's size is
    found on the meta device and taken on the device first."""
    torch, devices = _torch_devices()
    import resource

    import polychip.torch as pt

    small = [d for d in devices if pt.device_info(d.index)["memory_bytes"] <= 1 << 30]
    if not small:
        pytest.skip("no device of at most 1 GiB")
    for d in small:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        for make in (
            lambda: torch.eye(2**15, device=d),
            lambda: torch.tril_indices(2**15, 2**15, device=d),
            lambda: torch.triu_indices(2**15, 2**15, device=d),
        ):
            with pytest.raises(RuntimeError, match="out of memory"):
                make()
        # ru_maxrss is in KiB: well under the 4 GB the host took.
        assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 1 << 20
        assert torch.eye(3, device=d).cpu().tolist() == torch.eye(3).tolist()


def test_torch_conversions_to_half_precision_round_as_the_cpu_does():
    """PyTorch's CPU converts f64, int32 and int64 to f16 and bf16 through
    f32 (rounding twice); the device rounded once, so `.to(torch.float16)`
    of `1 + 2**-11 + 2**-40` was 1.0009765625 on the device and 1.0 on the
    CPU, and `.to(d, dtype)` differed from `.to(d).to(dtype)`."""
    torch, devices = _torch_devices()
    cases = [
        (torch.float64, torch.float16, [1.0 + 2**-11 + 2**-40, -(1.0 + 2**-11 + 2**-40), 0.1]),
        (torch.float64, torch.bfloat16, [1.0 + 2**-8 + 2**-40, 3.3]),
        (torch.int32, torch.bfloat16, [2**30 + 2**22 + 1, -(2**30 + 2**22 + 1), 7]),
        (torch.int64, torch.bfloat16, [2**40 + 2**32 + 1, 2**30 + 2**22 + 1]),
        (torch.int64, torch.float16, [2049, 65519, -3]),
    ]
    for d in devices:
        for src, dst, values in cases:
            x = torch.tensor(values, dtype=src)
            want = x.to(dst)
            for got in (x.to(d).to(dst), x.to(d, dst), x.to(d)[::2].to(dst)):
                w = want if got.shape == want.shape else want[::2]
                assert torch.equal(got.cpu(), w), (d, src, dst, got.cpu(), w)


def test_torch_repeats_and_pads_a_device_cannot_hold_are_refused_before_the_host_builds_them():
    """The reflect pad (a CPU kernel, run as a fallback) built its whole
    result in host memory before the device refused it (600 MB of the host
    for a 256 MiB device): the meta device sized only factories, and took
    a pad's list of sizes for a list of tensors. `repeat_interleave` by a
    tensor and `bincount`, sized by values, held 7.5 GB of the host for 27
    s. Each result is now taken on the device first (hostile sweep 6);
    `repeat`, `tile` and the other pads allocate on the device already."""
    torch, devices = _torch_devices()
    import resource

    import polychip.torch as pt

    small = [d for d in devices if pt.device_info(d.index)["memory_bytes"] <= 1 << 30]
    if not small:
        pytest.skip("no device of at most 1 GiB")
    F = torch.nn.functional
    for d in small:
        x = torch.ones(1, 2, 4, device=d)
        square = torch.ones(1, 2**12, 2**12, device=d)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        for make in (
            lambda: x.repeat(1, 2**14, 2**14),
            lambda: torch.tile(x, (2**14, 2**14)),
            lambda: F.pad(x, (2**29, 2**29), mode="replicate"),
            lambda: F.pad(square, (2**12 - 1,) * 4, mode="reflect"),
            lambda: torch.repeat_interleave(x, torch.tensor([2**30, 1], device=d), dim=1),
            lambda: torch.bincount(torch.tensor([2**31], device=d)),
        ):
            with pytest.raises(RuntimeError, match="out of memory"):
                make()
        # ru_maxrss is in KiB: well under the gigabytes the host took.
        assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 1 << 20
        for make in (
            lambda t: t.repeat(2, 1, 3),
            lambda t: F.pad(t, (2, 3), mode="replicate"),
            lambda t: F.pad(t, (2, 3), mode="reflect"),
            lambda t: torch.repeat_interleave(t, torch.tensor([3, 1], device=t.device), dim=1),
            lambda t: torch.bincount(t.flatten().long()),
        ):
            assert torch.equal(make(torch.arange(8.0).view(1, 2, 4).to(d)).cpu(), make(torch.arange(8.0).view(1, 2, 4)))


def test_torch_in_place_ops_whose_input_lies_partly_over_the_output_raise_as_on_the_cpu():
    """`a[1:].add_(a[:-1])` was computed on the device as if the input were
    cloned; PyTorch's CPU refuses it (the elements overlap), before writing
    anything. So does the device now, for in-place and out= operators,
    copies, fallbacks and `scatter_add_` (which refuses even its own
    source); full aliases (`a.add_(a)`) and disjoint views still work, and
    an expanded output (one element written twice) is refused."""
    torch, devices = _torch_devices()
    partly = "some elements of the input tensor and the written-to tensor refer to a single memory location"
    twice = "more than one element of the written-to tensor refers to a single memory location"
    for d in devices:
        for name, f, says in [
            ("add_", lambda a: a[1:].add_(a[:-1]), partly),
            ("mul_ transposed", lambda a: a[:4].view(2, 2).t().mul_(a[:4].view(2, 2)), partly),
            ("sub out=", lambda a: torch.sub(a[:-1], 1.0, out=a[1:]), partly),
            ("neg out=", lambda a: torch.neg(a[:-1], out=a[1:]), partly),
            ("copy_", lambda a: a[1:].copy_(a[:-1]), partly),
            ("lerp_", lambda a: a[1:].lerp_(a[:-1], 0.5), partly),
            ("addcmul_", lambda a: a[1:].addcmul_(a[:-1], a[1:]), partly),
            ("atan2_ (a fallback)", lambda a: a[1:].atan2_(a[:-1]), partly),
            ("scatter_add_ of itself", lambda a: a.scatter_add_(0, torch.zeros(6, dtype=torch.long, device=a.device), a), partly),
            ("sigmoid out= (a fallback)", lambda a: torch.sigmoid(a[:5], out=a[1:]), partly),
            ("cumsum out=", lambda a: torch.cumsum(a[:3], 0, out=a[1:4]), partly),
            ("gather out=", lambda a: torch.gather(a[:3], 0, torch.zeros(3, dtype=torch.long, device=a.device), out=a[1:4]), partly),
            ("add_ into an expanded view", lambda a: a[:1].expand(3).add_(1.0), twice),
            ("mul_ by a number into an expanded view", lambda a: a[:1].expand(3).mul_(2.0), twice),
            ("copy_ into an expanded view", lambda a: a[:1].expand(3).copy_(a[3:]), twice),
        ]:
            for dev in ("cpu", d):
                a = torch.arange(6.0, device=dev)
                with pytest.raises(RuntimeError, match=says):
                    f(a)
                assert a.cpu().tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0], (dev, name)
        # What the CPU takes: the same memory exactly, disjoint views, and
        # a reduction's out= over its input (a fallback; what it reads of
        # what it writes is the CPU kernel's order, so only taken).
        for dev in ("cpu", d):
            a = torch.arange(6.0, device=dev)
            a.add_(a)
            a[:3].add_(a[3:])
            a[::2].mul_(a[1::2])
            if dev == "cpu":
                want = a.tolist()
            m = a.view(2, 3)
            torch.sum(m, 0, out=m[1])
        assert a.cpu().tolist()[:3] == want[:3]


def test_torch_abi_1_4_routes_check_dims_as_the_cpu_does():
    """The ABI 1.4 routes took a dimension out of range to the plugin, whose
    refusal was raised as "index out of range in self", reduced a repeated
    `any`/`all` dim once (the CPU refuses it) and an empty dim list over
    every dim (the CPU reduces none)."""
    torch, devices = _torch_devices()
    idx = torch.zeros(2, 3, dtype=torch.long)
    for d in devices:
        for dev in ("cpu", d):
            x = torch.ones(2, 3, device=dev)
            i = idx.to(dev)
            for f, says in [
                (lambda: x.gather(5, i), r"range of \[-2, 1\], but got 5"),
                (lambda: x.gather(-3, i), r"range of \[-2, 1\], but got -3"),
                (lambda: x.cumsum(2), r"range of \[-2, 1\], but got 2"),
                (lambda: x.scatter_add(7, i, x), r"range of \[-2, 1\], but got 7"),
                (lambda: x.any(dim=(0, 4)), r"range of \[-2, 1\], but got 4"),
                (lambda: x.all(dim=-3), r"range of \[-2, 1\], but got -3"),
                (lambda: torch.tensor(1.0, device=dev).cumsum(1), r"range of \[-1, 0\], but got 1"),
            ]:
                with pytest.raises(IndexError, match=says):
                    f()
            with pytest.raises(RuntimeError, match="dim 0 appears multiple times"):
                x.any(dim=(0, -2))
        x = torch.tensor([[0.0, 1.0, 2.0], [3.0, 0.0, 5.0]])
        for f in (lambda t: t.all(dim=()), lambda t: t.any(dim=()), lambda t: t.any(dim=(0, 1), keepdim=True)):
            want = f(x)
            got = f(x.to(d)).cpu()
            assert got.shape == want.shape and torch.equal(got, want)


def test_torch_abi_1_4_routes_refuse_and_take_what_the_cpu_does():
    """An index out of range in `gather`, `scatter_add` or advanced indexing
    was an IndexError quoting the plugin ("index out of range in self
    (polychip_op_gather: ...)"): the CPU raises a RuntimeError for `gather`
    and `scatter_add` and an IndexError for indexing, naming the index,
    the dimension and its size; and an index past its own dimension but
    inside the indexed dimensions merged (`x[[0], [9]]` of a 3 x 4 `x`)
    read or added into another element. `x & 3` (a Python number) raised
    "Expected a value of type 'Tensor'"; `torch.any(x, 0, out=f)` wrote
    into a float `out` the CPU refuses; `embedding` and `cross_entropy`
    refused an index out of range with the plugin's InvalidArgument where
    the CPU raises an IndexError (hostile sweep 6)."""
    torch, devices = _torch_devices()
    F = torch.nn.functional
    for d in devices:
        for dev in ("cpu", d):
            x = torch.arange(12.0, device=dev).view(3, 4)
            i = lambda v, shape=(3, 1): torch.full(shape, v, dtype=torch.long, device=dev)  # noqa: E731
            for f, error, says in [
                (lambda: x.gather(1, i(4)), RuntimeError, "index 4 is out of bounds for dimension 1 with size 4"),
                (lambda: x.gather(1, i(-1)), RuntimeError, "index -1 is out of bounds for dimension 1 with size 4"),
                (lambda: x.scatter_add(1, i(-1), torch.ones(3, 1, device=dev)), RuntimeError, "index -1 is out of bounds"),
                (lambda: x[torch.tensor([3], device=dev)], IndexError, "index 3 is out of bounds for dimension 0 with size 3"),
                (lambda: x[torch.tensor([-4], device=dev)], IndexError, "index -4 is out of bounds for dimension 0 with size 3"),
                # The CPU names the place among the index tensors.
                (lambda: x[:, torch.tensor([1, 9], device=dev)], IndexError, "index 9 is out of bounds for dimension 0 with size 4"),
                # Past its own dimension but inside the merged one: the
                # device read (or added into) another element.
                (
                    lambda: x[torch.tensor([0], device=dev), torch.tensor([9], device=dev)],
                    IndexError,
                    "index 9 is out of bounds for dimension 1 with size 4",
                ),
                (
                    lambda: x[torch.tensor([1], device=dev), torch.tensor([-5], device=dev)],
                    IndexError,
                    "index -5 is out of bounds for dimension 1 with size 4",
                ),
                (
                    lambda: x.index_put_(
                        (torch.tensor([0], device=dev), torch.tensor([9], device=dev)), torch.ones(1, device=dev), accumulate=True
                    ),
                    IndexError,
                    "index 9 is out of bounds for dimension 1 with size 4",
                ),
                (
                    lambda: x.index_put_((torch.tensor([5], device=dev),), torch.ones(1, 4, device=dev), accumulate=True),
                    IndexError,
                    "index 5 is out of bounds for dimension 0 with size 3",
                ),
                (lambda: torch.any(x, 0, out=torch.empty(4, device=dev)), RuntimeError, "any only supports bool"),
                (lambda: F.embedding(torch.tensor([5], device=dev), x), IndexError, "index out of range in self"),
                (lambda: F.embedding(torch.tensor([-1], device=dev), x), IndexError, "index out of range in self"),
                (lambda: F.cross_entropy(x, torch.tensor([0, 4, 1], device=dev)), IndexError, "Target 4 is out of bounds"),
                (lambda: F.cross_entropy(x, torch.tensor([0, -2, 1], device=dev)), IndexError, "Target -2 is out of bounds"),
            ]:
                with pytest.raises(error, match=says):
                    f()
            assert x.cpu().flatten().tolist() == [float(v) for v in range(12)]
        n = torch.tensor([1, 2, 6], device=d)
        for f in (lambda t: t & 3, lambda t: t | 8, lambda t: t ^ True, lambda t: 5 & t):
            want = f(n.cpu())
            got = f(n).cpu()
            assert got.dtype == want.dtype and torch.equal(got, want)
        with pytest.raises(RuntimeError, match="bitwise_and"):
            n & 1.5
