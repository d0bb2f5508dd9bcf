#!/usr/bin/env python3
"""Converts the measured training runs of Sailor's simulator validation
(github.com/eth-easl/sailor, sailor/Planner/simulations/validation: each
file one Megatron-DeepSpeed run with its measured iteration time, "real",
and peak memory per GPU, "max_mem") into polychip's plan format, one
record per run, written to sailor-runs.json beside this script.

Usage: convert_sailor.py SAILOR_CHECKOUT [COMMIT]

It also converts Sailor's per-layer profiles of the same GPUs
(sailor/Planner/simulations/profiles_tmp.json: forward, backward and
update seconds of every layer, per micro-batch size and tp degree) into
polychip-profile/1 files, one per model: sailor-profile-<model>.json.

Only facts are taken: the plan of each run (stages, layers, the chips of
each stage's data-parallel group, tp, micro-batch size, global batch) and
its two measurements. Sailor counts the embedding and the head as layers
of the first and last stage; polychip counts transformer blocks only.
"""
import json
import pathlib
import subprocess

from outside_common import checkout_and_commit, toml_model

MODELS = {"OPT-350": "opt-350m", "GPT-NEO": "gpt-neo-2.7b"}
# Transformer blocks of each model, plus Sailor's embedding and head layers.
SAILOR_LAYERS = {"opt-350m": 26, "gpt-neo-2.7b": 34}


def runs(root, commit, skipped):
    base = "sailor/Planner/simulations/validation"
    files = subprocess.run(
        ["git", "-C", root, "ls-tree", "-r", "--name-only", commit, base],
        check=True, capture_output=True, text=True,
    ).stdout.split()
    for path in sorted(files):
        if not path.endswith(".json"):
            continue
        parts = path.split("/")
        where = parts[4]  # clariden or mit
        model = MODELS[parts[5]] if where == "clariden" else "opt-350m"
        cluster = "clariden-gh200" if where == "clariden" else "mit-rtx"
        text = subprocess.run(
            ["git", "-C", root, "show", f"{commit}:{path}"],
            check=True, capture_output=True, text=True,
        ).stdout
        d = json.loads(text)
        (p,) = d["pipeline_list"]
        layers = sum(len(x) for x in p["layers_per_stage"])
        if layers != SAILOR_LAYERS[model]:
            skipped.append((path, f"its stages hold {layers} layers; {model} has "
                            f"{SAILOR_LAYERS[model]} (a plan of another model)"))
            continue
        dp = p["dp"][0]
        assert all(x == dp for x in p["dp"]), path
        n = p["num_stages"]
        stages = []
        for i, (layers, members) in enumerate(zip(p["layers_per_stage"], p["tmp_per_stage"])):
            blocks = len(layers) - (i == 0) - (i == n - 1)
            assert len(members) == dp, path
            chips = [m[0][0][0] for m in members]
            tps = [m[1] for m in members]
            stage = {"layers": blocks}
            stage["chip"] = chips[0] if len(set(chips)) == 1 else chips
            stage["tp"] = tps[0] if len(set(tps)) == 1 else tps
            stages.append(stage)
        mbs, gbs = d["mbs"], d["gbs"]
        assert gbs % (mbs * dp) == 0, path
        yield {
            "name": "/".join(parts[4:]).removesuffix(".json"),
            "source": f"eth-easl/sailor@{commit}:{path}",
            "cluster": cluster,
            "model": model,
            "plan": {"groups": [{
                "copies": dp,
                "micro_batch_size": mbs,
                "micro_batches": gbs // (mbs * dp),
                "stages": stages,
            }]},
            "measured_step_s": d["real"],
            "measured_peak_bytes": d.get("max_mem"),
        }


# polychip's model files for Sailor's model names.
PROFILE_MODELS = {"OPT-350": "opt-350m", "GPT-Neo-2.7": "gpt-neo-2.7b"}


def params_per_block(m):
    h, f, kv = m["hidden"], m["ffn"], m["hidden"] * m["kv_heads"] // m["heads"]
    return h * (h + 2 * kv) + h * h + 3 * h * f + 2 * h


def profiles(root, commit, here):
    text = subprocess.run(
        ["git", "-C", root, "show", f"{commit}:sailor/Planner/simulations/profiles_tmp.json"],
        check=True, capture_output=True, text=True,
    ).stdout
    d = json.loads(text)
    for sailor_name, ours in PROFILE_MODELS.items():
        model = toml_model(here / f"{ours}.toml")
        entries = []
        for gpu, by_mbs in sorted(d[sailor_name].items()):
            for mbs, by_tp in sorted(by_mbs.items(), key=lambda x: int(x[0])):
                for tp, layers in sorted(by_tp.items(), key=lambda x: int(x[0])):
                    n = len(layers)
                    rows = [layers[str(i)] for i in range(n)]
                    blocks = sorted(rows[1:-1], key=lambda r: r[0] + r[1])
                    mid = blocks[len(blocks) // 2]
                    entries.append({
                        "chip": gpu,
                        "micro_batch": int(mbs),
                        "tp": int(tp),
                        "embedding": {"forward": rows[0][0], "backward": rows[0][1]},
                        "block": {"forward": mid[0], "backward": mid[1]},
                        "head": {"forward": rows[-1][0], "backward": rows[-1][1]},
                        # Sailor's per-layer update time over the block's
                        # parameters on one of its tp chips.
                        "optimizer_per_param": mid[2] * int(tp) / params_per_block(model),
                    })
        yield ours, {
            "format": "polychip-profile/1",
            "model": model,
            "dtype": "f32",
            "source": f"eth-easl/sailor@{commit}:sailor/Planner/simulations/profiles_tmp.json "
                      f"({sailor_name}; the median block of each entry)",
            "entries": entries,
        }


def main():
    root, commit = checkout_and_commit()
    out = pathlib.Path(__file__).with_name("sailor-runs.json")
    skipped = []
    records = list(runs(root, commit, skipped))
    # Two runs of different plans measured identical to every digit are a
    # copy of one file's figures into another: neither is kept.
    seen = {}
    for r in records:
        seen.setdefault((r["measured_step_s"], r["measured_peak_bytes"]), []).append(r)
    for same in seen.values():
        if len(same) > 1:
            for r in same:
                skipped.append((r["source"].split(":")[1], "its measurements equal those of "
                                + ", ".join(o["name"] for o in same if o is not r)))
                records.remove(r)
    for path, why in skipped:
        print(f"left out {path}: {why}")
    for model, profile in profiles(root, commit, out.parent):
        path = out.with_name(f"sailor-profile-{model}.json")
        path.write_text(json.dumps(profile, indent=1) + "\n")
        print(f"{len(profile['entries'])} profile entries written to {path}")
    out.write_text(json.dumps({
        "left_out": [{"source": p, "why": w} for p, w in skipped],
        "runs": records,
    }, indent=1) + "\n")
    print(f"{len(records)} runs written to {out}")


if __name__ == "__main__":
    main()
