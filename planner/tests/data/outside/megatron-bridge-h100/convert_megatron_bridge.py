"""Writes megatron-bridge-h100-runs.json from NVIDIA's Megatron-Bridge
performance tables (github.com/NVIDIA-NeMo/Megatron-Bridge,
docs/performance-summary.md at 00b7660be0254ac6f95f44164ddd0c3e9cc798ed,
"25.11 NeMo Container", and docs/performance-summary-archive.md at
0a25f911b2ed6c6905a539504fdb8e5b40e3438b, "26.02 NeMo Container"): the
dense runs on DGX-H100 (Llama 3 8B and 70B, Llama 3.1 405B) and the
mixtures of experts (Qwen3-30B-A3B at tp 1; Qwen3-235B-A22B and
DeepSeek-V3, whose recipes put 32- and 64-way expert parallelism over tp 2
x dp 16 and 64 at an expert tensor-parallel degree of 1, the recipes'
`expert_tensor_parallel_size=1`; GPT-OSS 120B, 8-way over 16 replicas of
4 stages), all in FP8 with current scaling but GPT-OSS's bf16, one run
for each distinct configuration (the latest release's where a
configuration repeats; DeepSeek-V3's only H100 row is the 25.09
container's dropless run, also in performance-summary-archive.md). Each row gives the GPUs, global
and micro-batch, sequence length, FSDP, TP, PP, CP, VP and the measured
tokens per second per GPU; the step is global batch x sequence / (tokens
per second per GPU x GPUs). The settings are those of Megatron-Bridge's
performance recipes (scripts/performance/configs/llama: bf16 with FP8
matmuls, gradients reduced in bf16 (`grad_reduce_in_fp32 = False` in
set_llama3_common_configs), fused (flash) attention, sequence parallelism
beside tensor parallelism, the distributed optimizer with its
reduce-scatter and gather overlapped, no recomputation but DeepSeek-V3's
of its latent attention's up projections and its dense MLPs
(`recompute_modules`); Megatron FSDP where the row says FSDP (ZeRO-3)). Not priced: their tensor-parallel
communication overlap (userbuffers) on the 70B and 405B runs.

Run: python3 convert_megatron_bridge.py (writes the JSON beside it)."""

import json
from pathlib import Path

SUMMARY = "NVIDIA-NeMo/Megatron-Bridge@00b7660be0254ac6f95f44164ddd0c3e9cc798ed:docs/performance-summary.md"
ARCHIVE = "NVIDIA-NeMo/Megatron-Bridge@0a25f911b2ed6c6905a539504fdb8e5b40e3438b:docs/performance-summary-archive.md"

# (name, model, layers, gpus, gbs, mbs, seq, fsdp, tp, pp, cp, vp, ep, etp, tokens/s/GPU, source);
# etp 0: the tp (Megatron-LM's default).
ROWS = [
    ("llama3-8b/fsdp", "llama3-8b", 32, 8, 128, 1, 8192, True, 1, 1, 1, 1, 1, 0, 14451,
     SUMMARY + " 25.11, DGX-H100, LLAMA3_8B"),
    ("llama3-70b/gbs128", "llama3-70b", 80, 64, 128, 1, 8192, False, 4, 8, 1, 5, 1, 0, 1602,
     SUMMARY + " 25.11, DGX-H100, LLAMA3_70B"),
    ("llama3-70b/gbs256", "llama3-70b", 80, 64, 256, 1, 8192, False, 4, 8, 1, 5, 1, 0, 1621,
     ARCHIVE + " 26.02, LLAMA3_70B, DGX-H100"),
    ("llama31-405b/gbs512", "llama31-405b", 126, 1024, 512, 1, 8192, False, 8, 8, 2, 8, 1, 0, 292,
     SUMMARY + " 25.11, DGX-H100, LLAMA3.1_405B"),
    ("llama31-405b/gbs1536", "llama31-405b", 126, 1024, 1536, 1, 8192, False, 8, 8, 2, 8, 1, 0, 311,
     ARCHIVE + " 26.02, LLAMA3.1_405B, DGX-H100"),
    ("qwen3-30b-a3b/gbs512", "qwen3-30b-a3b", 48, 16, 512, 2, 4096, False, 1, 2, 1, 24, 8, 1, 5275,
     SUMMARY + " 25.11, DGX-H100, Qwen3_30B_a3B"),
    ("qwen3-30b-a3b/gbs1024", "qwen3-30b-a3b", 48, 16, 1024, 1, 4096, False, 1, 2, 1, 12, 8, 1, 5113,
     ARCHIVE + " 26.02, Qwen3_30B_a3B, DGX-H100"),
    ("qwen3-235b-a22b/gbs2048", "qwen3-235b-a22b", 94, 256, 2048, 1, 4096, False, 2, 8, 1, 4,
     32, 1, 1575, ARCHIVE + " 25.11, DGX-H100, Qwen3_235B_a22B"),
    ("qwen3-235b-a22b/gbs8192", "qwen3-235b-a22b", 94, 256, 8192, 1, 4096, False, 2, 8, 1, 4,
     32, 1, 1633, ARCHIVE + " 26.02, Qwen3_235B_a22B, DGX-H100"),
    ("deepseek-v3/gbs8192", "deepseek-v3", 61, 1024, 8192, 1, 4096, False, 2, 8, 1, 4, 64, 1,
     1297, ARCHIVE + " 25.09, DGX-H100, DeepSeekV3 (dropless)"),
    ("gpt-oss-120b/gbs1280", "gpt-oss-120b", 36, 64, 1280, 1, 4096, False, 1, 4, 1, 1, 8, 1,
     5993, ARCHIVE + " 26.02, GPT OSS 120B, DGX-H100"),
]

# Runs in bf16 (the others in FP8 with current scaling): GPT-OSS 120B's
# H100 recipe (scripts/performance/configs/gpt_oss/
# gpt_oss_workload_base_configs.py, GPT_OSS_120B_PRETRAIN_CONFIG_H100_BF16_V2:
# 64 GPUs, pp 4, ep 8 at expert tp 1, micro-batch 1, global batch 1,280).
BF16 = {"gpt-oss-120b/gbs1280"}

# Layouts the recipes give where they are not the even split:
# DeepSeek-V3's H100 recipe (scripts/performance/configs/deepseek/
# deepseek_workload_base_configs.py, `pp_layout="Et|(tt|)*30mL"`): the
# embedding and one layer, 30 chunks of two, and a last chunk of its
# multi-token-prediction layer and the loss (the MTP layer priced from
# deepseek-v3.toml's `mtp_layers = 1` on the last stage).
LAYOUTS = {"deepseek-v3/gbs8192": [1] + [2] * 30 + [0]}

# Selective recomputation the recipes ask for by module (Megatron-LM's
# `recompute_modules`), the same file: DeepSeek-V3's latent attention's up
# projections and its dense MLPs.
RECOMPUTE = {"deepseek-v3/gbs8192": ["mla_up_proj", "mlp"],
             # GPT-OSS 120B's H100 recipe: its norms and the experts'
             # activation.
             "gpt-oss-120b/gbs1280": ["layernorm", "moe_act"]}


def chunks(layers, n):
    """Layers of each of `n` model chunks: even where they divide; else
    the first and last chunk one layer less than the others (Megatron's
    account_for_embedding/loss_in_pipeline_split: the embedding and the
    loss each counted as a layer), 126 over 64 as 1 + 62 x 2 + 1."""
    if layers % n == 0:
        return [layers // n] * n
    per = (layers + 2) // n
    assert per * n == layers + 2, (layers, n)
    return [per - 1] + [per] * (n - 2) + [per - 1]


runs = []
for name, model, layers, gpus, gbs, mbs, seq, fsdp, tp, pp, cp, vp, ep, etp, tps, source in ROWS:
    dp = gpus // (tp * pp * cp)
    assert dp * tp * pp * cp == gpus and gbs % (mbs * dp) == 0, name
    m = gbs // (mbs * dp)
    plan = {"groups": [{"copies": dp, "micro_batch_size": mbs, "micro_batches": m,
                        "stages": [{"layers": n, "chip": "H100", "tp": tp}
                                   for n in LAYOUTS.get(name) or chunks(layers, pp * vp)]}]}
    assert sum(s["layers"] for s in plan["groups"][0]["stages"]) == layers, name
    if vp > 1:
        plan["virtual_stages"] = vp
    runs.append({
        "name": name,
        "source": source,
        "model": model,
        "gpus": gpus,
        "settings": {"fp8": name not in BF16, "zero_stage": 3 if fsdp else 1,
                     "context_parallel": cp,
                     "expert_parallel": ep, "expert_tensor_parallel": etp,
                     "recompute_modules": RECOMPUTE.get(name, [])},
        "plan": plan,
        "tokens_per_s_per_gpu": tps,
        "measured_step_s": round(gbs * seq / (tps * gpus), 4),
    })

out = {
    "settings": {"dtype": "bf16", "bf16_gradients": True, "flash_attention": True,
                 "sequence_parallel": True, "overlap_grad_reduce": True,
                 "overlap_param_gather": "with the distributed optimizer (zero_stage 1)",
                 "loss": "fused",
                 "note": "fp8 (FP8 matmuls with current scaling), zero_stage, "
                         "context_parallel, expert_parallel, expert_tensor_parallel (0: the "
                         "tp) and recompute_modules (selective recomputation of them; none "
                         "where empty) are per run"},
    "runs": runs,
}
Path(__file__).with_name("megatron-bridge-h100-runs.json").write_text(json.dumps(out, indent=1) + "\n")
