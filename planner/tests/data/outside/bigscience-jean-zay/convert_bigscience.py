#!/usr/bin/env python3
"""Converts BigScience's topology sweep of the 181B model that preceded BLOOM
(github.com/bigscience-workshop/bigscience,
`train/tr11-176B-ml/chronicles-prequel.md`, section "GBS Variations", the
runs dated 02-25, i.e. 2022-02-25) into polychip's plan format, one record
per run, written to bigscience-runs.json beside this script.

The runs: one model (72 layers, hidden 14,336, 64 heads, sequences of 2,048,
a vocabulary of about 250k) trained by Megatron-DeepSpeed on 48 nodes of 8
A100 80GB of IDRIS's Jean Zay (384 GPUs), tp 2/4/8, 1 to 24 pipeline stages,
4 to 48 replicas, micro-batches of 1 to 6, global batches of 1,568, 2,016
or 2,048 sequences: the seconds of iteration 2 as logged, the largest GPU
memory nvidia-smi showed on the first (last) nodes, or "OOM". The section
notes that the nodes' PCIe/NUMA setting had been fixed that day, so only
that day's rows are taken (the rows of other days are not comparable, as
the document says).

Settings of every run, from the training script of the same days
(`train/tr11-200B-ml/tr11-200B-ml.slurm` at a16f0ea, 2022-02-25): `--fp16`
(DeepSpeed fp16, gradients accumulated in fp16: the prequel's "Rebalancing
layers" contrasts its later bf16 optimizer with this), ZeRO stage 1 (the
optimizer state sharded over the data-parallel replicas),
`--checkpoint-activations` (full recomputation), ALiBi positions, an
embedding layernorm, the fused softmax of 2022 (no flash attention), no
sequence parallelism (DeepSpeed's Megatron had none), DeepSpeed's pipeline
(1F1B) with transformer layers split evenly over the stages (72 is divisible
by every pipeline degree here).

Only facts are taken: each row's plan and its measured figures. Rows of
another model in the same section (hidden 12,288, 96 layers: one run) are
listed under `left_out` with the reason. A plan measured twice (tp 4, pp 12,
dp 8, micro-batch 2, at 110.48 s and 113.54 s; the document gives no
difference) keeps both measurements, the second named "#2".

Usage: convert_bigscience.py BIGSCIENCE_CHECKOUT_OR_GIT_DIR [COMMIT]
"""
import json
import pathlib
import re
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from outside_common import checkout_and_commit  # noqa: E402

import subprocess  # noqa: E402

PATH = "train/tr11-176B-ml/chronicles-prequel.md"
CLUSTER = "jean-zay-a100-80g"
CHIP = "A100"
CHIPS_PER_NODE = 8
MODEL = "bigscience-181b"
DATE = "02-25"
# The model of the section's header (NLAYERS=72, NHIDDEN=14336, NHEADS=64).
SHAPE = {"layers": 72, "hidden": 14336, "heads": 64}
# nvidia-smi reports MiB; the document's "GB" is taken as GiB.
GIB = 1 << 30


def git_show(root, commit, path):
    return subprocess.run(
        ["git", "-C", root, "show", f"{commit}:{path}"],
        check=True, capture_output=True, text=True,
    ).stdout


def section(lines, title, next_title):
    """Line numbers (1-based) and text of the lines from `## title` to the
    next `## next_title`."""
    start = next(i for i, l in enumerate(lines) if l.strip() == f"## {title}")
    end = next(i for i, l in enumerate(lines) if l.strip() == f"## {next_title}")
    assert start < end
    return [(i + 1, lines[i]) for i in range(start, end)]


def model_toml():
    h, layers, heads = SHAPE["hidden"], SHAPE["layers"], SHAPE["heads"]
    # The MLP is GELU 4h wide (two matrices: 8 h^2 parameters); a SwiGLU
    # width of 8h/3 has the same parameters and FLOPs. 8h/3 is not whole
    # here: 38,232 (divisible by 8) is within 0.01% of it.
    ffn = 38232
    return (
        "# The 181B model of BigScience's topology sweep before BLOOM (tr11, 2022-02-25;\n"
        "# bigscience-workshop/bigscience, train/tr11-176B-ml/chronicles-prequel.md,\n"
        "# \"GBS Variations\": NLAYERS=72, NHIDDEN=14336, NHEADS=64; sequences of 2048,\n"
        "# train/tr11-200B-ml/tr11-200B-ml.slurm of the same day). 181B parameters by\n"
        "# 12 h^2 L + v h, as the document sizes it. The vocabulary is the\n"
        "# multilingual tokenizer's, about 250k (250,680 in the final model's README),\n"
        "# padded by Megatron: 250,880 at tp 2 and 4 (251,904 at tp 8, 0.01% more\n"
        "# parameters). Its MLP is GELU 4h wide (two matrices); a SwiGLU width of 8h/3\n"
        f"# ({ffn}, the nearest multiple of 8) has about the same parameters and FLOPs,\n"
        "# which is what the planner models. ALiBi positions (no position embedding),\n"
        "# LayerNorm with biases and an embedding layernorm are not modelled (under\n"
        "# 0.01% of the parameters).\n"
        f'name = "{MODEL}"\n'
        f"layers = {layers}\nhidden = {h}\nffn = {ffn}\nheads = {heads}\n"
        f"kv_heads = {heads}\nvocab = 250880\nseq_len = 2048\n"
    )


def main():
    root, commit = checkout_and_commit()
    here = pathlib.Path(__file__).resolve().parent
    lines = git_show(root, commit, PATH).splitlines()
    body = section(lines, "GBS Variations", "Another round of NHEADS")
    header = " ".join(l for _, l in body[:12])
    for k, v in (("NLAYERS", 72), ("NHIDDEN", 14336), ("NHEADS", 64)):
        assert re.search(rf"\b{k}={v}\b", header), (k, header)
    assert "PCI-Express/NUMA was improved today" in header
    runs, left_out, seen = [], [], {}
    model_of_table = (72, 14336)
    for no, line in body:
        shape = re.match(r"^N?HIDDEN=(\d+) / NLAYERS=(\d+)", line.strip())
        if shape:
            model_of_table = (int(shape.group(2)), int(shape.group(1)))
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 11 or not cells[0].isdigit():
            continue
        nodes, size, dp, tp, pp, mbs, gbs, mem, sec, tflops, notes = cells
        nodes, dp, tp, pp, mbs, gbs = (int(x) for x in (nodes, dp, tp, pp, mbs, gbs))
        source = f"bigscience-workshop/bigscience@{commit}:{PATH} line {no}"
        name = f"{size}/dp{dp}-tp{tp}-pp{pp}-mbs{mbs}-gbs{gbs}"
        seen[name] = seen.get(name, 0) + 1
        if seen[name] > 1:
            name += f" #{seen[name]}"
        assert notes == DATE, source
        assert dp * tp * pp == nodes * CHIPS_PER_NODE, source
        if model_of_table != (72, 14336):
            left_out.append({
                "source": source, "name": name,
                "why": f"another model ({model_of_table[0]} layers, hidden "
                       f"{model_of_table[1]}), measured once: nothing to rank it against"})
            continue
        assert SHAPE["layers"] % pp == 0 and gbs % (dp * mbs) == 0, source
        ran = mem != "OOM"
        run = {
            "name": name,
            "source": source,
            "cluster": CLUSTER,
            "model": MODEL,
            "gpus": nodes * CHIPS_PER_NODE,
            "ran": ran,
            "plan": {"groups": [{
                "copies": dp,
                "micro_batch_size": mbs,
                "micro_batches": gbs // (dp * mbs),
                "stages": [{"layers": SHAPE["layers"] // pp, "chip": CHIP, "tp": tp}] * pp,
            }]},
            "measured_step_s": float(sec) if ran else None,
            "measured_tflops_per_gpu": float(tflops) if ran else None,
        }
        peak = re.fullmatch(r"(\d+)GB", mem)
        run["measured_peak_bytes"] = int(peak.group(1)) * GIB if peak else None
        if not ran:
            assert sec == "" and tflops == "", source
        runs.append(run)
    settings = {"dtype": "f16", "recompute": "full", "flash_attention": False,
                "sequence_parallel": False, "shard_optimizer": True,
                "gradient_bytes": 2, "schedule": "1f1b"}
    (here / "bigscience-runs.json").write_text(json.dumps(
        {"settings": settings, "left_out": left_out, "runs": runs}, indent=1) + "\n")
    (here / f"{MODEL}.toml").write_text(model_toml())
    ran = sum(r["ran"] for r in runs)
    print(f"bigscience-runs.json: {len(runs)} runs ({ran} ran, {len(runs) - ran} OOM), "
          f"{len(left_out)} left out")


if __name__ == "__main__":
    main()
