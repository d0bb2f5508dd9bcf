"""Hugging Face LLaMA checkpoints in and out of `polychip train`, checked
against transformers itself: what `--export-hf` and `polychip checkpoint
export-hf` write loads into LlamaForCausalLM with every tensor assigned and
gives the logits `polychip checkpoint logits` prints (computed by the
trainer's own model on a bundled plugin) within 1e-4; a model saved by
transformers (whole or sharded, tied or not) imports with `--init-from`
with the same logits, and trains."""

import json
import os
import subprocess

import pytest
import torch

from conftest import PROFILE_DIR

transformers = pytest.importorskip("transformers")

POLYCHIP = str(PROFILE_DIR / "polychip")
TOKENS = [84, 104, 101, 32, 113, 117, 105, 99, 107, 0, 255, 7]
BOUND = 1e-4
COMMON = ["--global-batch", "4", "--micro-batch-size", "2", "--eval-every", "0",
          "--log-every", "0", "--no-pin"]


def polychip(*args):
    r = subprocess.run([POLYCHIP, *map(str, args)], capture_output=True, text=True,
                       env={**os.environ, "POLYCHIP_TRANSPORT": "shm"}, timeout=120)
    assert r.returncode == 0, f"polychip {args}:\n{r.stdout}\n{r.stderr}"
    return r.stdout


def polychip_logits(path, tokens=TOKENS, device="ferrite:0"):
    out = polychip("checkpoint", "logits", path, "--tokens", ",".join(map(str, tokens)),
                   "--device", device)
    return torch.tensor(json.loads(out), dtype=torch.float32)


def load(path):
    model, info = transformers.LlamaForCausalLM.from_pretrained(
        str(path), output_loading_info=True, dtype=torch.float32)
    assert not info["missing_keys"], info
    assert not info["unexpected_keys"], info
    assert not info["mismatched_keys"], info
    assert not info.get("error_msgs"), info
    return model.eval()


def hf_logits(model, tokens=TOKENS):
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0]


def assert_same_logits(exported, tokens=TOKENS):
    model = load(exported)
    theirs = hf_logits(model, tokens)
    ours = polychip_logits(exported, tokens)
    assert ours.shape == theirs.shape == (len(tokens), model.config.vocab_size)
    worst = (ours - theirs).abs().max().item()
    assert worst < BOUND, worst
    # Not trivially equal: the logits depend on the tokens.
    assert (theirs[0] - theirs[1]).abs().max().item() > 1e-3
    return model


def test_train_export_loads_in_transformers_with_equal_logits(tmp_path):
    out = tmp_path / "hf"
    polychip("train", "--model", "mini", "--steps", "3", "--device", "ferrite:0",
             *COMMON, "--export-hf", out)
    model = assert_same_logits(out)
    cfg = model.config
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads,
            cfg.num_key_value_heads, cfg.intermediate_size, cfg.vocab_size) == (32, 2, 4, 2, 64, 256)
    assert cfg.max_position_embeddings == 16 and not cfg.tie_word_embeddings


def test_step0_and_saved_checkpoint_exports(tmp_path):
    # Step 0: the seeded initial weights.
    polychip("train", "--model", "mini", "--steps", "0", "--device", "ferrite:0", *COMMON,
             "--export-hf", tmp_path / "step0")
    initial = assert_same_logits(tmp_path / "step0")
    # A saved checkpoint of a two-vendor pipeline, exported afterwards.
    ckpt = tmp_path / "ckpt"
    polychip("train", "--model", "mini", "--steps", "2", "--stages",
             "ferrite:0=0..1,cobalt:0=1..2", *COMMON, "--checkpoint-dir", ckpt)
    polychip("checkpoint", "export-hf", ckpt, tmp_path / "exported")
    trained = assert_same_logits(tmp_path / "exported")
    # Training moved the weights.
    diff = (trained.lm_head.weight - initial.lm_head.weight).abs().max().item()
    assert diff > 1e-4


def save_transformers_model(path, seed=0, shard=None, mistral=False, **kw):
    torch.manual_seed(seed)
    base = dict(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                rope_theta=5000.0, rms_norm_eps=1e-5)
    base.update(kw)
    if mistral:
        # No sliding window: LLaMA's computation under Mistral's names.
        model = transformers.MistralForCausalLM(transformers.MistralConfig(**base, sliding_window=None)).eval()
    else:
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**base)).eval()
    with torch.no_grad():
        for p in model.parameters():
            # Larger than the default init, so the logits vary visibly.
            p.normal_(0.0, 0.15)
    extra = {"max_shard_size": shard} if shard else {}
    model.save_pretrained(str(path), **extra)
    return model


@pytest.mark.parametrize("kind", ["single", "sharded", "tied", "mistral"])
def test_transformers_model_imports_with_equal_logits_and_trains(tmp_path, kind):
    src = tmp_path / "src"
    kw = {"sharded": dict(shard="20KB", num_key_value_heads=1),
          "tied": dict(tie_word_embeddings=True, vocab_size=300, num_hidden_layers=1),
          "mistral": dict(mistral=True)}.get(kind, {})
    model = save_transformers_model(src, **kw)
    if kind == "sharded":
        assert (src / "model.safetensors.index.json").exists()
    ours = polychip_logits(src)
    theirs = hf_logits(model)
    assert (ours - theirs).abs().max().item() < BOUND
    # Training from it runs, on a pipeline across both vendors unless there is one block.
    layout = ["--device", "ferrite:0"] if kind == "tied" else \
        ["--stages", "cobalt:0=0..1,ferrite:0=1..2"]
    out = polychip("train", "--init-from", src, "--seq-len", "16", "--steps", "3", *layout,
                   *COMMON, "--export-hf", tmp_path / "after")
    assert "step 3" in out, out
    after = load(tmp_path / "after")
    assert after.config.vocab_size == model.config.vocab_size
    # Started from the imported weights: one step of AdamW at lr <= 3e-3
    # moves each weight by at most about lr per step.
    moved = (after.model.embed_tokens.weight - model.model.embed_tokens.weight).abs().max().item()
    assert 0 < moved < 0.05, moved
