"""What a training loop does beyond a forward pass, against the CPU: the
optimizers PyTorch ships (each option that changes their arithmetic), the
losses and norms as a loop calls them, including the arguments the CPU
refuses, dropout's masks under checkpointing, and a checkpoint (model,
optimizer and the device's random state) saved mid-run and resumed."""

import io

import pytest
import torch
import torch.nn.functional as F
import torch.utils.checkpoint

import polychip.torch as pt


def index_of(vendor):
    return next(i for i in range(pt.device_count()) if pt.device_info(i)["vendor"] == vendor)


FERRITE, COBALT = index_of("Ferrite"), index_of("Cobalt")
DEVICES = [f"polychip:{FERRITE}", f"polychip:{COBALT}"]


def _refusal(fn, device):
    """fn's exception on the CPU and on ``device``: (type, message) each."""
    out = []
    for d in ("cpu", device):
        with pytest.raises(Exception) as info:
            fn(d)
        out.append((info.type, str(info.value)))
    return out


@pytest.mark.parametrize("device", DEVICES)
def test_layer_norm_refuses_a_normalized_shape_the_input_does_not_end_with(device):
    """layer_norm over (4,) of rows of 5 normalized the rows of 5 without a
    word (the kernel took the input's last dimension); the CPU refuses."""
    x = torch.randn(3, 5, generator=torch.Generator().manual_seed(0))
    (cpu_type, cpu_msg), (dev_type, dev_msg) = _refusal(lambda d: F.layer_norm(x.to(d), (4,)), device)
    assert dev_type is cpu_type and dev_msg == cpu_msg
    # The shape it matches still runs on the plugin, forward and backward.
    pt.reset_fallback_report()
    w = torch.ones(5, device=device, requires_grad=True)
    y = F.layer_norm(x.to(device), (5,), w)
    y.sum().backward()
    assert not any("layer_norm" in k for k in pt.fallback_report()), pt.fallback_report()
    torch.testing.assert_close(y.detach().cpu(), F.layer_norm(x, (5,)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_cross_entropy_refuses_int32_targets_as_the_cpu_does(device):
    """The fused cross-entropy took int32 targets, which PyTorch's nll_loss
    (CPU and CUDA) refuses: a loop that worked on polychip failed on them."""
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(0))
    t = torch.tensor([0, 4, 1, 2])

    def loss(d, dtype):
        return F.cross_entropy(x.to(d), t.to(dtype).to(d))

    (cpu_type, cpu_msg), (dev_type, dev_msg) = _refusal(lambda d: loss(d, torch.int32), device)
    assert dev_type is cpu_type and dev_msg == cpu_msg
    torch.testing.assert_close(loss(device, torch.int64).cpu(), loss("cpu", torch.int64))


OPTIMIZERS = {
    "sgd-nesterov": lambda p, fe: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01, foreach=fe),
    "adam-amsgrad": lambda p, fe: torch.optim.Adam(p, lr=1e-2, amsgrad=True, foreach=fe),
    "adamw-amsgrad": lambda p, fe: torch.optim.AdamW(p, lr=1e-2, amsgrad=True, weight_decay=0.1, foreach=fe),
    "rmsprop-centered": lambda p, fe: torch.optim.RMSprop(p, lr=1e-2, centered=True, momentum=0.9, foreach=fe),
    "adagrad": lambda p, fe: torch.optim.Adagrad(p, lr=0.1, lr_decay=0.01, weight_decay=0.1, foreach=fe),
    "nadam": lambda p, fe: torch.optim.NAdam(p, lr=1e-2, decoupled_weight_decay=True, weight_decay=0.1, foreach=fe),
    "radam": lambda p, fe: torch.optim.RAdam(p, lr=1e-2, foreach=fe),
    "adamax": lambda p, fe: torch.optim.Adamax(p, lr=1e-2, foreach=fe),
}


def _fit(device, make_opt, foreach, steps=4):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).to(device)
    opt = make_opt(model.parameters(), foreach)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(6, 8, generator=g).to(device), torch.randn(6, 4, generator=g).to(device)
    for _ in range(steps):
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
    return [p.detach().cpu() for p in model.parameters()], opt


@pytest.mark.parametrize("foreach", [True, False], ids=["foreach", "for-loop"])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_optimizers_step_as_on_the_cpu(name, foreach):
    """Each optimizer's update, in both of its implementations, with gradient
    clipping: the parameters after a few steps equal the CPU's, within f32
    rounding (RMSprop divides by the root of a tiny running square, which
    amplifies the last bit; in f64 it agrees to 1e-15)."""
    want, _ = _fit("cpu", OPTIMIZERS[name], foreach)
    got, opt = _fit(DEVICES[0], OPTIMIZERS[name], foreach)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    for state in opt.state.values():
        for v in state.values():
            if isinstance(v, torch.Tensor) and v.dim():
                assert v.device.type == "polychip"


@pytest.mark.parametrize("device", DEVICES)
def test_checkpointed_dropout_recomputes_the_same_mask(device):
    """Activation checkpointing reruns the forward pass in backward; the
    device's random state is saved and restored around it, so the dropout
    mask recomputed is the one the forward pass drew (both checkpoint
    implementations), and the gradients equal an uncheckpointed pass's."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(16, 16).to(device)

    def block(x):
        return F.dropout(torch.tanh(lin(x)), 0.5, training=True)

    x = torch.randn(8, 16, device=device, requires_grad=True)
    torch.manual_seed(7)
    block(x).sum().backward()
    want = (x.grad.cpu(), lin.weight.grad.cpu())
    for reentrant in (False, True):
        x.grad = None
        lin.weight.grad = None
        torch.manual_seed(7)
        torch.utils.checkpoint.checkpoint(block, x, use_reentrant=reentrant).sum().backward()
        torch.testing.assert_close((x.grad.cpu(), lin.weight.grad.cpu()), want, rtol=0, atol=0)


def test_a_training_run_resumes_from_a_checkpoint_exactly():
    """Model, optimizer and the device's random state saved mid-run, loaded
    onto the CPU and then onto another vendor's device: the resumed steps
    (dropout included) equal the uninterrupted run's."""
    first, second = DEVICES

    def make(device):
        torch.manual_seed(0)
        return torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Dropout(0.2), torch.nn.LayerNorm(16), torch.nn.Linear(16, 3)
        ).to(device)

    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(1))
    t = torch.tensor([0, 1, 2, 0, 1, -100])

    def step(model, opt, device):
        loss = F.cross_entropy(model(x.to(device)), t.to(device), label_smoothing=0.1)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.item()

    model = make(first)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(2):
        step(model, opt, first)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "rng": torch.polychip.get_rng_state(first)}, buf)
    want = [step(model, opt, first) for _ in range(3)]

    buf.seek(0)
    ckpt = torch.load(buf, map_location="cpu")
    assert all(v.device.type == "cpu" for v in ckpt["model"].values())
    resumed = make(second)
    resumed.load_state_dict(ckpt["model"])
    opt2 = torch.optim.AdamW(resumed.parameters(), lr=1e-2)
    opt2.load_state_dict(ckpt["opt"])
    torch.polychip.set_rng_state(ckpt["rng"], second)
    got = [step(resumed, opt2, second) for _ in range(3)]
    assert got == pytest.approx(want, rel=1e-5)
