"""Hugging Face's LlamaForCausalLM trains on `polychip:N` with
torch.optim.AdamW, on each bundled vendor's device, and its loss curve
matches the same model on PyTorch's CPU: within 2e-5 (relative) per step in
f32, within 2e-2 in bf16. Every forward, backward and optimizer operator
runs on the plugin except a short, known list (rotary tables and position
arithmetic), which the fallback report shows."""

import pytest
import torch

import polychip.torch as pt

transformers = pytest.importorskip("transformers")

# What a LLaMA step still runs on the CPU (once per forward pass, on small
# tensors): the rotary cos/sin tables, positions (arange, integer add) and
# their conversion to float.
KNOWN_FALLBACKS = {
    "aten::cos.out",
    "aten::sin.out",
    "aten::arange.start_out",
    "aten::add.Tensor",
    "aten::_copy_from (Long to Float)",
}


def index_of(vendor):
    return next(i for i in range(pt.device_count()) if pt.device_info(i)["vendor"] == vendor)


def config(**kw):
    base = dict(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    base.update(kw)
    return transformers.LlamaConfig(**base)


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
