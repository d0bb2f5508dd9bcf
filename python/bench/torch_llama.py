"""The PyTorch backend benchmark: training steps/s and tokens/s of Hugging
Face's LlamaForCausalLM on a polychip device against PyTorch's CPU eager
kernels on the same cores, side by side in one run (rounds interleaved),
with the share of each device step spent in CPU fallbacks, in the plugin's
operators (from the Python kernels and the C++ half's copies and fills),
and the rest, dispatch, split into our Python kernels around the operator
calls and PyTorch's own share (autograd, the dispatcher, the model's Python,
allocation: costs the CPU run pays as well); then DDP across two vendors'
devices.

    scripts/python-env --release
    .venv/bin/python python/bench/torch_llama.py            # ROUNDS=7, STEPS=5
    MODEL=tiny .venv/bin/python python/bench/torch_llama.py  # a smaller model

Medians and spreads (min-max) over rounds of STEPS steps each; ratios are
polychip / CPU (above 1: polychip is faster).
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

import torch
import transformers

import polychip
import polychip.torch as pt

ROUNDS = int(os.environ.get("ROUNDS", "7"))
STEPS = int(os.environ.get("STEPS", "5"))
MODELS = {
    # vocab, hidden, layers, heads, kv heads, ffn, batch, seq
    "tiny": (256, 64, 2, 4, 2, 176, 4, 64),
    "small": (256, 128, 4, 4, 2, 352, 4, 128),
}
MODEL = os.environ.get("MODEL", "small")


def config():
    v, h, layers, heads, kv, ffn, _, seq = MODELS[MODEL]
    return transformers.LlamaConfig(
        vocab_size=v, hidden_size=h, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=kv, intermediate_size=ffn, max_position_embeddings=seq,
    )


def batch():
    *_, b, seq = MODELS[MODEL]
    return torch.randint(0, 256, (b, seq), generator=torch.Generator().manual_seed(0))


class Trainer:
    def __init__(self, device):
        torch.manual_seed(0)
        self.model = transformers.LlamaForCausalLM(config()).to(device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3, fused=device.type != "cpu" or None)
        self.ids = batch().to(device)
        self.device = device

    def step(self):
        loss = self.model(self.ids, labels=self.ids).loss
        loss.backward()
        self.opt.step()
        self.opt.zero_grad()
        return loss.item()  # waits for the device

    def round(self):
        start = time.perf_counter()
        for _ in range(STEPS):
            self.step()
        return (time.perf_counter() - start) / STEPS


def spread(xs):
    return f"{min(xs) * 1e3:7.1f}-{max(xs) * 1e3:<7.1f}"


def shares(trainer):
    """One profiled round: fractions of the step in fallbacks, in plugin
    operators (timed around each polychip.ops call), and in dispatch."""
    ops = polychip.ops
    in_ops = [0.0]
    originals = {}
    for name in ops.DTYPES:
        fn = getattr(ops, name)
        originals[name] = fn

        def timed(*a, _fn=fn, **k):
            t = time.perf_counter()
            try:
                return _fn(*a, **k)
            finally:
                in_ops[0] += time.perf_counter() - t

        setattr(ops, name, timed)
    pt.reset_fallback_report()
    pt.reset_kernel_report()
    native = pt._native_backend
    native.reset_plugin_seconds()
    try:
        with pt.profile():
            total = trainer.round() * STEPS
    finally:
        for name, fn in originals.items():
            setattr(ops, name, fn)
    # Copies, casts and fills run from the C++ half, inside kernels or not.
    from polychip.torch import _aten

    cpp_ops = native.plugin_seconds()
    report = pt.fallback_report()
    kernels = pt.kernel_report()
    in_kernels = _aten.TOTALS["kernels"]
    return {
        "fallback": report.total_seconds / total,
        "plugin ops": (in_ops[0] + cpp_ops) / total,
        # Our Python kernels around their operator calls.
        "kernels": max(in_kernels - in_ops[0] - _aten.TOTALS["kernels_plugin"], 0.0) / total,
        # PyTorch's autograd and dispatcher, the model's Python, allocation.
        "pytorch": max(total - in_kernels - (cpp_ops - _aten.TOTALS["kernels_plugin"]) - report.total_seconds, 0.0)
        / total,
        "kernel calls per step": sum(n for n, _ in kernels.values()) / STEPS,
        "fallback calls per step": report.total / STEPS,
        "fallbacks": dict(report),
    }


DDP = textwrap.dedent(
    """
    import json, os, sys, time, torch, torch.distributed as dist
    sys.path.insert(0, os.environ["BENCH_DIR"])
    import polychip.torch as pt
    from polychip.torch.distributed import device_for_rank
    import torch_llama as b
    dist.init_process_group("polychip")
    dev = device_for_rank(vendors=os.environ["VENDORS"].split(","))
    t = b.Trainer(dev)
    t.model = torch.nn.parallel.DistributedDataParallel(t.model)
    t.round()
    times = [t.round() for _ in range(int(os.environ["DDP_ROUNDS"]))]
    if dist.get_rank() == 0:
        print("TIMES " + json.dumps(times), flush=True)
    dist.destroy_process_group()
    """
)


def ddp(vendors, rounds):
    """Median step time of a 2-rank DDP run, one rank per vendor given."""
    here = os.path.dirname(os.path.abspath(__file__))
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(DDP)
    env = {**os.environ, "BENCH_DIR": here, "VENDORS": ",".join(vendors), "DDP_ROUNDS": str(rounds)}
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", f.name],
        capture_output=True, text=True, env=env, timeout=3600,
    )
    os.unlink(f.name)
    if run.returncode != 0:
        raise RuntimeError(run.stdout[-3000:] + run.stderr[-3000:])
    times = json.loads(run.stdout.split("TIMES ", 1)[1].splitlines()[0])
    return statistics.median(times), times


def main():
    index = {pt.device_info(i)["vendor"]: i for i in reversed(range(pt.device_count()))}
    ferrite = torch.device("polychip", index["Ferrite"])
    *_, b, seq = MODELS[MODEL]
    tokens = b * seq
    print(
        f"LlamaForCausalLM {MODEL} ({sum(p.numel() for p in transformers.LlamaForCausalLM(config()).parameters()) / 1e6:.2f} M "
        f"parameters), batch {b} x {seq} tokens, AdamW; {torch.get_num_threads()} CPU threads for torch; "
        f"median of {ROUNDS} rounds x {STEPS} steps"
    )
    cpu, dev = Trainer(torch.device("cpu")), Trainer(ferrite)
    cpu.round(), dev.round()  # warm-up
    rows = {"PyTorch CPU eager": [], f"polychip:{ferrite.index} (Ferrite)": []}
    for _ in range(ROUNDS):
        rows["PyTorch CPU eager"].append(cpu.round())
        rows[f"polychip:{ferrite.index} (Ferrite)"].append(dev.round())
    base = statistics.median(rows["PyTorch CPU eager"])
    print(f"  {'':28s} {'ms/step':>8s} {'spread':>16s} {'tokens/s':>9s} {'vs CPU':>7s}")
    for name, xs in rows.items():
        m = statistics.median(xs)
        print(f"  {name:28s} {m * 1e3:8.1f} {spread(xs)} {tokens / m:9.0f} {base / m:7.2f}")
    s = shares(dev)
    print(
        f"  polychip step: {s['plugin ops'] * 100:.1f}% in plugin operators, dispatch {(s['kernels'] + s['pytorch']) * 100:.1f}% "
        f"({s['kernels'] * 100:.1f}% our kernels around the operators, {s['pytorch'] * 100:.1f}% PyTorch autograd, "
        f"dispatcher and model code), {s['fallback'] * 100:.1f}% CPU fallback; "
        f"{s['kernel calls per step']:.0f} kernel calls and {s['fallback calls per step']:.0f} fallbacks per step"
    )
    print(f"  fallbacks in the profiled round: {s['fallbacks']}")
    rounds = max(3, ROUNDS // 2)
    one = {v: Trainer(torch.device("polychip", index[v])) for v in ("Ferrite", "Cobalt")}
    alone = {}
    for v, t in one.items():
        t.round()
        alone[v] = statistics.median([t.round() for _ in range(rounds)])
    print(f"DDP over torch.distributed's polychip backend, 2 ranks (torchrun), batch {b} x {seq} per rank")
    for vendors in (("Ferrite", "Ferrite"), ("Ferrite", "Cobalt")):
        m, times = ddp(vendors, rounds)
        slowest = max(alone[v] for v in vendors)
        # Ideal: each rank as fast as its device alone, the pair waiting for
        # the slower one; efficiency is that over the measured step.
        print(
            f"  {'+'.join(vendors):16s} {m * 1e3:8.1f} ms/step (spread {spread(times)}), "
            f"{2 * tokens / m:8.0f} tokens/s; one rank alone: "
            + ", ".join(f"{v} {alone[v] * 1e3:.1f} ms" for v in dict.fromkeys(vendors))
            + f"; efficiency {slowest / m:.2f}"
        )


if __name__ == "__main__":
    main()
