"""DLPack with real consumers and producers: NumPy and PyTorch take
polychip tensors (zero-copy where the memory is host-visible, a flagged
copy where it is private), polychip takes theirs, polychip takes its own
back without a copy, and the memory lives exactly as long as its last user."""

import gc

import numpy as np
import pytest
import torch

import polychip


def address(array):
    return array.__array_interface__["data"][0]


def test_numpy_shares_host_visible_memory(ferrite):
    t = polychip.tensor(np.arange(6, dtype=np.float32), device=ferrite)
    assert t.__dlpack_device__() == (1, 0)
    array = np.from_dlpack(t)
    assert address(array) == t.data_ptr
    array[0] = 42.0
    assert t.to(ferrite).numpy()[0] == 42.0, "a write through NumPy is seen by polychip"
    polychip.ops.scale(t, 2.0)
    assert array[1] == 2.0, "and a write by polychip is seen by NumPy"


def test_private_memory_reaches_numpy_as_a_copy(cobalt):
    t = polychip.tensor(np.arange(4, dtype=np.float32), device=cobalt)
    assert t.__dlpack_device__() == (12, cobalt.index)
    with pytest.raises((BufferError, ValueError, RuntimeError)):
        np.from_dlpack(t)  # NumPy reads only CPU memory
    copy = np.from_dlpack(t, device="cpu")
    assert copy.tolist() == [0, 1, 2, 3]
    copy[0] = 9.0
    assert t.numpy()[0] == 0.0, "a copy is not the device memory"
    with pytest.raises(BufferError, match="private memory"):
        t.__dlpack__(max_version=(1, 0), dl_device=(1, 0), copy=False)


def test_torch_shares_host_visible_memory_both_ways(ferrite):
    t = polychip.tensor(np.ones((2, 3), dtype=np.float32), device=ferrite)
    tt = torch.from_dlpack(t)
    assert tt.data_ptr() == t.data_ptr and tt.shape == (2, 3)
    tt.mul_(3)
    assert t.numpy().tolist() == [[3.0] * 3] * 2
    back = polychip.from_dlpack(tt)
    assert back.data_ptr == t.data_ptr, "torch's view of polychip memory comes back as the same memory"


def test_numpy_and_torch_tensors_become_polychip_copies(ferrite, cobalt):
    array = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2]  # strided
    t = polychip.from_dlpack(array, device=cobalt)
    assert t.device == cobalt and t.numpy().tolist() == array.tolist()
    tt = torch.arange(5, dtype=torch.int64)
    u = polychip.from_dlpack(tt, device=ferrite)
    assert u.dtype == "int64" and u.numpy().tolist() == [0, 1, 2, 3, 4]


def test_polychip_tensors_come_back_without_a_copy(ferrite, cobalt):
    for dev in (ferrite, cobalt):
        t = polychip.tensor([1.0, 2.0, 3.0], device=dev)
        u = polychip.from_dlpack(t)
        assert u.data_ptr == t.data_ptr and u.device == dev
        polychip.ops.scale(u, 10.0)
        assert t.numpy().tolist() == [10.0, 20.0, 30.0]
    legacy = t.__dlpack__()  # no max_version: a legacy capsule
    assert "dltensor" in repr(legacy) and "versioned" not in repr(legacy)
    v = polychip.from_dlpack(legacy)
    assert v.data_ptr == t.data_ptr
    with pytest.raises(TypeError, match="not an unused DLPack tensor"):
        polychip.from_dlpack(legacy)  # a capsule is taken once


def test_memory_outlives_its_producer_and_is_freed_after_its_last_user(cobalt):
    capsule = polychip.tensor([5.0, 6.0], device=cobalt).__dlpack__(max_version=(1, 0))
    gc.collect()
    assert polychip.from_dlpack(capsule).numpy().tolist() == [5.0, 6.0]
    ferrite_array = np.from_dlpack(polychip.tensor([7.0, 8.0], device=0))
    gc.collect()
    assert ferrite_array.tolist() == [7.0, 8.0]
    # Cobalt has 256 MiB: 40 rounds of 64 MiB only fit if every deleter runs.
    shape = (16 * 1024 * 1024,)
    for i in range(40):
        t = polychip.empty(shape, device=cobalt)
        if i % 2:
            t.__dlpack__(max_version=(1, 0))  # never consumed: the capsule frees it
        else:
            polychip.from_dlpack(t)  # consumed: freed with its importer
        del t
        gc.collect()


def test_bad_dlpack_requests_are_refused(ferrite):
    t = polychip.tensor([1.0], device=ferrite)
    with pytest.raises(TypeError, match="not int"):
        polychip.from_dlpack(42)
    with pytest.raises(BufferError, match="dl_device \\(2, 0\\)"):
        t.__dlpack__(max_version=(1, 0), dl_device=(2, 0))
    with pytest.raises(BufferError, match="stream must be"):
        t.__dlpack__(max_version=(1, 0), stream=7)
    s = polychip.stream(ferrite)
    polychip.ops.scale(t, 3.0, stream=s)
    assert np.from_dlpack(polychip.from_dlpack(t.__dlpack__(max_version=(1, 0), stream=s))).tolist() == [3.0]


def test_a_broadcast_array_larger_than_the_device_is_refused(ferrite, cobalt):
    # 2^40 floats that NumPy holds in 4 bytes (zero strides): the import
    # used to gather 4 TiB on the host first, and the process aborted.
    huge = np.broadcast_to(np.zeros(1, np.float32), (2**20, 2**20))
    for device in (ferrite, cobalt):
        with pytest.raises(polychip.errors.OutOfMemory, match="4398046511104 bytes"):
            polychip.from_dlpack(huge, device=device)
    small = np.broadcast_to(np.arange(3, dtype=np.float32), (4, 3))
    assert polychip.from_dlpack(small, device=cobalt).numpy().tolist() == small.tolist()


def test_a_capsule_imported_from_two_threads_at_once_is_taken_once(cobalt):
    # The capsule used to be marked taken only after the import, with the
    # GIL released in between: two threads both imported it, NumPy's
    # deleter ran twice and the process aborted.
    import threading

    for _ in range(50):
        a = np.arange(2**14, dtype=np.float32)
        capsule = a.__dlpack__(max_version=(1, 0))
        results = []

        def take():
            try:
                results.append(polychip.from_dlpack(capsule, device=cobalt))
            except TypeError as e:
                results.append(e)

        threads = [threading.Thread(target=take) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        taken = [r for r in results if isinstance(r, polychip.Tensor)]
        assert len(taken) == 1, results
        assert "not an unused DLPack tensor" in str(next(r for r in results if isinstance(r, TypeError)))
        assert taken[0].numpy()[-1] == 2**14 - 1
        del results, taken, capsule, a
        gc.collect()


def test_a_refused_capsule_stays_the_callers(ferrite):
    # A failed import leaves the capsule unused: it can be imported again
    # (and is freed once, by its own destructor, when nobody does).
    capsule = np.arange(3, dtype=np.float32).__dlpack__(max_version=(1, 0))
    with pytest.raises(polychip.errors.InvalidArgument, match="device 99 does not exist"):
        polychip._native.from_dlpack(polychip.runtime(), capsule, 99)
    assert polychip.from_dlpack(capsule, device=ferrite).numpy().tolist() == [0.0, 1.0, 2.0]


def test_a_forged_device_capsule_is_refused_naming_its_memory(ferrite):
    """kDLExtDev is shared with other libraries: a capsule naming memory
    polychip did not allocate (another library's, or a forged address) was
    taken, and reading it crashed the process. Only memory this process's
    polychip holds on that device is taken."""
    import ctypes as C

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

    class Managed(C.Structure):
        pass

    deleter = C.CFUNCTYPE(None, C.POINTER(Managed))
    Managed._fields_ = [
        ("version", C.c_uint32 * 2),
        ("ctx", C.c_void_p),
        ("deleter", deleter),
        ("flags", C.c_uint64),
        ("tensor", DLTensor),
    ]
    new_capsule = C.pythonapi.PyCapsule_New
    new_capsule.restype, new_capsule.argtypes = C.py_object, [C.c_void_p, C.c_char_p, C.c_void_p]
    host = np.arange(4, dtype=np.float32)
    shape = (C.c_int64 * 1)(4)
    kept = []
    for data in (0x1000, address(host)):
        m = Managed((1, 0), None, deleter(), 0, DLTensor(data, (12, ferrite.index), 1, (2, 32, 1, 0), shape, None, 0))
        kept.append(m)
        capsule = new_capsule(C.addressof(m), b"dltensor_versioned", None)
        with pytest.raises(polychip.errors.InvalidArgument, match="not inside memory polychip allocated"):
            polychip.from_dlpack(capsule)
    # Its own memory still comes back, as a view of the same buffer.
    t = polychip.from_dlpack(host, device=ferrite).to(ferrite)
    back = polychip.from_dlpack(torch.from_dlpack(t))
    assert back.numpy().tolist() == [0.0, 1.0, 2.0, 3.0]



def test_a_legacy_export_of_private_memory_says_why_it_needs_a_copy(cobalt):
    """A legacy (unversioned) capsule cannot flag a copy, so a CPU export of
    Cobalt's private memory is refused unless the copy is asked for; the
    message said "copies were forbidden" though the caller had not
    forbidden them. A CPU device id other than 0 is refused, not read as
    (1, 0)."""
    t = polychip.tensor([1.0, 2.0], device=cobalt)
    with pytest.raises(BufferError, match="legacy .unversioned. DLPack tensor cannot say it is one"):
        t.__dlpack__(dl_device=(1, 0))
    assert t.__dlpack__(dl_device=(1, 0), copy=True) is not None
    assert t.__dlpack__(dl_device=(1, 0), max_version=(1, 0)) is not None
    with pytest.raises(BufferError, match=r"dl_device \(1, 7\) cannot be given"):
        t.__dlpack__(dl_device=(1, 7))
