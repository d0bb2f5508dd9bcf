#!/usr/bin/env python3
"""Converts OneFlow's DLPerf measurements of NVIDIA Megatron-LM on four nodes
of eight V100-SXM2-16GB (github.com/Oneflow-Inc/DLPerf, `Megatron-LM/README.md`)
into polychip's plan format, one record per run, written to
dlperf-megatron-runs.json beside this script, with a model file per shape.

The runs: GPT models of hidden 768 to 3,072 and 12 to 32 layers, sequences
of 2,048, trained by Megatron-LM at 8aa4619f (NGC PyTorch 20.12) with the
scripts of `Megatron-LM/scripts/` (`--fp16`, `--checkpoint-activations`, the
GPT-2 BPE vocabulary padded to 51,200 as DLPerf's summary report
`reports/GPT/dlperf_gpt_test_report_210512.md` counts it), on 1 to 32 GPUs:
data parallelism, tensor parallelism (tp 1 to 32), both, and pipelines of 2
and 4 stages with 32 micro-batches. The README's results table gives each
run's iteration time ("lantency", ms: the global batch over it is the
report's sequences/s); the same table in the pull request's commit 01e43de
(2021-05-12), which the squash-merge 10f7979 replaced by TFLOP/s columns,
gives the GPU memory nvidia-smi showed (MiB), which is taken as each run's
measured peak.

Only facts are taken: each row's plan (the README's test-case table), its
time and memory. Two runs put one tensor-parallel group over 2 and 4 nodes
(tp 16 and 32), which no polychip plan expresses (tp stays inside a node):
they are listed under `left_out`. Two plans appear twice (in the DP and 2D
groups, and in the MP and 2D groups: the 8-way data-parallel and the 8-way
tensor-parallel 1536x16 runs); both measurements are kept, the second named
"#2".

Usage: convert_dlperf.py DLPERF_CHECKOUT_OR_GIT_DIR [COMMIT [MEMORY_COMMIT]]
"""
import json
import pathlib
import re
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from outside_common import checkout_and_commit  # noqa: E402

PATH = "Megatron-LM/README.md"
MEMORY_COMMIT = "01e43de400ab91475437b181f220777615c24253"
CLUSTER = "dlperf-v100-16g"
CHIP = "V100"
CHIPS_PER_NODE = 8
SEQ = 2048
VOCAB = 51200
MIB = 1 << 20


def git_show(root, commit, path):
    return subprocess.run(
        ["git", "-C", root, "show", f"{commit}:{path}"],
        check=True, capture_output=True, text=True,
    ).stdout


def cells(line):
    return [c.strip() for c in line.strip().split("|")]


def model_name(hidden, layers, heads):
    return f"gpt-h{hidden}-l{layers}-a{heads}-s{SEQ}"


def model_toml(hidden, layers, heads):
    ffn = hidden * 8 // 3
    assert ffn * 3 == hidden * 8
    params = 12 * hidden * hidden * layers + VOCAB * hidden
    return (
        f"# GPT of DLPerf's Megatron-LM runs (Oneflow-Inc/DLPerf, {PATH}): hidden\n"
        f"# {hidden}, {layers} layers, {heads} heads, sequences of {SEQ}; the GPT-2 BPE\n"
        f"# vocabulary padded to {VOCAB} as DLPerf's report counts it (Megatron pads it\n"
        "# to a multiple of 128 tp: 50,304 at tp 1, 51,200 at tp 8; 2% of the head at\n"
        f"# most). {params / 1e9:.3f}B parameters by 12 h^2 L + v h. Its MLP is GELU 4h\n"
        f"# wide (two matrices); a SwiGLU width of 8h/3 ({ffn}) has the same parameters\n"
        "# and FLOPs, which is what the planner models. Learned position embeddings\n"
        f"# ({SEQ} x {hidden}) and biases are not modelled.\n"
        f'name = "{model_name(hidden, layers, heads)}"\n'
        f"layers = {layers}\nhidden = {hidden}\nffn = {ffn}\nheads = {heads}\n"
        f"kv_heads = {heads}\nvocab = {VOCAB}\nseq_len = {SEQ}\n"
    )


def main():
    root, commit = checkout_and_commit()
    memory_commit = sys.argv[3] if len(sys.argv) > 3 else MEMORY_COMMIT
    here = pathlib.Path(__file__).resolve().parent
    lines = git_show(root, commit, PATH).splitlines()
    old = git_show(root, memory_commit, PATH).splitlines()
    assert any("8aa4619f2b2a57b5725026a50ebd2b15e8121482" in l for l in lines)
    assert any("V100-SXM2-16GB" in l for l in lines)
    configs, latency, memory = {}, {}, {}
    for no, line in enumerate(lines, 1):
        c = cells(line)
        if len(c) == 14 and re.fullmatch(r"[A-Z0-9x_]+_\d+x\d+", c[1]):
            n, g, dp, tp, pp, mbs, mbs_dp, acc, gbs, h, heads, layers = map(int, c[2:])
            assert dp * tp * pp == n * g and mbs * dp == mbs_dp and acc * mbs_dp == gbs, line
            configs[c[1]] = (no, n * g, dp, tp, pp, mbs, gbs, h, heads, layers)
        m = re.fullmatch(r"([\d.]+) ?\(ms\)", c[2]) if len(c) == 6 else None
        if m:
            latency[c[1]] = (no, float(m.group(1)))
    for no, line in enumerate(old, 1):
        c = cells(line)
        if len(c) == 4 and c[3].endswith("(MiB)"):
            memory[c[1]] = (no, float(c[2].split("(")[0]), int(c[3].split()[0]))
    assert set(configs) == set(latency) == set(memory), (configs, latency, memory)
    runs, left_out, models, seen = [], [], {}, {}
    for case, (cno, gpus, dp, tp, pp, mbs, gbs, h, heads, layers) in configs.items():
        lno, ms = latency[case]
        mno, ms_old, mib = memory[case]
        assert ms == ms_old, (case, ms, ms_old)
        source = (f"Oneflow-Inc/DLPerf@{commit}:{PATH} lines {cno} (plan), {lno} (time); "
                  f"@{memory_commit} line {mno} (memory)")
        name = f"h{h}-l{layers}/dp{dp}-tp{tp}-pp{pp}-mbs{mbs}-gbs{gbs}"
        seen[name] = seen.get(name, 0) + 1
        if seen[name] > 1:
            name += f" #{seen[name]}"
        if tp > CHIPS_PER_NODE:
            left_out.append({
                "source": source, "name": name, "case": case,
                "measured_step_s": round(ms / 1e3, 6),
                "why": f"tp {tp} spans {tp // CHIPS_PER_NODE} nodes: polychip keeps a "
                       "tensor-parallel group inside a node"})
            continue
        assert layers % pp == 0 and gbs % (dp * mbs) == 0, case
        model = model_name(h, layers, heads)
        models[model] = (h, layers, heads)
        runs.append({
            "name": name,
            "case": case,
            "source": source,
            "cluster": CLUSTER,
            "model": model,
            "gpus": gpus,
            "ran": True,
            "plan": {"groups": [{
                "copies": dp,
                "micro_batch_size": mbs,
                "micro_batches": gbs // (dp * mbs),
                "stages": [{"layers": layers // pp, "chip": CHIP, "tp": tp}] * pp,
            }]},
            "measured_step_s": round(ms / 1e3, 6),
            "measured_peak_bytes": mib * MIB,
        })
    settings = {"dtype": "f16", "recompute": "full", "flash_attention": False,
                "sequence_parallel": False, "shard_optimizer": False,
                "gradient_bytes": 2, "schedule": "1f1b"}
    (here / "dlperf-megatron-runs.json").write_text(json.dumps(
        {"settings": settings, "left_out": left_out, "runs": runs}, indent=1) + "\n")
    for model, shape in models.items():
        (here / f"{model}.toml").write_text(model_toml(*shape))
    print(f"dlperf-megatron-runs.json: {len(runs)} runs, {len(left_out)} left out, "
          f"{len(models)} models")


if __name__ == "__main__":
    main()
