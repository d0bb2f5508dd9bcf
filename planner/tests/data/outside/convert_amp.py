#!/usr/bin/env python3
"""Converts the measured runs of AMP's two GPT-2 experiments
(github.com/DachengLi1/AMP, NeurIPS 2022: GPT-2 with hidden 1024, 24
layers, sequences of 1024 and a vocabulary of 52,256 trained by DeepSpeed's
Megatron-LM v1.1.5 in fp16 on 16 GPUs, plans over tensor, pipeline and data
parallelism, each launched and timed; "r_cost: inf" is a run that failed)
into polychip's plan format, written beside this script:

- the heterogeneous cluster (src/results/het_cluster_results.txt: three
  AWS p3.8xlarge nodes of four V100 and one g4dn.12xlarge node of four T4,
  53 plans) to amp-runs.json;
- the homogeneous one (src/results/homogeneous_results.txt: four
  g4dn.12xlarge nodes of four T4, src/homogeneous.py, 52 plans) to
  amp-homogeneous-runs.json.

Usage: convert_amp.py AMP_CHECKOUT [COMMIT]

It also converts AMP's per-layer forward times of the same GPUs at one
sequence per micro-batch (src/known_cost/gpt2_{P3,G4}_{1,2,4}.npy: P3 is
the V100, G4 the T4, the suffix the tensor-parallel degree) into
polychip-profile/1, amp-profile-gpt2-medium.json, with the backward at
twice the forward, as AMP's own cost model takes it.

Only facts are taken. AMP numbers the model's 30 layers as DeepSpeed's
pipeline module holds them: 0 the embedding, 1 a transpose, 2-25 the
transformer blocks, 26-27 a transpose and the final norm, 28 the output
head, 29 the loss; a plan's partition gives each stage's first layer.
polychip counts transformer blocks only, so a stage's "layers" are the
blocks among its AMP layers (a stage may hold none). Ranks are laid out as
DeepSpeed's pipe-data-model topology does (rank = (stage * dp + replica) *
tp + k), four to a node in the host file's order, whose last node is the T4
node (AMP's cluster description gives its bandwidths to the last node).
"""
import ast
import json
import pathlib
import re
import struct
import subprocess

from outside_common import checkout_and_commit, toml_model

GPUS_PER_NODE = 4
BLOCKS = range(2, 26)  # AMP's layer numbers of the transformer blocks
GLOBAL_BATCH = 32

LINE = re.compile(
    r"Simulating result: None, \[(?P<partition>[0-9, ]+)\], (?P<mbs>\d+), "
    r"\{'mp_deg': tensor\(\[(?P<mp>[0-9.]+)\]\), 'dp_deg': tensor\(\[(?P<dp>[0-9.]+)\]\), "
    r"'pp_deg': tensor\(\[(?P<pp>[0-9.]+)\]\)\}, with p_cost: tensor\(\[(?P<pred>[0-9.]+)\]\), "
    r"r_cost: (?P<real>inf|[0-9.]+)"
)


def git_show(root, commit, path, binary=False):
    return subprocess.run(
        ["git", "-C", root, "show", f"{commit}:{path}"],
        check=True, capture_output=True, text=not binary,
    ).stdout


# Each experiment: its results file, the cluster file it ran on, how many
# runs it has, and the chip type of a rank (four to a node, in the host
# file's order: the heterogeneous cluster's last node is the T4 node).
EXPERIMENTS = {
    "amp-runs.json": (
        "src/results/het_cluster_results.txt", "aws-v100-t4", 53,
        lambda rank: "T4" if rank // GPUS_PER_NODE == 3 else "V100",
    ),
    "amp-homogeneous-runs.json": (
        "src/results/homogeneous_results.txt", "aws-t4x16", 52, lambda rank: "T4",
    ),
}


def runs(root, commit, results, cluster, chip_of):
    text = git_show(root, commit, results)
    for n, m in enumerate(LINE.finditer(text)):
        mp, dp, pp = (int(float(m[k])) for k in ("mp", "dp", "pp"))
        mbs = int(m["mbs"])
        bounds = [int(x) for x in m["partition"].split(",")]
        assert len(bounds) == pp + 1 and bounds[0] == 0 and bounds[-1] == 30, m[0]
        assert GLOBAL_BATCH % (dp * mbs) == 0, m[0]
        stages = []
        for s in range(pp):
            blocks = sum(1 for layer in range(bounds[s], bounds[s + 1]) if layer in BLOCKS)
            chips = []
            for d in range(dp):
                ranks = [(s * dp + d) * mp + k for k in range(mp)]
                kinds = {chip_of(r) for r in ranks}
                assert len(kinds) == 1, f"a tp group across node kinds: {m[0]}"
                chips.append(kinds.pop())
            stage = {"layers": blocks, "tp": mp}
            stage["chip"] = chips[0] if len(set(chips)) == 1 else chips
            stages.append(stage)
        real = None if m["real"] == "inf" else float(m["real"])
        yield {
            "name": f"trial {n}: mbs {mbs}, tp {mp}, dp {dp}, pp {pp}, partition {bounds}",
            "source": f"DachengLi1/AMP@{commit}:{results} (real trial {n})",
            "cluster": cluster,
            "model": "gpt2-medium-amp",
            "amp_partition": bounds,
            "plan": {"groups": [{
                "copies": dp,
                "micro_batch_size": mbs,
                "micro_batches": GLOBAL_BATCH // (dp * mbs),
                "stages": stages,
            }]},
            "measured_step_s": real,
            "ran": real is not None,
            "amp_predicted_s": float(m["pred"]),
        }


def npy(data):
    """A 1-D little-endian float array from a .npy file (NumPy not needed)."""
    assert data[:6] == b"\x93NUMPY", "not a .npy file"
    major = data[6]
    (hlen,) = struct.unpack("<H" if major == 1 else "<I", data[8:10] if major == 1 else data[8:12])
    start = (10 if major == 1 else 12) + hlen
    header = ast.literal_eval(data[(10 if major == 1 else 12):start].decode("latin1"))
    fmt = {"<f8": "d", "<f4": "f"}[header["descr"]]
    (count,) = header["shape"]
    return list(struct.unpack(f"<{count}{fmt}", data[start:start + count * struct.calcsize(fmt)]))


def profile(root, commit, model):
    entries = []
    for chip, key in (("V100", "P3"), ("T4", "G4")):
        for tp in (1, 2, 4):
            path = f"src/known_cost/gpt2_{key}_{tp}.npy"
            fwd = npy(git_show(root, commit, path, binary=True))
            assert len(fwd) == 30, path
            blocks = sorted(fwd[b] for b in BLOCKS)
            mid = blocks[len(blocks) // 2]
            # The embedding with its transpose; the head with the final
            # norm, transposes and the loss around it.
            embed = fwd[0] + fwd[1]
            head = fwd[26] + fwd[27] + fwd[28] + fwd[29]
            entries.append({
                "chip": chip,
                "micro_batch": 1,
                "tp": tp,
                "embedding": {"forward": embed, "backward": 2 * embed},
                "block": {"forward": mid, "backward": 2 * mid},
                "head": {"forward": head, "backward": 2 * head},
            })
    return {
        "format": "polychip-profile/1",
        "model": model,
        "dtype": "f16",
        "source": f"DachengLi1/AMP@{commit}:src/known_cost/gpt2_{{P3,G4}}_{{1,2,4}}.npy "
                  "(forward seconds per layer at one sequence; the median block; "
                  "backward twice the forward, as AMP's cost model takes it)",
        "entries": entries,
    }


def main():
    root, commit = checkout_and_commit()
    here = pathlib.Path(__file__).parent
    for out, (results, cluster, count, chip_of) in EXPERIMENTS.items():
        records = list(runs(root, commit, results, cluster, chip_of))
        assert len(records) == count, (results, len(records))
        (here / out).write_text(json.dumps({"runs": records}, indent=1) + "\n")
        failed = sum(not r["ran"] for r in records)
        print(f"{len(records)} runs ({failed} failed) written to {here / out}")
    model = toml_model(here / "gpt2-medium-amp.toml")
    path = here / "amp-profile-gpt2-medium.json"
    path.write_text(json.dumps(profile(root, commit, model), indent=1) + "\n")
    print(f"profile written to {path}")


if __name__ == "__main__":
    main()
