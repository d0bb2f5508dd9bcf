#!/usr/bin/env python3
"""Converts the end-to-end iteration times NVIDIA measured with Megatron-LM on
Selene (Korthikanti et al., "Reducing Activation Recomputation in Large
Transformer Models", MLSys 2023, arXiv:2205.05198) into polychip's plan
format, one record per run, written to megatron-selene-runs.json beside this
script.

The runs: four GPT models (22B, 175B, 530B, 1T) with tp 8 inside DGX A100
80GB nodes, pipelines of 1 to 64 stages (the 175B and 530B under the
interleaved schedule with three model chunks per device), no data
parallelism, each trained two ways: full activation recomputation without
sequence parallelism, and the paper's selective recomputation (the attention
core only) with sequence parallelism. Eight runs, the paper's Table 5. A
ninth, the 530B scaled to eight data-parallel replicas (2,240 GPUs, "the
time per iteration increases slightly from 37.83 seconds to 39.15 seconds",
section 6.3), is taken from the paper's text.

Where the facts come from:
- Calculon (github.com/calculon-ai/calculon), a performance model whose
  validation replays these runs: `calculon/llm/validation.py` (function
  `seqsel_tab5`, its `kProfile` table: the measured seconds of Table 5),
  `validation/seqsel/tab5/<model>_<mode>.json` (each run's execution: tp,
  pp, dp, global and micro-batch size, recomputation, interleaving,
  sequence parallelism) and `models/<model>.json` (the shapes). The
  converter reads them from a checkout at a commit (argv), or, without
  arguments, from the copies in `source/` it wrote last time.
- The paper itself, for what Calculon does not record: the vocabulary
  (51,200, section 6), the 2,240-GPU run (section 6.3) and Table 4, one
  transformer layer of the 22B model timed forward and backward (tp 8,
  micro-batch 4) under each technique, which is written as two
  polychip-profile/1 files (see PROFILE below).

Usage: convert_megatron_selene.py [CALCULON_CHECKOUT [COMMIT]]
"""
import ast
import json
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
SOURCE = HERE / "source"
CLUSTER = "selene-a100-80g"
CHIP = "A100"
# Section 6: "For all the cases, sequence length is set to s = 2048 and
# vocabulary size is set to v = 51200" (GPT-2's 50,257 padded by Megatron to
# a multiple of 128 x tp = 1,024).
VOCAB = 51200
MODELS = ["megatron-22B", "gpt3-175B", "turing-530B", "megatron-1T"]
MODES = ["full", "seqsel"]
PAPER = "arXiv:2205.05198 (Korthikanti et al., MLSys 2023)"
# Section 6.3: the 530B at 8-way data parallelism, the batch per replica
# kept (global batch 2,240 on 2,240 GPUs), with the present work's
# techniques (selective recomputation and sequence parallelism).
DP8_530B = {"dp": 8, "measured_step_s": 39.15}
# Table 4: one transformer layer of the 22B model (tp 8, micro-batch 4, no
# pipeline), milliseconds forward and backward.
TABLE4 = {
    "baseline no recompute": (7.7, 11.9),
    "sequence parallelism": (7.2, 11.8),
    "baseline with recompute": (7.7, 19.5),
    "selective recompute": (7.7, 13.2),
    "selective + sequence": (7.2, 13.1),
}


def reader(argv):
    """A function reading a Calculon path, and the commit it reads at."""
    if len(argv) > 1:
        root = argv[1]
        commit = subprocess.run(
            ["git", "-C", root, "rev-parse", argv[2] if len(argv) > 2 else "HEAD"],
            check=True, capture_output=True, text=True).stdout.strip()

        def read(path):
            text = subprocess.run(["git", "-C", root, "show", f"{commit}:{path}"],
                                  check=True, capture_output=True, text=True).stdout
            return text
        return read, commit
    commit = json.loads((SOURCE / "commit.json").read_text())["commit"]
    return (lambda path: (SOURCE / path).read_text()), commit


def measured_table(validation_py):
    """The kProfile dict of `seqsel_tab5` in calculon/llm/validation.py: the
    paper's Table 5, seconds per iteration by model and mode."""
    tree = ast.parse(validation_py)
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "seqsel_tab5":
            for stmt in node.body:
                if (isinstance(stmt, ast.Assign)
                        and getattr(stmt.targets[0], "id", None) == "kProfile"):
                    return ast.literal_eval(stmt.value)
    raise SystemExit("seqsel_tab5's kProfile not found")


def model_toml(name, m, params):
    h, heads, layers, seq = m["hidden"], m["attn_heads"], m["num_blocks"], m["seq_size"]
    assert m["feedforward"] == 4 * h and m["attn_size"] * heads == h, name
    ffn = round(8 * h / 3)
    return (
        f"# {name} of Korthikanti et al. 2022 (Megatron-LM on Selene; {params}):\n"
        f"# {layers} layers, hidden {h}, {heads} heads, sequences of {seq}, a vocabulary\n"
        f"# of {VOCAB} (the paper's section 6). Its MLP is GELU 4h wide (two\n"
        f"# matrices); a SwiGLU width of 8h/3 ({ffn}) has about the same parameters and\n"
        f"# FLOPs, which is what the planner models.\n"
        f'name = "{name}"\n'
        f"layers = {layers}\nhidden = {h}\nffn = {ffn}\nheads = {heads}\n"
        f"kv_heads = {heads}\nvocab = {VOCAB}\nseq_len = {seq}\n"
    )


def params_b(m):
    h, layers = m["hidden"], m["num_blocks"]
    return (12 * h * h * layers + VOCAB * h) / 1e9


def plan(exe, layers, dp=None):
    tp, pp, v = exe["tensor_par"], exe["pipeline_par"], exe["pipeline_interleaving"]
    dp = dp or exe["data_par"]
    gbs, mbs = exe["batch_size"] * dp // exe["data_par"], exe["microbatch_size"]
    assert exe["data_par"] == 1 and exe["num_procs"] == tp * pp
    assert layers % (pp * v) == 0 and gbs % (dp * mbs) == 0
    out = {}
    if v > 1:
        out["virtual_stages"] = v
    out["groups"] = [{
        "copies": dp,
        "micro_batch_size": mbs,
        "micro_batches": gbs // (dp * mbs),
        # With interleaving, the p v model chunks in model order, chunk k on
        # device k mod p (Megatron's layout).
        "stages": [{"layers": layers // (pp * v), "chip": CHIP, "tp": tp}] * (pp * v),
    }]
    return out


def settings_of(exe):
    mode = {"full": "full", "attn_only": "selective"}[exe["activation_recompute"]]
    sp = exe["tensor_par_comm_type"] == "rs_ag"
    assert exe["datatype"] == "float16" and not exe["optimizer_sharding"]
    return {"recompute": mode, "sequence_parallel": sp}


def profile(model_name, m, mode):
    """Table 4's 22B layer as a polychip-profile/1 file. polychip's profiled
    backward excludes full recomputation (the planner adds the block's
    forward under --recompute full), so the full-recompute profile takes the
    no-recompute row (11.9 ms; the run's own row, 19.5, is 11.9 + 7.6); the
    planner adds nothing for selective recomputation, so that profile takes
    the selective + sequence row, recomputation included."""
    row = {"full": "baseline no recompute", "seqsel": "selective + sequence"}[mode]
    fwd, bwd = TABLE4[row]
    return {
        "format": "polychip-profile/1",
        "model": {"name": model_name, "layers": m["num_blocks"], "hidden": m["hidden"],
                  "ffn": round(8 * m["hidden"] / 3), "heads": m["attn_heads"],
                  "kv_heads": m["attn_heads"], "vocab": VOCAB, "seq_len": m["seq_size"]},
        "dtype": "f16",
        "source": f"{PAPER}, Table 4, row \"{row}\": one transformer layer of the 22B "
                  f"model, Megatron-LM on Selene's A100 80GB, tp 8, micro-batch 4 "
                  f"(forward {fwd} ms, backward {bwd} ms); embedding, head and "
                  f"optimizer not measured",
        "entries": [{"chip": CHIP, "micro_batch": 4, "tp": 8,
                     "block": {"forward": round(fwd / 1e3, 7),
                               "backward": round(bwd / 1e3, 7)}}],
    }


def main():
    read, commit = reader(sys.argv)
    files = {"calculon/llm/validation.py": read("calculon/llm/validation.py")}
    table = measured_table(files["calculon/llm/validation.py"])
    runs = []
    for name in MODELS:
        mpath = f"models/{name}.json"
        files[mpath] = read(mpath)
        m = json.loads(files[mpath])
        (HERE / f"{name.lower()}.toml").write_text(
            model_toml(name.lower(), m, f"{params_b(m):.1f}B parameters by 12 h^2 L + v h"))
        for mode in MODES:
            path = f"validation/seqsel/tab5/{name}_{mode}.json"
            files[path] = read(path)
            exe = json.loads(files[path])
            s = settings_of(exe)
            assert (mode == "full") == (s["recompute"] == "full" and not s["sequence_parallel"])
            runs.append({
                "name": f"{name}/{mode}",
                "source": f"calculon-ai/calculon@{commit}:{path}; measured: "
                          f"calculon/llm/validation.py seqsel_tab5 kProfile (the "
                          f"paper's Table 5)",
                "cluster": CLUSTER,
                "model": name.lower(),
                "gpus": exe["num_procs"],
                "settings": s,
                "plan": plan(exe, m["num_blocks"]),
                "measured_step_s": table[name][mode],
            })
            if name == "turing-530B" and mode == "seqsel":
                runs.append({
                    "name": f"{name}/{mode}/dp8",
                    "source": f"{PAPER} section 6.3 (the {name}_{mode} run at 8-way data "
                              f"parallelism, batch per replica kept)",
                    "cluster": CLUSTER,
                    "model": name.lower(),
                    "gpus": exe["num_procs"] * DP8_530B["dp"],
                    "settings": s,
                    "plan": plan(exe, m["num_blocks"], dp=DP8_530B["dp"]),
                    "measured_step_s": DP8_530B["measured_step_s"],
                })
    settings = {"dtype": "f16", "flash_attention": False, "schedule": "1f1b",
                "note": "recompute and sequence_parallel are per run"}
    (HERE / "megatron-selene-runs.json").write_text(json.dumps(
        {"settings": settings, "left_out": [], "runs": runs}, indent=1) + "\n")
    m22 = json.loads(files["models/megatron-22B.json"])
    for mode in MODES:
        (HERE / f"megatron-selene-profile-22b-{mode}.json").write_text(
            json.dumps(profile("megatron-22b", m22, mode), indent=1) + "\n")
    # The source files, so that the conversion reruns without a checkout
    # (validation.py is reduced to the measured table).
    if len(sys.argv) > 1:
        files["calculon/llm/validation.py"] = (
            "# calculon/llm/validation.py, function seqsel_tab5, reduced to its\n"
            "# table of measured seconds (the paper's Table 5).\n"
            "def seqsel_tab5():\n    kProfile = " + json.dumps(table, indent=2).replace(
                "\n", "\n    ") + "\n")
        for path, text in files.items():
            (SOURCE / path).parent.mkdir(parents=True, exist_ok=True)
            (SOURCE / path).write_text(text)
        (SOURCE / "commit.json").write_text(json.dumps(
            {"repository": "calculon-ai/calculon", "commit": commit}, indent=1) + "\n")
    print(f"megatron-selene-runs.json: {len(runs)} runs from calculon-ai/calculon@{commit}")


if __name__ == "__main__":
    main()
