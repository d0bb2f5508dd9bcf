"""Operators from Python against NumPy, on both vendors, on streams, with
the GIL released while they run."""

import threading
import time

import numpy as np
import pytest

import polychip


@pytest.mark.parametrize("vendor", ["Ferrite", "Cobalt"])
def test_operators_match_numpy(vendor):
    dev = next(d for d in polychip.devices() if d.vendor == vendor)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((4, 8), dtype=np.float32), rng.standard_normal((8, 3), dtype=np.float32)
    pa, pb = polychip.tensor(a, device=dev), polychip.tensor(b, device=dev)
    out = polychip.empty((4, 3), device=dev)
    polychip.ops.matmul(pa, pb, out, alpha=2.0)
    np.testing.assert_allclose(out.numpy(), 2 * a @ b, rtol=1e-5, atol=1e-5)
    s = polychip.empty((4, 8), device=dev)
    polychip.ops.softmax(pa, s)
    e = np.exp(a - a.max(axis=1, keepdims=True))
    np.testing.assert_allclose(s.numpy(), e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-6)
    polychip.ops.exp(pa, s)
    np.testing.assert_allclose(s.numpy(), np.exp(a), rtol=1e-5)
    r = polychip.empty((4,), device=dev)
    polychip.ops.sum(pa, r, dim=-1)
    np.testing.assert_allclose(r.numpy(), a.sum(axis=1), rtol=1e-5, atol=1e-5)
    polychip.ops.add(pa, pa, pa, alpha=0.5)
    np.testing.assert_allclose(pa.numpy(), 1.5 * a, rtol=1e-6)
    lin = polychip.empty((4, 3), device=dev)
    w = polychip.tensor(b.T.copy(), device=dev)
    polychip.ops.linear(pa, w, None, lin)
    np.testing.assert_allclose(lin.numpy(), (1.5 * a) @ b, rtol=1e-4, atol=1e-4)


def test_streams_and_events_across_vendors(ferrite, cobalt):
    sf, sc = polychip.stream(ferrite), polychip.stream(cobalt)
    x = polychip.tensor([1.0, 4.0, 9.0], device=ferrite)
    polychip.ops.sqrt(x, x, stream=sf)
    done = sf.record()
    sc.wait(done)
    y = x.to(cobalt)
    polychip.ops.scale(y, 2.0, stream=sc)
    sc.synchronize()
    assert y.numpy().tolist() == [2.0, 4.0, 6.0]


def test_the_gil_is_released_during_an_operator(ferrite):
    n = 512
    a = polychip.tensor(np.ones((n, n), dtype=np.float32), device=ferrite)
    out = polychip.empty((n, n), device=ferrite)
    span = []
    calls = []

    def work():
        # At least 100 ms of matmuls, whatever this machine's speed.
        span.append(time.perf_counter())
        while not calls or time.perf_counter() - span[0] < 0.1:
            polychip.ops.matmul(a, a, out)
            calls.append(time.perf_counter())
        span.append(time.perf_counter())

    worker = threading.Thread(target=work)
    ticks = []
    worker.start()
    while worker.is_alive():
        ticks.append(time.perf_counter())
        time.sleep(0)
    worker.join()
    inside = [t for t in ticks if span[0] < t < span[1]]
    # Were the GIL held during each matmul, this thread could only run in
    # the moments between them, a few ticks per call; released, it keeps
    # ticking throughout.
    assert len(inside) > 5 * len(calls) + 100, (len(inside), len(calls), span[1] - span[0])
    assert out.numpy()[0, 0] == n
