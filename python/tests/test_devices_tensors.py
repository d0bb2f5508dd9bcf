"""Devices of several vendors in one process, tensors on them, copies
between them, and the errors bad calls raise."""

import numpy as np
import pytest

import polychip
from polychip import errors


def test_every_vendors_devices_are_listed(ferrite, cobalt):
    devices = polychip.devices()
    vendors = [d.vendor for d in devices]
    assert "Ferrite" in vendors and "Cobalt" in vendors
    assert ferrite.host_visible and not cobalt.host_visible
    assert ferrite.ops_implemented == ferrite.ops_total == 72
    assert "Ferrite" in repr(ferrite)
    assert polychip.runtime().failures() == []


def test_tensors_have_shape_strides_dtype_and_device(ferrite):
    t = polychip.tensor([[1, 2, 3], [4, 5, 6]], dtype="float32", device=ferrite)
    assert (t.shape, t.strides, t.dtype, t.numel) == ([2, 3], [3, 1], "float32", 6)
    assert t.device == ferrite and t.is_contiguous and len(t) == 2
    assert np.array_equal(t.numpy(), np.array([[1, 2, 3], [4, 5, 6]], dtype=np.float32))
    view = t.view([3, 2], [1, 3])
    assert not view.is_contiguous
    assert np.array_equal(view.numpy(), np.array([[1, 4], [2, 5], [3, 6]], dtype=np.float32))
    for dtype in ("float16", np.dtype("int64"), "torch.bfloat16"):
        assert polychip.zeros((2,), dtype=dtype).dtype in ("float16", "int64", "bfloat16")


def test_tensors_move_between_vendors(ferrite, cobalt):
    a = polychip.tensor(np.arange(12, dtype=np.float32).reshape(3, 4), device=ferrite)
    b = a.to(cobalt)
    assert b.device == cobalt
    assert np.array_equal(b.numpy(), np.arange(12, dtype=np.float32).reshape(3, 4))
    c = polychip.zeros((3, 4), device=ferrite)
    c.copy_(b)
    assert np.array_equal(c.numpy(), a.numpy())


def test_bad_input_raises_the_class_of_its_code(ferrite, cobalt):
    with pytest.raises(TypeError, match="'complex' is not a polychip dtype"):
        polychip.empty((2,), dtype="complex")
    with pytest.raises(errors.InvalidArgument, match="device 99 does not exist"):
        polychip.empty((2,), device=99)
    a = polychip.zeros((2, 3), device=ferrite)
    b = polychip.zeros((4, 5), device=ferrite)
    out = polychip.zeros((2, 5), device=ferrite)
    with pytest.raises(errors.ShapeMismatch, match="matmul: b has shape \\[4, 5\\]") as e:
        polychip.ops.matmul(a, b, out)
    assert e.value.code == 6 and isinstance(e.value, ValueError)
    # RuntimeError too, as PyTorch's shape errors and out-of-memory are.
    assert isinstance(e.value, RuntimeError)
    assert issubclass(errors.OutOfMemory, MemoryError) and issubclass(errors.OutOfMemory, RuntimeError)
    with pytest.raises(errors.DTypeMismatch, match="a is float32|a is f32"):
        polychip.ops.add(a, polychip.zeros((2, 3), dtype="float16", device=ferrite), a)
    with pytest.raises(errors.InvalidArgument, match="is on Cobalt"):
        polychip.ops.add(a, polychip.zeros((2, 3), device=cobalt), a)
    with pytest.raises(ValueError, match="shape has 2 dimensions but strides 1"):
        a.view([2, 3], [1])
    with pytest.raises(errors.InvalidArgument, match="reaches outside its"):
        a.view([100], [1])
    with pytest.raises(TypeError):
        polychip.ops.add(a, "not a tensor", a)


def test_views_whose_sizes_overflow_are_refused_not_panicking(ferrite, cobalt):
    a = polychip.zeros((4,), device=ferrite)
    # Used to be made and then panic in every call that described it.
    with pytest.raises(errors.InvalidArgument, match=r"shape \[1099511627776, 1099511627776\].*overflows 64-bit sizes"):
        a.view([2**40, 2**40], [0, 0])
    with pytest.raises(errors.InvalidArgument, match="element offset 9223372036854775807 overflows"):
        a.view([2], [1], 2**63 - 1)
    with pytest.raises(errors.InvalidArgument, match="overflows 64-bit sizes"):
        a.reinterpret("float32", [3, 3], [2**62, 2**62])
    # A legal view of far more elements than host memory: reading it is an
    # error, not an abort on allocation.
    for device in (ferrite, cobalt):
        v = polychip.zeros((4,), device=device).view([2**20, 2**20], [0, 0])
        with pytest.raises(errors.OutOfMemory, match="needs 4398046511104 bytes of host memory"):
            v.read_bytes()


def test_tensor_keeps_0_d_shapes_and_reads_any_byte_order(ferrite):
    assert polychip.tensor(3.5).shape == []
    assert polychip.tensor(np.array(7, np.int32), device=ferrite).numpy().tolist() == 7
    # Big-endian data used to be written as its raw bytes: [1, 2] read back
    # as [16777216, 33554432].
    assert polychip.tensor(np.array([1, 2], dtype=">i4")).numpy().tolist() == [1, 2]
    assert polychip.tensor(np.array([1.5], dtype=">f8")).numpy().tolist() == [1.5]
    with pytest.raises(TypeError, match="len\\(\\) of a 0-d tensor"):
        len(polychip.tensor(1.0))


def test_device_arguments_are_checked(ferrite):
    t = polychip.tensor([1.0], device=ferrite)
    count = len(polychip.devices())
    for bad in (-1, count, 2**40):
        with pytest.raises(errors.InvalidArgument, match=f"device {bad} does not exist"):
            t.to(bad)
        with pytest.raises(errors.InvalidArgument, match=f"device {bad} does not exist"):
            polychip.empty((1,), device=bad)
        with pytest.raises(errors.InvalidArgument, match=f"device {bad} does not exist"):
            polychip.from_dlpack(np.ones(1, np.float32), device=bad)
    # Anything with an `index` was taken for a device (a torch.device of
    # "cuda" or "meta" moved the tensor to that polychip index), and a bool
    # for an int.
    import types
    for bad in (1.5, "0", None, True, types.SimpleNamespace(type="cuda", index=0)):
        with pytest.raises(TypeError, match="device must be a device index"):
            t.to(bad)
    for bad in (0.0, False):
        with pytest.raises(TypeError, match="device must be a device index"):
            polychip.empty((1,), device=bad)
    assert t.to(polychip.device(ferrite.index)).device_index == ferrite.index


def test_integers_out_of_range_name_their_argument(ferrite):
    """An int outside its argument's range raised a bare OverflowError
    ("Python int too large to convert to C long") that named nothing; the
    native layer now says which argument, the value and the range."""
    rt = polychip.runtime()
    d = ferrite.index
    cases = [
        (lambda: rt.tensor(d, "float32", [2**70]), "argument 'shape': 1180591620717411303424 is out of range"),
        (lambda: rt.tensor(-1, "float32", [2]), "argument 'device': -1 is out of range: expected an integer from 0 to 4294967295"),
        (lambda: rt.device_info(2**64), "argument 'index': 18446744073709551616 is out of range"),
        (lambda: polychip.ops.sum(rt.tensor(d, "float32", [2]), rt.tensor(d, "float32", [1]), 2**40),
         "argument 'dim': 1099511627776 is out of range: expected an integer from -2147483648 to 2147483647"),
    ]
    v = rt.tensor(d, "float32", [4])
    cases += [
        (lambda: v.view([2], [1], 2**64), "argument 'offset': 18446744073709551616 is out of range"),
        (lambda: v.reinterpret("float32", [1], [1], -1), "argument 'byte_offset': -1 is out of range"),
        # These raised a bare OverflowError that named nothing.
        (lambda: polychip._native.Stream(rt, 2**32), "argument 'device': 4294967296 is out of range"),
        (lambda: v.__dlpack__(max_version=(-1, 0)), "-1 is out of range"),
    ]
    for call, message in cases:
        with pytest.raises(TypeError, match=message):
            call()
    # A huge int's digits are cut.
    with pytest.raises(TypeError, match=r"argument 'shape': 1000000000000000000000000000000000000000\.\.\. \(201 digits\)"):
        rt.tensor(d, "float32", [10**200])


def test_a_device_of_another_runtime_is_refused(ferrite):
    old = polychip.device(ferrite.index)
    other = polychip._native.Runtime(None, True, False)
    u = other.tensor(0, "float32", [1], True)
    # Its index would silently name another runtime's device.
    with pytest.raises(errors.InvalidArgument, match="belongs to another runtime"):
        u.to(old)
    saved = polychip._runtime
    try:
        polychip.runtime(bundled=False)  # a new default runtime
        with pytest.raises(errors.InvalidArgument, match="belongs to an earlier runtime"):
            polychip.empty((1,), device=old)
    finally:
        polychip._runtime = saved
    assert polychip.empty((1,), device=old).device_index == old.index
