#!/usr/bin/env python3
"""Converts the measured training runs that vTrain (github.com/VIA-Research/vTrain,
MICRO 2024) publishes as its simulator's ground truth into polychip's plan
format, one record per run:

- data/ground_truth_multi.csv: 109 runs of four GPT-3-style models (3.6B on
  64 A100s, 18.4B on 256, 39.1B and 175B on 512), each model at one global
  batch and over many (tensor, data, pipeline) degrees and micro-batch
  sizes -> vtrain-multi-runs.json;
- data/ground_truth_single.csv: 1,440 runs on one node (2, 4 or 8 A100s) of
  eight small GPT shapes (hidden 1,024 or 2,048, 12-24 layers, sequences of
  1,024) -> vtrain-single-runs.json.

data/README.md there: "All data points here are collected using
Megatron-DeepSpeed codebase". Every validation configuration of the
repository (config/validation/*/*.json) sets "use_checkpoint": true (full
activation recomputation), "use_gradient_bucket": false, "1f1b", A100,
nodes of 8 GPUs and 800 Gb/s out of a node; the model is GPT-2-style
(learned positions, LayerNorm, GELU MLP 4h wide, vocabulary 50,257) in fp16.

Usage: convert_vtrain.py VTRAIN_CHECKOUT [COMMIT]

Also writes one polychip model file per model shape (gpt-*.toml beside this
script). Only facts are taken: each row's plan (tp, dp, pp, micro-batch
size, global batch; layers split evenly over the stages, as vTrain requires
and DeepSpeed's pipeline partitions transformer layers) and its measured
iteration time. The runs record no memory and no failed runs. A row whose
tensor-parallel group spans nodes (tp 16 on nodes of 8) is left out, with
the reason: polychip keeps a tensor-parallel group inside a node.
"""
import csv
import io
import json
import pathlib
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from outside_common import checkout_and_commit  # noqa: E402

CLUSTER = "a100-80g-vtrain"
CHIP = "A100"
CHIPS_PER_NODE = 8
# Megatron pads GPT-2's 50,257 tokens to a multiple of 128 (times tp); the
# model file takes 50,304, the pad at tp 1, as the repository's GPT-Neo does.
VOCAB = 50304


def git_show(root, commit, path):
    return subprocess.run(
        ["git", "-C", root, "show", f"{commit}:{path}"],
        check=True, capture_output=True, text=True,
    ).stdout


def model_name(h, heads, layers, seq):
    return f"gpt-h{h}-l{layers}-a{heads}-s{seq}"


def model_toml(h, heads, layers, seq, params):
    ffn = round(8 * h / 3)
    about = f" ({params} billion parameters as vTrain's table gives them)" if params else ""
    return (
        f"# A GPT-3-style model of vTrain's measured runs{about}:\n"
        f"# {layers} layers, hidden {h}, {heads} heads, sequences of {seq}, GPT-2's\n"
        f"# vocabulary (50,257, padded by Megatron to {VOCAB}). Its MLP is GELU 4h wide\n"
        f"# (two matrices); a SwiGLU width of 8h/3 ({ffn}) has about the same\n"
        f"# parameters and FLOPs, which is what the planner models.\n"
        f'name = "{model_name(h, heads, layers, seq)}"\n'
        f"layers = {layers}\nhidden = {h}\nffn = {ffn}\nheads = {heads}\n"
        f"kv_heads = {heads}\nvocab = {VOCAB}\nseq_len = {seq}\n"
    )


def convert(root, commit, path, kind, models, left_out):
    text = git_show(root, commit, path)
    rows = list(csv.DictReader(io.StringIO(text.lstrip("\ufeff"))))
    runs, seen = [], {}
    for i, r in enumerate(rows):
        row = i + 2  # the file's line: the header is line 1
        h, heads, layers, seq = (int(r[k]) for k in
                                 ("hidden size", "attention heads", "# layers", "sequence length"))
        gpus, gbs, mb = int(r["# GPUs"]), int(r["global batch"]), int(r["micro batch"])
        tp, dp, pp = (int(r[k]) for k in
                      ("tensor parallelism", "data parallelism", "pipeline parallelism"))
        params = r.get("Parameters (billion)")
        name = model_name(h, heads, layers, seq)
        models.setdefault((h, heads, layers, seq), params)
        source = f"VIA-Research/vTrain@{commit}:{path} line {row}"
        run_name = (f"{kind}/{params + 'B' if params else name}/g{gpus}-b{gbs}"
                    f"-t{tp}-d{dp}-p{pp}-mb{mb}")
        # A plan measured twice (the 175B t4-d4-p32-mb2 row is) keeps both
        # measurements, the second named "-rep2".
        seen[run_name] = seen.get(run_name, 0) + 1
        if seen[run_name] > 1:
            run_name += f"-rep{seen[run_name]}"
        assert tp * dp * pp == gpus, source
        if tp > CHIPS_PER_NODE:
            left_out.append({"source": source, "name": run_name,
                             "why": f"tp {tp} spans nodes of {CHIPS_PER_NODE} GPUs; polychip "
                                    "keeps a tensor-parallel group inside a node"})
            continue
        assert layers % pp == 0 and gbs % (dp * mb) == 0, source
        runs.append({
            "name": run_name,
            "source": source,
            "cluster": CLUSTER,
            "model": name,
            "gpus": gpus,
            "plan": {"groups": [{
                "copies": dp,
                "micro_batch_size": mb,
                "micro_batches": gbs // (dp * mb),
                "stages": [{"layers": layers // pp, "chip": CHIP, "tp": tp}] * pp,
            }]},
            "measured_step_s": float(r["iteration time (ms)"]) / 1000.0,
        })
    return runs


def main():
    root, commit = checkout_and_commit()
    here = pathlib.Path(__file__).resolve().parent
    # Megatron-DeepSpeed in fp16 keeps each gradient in fp16 (the
    # parameters' .grad under DeepSpeed's fp16 optimizers, Megatron's fp16
    # grad buffer without --accumulate-allreduce-grads-in-fp32), as the
    # BigScience and DLPerf sets of the same stack record.
    settings = {"dtype": "f16", "recompute": "full", "flash_attention": False,
                "sequence_parallel": False, "gradient_bytes": 2, "schedule": "1f1b"}
    for kind, path, out in (("multi", "data/ground_truth_multi.csv", "vtrain-multi-runs.json"),
                            ("single", "data/ground_truth_single.csv", "vtrain-single-runs.json")):
        models, left_out = {}, []
        runs = convert(root, commit, path, kind, models, left_out)
        (here / out).write_text(json.dumps(
            {"settings": settings, "left_out": left_out, "runs": runs}, indent=1) + "\n")
        for (h, heads, layers, seq), params in models.items():
            (here / f"{model_name(h, heads, layers, seq)}.toml").write_text(
                model_toml(h, heads, layers, seq, params))
        print(f"{out}: {len(runs)} runs, {len(left_out)} left out, {len(models)} models")


if __name__ == "__main__":
    main()
