"""The embedding benchmark: the call overhead of an operator through the
Rust host, the C API, Python (polychip.ops) and a PyTorch CPU call of the
same size, side by side in one run; and the DLPack exchange time for 1 KiB
and 1 GiB tensors (zero-copy: it must not grow with the size).

    scripts/python-env --release
    .venv/bin/python python/bench/overhead.py          # ROUNDS=15 by default

Medians over interleaved rounds; the ratios are to the Rust host (calls)
and to the 1 KiB exchange (DLPack).
"""

import os
import statistics
import time

import numpy as np
import torch

import polychip
from polychip import _native

ROUNDS = int(os.environ.get("ROUNDS", "15"))
CALLS = 20000


def per_call(f, calls=CALLS):
    start = time.perf_counter()
    for _ in range(calls):
        f()
    return (time.perf_counter() - start) / calls * 1e9


def main():
    torch.set_num_threads(1)
    dev = next(d for d in polychip.devices() if d.vendor == "Ferrite")
    t = polychip.empty((16,), device=dev)
    tt = torch.empty(16)
    fill = polychip.ops.fill
    rows = {"Rust host": [], "C API": [], "Python polychip.ops.fill": [], "PyTorch CPU fill_": []}
    for _ in range(ROUNDS):
        rust, capi = _native._bench_fill(t, dev.plugin_path, dev.plugin_device, CALLS)
        rows["Rust host"].append(rust)
        rows["C API"].append(capi)
        rows["Python polychip.ops.fill"].append(per_call(lambda: fill(t, 1.0)))
        rows["PyTorch CPU fill_"].append(per_call(lambda: tt.fill_(1.0)))
    base = statistics.median(rows["Rust host"])
    print(f"fill of 16 f32 on {dev.vendor} (polychip) / on the CPU (torch), median of {ROUNDS} rounds x {CALLS} calls")
    print(f"  {'path':28s} {'ns/call':>9s} {'spread':>17s} {'/ Rust host':>12s}")
    for name, xs in rows.items():
        m = statistics.median(xs)
        print(f"  {name:28s} {m:9.1f} {min(xs):8.1f}-{max(xs):<8.1f} {m / base:12.2f}")

    print(f"DLPack exchange of a Ferrite tensor (host-visible), median of {ROUNDS} rounds")
    print(f"  {'size':>6s} {'numpy.from_dlpack':>18s} {'torch.from_dlpack':>18s} {'polychip.from_dlpack(torch)':>28s}")
    results = {}
    for label, numel in (("1 KiB", 256), ("1 GiB", 256 * 1024 * 1024)):
        big = polychip.empty((numel,), device=dev)
        as_torch = torch.from_dlpack(big)
        cols = {"numpy": [], "torch": [], "back": []}
        for _ in range(ROUNDS):
            cols["numpy"].append(per_call(lambda: np.from_dlpack(big), 2000))
            cols["torch"].append(per_call(lambda: torch.from_dlpack(big), 2000))
            cols["back"].append(per_call(lambda: polychip.from_dlpack(as_torch), 2000))
        results[label] = {k: statistics.median(v) for k, v in cols.items()}
        r = results[label]
        print(f"  {label:>6s} {r['numpy']:15.0f} ns {r['torch']:15.0f} ns {r['back']:25.0f} ns")
        del big, as_torch
    small, large = results["1 KiB"], results["1 GiB"]
    ratios = ", ".join(f"{k} {large[k] / small[k]:.2f}x" for k in small)
    print(f"  1 GiB / 1 KiB: {ratios} (zero-copy: about 1)")


if __name__ == "__main__":
    main()
