"""Hugging Face's LlamaForCausalLM trains on `polychip:N` with
torch.optim.AdamW, on each bundled vendor's device, and its loss curve
matches the same model on PyTorch's CPU: within 2e-5 (relative) per step in
f32, within 2e-2 in bf16. Every forward, backward and optimizer operator
runs on the plugin (since ABI 1.3 the rotary tables and the position
arithmetic too), which the fallback report shows."""

import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

import polychip.torch as pt
from conftest import PROFILE_DIR

transformers = pytest.importorskip("transformers")

import tiny_models  # noqa: E402 - needs transformers
from tiny_models import llama_config as config  # noqa: E402

# What a LLaMA step still runs on the CPU: nothing since ABI 1.3, whose
# `sin`, `cos`, `arange`, integer `add` and `convert` took the rotary
# tables, the positions and their conversion to float.
KNOWN_FALLBACKS: set = set()


def index_of(vendor):
    return next(i for i in range(pt.device_count()) if pt.device_info(i)["vendor"] == vendor)


def train(model, device, steps, fused, seed=1, batch=2, seq=16):
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1, fused=fused)
    # One batch, seen every step: the model memorizes it, so the loss falls.
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (batch, seq), generator=g).to(device)
    losses = []
    for _ in range(steps):
        loss = model(ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def pair(dtype, **kw):
    torch.manual_seed(0)
    cpu = transformers.LlamaForCausalLM(config(**kw)).to(dtype)
    dev = transformers.LlamaForCausalLM(config(**kw)).to(dtype)
    dev.load_state_dict(cpu.state_dict())
    return cpu, dev


@pytest.mark.parametrize("vendor", ["Ferrite", "Cobalt"])
@pytest.mark.parametrize("fused", [True, None], ids=["fused", "foreach"])
def test_llama_trains_like_cpu_in_f32(vendor, fused):
    device = torch.device("polychip", index_of(vendor))
    cpu, dev = pair(torch.float32)
    want = train(cpu, "cpu", 6, fused)
    pt.reset_fallback_report()
    got = train(dev.to(device), device, 6, fused)
    report = pt.fallback_report()
    for a, b in zip(got, want):
        assert abs(a - b) <= 2e-5 * abs(b), (got, want)
    assert want[-1] < want[0]  # it learns
    assert set(report) <= KNOWN_FALLBACKS, str(report)
    # The parameters themselves end up equal too.
    for (name, p), q in zip(cpu.named_parameters(), dev.parameters()):
        torch.testing.assert_close(q.detach().cpu(), p.detach(), rtol=1e-4, atol=1e-5, msg=name)


def test_llama_trains_like_cpu_in_bf16():
    device = torch.device("polychip", index_of("Ferrite"))
    cpu, dev = pair(torch.bfloat16)
    want = train(cpu, "cpu", 6, None)
    got = train(dev.to(device), device, 6, None)
    for a, b in zip(got, want):
        assert abs(a - b) <= 2e-2 * abs(b), (got, want)


def test_llama_forward_with_padding_uses_the_math_attention_on_the_plugin():
    device = torch.device("polychip", index_of("Ferrite"))
    cpu, dev = pair(torch.float32)
    dev.to(device)
    ids = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(3))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, :4] = 0  # left padding: a real mask, not is_causal
    want = cpu(ids, attention_mask=mask).logits
    got = dev(ids.to(device), attention_mask=mask.to(device)).logits
    torch.testing.assert_close(got.cpu()[mask.bool()], want[mask.bool()], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("vendor", ["Ferrite", "Cobalt"])
def test_from_pretrained_with_a_polychip_device_map(tmp_path, vendor):
    """`from_pretrained(path, device_map="polychip:N")` loads the checkpoint
    onto the device. transformers 5 then kernelizes the model for its
    device type through the `kernels` library (one of its dependencies),
    which refused any type it does not know: every polychip device map
    failed with `ValueError: Unsupported device type 'polychip'`. polychip
    is now a type it knows no kernel for, so each layer keeps its PyTorch
    forward, and the loaded model trains like the CPU's."""
    device = torch.device("polychip", index_of(vendor))
    cpu, _ = pair(torch.float32)
    cpu.save_pretrained(tmp_path)
    ids = torch.randint(0, 96, (2, 8), generator=torch.Generator().manual_seed(4))
    want = cpu(ids, labels=ids).loss
    for device_map in (str(device), {"": str(device)}):
        dev = transformers.LlamaForCausalLM.from_pretrained(tmp_path, device_map=device_map)
        for (name, p), q in zip(cpu.named_parameters(), dev.parameters()):
            assert q.device == device and torch.equal(q.detach().cpu(), p.detach()), name
        got = dev(ids.to(device), labels=ids.to(device)).loss
        got.backward()
        assert abs(got.item() - want.item()) <= 2e-5 * abs(want.item())
    kernels = pytest.importorskip("kernels")
    kernels.kernelize(dev, device="polychip", mode=kernels.Mode.TRAINING)  # what from_pretrained asks
    with pytest.raises(ValueError, match="Unsupported device type"):
        kernels.kernelize(dev, device="no-such-device", mode=kernels.Mode.TRAINING)  # others: as before


FAMILIES = [
    "gpt2", "bert", "mistral", "qwen2", "opt", "gpt_neox", "falcon", "bloom", "phi", "gemma", "gptj", "t5", "bart",
    "mixtral", "phimoe", "gemma2", "deepseek_v3", "gpt_bigcode", "cohere", "deberta_v2", "longformer", "xlnet",
    "roberta", "gpt_neo", "qwen2_moe", "jamba", "recurrent_gemma", "switch_transformers", "led", "funnel",
    "rwkv", "fnet", "prophetnet", "gpt_oss", "qwen3_next",
]


@pytest.mark.parametrize("family", FAMILIES)
def test_other_architectures_match_cpu(family):
    """Models not built around the LLaMA kernels: GPT-2 (Conv1D addmm, the
    tanh GELU, layer norm, tied embeddings), BERT (a padding mask, tied
    decoder weight and bias), Mistral (sliding-window masks), Qwen2 (biased
    projections), OPT (learned positions from a cumsum), GPT-NeoX and Phi
    (partial rotary), Falcon (ALiBi), BLOOM (ALiBi, an embedding layer
    norm), Gemma (a scaled embedding, one key/value head), GPT-J (parallel
    attention and MLP), T5 (relative position buckets, an encoder and a
    decoder), BART and Mixtral (mixture-of-experts routing as
    transformers runs it on an accelerator, with its load-balancing loss:
    integer histograms), PhiMoE (sparsemixer routing: a Python number as
    the first operand of add). Gradients equal the CPU's, tied parameters included
    (Module.to keeps the Parameter objects). Gemma 2 (logit soft-capping,
    sliding and global layers alternating, eager attention), DeepSeek-V3
    (low-rank latent attention, a sigmoid router choosing experts within
    the best groups, shared experts), GPT-BigCode (multi-query attention),
    Cohere (parallel attention and MLP, interleaved rotary), DeBERTa-v2
    (disentangled relative attention: gathers by clamped log buckets),
    Longformer (banded attention over overlapping chunks: as_strided views,
    padding, diagonal shifts; global attention on chosen tokens) and XLNet (relative attention with its shift,
    einsum, two streams under a permutation mask, segments). From a sweep
    of 86 further architectures (all matching), those with mechanisms the
    others lack: RoBERTa's positions past the padding, GPT-Neo's local
    layers, Qwen2-MoE's grouped expert matmul (`mm` into rows of one
    buffer, which fell back), Jamba, RecurrentGemma's RG-LRU scan, Switch
    Transformers' expert capacity, LED, Funnel's pooling, RWKV's WKV
    recurrence, FNet's Fourier mixing, ProphetNet's n-gram streams, GPT-OSS's
    attention sinks and Qwen3-Next's gated delta rule."""
    make = {
        "gpt2": tiny_models.gpt2,
        "bert": lambda: transformers.BertForMaskedLM(transformers.BertConfig(
            vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)),
        "mistral": lambda: transformers.MistralForCausalLM(transformers.MistralConfig(
            vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, sliding_window=8)),
        "qwen2": lambda: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
            vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2)),
        "opt": lambda: transformers.OPTForCausalLM(transformers.OPTConfig(
            vocab_size=96, hidden_size=32, num_hidden_layers=2, ffn_dim=64, num_attention_heads=4,
            max_position_embeddings=64, word_embed_proj_dim=32, dropout=0.0)),
        "gpt_neox": lambda: transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(
            vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=64, rotary_pct=0.25, max_position_embeddings=64)),
        "falcon": lambda: transformers.FalconForCausalLM(transformers.FalconConfig(
            vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, alibi=True)),
        "bloom": lambda: transformers.BloomForCausalLM(transformers.BloomConfig(
            vocab_size=96, hidden_size=32, n_layer=2, n_head=4)),
        "phi": lambda: transformers.PhiForCausalLM(transformers.PhiConfig(
            vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, partial_rotary_factor=0.5)),
        "gemma": lambda: transformers.GemmaForCausalLM(transformers.GemmaConfig(
            vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=1, head_dim=8)),
        "gptj": lambda: transformers.GPTJForCausalLM(transformers.GPTJConfig(
            vocab_size=96, n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_positions=64)),
        "t5": lambda: transformers.T5ForConditionalGeneration(transformers.T5Config(
            vocab_size=96, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, dropout_rate=0.0,
            decoder_start_token_id=0, pad_token_id=0)),
        "bart": lambda: transformers.BartForConditionalGeneration(transformers.BartConfig(
            vocab_size=96, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
            max_position_embeddings=64, dropout=0.0)),
        "mixtral": lambda: transformers.MixtralForCausalLM(transformers.MixtralConfig(
            vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
            output_router_logits=True, router_aux_loss_coef=0.1)),
        # PhiMoE's sparsemixer routing calls torch.add(0.3333, mask,
        # alpha=0.6667): a number as `self`, which crashed the add kernel.
        "phimoe": lambda: transformers.PhimoeForCausalLM(transformers.PhimoeConfig(
            vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2)),
        "gemma2": lambda: transformers.Gemma2ForCausalLM(transformers.Gemma2Config(
            vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, sliding_window=8, attn_implementation="eager")),
        "deepseek_v3": lambda: transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config(
            vocab_size=96, hidden_size=32, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=4, n_routed_experts=4, n_shared_experts=1,
            num_experts_per_tok=2, n_group=2, topk_group=1, first_k_dense_replace=1, kv_lora_rank=16,
            q_lora_rank=16, qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=8)),
        "gpt_bigcode": lambda: transformers.GPTBigCodeForCausalLM(transformers.GPTBigCodeConfig(
            vocab_size=96, n_embd=32, n_layer=2, n_head=4, n_positions=64, multi_query=True,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)),
        "cohere": lambda: transformers.CohereForCausalLM(transformers.CohereConfig(
            vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2)),
        "deberta_v2": lambda: transformers.DebertaV2ForMaskedLM(transformers.DebertaV2Config(
            vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=64, relative_attention=True, position_buckets=8,
            pos_att_type=["p2c", "c2p"], hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)),
        "longformer": lambda: transformers.LongformerForMaskedLM(transformers.LongformerConfig(
            vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=64, attention_window=4, pad_token_id=1, hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0)),
        "xlnet": lambda: transformers.XLNetLMHeadModel(transformers.XLNetConfig(
            vocab_size=96, d_model=32, n_layer=2, n_head=4, d_inner=64, dropout=0.0)),
        # RoBERTa: positions counted past the padding (a cumsum of a mask).
        "roberta": lambda: transformers.RobertaForMaskedLM(transformers.RobertaConfig(
            vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=64, pad_token_id=1, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)),
        # GPT-Neo: local (windowed) and global layers alternating.
        "gpt_neo": lambda: transformers.GPTNeoForCausalLM(transformers.GPTNeoConfig(
            vocab_size=96, hidden_size=32, num_layers=2, num_heads=4, attention_types=[[["global", "local"], 1]],
            window_size=8, max_position_embeddings=64, embed_dropout=0.0, attention_dropout=0.0,
            resid_dropout=0.0)),
        # Qwen2-MoE: the grouped expert matmul writes each expert's rows
        # into one buffer (`torch.mm(..., out=rows)`), and a shared expert.
        "qwen2_moe": lambda: transformers.Qwen2MoeForCausalLM(transformers.Qwen2MoeConfig(
            vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
            shared_expert_intermediate_size=32, output_router_logits=True)),
        # Jamba: Mamba layers (PyTorch's reference scan) and attention,
        # mixture-of-experts every other layer.
        "jamba": lambda: transformers.JambaForCausalLM(transformers.JambaConfig(
            vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, num_experts=2, num_experts_per_tok=1, expert_layer_period=2,
            expert_layer_offset=1, attn_layer_period=2, attn_layer_offset=1, mamba_d_state=4, mamba_d_conv=4,
            mamba_expand=2)),
        # RecurrentGemma: the RG-LRU recurrence (softplus, a gated scan) and
        # a causal 1-D convolution, with local attention.
        "recurrent_gemma": lambda: transformers.RecurrentGemmaForCausalLM(transformers.RecurrentGemmaConfig(
            vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=1, lru_width=32, attention_window_size=8, conv1d_width=4,
            block_types=("recurrent", "attention"), head_dim=8)),
        # Switch Transformers: top-1 routing with an expert capacity
        # (cumsum of one-hot masks, tokens dropped past it).
        "switch_transformers": lambda: transformers.SwitchTransformersForConditionalGeneration(
            transformers.SwitchTransformersConfig(
                vocab_size=96, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
                num_experts=4, expert_capacity=8, encoder_sparse_step=2, decoder_sparse_step=2,
                router_jitter_noise=0.0, dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0)),
        # LED: Longformer's banded attention in an encoder-decoder.
        "led": lambda: transformers.LEDForConditionalGeneration(transformers.LEDConfig(
            vocab_size=96, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_encoder_position_embeddings=64,
            max_decoder_position_embeddings=64, attention_window=4, dropout=0.0, attention_dropout=0.0,
            activation_dropout=0.0, pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2)),
        # Funnel: the sequence pooled between blocks (avg_pool2d) and
        # upsampled back by repeat_interleave.
        "funnel": lambda: transformers.FunnelForMaskedLM(transformers.FunnelConfig(
            vocab_size=96, block_sizes=[1, 1], d_model=32, n_head=4, d_head=8, d_inner=64, num_decoder_layers=1,
            hidden_dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)),
        # RWKV: its WKV recurrence in PyTorch operators (exp, maximum, a
        # loop over time).
        "rwkv": lambda: transformers.RwkvForCausalLM(transformers.RwkvConfig(
            vocab_size=96, hidden_size=32, num_hidden_layers=2, attention_hidden_size=32, intermediate_size=64,
            context_length=64)),
        # FNet: Fourier mixing (a 2-D FFT, complex tensors on the fallback).
        "fnet": lambda: transformers.FNetForMaskedLM(transformers.FNetConfig(
            vocab_size=96, hidden_size=32, num_hidden_layers=2, intermediate_size=64, max_position_embeddings=64,
            use_tpu_fourier_optimizations=False, hidden_dropout_prob=0.0)),
        # ProphetNet: n-gram streams with relative position buckets.
        "prophetnet": lambda: transformers.ProphetNetForConditionalGeneration(transformers.ProphetNetConfig(
            vocab_size=96, hidden_size=32, encoder_ffn_dim=64, decoder_ffn_dim=64, num_encoder_layers=1,
            num_decoder_layers=1, num_encoder_attention_heads=4, num_decoder_attention_heads=4, ngram=2,
            num_buckets=8, relative_max_distance=16, max_position_embeddings=64, dropout=0.0,
            attention_dropout=0.0, activation_dropout=0.0, pad_token_id=0, decoder_start_token_id=1)),
        # GPT-OSS: attention sinks (a learned logit per head in the
        # softmax), sliding and full layers, clamped SwiGLU experts.
        "gpt_oss": lambda: transformers.GptOssForCausalLM(transformers.GptOssConfig(
            vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, max_position_embeddings=64, num_local_experts=4,
            num_experts_per_tok=2, sliding_window=8, layer_types=["sliding_attention", "full_attention"],
            output_router_logits=True)),
        # Qwen3-Next: the gated delta rule's chunked scan (triangular
        # solves, cumsum, a causal 1-D convolution) beside full attention.
        "qwen3_next": lambda: transformers.Qwen3NextForCausalLM(transformers.Qwen3NextConfig(
            vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
            layer_types=["linear_attention", "full_attention"], linear_num_value_heads=4, linear_num_key_heads=2,
            linear_key_head_dim=8, linear_value_head_dim=8, linear_conv_kernel_dim=4, num_experts=4,
            num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32,
            decoder_sparse_step=1)),
    }[family]
    device = torch.device("polychip", index_of("Ferrite"))
    torch.manual_seed(0)
    cpu = make()
    dev = make()
    dev.load_state_dict(cpu.state_dict())
    dev.to(device)
    # Ties survive the move: one Parameter object, on the device.
    def embeddings_tied(m):
        return m.get_output_embeddings().weight is m.get_input_embeddings().weight

    assert embeddings_tied(dev) == embeddings_tied(cpu)
    if family in ("gpt2", "bert", "mistral", "qwen2"):
        assert embeddings_tied(dev) == (family in ("gpt2", "bert"))
    ids = torch.randint(0, 96, (2, 16), generator=torch.Generator().manual_seed(2))
    inputs = {"input_ids": ids, "labels": ids}
    if family in ("bert", "deberta_v2", "longformer", "roberta", "funnel"):
        mask = torch.ones_like(ids)
        mask[0, :3] = 0
        inputs["attention_mask"] = mask
    if family == "longformer":
        # Global attention on one token of each sequence: the global
        # projections (gathered by nonzero indices) train too.
        inputs["global_attention_mask"] = torch.zeros_like(ids)
        inputs["global_attention_mask"][:, 3] = 1
    if family == "xlnet":
        # Permutation language modelling (its two attention streams): the
        # last two tokens, hidden from every position, are predicted.
        inputs["perm_mask"] = torch.zeros(2, 16, 16)
        inputs["perm_mask"][:, :, -2:] = 1.0
        inputs["target_mapping"] = torch.zeros(2, 2, 16)
        inputs["target_mapping"][:, 0, -2] = inputs["target_mapping"][:, 1, -1] = 1.0
        inputs["labels"] = ids[:, -2:].contiguous()
        inputs["token_type_ids"] = (torch.arange(16) >= 8).long().expand(2, 16)  # two segments
    want = cpu(**inputs).loss
    got = dev(**{k: v.to(device) for k, v in inputs.items()}).loss
    want.backward()
    got.backward()
    assert abs(got.item() - want.item()) <= 2e-5 * abs(want.item())
    # Rounding is relative to the model's largest gradient (RWKV's
    # embedding, under a layer norm of tiny inputs, has gradients in the
    # hundreds).
    scale = max(1.0, max(p.grad.abs().max().item() for p in cpu.parameters() if p.grad is not None))
    for (name, p), q in zip(cpu.named_parameters(), dev.parameters()):
        if p.grad is None and family in ("led", "fnet"):
            # Not used by this batch: LED's global attention (no token is
            # global), FNet's pooler.
            assert q.grad is None, name
            continue
        assert q.grad is not None, name
        torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=1e-4, atol=1e-5 * scale, msg=name)


class _Recurrent(torch.nn.Module):
    def __init__(self, cell):
        super().__init__()
        self.embed = torch.nn.Embedding(96, 16)
        self.rnn = cell(16, 16, num_layers=2, batch_first=True)
        self.out = torch.nn.Linear(16, 96)

    def forward(self, ids, labels):
        logits = self.out(self.rnn(self.embed(ids))[0])
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())


class _Convolutional(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
            torch.nn.MaxPool2d(2), torch.nn.Conv2d(8, 8, 3, stride=2, groups=2),
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 5),
        )

    def forward(self, pixels, labels):
        return torch.nn.functional.cross_entropy(self.body(pixels), labels)


@pytest.mark.parametrize("family", [
    "vit", "whisper", "mamba", "cnn", "lstm", "gru", "convnext", "swin", "segformer", "wav2vec2", "mamba2", "clip",
    "speech_to_text", "vit_mae",
])
def test_convolutional_and_recurrent_models_match_cpu(family):
    """Models with convolutions (ViT's patch embedding, Whisper's audio
    front end, Mamba's causal depthwise convolution, a CNN with batch norm
    and pooling, ConvNeXt's depthwise 7x7 convolutions and channels-last
    layer norm, SegFormer's overlapping patches, reduced keys and
    bilinear upsampling, Wav2Vec2's group-normed feature encoder, its
    weight-normed positional convolution and CTC loss), windowed attention
    (Swin: shifted windows by roll, a relative position bias gathered from
    a table), Mamba2's chunked state-space scan (cumsum, segment sums),
    CLIP's two towers and contrastive loss, Speech2Text's strided
    convolutions with GLU, ViT-MAE's random masking (argsort, gather), and
    recurrent layers (LSTM, GRU: PyTorch's fused cells).
    The convolutions and the cells run on the plugin (none of them falls
    back), and the loss and every gradient equal the CPU's."""
    make, inputs = {
        "vit": (lambda: transformers.ViTForImageClassification(transformers.ViTConfig(
            hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            image_size=16, patch_size=4, num_labels=5)),
            lambda g: {"pixel_values": torch.randn(2, 3, 16, 16, generator=g), "labels": torch.tensor([0, 3])}),
        "whisper": (lambda: transformers.WhisperForConditionalGeneration(transformers.WhisperConfig(
            vocab_size=96, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=8,
            max_source_positions=16, max_target_positions=32, pad_token_id=0, bos_token_id=1,
            eos_token_id=2, decoder_start_token_id=1)),
            lambda g: {"input_features": torch.randn(2, 8, 32, generator=g),
                       "labels": torch.randint(3, 96, (2, 8), generator=g)}),
        "mamba": (lambda: transformers.MambaForCausalLM(transformers.MambaConfig(
            vocab_size=96, hidden_size=32, num_hidden_layers=2, state_size=4, use_mambapy=True)),
            lambda g: (lambda ids: {"input_ids": ids, "labels": ids})(torch.randint(3, 96, (2, 12), generator=g))),
        "cnn": (_Convolutional,
                lambda g: {"pixels": torch.randn(4, 3, 16, 16, generator=g), "labels": torch.tensor([0, 1, 4, 2])}),
        "lstm": (lambda: _Recurrent(torch.nn.LSTM),
                 lambda g: (lambda ids: {"ids": ids, "labels": ids})(torch.randint(0, 96, (2, 10), generator=g))),
        "gru": (lambda: _Recurrent(torch.nn.GRU),
                lambda g: (lambda ids: {"ids": ids, "labels": ids})(torch.randint(0, 96, (2, 10), generator=g))),
        "convnext": (lambda: transformers.ConvNextForImageClassification(transformers.ConvNextConfig(
            hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, num_labels=5, image_size=32)),
            lambda g: {"pixel_values": torch.randn(2, 3, 32, 32, generator=g), "labels": torch.tensor([0, 3])}),
        "swin": (lambda: transformers.SwinForImageClassification(transformers.SwinConfig(
            image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4,
            num_labels=5, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, drop_path_rate=0.0)),
            lambda g: {"pixel_values": torch.randn(2, 3, 32, 32, generator=g), "labels": torch.tensor([0, 3])}),
        "segformer": (lambda: transformers.SegformerForSemanticSegmentation(transformers.SegformerConfig(
            num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[8, 16], patch_sizes=[7, 3],
            strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2], decoder_hidden_size=16, num_labels=4,
            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, classifier_dropout_prob=0.0,
            drop_path_rate=0.0)),
            lambda g: {"pixel_values": torch.randn(2, 3, 32, 32, generator=g),
                       "labels": torch.randint(0, 4, (2, 32, 32), generator=g)}),
        "wav2vec2": (lambda: transformers.Wav2Vec2ForCTC(transformers.Wav2Vec2Config(
            vocab_size=12, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
            conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=8,
            num_conv_pos_embedding_groups=4, hidden_dropout=0.0, activation_dropout=0.0, attention_dropout=0.0,
            feat_proj_dropout=0.0, final_dropout=0.0, layerdrop=0.0, mask_time_prob=0.0, pad_token_id=0,
            ctc_loss_reduction="mean")),
            lambda g: {"input_values": torch.randn(2, 400, generator=g),
                       "labels": torch.randint(1, 12, (2, 5), generator=g)}),
        "mamba2": (lambda: transformers.Mamba2ForCausalLM(transformers.Mamba2Config(
            vocab_size=96, hidden_size=32, num_hidden_layers=1, state_size=8, num_heads=8, head_dim=8,
            n_groups=1, chunk_size=4, expand=2)),
            lambda g: (lambda ids: {"input_ids": ids, "labels": ids})(torch.randint(3, 96, (2, 12), generator=g))),
        "clip": (lambda: transformers.CLIPModel(transformers.CLIPConfig(
            text_config=dict(vocab_size=96, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                             intermediate_size=64, max_position_embeddings=32),
            vision_config=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
                               image_size=16, patch_size=4),
            projection_dim=16)),
            lambda g: {"input_ids": torch.randint(3, 96, (2, 8), generator=g),
                       "pixel_values": torch.randn(2, 3, 16, 16, generator=g), "return_loss": True}),
        # Speech2Text: strided 1-D convolutions with GLU, sinusoidal positions.
        "speech_to_text": (lambda: transformers.Speech2TextForConditionalGeneration(transformers.Speech2TextConfig(
            vocab_size=96, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, input_feat_per_channel=8,
            input_channels=1, conv_channels=16, conv_kernel_sizes=(5, 5), num_conv_layers=2, max_source_positions=64,
            max_target_positions=64, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, pad_token_id=1,
            bos_token_id=0, eos_token_id=2, decoder_start_token_id=2)),
            lambda g: {"input_features": torch.randn(2, 24, 8, generator=g),
                       "labels": torch.randint(3, 96, (2, 6), generator=g)}),
        # ViT-MAE: random masking (argsort of the given noise, gathers) and
        # a decoder restoring the order; the loss on masked patches only.
        "vit_mae": (lambda: transformers.ViTMAEForPreTraining(transformers.ViTMAEConfig(
            hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64, image_size=16,
            patch_size=4, decoder_hidden_size=16, decoder_num_hidden_layers=1, decoder_num_attention_heads=2,
            decoder_intermediate_size=32, mask_ratio=0.5)),
            lambda g: {"pixel_values": torch.randn(2, 3, 16, 16, generator=g),
                       "noise": torch.rand(2, 16, generator=g)}),
    }[family]
    device = torch.device("polychip", index_of("Cobalt"))
    torch.manual_seed(0)
    cpu = make()
    dev = make()
    dev.load_state_dict(cpu.state_dict())
    dev.to(device)
    batch = inputs(torch.Generator().manual_seed(2))

    def loss(model, on):
        out = model(**{k: v.to(on) if isinstance(v, torch.Tensor) else v for k, v in batch.items()})
        return out if isinstance(out, torch.Tensor) else out.loss

    want = loss(cpu, "cpu")
    pt.reset_fallback_report()
    got = loss(dev, device)
    want.backward()
    got.backward()
    fell_back = " ".join(pt.fallback_report())
    for op in ("convolution", "lstm", "gru", "sigmoid"):
        assert op not in fell_back, pt.fallback_report()
    assert abs(got.item() - want.item()) <= 2e-5 * abs(want.item())
    scale = max(p.grad.abs().max().item() for p in cpu.parameters() if p.grad is not None)
    for (name, p), q in zip(cpu.named_parameters(), dev.parameters()):
        assert (q.grad is None) == (p.grad is None), name
        if p.grad is None:
            continue  # not trained (Whisper's fixed positions)
        # Gradients that are zero but for rounding (a bias before batch
        # norm) are compared against the model's largest.
        torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=1e-4, atol=1e-6 * scale, msg=name)


def test_generate_save_load_clipping_sgd_and_autocast():
    device = torch.device("polychip", index_of("Ferrite"))
    cpu, dev = pair(torch.float32)
    cpu.eval()
    dev.to(device).eval()
    ids = torch.randint(0, 96, (1, 5), generator=torch.Generator().manual_seed(2))
    # Greedy decoding with the KV cache: one-token queries against longer keys.
    want = cpu.generate(ids, max_new_tokens=8, do_sample=False)
    got = dev.generate(ids.to(device), max_new_tokens=8, do_sample=False)
    assert torch.equal(got.cpu(), want)
    # torch.save of device tensors, loaded on the CPU and back onto the device.
    import io

    buf = io.BytesIO()
    torch.save(dev.state_dict(), buf)
    buf.seek(0)
    on_cpu = torch.load(buf, map_location="cpu")
    assert all(torch.equal(on_cpu[k], v) for k, v in cpu.state_dict().items())
    buf.seek(0)
    assert next(iter(torch.load(buf).values())).device == device
    # Gradient clipping (foreach norms) and SGD with momentum (foreach path).
    for m, d in ((cpu, "cpu"), (dev, device)):
        m.train()
        m(ids.to(d), labels=ids.to(d)).loss.backward()
        m.norm = torch.nn.utils.clip_grad_norm_(m.parameters(), 0.1)
        torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9).step()
    assert abs(dev.norm.item() - cpu.norm.item()) <= 1e-5 * cpu.norm.item()
    for p, q in zip(cpu.parameters(), dev.parameters()):
        torch.testing.assert_close(q.detach().cpu(), p.detach(), rtol=1e-5, atol=1e-6)
    # Autocast: PyTorch's CUDA policy (matmuls in bf16, norms and losses in f32).
    with torch.autocast("polychip", dtype=torch.bfloat16):
        logits = dev(ids.to(device)).logits
        x = torch.randn(4, 4, device=device)
        assert (x @ x).dtype == torch.bfloat16 and torch.softmax(x, -1).dtype == torch.float32
    assert logits.dtype == torch.bfloat16


TRAINER = """
import json, sys, torch, transformers
import polychip.torch
cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
ids = torch.randint(0, 64, (8, 12), generator=torch.Generator().manual_seed(0))
class Data(torch.utils.data.Dataset):
    def __len__(self): return 8
    def __getitem__(self, i): return {"input_ids": ids[i], "labels": ids[i]}
torch.manual_seed(0)
model = transformers.LlamaForCausalLM(cfg)
args = transformers.TrainingArguments(
    output_dir=sys.argv[1], per_device_train_batch_size=4, num_train_epochs=2, learning_rate=1e-3,
    report_to=[], save_strategy="no", logging_steps=1, seed=0, disable_tqdm=True, use_cpu=sys.argv[2] == "cpu")
trainer = transformers.Trainer(model=model, args=args, train_dataset=Data())
trainer.train()
print("DEVICE", next(model.parameters()).device)
print("LOSSES", json.dumps([h["loss"] for h in trainer.state.log_history if "loss" in h]))
"""


def test_the_hugging_face_trainer_trains_on_the_device_accelerate_is_told(tmp_path):
    """accelerate (under the Trainer) knows the accelerators it was written
    for; ACCELERATE_TORCH_DEVICE, its own override, puts the Trainer on a
    polychip device. Its losses equal the CPU Trainer's."""
    pytest.importorskip("accelerate")
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)

    def run(where, env):
        out = subprocess.run(
            [sys.executable, str(script), str(tmp_path / where), where],
            capture_output=True, text=True, timeout=600, env={**os.environ, **env},
        )
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        lines = dict(line.split(" ", 1) for line in out.stdout.splitlines() if line.startswith(("DEVICE", "LOSSES")))
        return lines["DEVICE"], json.loads(lines["LOSSES"])

    device, got = run("polychip", {"ACCELERATE_TORCH_DEVICE": "polychip:0"})
    assert device == "polychip:0"
    cpu_device, want = run("cpu", {})
    assert cpu_device == "cpu" and len(got) == len(want) == 4
    for a, b in zip(got, want):
        assert abs(a - b) <= 1e-4 * abs(b), (got, want)


OPENCL_TRAINING = """
import json, sys, torch
import polychip.torch as pt
sys.path.insert(0, sys.argv[1])
import tiny_models
vendors = [pt.device_info(i)["vendor"] for i in range(pt.device_count())]
if vendors != ["OpenCL"]:
    print("SKIP", json.dumps(vendors))
    sys.exit(0)
models = {"gpt2": tiny_models.gpt2, "llama": tiny_models.llama}
ids = torch.randint(0, 96, (2, 16), generator=torch.Generator().manual_seed(0))
result = {}
for name, make in models.items():
    torch.manual_seed(0)
    cpu = make()
    dev = make()
    dev.load_state_dict(cpu.state_dict())
    dev.to("polychip:0")
    pt.reset_fallback_report()
    losses = []
    for model, where in ((cpu, "cpu"), (dev, "polychip:0")):
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
        got = []
        for _ in range(3):
            loss = model(ids.to(where), labels=ids.to(where)).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
            got.append(loss.item())
        losses.append(got)
    result[name] = {"cpu": losses[0], "device": losses[1], "fallbacks": dict(pt.fallback_report())}
print("RESULT", json.dumps(result))
"""


def test_hugging_face_models_train_on_the_opencl_plugin_as_on_the_cpu(tmp_path):
    """The real-driver plugin (OpenCL, on PoCL here) behind the PyTorch
    device: GPT-2 and LLaMA train three AdamW steps with the CPU's losses
    and nothing falling back. In a process of its own, as the plugins are
    chosen at import."""
    lib = PROFILE_DIR / "libpolychip_opencl.so"
    if not lib.exists():
        pytest.skip(f"the OpenCL plugin is not built ({lib}): cargo build --workspace builds it")
    script = tmp_path / "opencl_training.py"
    script.write_text(OPENCL_TRAINING)
    env = {**os.environ, "POLYCHIP_PLUGIN_PATH": str(lib), "POLYCHIP_NO_BUNDLED_PLUGINS": "1"}
    tests = pathlib.Path(__file__).resolve().parent
    out = subprocess.run(
        [sys.executable, str(script), str(tests)], capture_output=True, text=True, timeout=600, env=env
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines() if line.startswith(("SKIP", "RESULT")))
    if "SKIP" in lines:
        pytest.skip(f"no OpenCL device (scripts/install-deps installs PoCL); the plugins loaded: {lines['SKIP']}")
    result = json.loads(lines["RESULT"])
    for name, r in result.items():
        assert r["fallbacks"] == {}, (name, r["fallbacks"])
        assert r["device"][-1] < r["device"][0], (name, r["device"])
        for a, b in zip(r["device"], r["cpu"]):
            assert abs(a - b) <= 1e-4 * abs(b), (name, r)
