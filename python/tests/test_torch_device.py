"""The `polychip` PyTorch device: index mapping, tensors and their memory,
copies across vendors, the device guard, streams and events, generators,
the counted CPU fallback and strict mode, and autoloading."""

import copy
import gc
import os
import re
import subprocess
import sys

import pytest
import torch
import torch.utils.checkpoint

import polychip
import polychip.torch as pt
from conftest import PROFILE_DIR


def index_of(vendor):
    return next(i for i in range(pt.device_count()) if pt.device_info(i)["vendor"] == vendor)


FERRITE, COBALT = index_of("Ferrite"), index_of("Cobalt")


def test_indices_follow_polychip_devices_order():
    devices = polychip.devices()
    assert pt.device_count() == len(devices) == torch.polychip.device_count()
    for i, d in enumerate(devices):
        info = pt.device_info(i)
        assert (info["vendor"], info["name"], info["plugin_device"]) == (d.vendor, d.name, d.info["plugin_device"])
    assert torch.polychip.is_available()
    with pytest.raises(IndexError, match="polychip:99 does not exist"):
        pt.device_info(99)
    with pytest.raises(RuntimeError, match="polychip:99 does not exist"):
        torch.zeros(1, device="polychip:99")


def test_tensors_views_and_copies_on_every_vendor():
    x = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4)
    for i in range(pt.device_count()):
        d = torch.device("polychip", i)
        y = x.to(d)
        assert y.device == d and y.is_polychip and y.shape == x.shape
        assert torch.equal(y.cpu(), x)
        assert torch.equal(y.transpose(0, 2).contiguous().cpu(), x.transpose(0, 2).contiguous())
        assert torch.equal(y[:, 1:, ::2].cpu(), x[:, 1:, ::2])
        assert y[1, 2, 3].item() == 23.0
        z = y.clone().view(6, 4)
        z[2:4].fill_(-1)
        want = x.clone().view(6, 4)
        want[2:4] = -1
        assert torch.equal(z.cpu(), want)
        z.resize_(30)
        assert z.shape == (30,) and torch.equal(z[:24].cpu(), want.reshape(-1))
        for dtype in (torch.int64, torch.int32, torch.bool, torch.uint8, torch.float16, torch.bfloat16, torch.float64):
            t = x.to(dtype)
            assert torch.equal(t.to(d).cpu(), t), dtype


def test_copies_between_vendors_and_casts_keep_values():
    x = torch.randn(5, 7)
    f = x.to(f"polychip:{FERRITE}")
    c = f.to(f"polychip:{COBALT}")  # Ferrite -> Cobalt, staged through the host
    assert torch.equal(c.cpu(), x)
    back = c.t().to(f"polychip:{FERRITE}")  # strided source
    assert torch.equal(back.cpu(), x.t())
    assert torch.equal(c.to(torch.bfloat16).cpu(), x.to(torch.bfloat16))
    assert torch.equal(f.double().to(f"polychip:{COBALT}").cpu(), x.double())
    # Cobalt's memory is private: the bytes at its addresses are encoded,
    # so only the plugin's copies read it right.
    assert not pt.device_info(COBALT)["host_visible"]


def test_memory_is_accounted_and_freed():
    before = pt.memory_allocated(FERRITE)
    t = torch.empty(1024, 1024, device=f"polychip:{FERRITE}")
    assert pt.memory_allocated(FERRITE) - before == 4 * 1024 * 1024
    assert pt.max_memory_allocated(FERRITE) >= pt.memory_allocated(FERRITE)
    del t
    assert pt.memory_allocated(FERRITE) == before


def test_device_generic_memory_functions_answer():
    # torch.accelerator's memory functions (which device-generic code such
    # as Hugging Face's calls) need a DeviceAllocator; torch.polychip has
    # torch.cuda's names.
    d = f"polychip:{COBALT}"
    before = torch.accelerator.memory_allocated(COBALT)
    x = torch.ones(1000, device=d)
    assert torch.accelerator.memory_allocated(COBALT) == before + 4000
    assert torch.polychip.memory_allocated(d) == before + 4000
    assert torch.accelerator.memory_stats(COBALT)["allocated_bytes.all.current"] == before + 4000
    torch.accelerator.empty_cache()
    torch.accelerator.reset_peak_memory_stats(COBALT)
    assert torch.accelerator.max_memory_allocated(COBALT) == before + 4000
    del x
    assert torch.polychip.max_memory_allocated(COBALT) == before + 4000
    assert torch.polychip.get_device_name(COBALT).startswith("Cobalt")
    assert torch.polychip.is_bf16_supported()
    assert pt.memory_allocated(torch.device(d)) == pt.memory_allocated(COBALT)
    for bad in ("cpu", torch.device("cpu"), "cuda:0"):
        with pytest.raises(ValueError, match="Expected a polychip device"):
            torch.polychip.memory_allocated(bad)
    before = torch.polychip.current_device()
    torch.polychip.set_device(f"polychip:{COBALT}")
    assert torch.polychip.current_device() == COBALT
    torch.polychip.set_device(before)


def test_device_guard_streams_and_events():
    torch.polychip.set_device(COBALT)
    try:
        assert torch.polychip.current_device() == COBALT
        assert torch.empty(1, device="polychip").device.index == COBALT
    finally:
        torch.polychip.set_device(FERRITE)
    s = torch.Stream(device=f"polychip:{FERRITE}")
    start = torch.Event(device=f"polychip:{FERRITE}", enable_timing=True)
    end = torch.Event(device=f"polychip:{FERRITE}", enable_timing=True)
    with s:
        start.record()
        y = torch.randn(64, 64).to(f"polychip:{FERRITE}") @ torch.ones(64, 64, device=f"polychip:{FERRITE}")
        end.record()
    end.synchronize()
    s.synchronize()
    assert start.query() and end.query() and start.elapsed_time(end) >= 0
    assert y.shape == (64, 64)


def test_generators_are_per_device_and_seedable():
    torch.polychip.manual_seed_all(7)
    a = torch.polychip.get_rng_state(FERRITE)
    torch.polychip.manual_seed_all(7)
    assert torch.equal(a, torch.polychip.get_rng_state(FERRITE))
    assert len(torch.polychip.default_generators) == pt.device_count()


class _DeviceDataset(torch.utils.data.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return torch.full((2,), float(i), device=f"polychip:{FERRITE}")


def test_a_forked_worker_making_device_tensors_is_refused_in_a_sentence():
    # A DataLoader worker is a fork of this process: the device cannot
    # follow it there (as CUDA's cannot). The tensors it would have sent
    # back could not cross processes either: the parent waited for ever.
    loader = torch.utils.data.DataLoader(_DeviceDataset(), batch_size=2, num_workers=1, timeout=60)
    with pytest.raises(RuntimeError, match="forked from the one that loaded the polychip device"):
        next(iter(loader))
    # The usual way: CPU tensors in the worker, moved in the parent.
    cpu = torch.utils.data.DataLoader(torch.arange(8.0), batch_size=4, num_workers=1, pin_memory=True)
    assert [b.to(f"polychip:{FERRITE}").sum().item() for b in cpu] == [6.0, 22.0]


def test_pinned_host_memory_is_what_the_device_pinned():
    t = torch.arange(6.0).pin_memory()
    assert t.is_pinned() and not torch.arange(6.0).is_pinned()
    assert torch.empty(3, pin_memory=True).is_pinned()
    assert t[2:].is_pinned()  # a view inside a pinned block
    d = t.to(f"polychip:{COBALT}", non_blocking=True)
    assert torch.equal(d.cpu(), t)


def test_random_operators_draw_from_the_devices_generators():
    d = f"polychip:{FERRITE}"
    # The device's default generator, as CUDA's operators use theirs.
    torch.polychip.manual_seed(11)
    a = torch.randn(4, device=d)
    torch.polychip.manual_seed(11)
    assert torch.equal(torch.randn(4, device=d).cpu(), a.cpu())
    state = torch.polychip.get_rng_state(FERRITE)
    b = torch.rand(3, device=d)
    torch.polychip.set_rng_state(state, FERRITE)
    assert torch.equal(torch.rand(3, device=d).cpu(), b.cpu())
    # A generator of the device's own, passed in.
    g = torch.Generator(device=d).manual_seed(5)
    x = torch.randn(3, generator=g, device=d)
    assert x.device == torch.device(d)
    assert not torch.equal(torch.randn(3, generator=g, device=d).cpu(), x.cpu())  # it advanced
    g.manual_seed(5)
    assert torch.equal(torch.randn(3, generator=g, device=d).cpu(), x.cpu())
    assert sorted(torch.randperm(6, generator=g, device=d).cpu().tolist()) == list(range(6))
    assert torch.multinomial(torch.ones(5, device=d), 3, generator=g).device == torch.device(d)
    # A random operator without a generator argument (native_dropout)
    # draws from the device's generator too.
    x = torch.ones(64, device=d)
    torch.polychip.manual_seed(123)
    a = torch.nn.functional.dropout(x, 0.5, training=True)
    torch.polychip.manual_seed(123)
    assert torch.equal(torch.nn.functional.dropout(x, 0.5, training=True).cpu(), a.cpu())
    cpu_state = torch.get_rng_state()
    torch.nn.functional.dropout(x, 0.5, training=True)
    assert torch.equal(torch.get_rng_state(), cpu_state)  # the CPU's own stream is left alone
    # Activation checkpointing replays the device's random state, so a
    # recomputed dropout draws the forward pass's mask.
    lin = torch.nn.Linear(8, 8).to(d)
    for reentrant in (False, True):
        x = torch.randn(4, 8, device=d, requires_grad=True)
        y = torch.utils.checkpoint.checkpoint(
            lambda v: torch.nn.functional.dropout(lin(v), 0.5, True), x, use_reentrant=reentrant
        )
        y.sum().backward()
        want = ((y != 0).float() * 2) @ lin.weight
        torch.testing.assert_close(x.grad.cpu(), want.detach().cpu())
    # torch.manual_seed seeds every device's generator.
    torch.manual_seed(3)
    u = torch.rand(2, device=d)
    torch.manual_seed(3)
    assert torch.equal(torch.rand(2, device=d).cpu(), u.cpu())


def test_fallback_is_counted_per_operator_and_correct():
    pt.reset_fallback_report()
    x = torch.randn(4, 5)
    d = x.to(f"polychip:{COBALT}")
    # cumprod: still without a polychip kernel (cumsum has one since ABI 1.4).
    assert torch.equal(torch.cumprod(d, 1).cpu(), torch.cumprod(x, 1))
    d.clamp_(-0.5, 0.5)  # in place: written back to the device
    assert torch.equal(d.cpu(), x.clamp(-0.5, 0.5))
    report = pt.fallback_report()
    # Structured operators reach a backend as their out= form.
    cumprod = next(k for k in report if k.startswith("aten::cumprod"))
    clamp = next(k for k in report if k.startswith("aten::clamp"))
    assert report[cumprod] == 1 and report[clamp] == 1, report
    assert report.total == sum(report.values()) and report.seconds[cumprod] > 0
    assert cumprod in str(report)
    pt.reset_fallback_report()
    assert not pt.fallback_report() and "no aten operator" in str(pt.fallback_report())


@pytest.mark.parametrize("index", [FERRITE, COBALT])
def test_fallback_writes_in_place_and_out_results_through_strided_views(index):
    """The CPU fallback writes an in-place or out= result back through
    resize_ and a copy: resize_ to the same sizes made a strided view
    contiguous, so the result landed on the wrong elements of its storage
    (an nn.init on a column slice of a weight wrote into other columns)."""
    d = f"polychip:{index}"
    x = torch.arange(12.0).view(3, 4) - 5
    y = x.to(d)
    v = y[:, 1:]
    v.masked_fill_(v > 0, 0.0)
    want = x.clone()
    want[:, 1:].masked_fill_(want[:, 1:] > 0, 0.0)
    assert torch.equal(y.cpu(), want) and v.stride() == (4, 1)
    y = x.to(d)
    y.t().clamp_(min=0)
    assert torch.equal(y.cpu(), x.clamp(min=0))
    y = x.to(d)
    torch.cumsum(x.to(d)[:, :2], 1, out=y[:, 2:])
    want = x.clone()
    torch.cumsum(x[:, :2], 1, out=want[:, 2:])
    assert torch.equal(y.cpu(), want)
    t = x.to(d).t()
    t.resize_(4, 3)
    assert t.stride() == (1, 4)
    w = torch.full((4, 6), 7.0, device=d)
    torch.nn.init.uniform_(w[:, :3], -1, 1)
    assert torch.equal(w[:, 3:].cpu(), torch.full((4, 3), 7.0)) and bool((w[:, :3].abs() <= 1).all())


@pytest.mark.parametrize("index", [FERRITE, COBALT])
def test_cross_entropy_is_twice_differentiable_and_sums_no_row_to_zero(index):
    """The fused cross-entropy's backward had no graph of its own, so a
    gradient penalty lost its second-order term silently; and a sum over
    rows that are all ignored (Hugging Face's loss with
    num_items_in_batch) was NaN (a mean over none times 0)."""
    d = f"polychip:{index}"
    g = torch.Generator().manual_seed(3)
    x0, w0 = torch.randn(6, 4, generator=g), torch.randn(4, 5, generator=g)
    t0 = torch.tensor([0, 4, -100, 2, 1, 3])
    grads = []
    for dev in ("cpu", d):
        x = x0.to(dev, copy=True).requires_grad_()
        w = w0.to(dev, copy=True).requires_grad_()
        loss = torch.nn.functional.cross_entropy(x @ w, t0.to(dev))
        (gx,) = torch.autograd.grad(loss, x, create_graph=True)
        (loss + gx.pow(2).sum()).backward()
        grads.append((w.grad.cpu(), x.grad.cpu()))
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-4, atol=1e-5)
    for targets in (torch.full((6,), -100), torch.zeros(0, dtype=torch.long)):
        x = x0[: len(targets)].to(d, copy=True).requires_grad_()
        loss = torch.nn.functional.cross_entropy(x, targets.to(d), reduction="sum")
        loss.backward()
        assert loss.item() == 0.0 and torch.equal(x.grad.cpu(), torch.zeros_like(x0[: len(targets)]))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_times_or_over_a_scalar_rounds_once_as_pytorch(dtype):
    """PyTorch multiplies and divides a bf16/f16 tensor by a Python scalar
    in f32 and rounds once (its add and sub round the scalar first); the
    scalar was rounded to the tensor's dtype first (1-ULP differences in a
    quarter of the elements for 0.1)."""
    d = f"polychip:{FERRITE}"
    x = (torch.randn(4096, generator=torch.Generator().manual_seed(5)) * 3).to(dtype)
    x[:4] = torch.tensor([0.0, -0.0, float("inf"), float("nan")])
    for f in (
        lambda t: t * 0.1,
        lambda t: t * torch.tensor(0.1),
        lambda t: t / 0.3,
        lambda t: t / 4.0,
        lambda t: t + 0.1,
        lambda t: t - 0.3,
        lambda t: t.clone().mul_(0.1),
        lambda t: t.clone().div_(0.3),
        lambda t: t * -0.0,
    ):
        want, got = f(x), f(x.to(d)).cpu()
        assert torch.equal(got.view(torch.int16), want.view(torch.int16)) or (
            torch.equal(got.isnan(), want.isnan())
            and torch.equal(got[~got.isnan()].view(torch.int16), want[~want.isnan()].view(torch.int16))
        )


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8])
def test_integer_histograms_count_as_cuda_counts_them(dtype):
    # The CPU's kernel takes floats only; CUDA's counts integers (MoE
    # routing in transformers relies on it) and returns their dtype.
    x = torch.tensor([0, 1, 1, 3, 7, 2, 2, 2], dtype=dtype)
    d = x.to(f"polychip:{FERRITE}")
    got = torch.histc(d, bins=4, min=0, max=3)
    assert got.dtype == dtype and got.device == d.device
    assert got.cpu().tolist() == torch.histc(x.double(), bins=4, min=0, max=3).tolist() == [1, 2, 3, 1]
    # min == max: the data's range, as for floats.
    assert torch.histc(d, bins=7).cpu().tolist() == torch.histc(x.double(), bins=7).tolist()


@pytest.mark.parametrize("index", [FERRITE, COBALT])
def test_batch_norm_updates_its_running_statistics(index):
    # native_batch_norm's schema does not say it writes the running
    # statistics; the CPU fallback must not lose the update (eval-mode
    # outputs of every BatchNorm model depend on it).
    dev = f"polychip:{index}"
    torch.manual_seed(0)
    for cpu in (torch.nn.BatchNorm1d(3), torch.nn.BatchNorm1d(3, momentum=None), torch.nn.InstanceNorm1d(3, track_running_stats=True)):
        on = copy.deepcopy(cpu).to(dev)
        for _ in range(3):
            x = torch.randn(8, 3, 5) * 2 + 1
            cpu(x)
            on(x.to(dev))
        torch.testing.assert_close(on.running_mean.cpu(), cpu.running_mean)
        torch.testing.assert_close(on.running_var.cpu(), cpu.running_var)
        assert on.num_batches_tracked.item() == cpu.num_batches_tracked.item()
        cpu.eval(), on.eval()
        x = torch.randn(4, 3, 5)
        torch.testing.assert_close(on(x.to(dev)).cpu(), cpu(x))


def test_fallback_backward_passes_keep_their_arguments():
    # f64 takes the CPU for gelu's backward: the tanh form must go with it;
    # rms_norm over two dimensions or in f64 has no CPU backward kernel at
    # all (CUDA's only): its formula runs instead.
    dev = f"polychip:{FERRITE}"
    x = torch.linspace(-4, 4, 9, dtype=torch.float64)
    for approximate in ("tanh", "none"):
        want = torch.autograd.grad(torch.nn.functional.gelu(x.requires_grad_(), approximate=approximate).sum(), x)[0]
        d = x.detach().to(dev).requires_grad_()
        got = torch.autograd.grad(torch.nn.functional.gelu(d, approximate=approximate).sum(), d)[0]
        torch.testing.assert_close(got.cpu(), want)
    for shape, dtype in (((2, 8), torch.float32), ((8,), torch.float64)):
        torch.manual_seed(1)
        cpu = torch.nn.RMSNorm(shape, dtype=dtype)
        with torch.no_grad():
            cpu.weight.uniform_(0.5, 1.5)
        on = copy.deepcopy(cpu).to(dev)
        x = torch.randn(4, 2, 8, dtype=dtype)
        g = torch.randn(4, 2, 8, dtype=dtype)
        xc, xd = x.clone().requires_grad_(), x.to(dev).requires_grad_()
        cpu(xc).backward(g)
        on(xd).backward(g.to(dev))
        torch.testing.assert_close(xd.grad.cpu(), xc.grad)
        torch.testing.assert_close(on.weight.grad.cpu(), cpu.weight.grad)


def test_losses_run_in_f32_under_autocast():
    # As on CUDA, where cross_entropy decomposes into operators autocast
    # runs in f32: the fused loss casts its 16-bit logits.
    dev = f"polychip:{FERRITE}"
    torch.manual_seed(0)
    x, w, y = torch.randn(16, 50) * 3, torch.randn(50, 40) / 7, torch.randint(0, 40, (16,))
    wd = w.to(dev).requires_grad_()
    with torch.autocast("polychip", dtype=torch.bfloat16):
        logits = x.to(dev) @ wd
        loss = torch.nn.functional.cross_entropy(logits, y.to(dev))
    assert logits.dtype == torch.bfloat16 and loss.dtype == torch.float32
    want = torch.nn.functional.cross_entropy(logits.detach().cpu().float(), y)
    torch.testing.assert_close(loss.detach().cpu(), want)
    loss.backward()
    assert wd.grad.dtype == torch.float32 and torch.isfinite(wd.grad).all()


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_nested_tensors_run_through_the_cpu():
    # nn.TransformerEncoder in inference with a padding mask takes
    # PyTorch's nested-tensor fast path on any accelerator.
    device = f"polychip:{COBALT}"
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True)
    enc = torch.nn.TransformerEncoder(layer, 2).eval()
    x = torch.randn(3, 6, 32)
    pad = torch.zeros(3, 6, dtype=torch.bool)
    pad[0, 4:] = True
    pad[2, 1:] = True
    with torch.no_grad():
        want = enc(x, src_key_padding_mask=pad)
        pt.reset_fallback_report()
        got = enc.to(device)(x.to(device), src_key_padding_mask=pad.to(device))
    assert got.device == torch.device(device)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-6)
    assert "aten::_nested_tensor_from_mask" in pt.fallback_report()
    # Nested tensors themselves: made, copied, padded, written in place.
    a, b = torch.randn(2, 3), torch.randn(4, 3)
    nt = torch.nested.nested_tensor([a, b], device=device)
    assert nt.is_nested and nt.device == torch.device(device)
    back = nt.to("cpu")
    assert back.device.type == "cpu" and torch.equal(back.unbind()[1], b)
    padded = torch.nested.to_padded_tensor(nt, 0.0)
    assert padded.device == torch.device(device) and torch.equal(padded.cpu()[0, :2], a)
    assert nt.mul_(2) is nt
    assert torch.equal(nt.to("cpu").unbind()[0], a * 2)
    assert torch.equal((nt + 1).to("cpu").unbind()[1], b * 2 + 1)
    assert nt.to(torch.float64).to("cpu").dtype == torch.float64
    # Writes through views of a nested tensor reach it, as on the CPU.
    for where in ("cpu", device):
        n = torch.nested.nested_tensor([torch.ones(2, 3), torch.ones(1, 3)], device=where)
        n.unbind()[0].fill_(7)
        n.select(0, 1).fill_(5)
        n.reshape(2, -1, 3).mul_(2)
        got = [t.cpu().tolist() for t in n.unbind()]
        assert got == [[[14.0] * 3] * 2, [[10.0] * 3]], (where, got)
    # Operators that are compositions for dense tensors but nested kernels
    # of their own on the CPU (linear, matmul, attention) run there.
    w = torch.randn(4, 3)
    cpu_nt = torch.nested.nested_tensor([a, b])
    dev_nt = torch.nested.nested_tensor([a, b], device=device)
    for f in (
        lambda v, w: torch.nn.functional.linear(v, w),
        lambda v, w: torch.matmul(v, v.transpose(1, 2)),
    ):
        want, got = f(cpu_nt, w), f(dev_nt, w.to(device))
        for x, y in zip(want.unbind(), got.to("cpu").unbind()):
            torch.testing.assert_close(y, x)


def test_sparse_gradients_are_refused_in_a_sentence():
    emb = torch.nn.Embedding(10, 4, sparse=True).to(f"polychip:{FERRITE}")
    out = emb(torch.tensor([1, 2], device=f"polychip:{FERRITE}")).sum()
    with pytest.raises(NotImplementedError, match=r"no sparse tensors \(nn.Embedding\(sparse=True\)"):
        out.backward()


def test_quantized_tensors_are_refused_in_a_sentence():
    """A quantized tensor moved to the device is refused naming what to do
    (the dispatcher's message named aten::empty_quantized and a
    `Quantizedpolychip` backend)."""
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # quantized creation is deprecated in PyTorch
        q = torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.qint8)
    with pytest.raises(NotImplementedError, match=r"no quantized tensors \(call .dequantize\(\) first"):
        q.to(f"polychip:{FERRITE}")


def test_strict_mode_names_the_operator_and_restores():
    d = torch.randn(3, device=f"polychip:{FERRITE}")
    assert not pt.strict.enabled()
    with pt.strict():
        with pytest.raises(RuntimeError, match=r"strict mode: aten::cumprod(\.out)? has no polychip kernel"):
            torch.cumprod(d, 0)
        # A kernel's own unsupported case names the operator too.
        with pytest.raises(RuntimeError, match=r"aten::gelu"):
            torch.nn.functional.gelu(d.double())  # no plugin GELU in f64
        (d * 2).sum()  # what the plugins do still runs
    assert not pt.strict.enabled()
    pt.strict(True)
    try:
        assert pt.strict.enabled()
    finally:
        pt.strict(False)


def run(code, **env):
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env={**os.environ, **env}
    )


def test_strict_mode_from_the_environment():
    r = run("import torch, polychip.torch as pt; print(pt.strict.enabled())", POLYCHIP_TORCH_STRICT="1")
    assert r.returncode == 0 and r.stdout.strip() == "True", r.stderr


ABI_1_1_PLUGIN = """
import torch, polychip.torch as pt
dev = torch.device("polychip", 0)
assert pt.device_info(0)["vendor"] == "Planted"
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.GELU(), torch.nn.Linear(8, 8), torch.nn.Sigmoid(),
                            torch.nn.Linear(8, 4), torch.nn.Tanh())
x = torch.randn(5, 6)
want = torch.autograd.grad(model(x).sum(), list(model.parameters()))
model.to(dev)
pt.reset_fallback_report()
got = torch.autograd.grad(model(x.to(dev)).sum(), list(model.parameters()))
for g, w in zip(got, want):
    torch.testing.assert_close(g.cpu(), w, rtol=1e-5, atol=1e-6)
print(sorted(pt.fallback_report()))
"""


@pytest.mark.parametrize("ops", ["1.1", "1.2"])
def test_a_plugin_without_the_1_2_operators_falls_back_for_them(ops):
    """The exact GELU, sigmoid and tanh's backward run on ABI 1.2
    operators (`gelu_erf`, `sigmoid`, `sigmoid_backward`, `tanh_backward`).
    A plugin built for 1.1 has NULL entries there (the Planted plugin under
    POLYCHIP_PLANTED_OPS=1.1): the model still trains, gelu and its
    backward fall back to the CPU, counted, and sigmoid and tanh's backward
    take their 1.1 compositions on the plugin."""
    planted = PROFILE_DIR / "libpolychip_testplugin_planted.so"
    if not planted.exists():
        pytest.skip("the Planted plugin is not built")
    r = run(
        ABI_1_1_PLUGIN,
        POLYCHIP_PLUGIN_PATH=str(planted),
        POLYCHIP_PLANTED_BUG="none",
        POLYCHIP_PLANTED_OPS=ops,
    )
    assert r.returncode == 0, r.stderr
    fell_back = r.stdout.strip()
    if ops == "1.1":
        assert fell_back == "['aten::gelu', 'aten::gelu_backward']", fell_back
    else:
        assert fell_back == "[]", fell_back


ABI_1_2_PLUGIN = """
import torch, polychip.torch as pt
dev = torch.device("polychip", 0)
assert pt.device_info(0)["vendor"] == "Planted"
x = torch.linspace(-3, 3, 24).reshape(4, 6)
mask = x > 0.5
def step(t):
    pos = torch.arange(0, 6, device=t.device)
    y = torch.where(t.gt(0), t.sin(), t.cos()) + pos.to(t.dtype)
    z = t.clone().sin_()
    return y.masked_fill(t < -2, -1.0), t.eq(0.0), z
want = step(x)
pt.reset_fallback_report()
got = step(x.to(dev))
for g, w in zip(got, want):
    # sin and cos: the plugin's are within 1 ULP, as the CPU's are.
    torch.testing.assert_close(g.cpu(), w, rtol=2.4e-7, atol=2.4e-7)
print(sorted(pt.fallback_report()))
"""


@pytest.mark.parametrize("ops", ["1.2", "1.3"])
def test_a_plugin_without_the_1_3_operators_falls_back_for_them(ops):
    """where, masked_fill, comparisons, sin, cos, integer arange and
    conversions run on ABI 1.3 operators. A plugin whose table lacks them
    (the Planted plugin under POLYCHIP_PLANTED_OPS=1.2, as one built for
    1.2 has it) gives the same results: those aten operators fall back to
    the CPU, counted, and nothing else does."""
    planted = PROFILE_DIR / "libpolychip_testplugin_planted.so"
    if not planted.exists():
        pytest.skip("the Planted plugin is not built")
    env = dict(POLYCHIP_PLUGIN_PATH=str(planted), POLYCHIP_PLANTED_BUG="none")
    if ops == "1.2":
        env["POLYCHIP_PLANTED_OPS"] = "1.2"
    r = run(ABI_1_2_PLUGIN, **env)
    assert r.returncode == 0, r.stderr
    fell_back = r.stdout.strip()
    if ops == "1.2":
        assert fell_back == (
            "['aten::_copy_from (Long to Float)', 'aten::arange.start_out', 'aten::cos', "
            "'aten::eq.Scalar', 'aten::gt.Scalar', 'aten::lt.Scalar', 'aten::masked_fill.Scalar', "
            "'aten::sin', 'aten::sin_', 'aten::where.self']"
        ), fell_back
    else:
        assert fell_back == "[]", fell_back


ABI_1_3_PLUGIN = """
import torch, polychip.torch as pt
dev = torch.device("polychip", 0)
assert pt.device_info(0)["vendor"] == "Planted"
x = torch.linspace(-3, 3, 24).reshape(4, 6)
i = torch.tensor([3, 0, 3, 1])
def step(t):
    xs = t.clone().requires_grad_(True)
    picked = xs[i.to(t.device)]
    picked.sum().backward()
    g = torch.gather(t, 1, i.to(t.device).reshape(4, 1))
    c = torch.cumsum(t, 1)
    a = torch.all(t > -3, 1)
    n = torch.isneginf(t)
    b = (t > 0) & (t < 2)
    return picked.detach(), xs.grad, g, c, a, n, b
want = step(x)
pt.reset_fallback_report()
got = step(x.to(dev))
for g, w in zip(got, want):
    torch.testing.assert_close(g.cpu(), w)
print(sorted(pt.fallback_report()))
"""


@pytest.mark.parametrize("ops", ["1.3", "1.4"])
def test_a_plugin_without_the_1_4_operators_falls_back_for_them(ops):
    """Advanced indexing and its backward, gather, cumsum, all, isneginf
    and bitwise_and run on ABI 1.4 operators (isneginf on 1.3's eq). A
    plugin whose table lacks them (the Planted plugin under
    POLYCHIP_PLANTED_OPS=1.3, as one built for 1.3 has it) gives the same
    results: those aten operators fall back to the CPU, counted, and
    nothing else does."""
    planted = PROFILE_DIR / "libpolychip_testplugin_planted.so"
    if not planted.exists():
        pytest.skip("the Planted plugin is not built")
    env = dict(POLYCHIP_PLUGIN_PATH=str(planted), POLYCHIP_PLANTED_BUG="none")
    if ops == "1.3":
        env["POLYCHIP_PLANTED_OPS"] = "1.3"
    r = run(ABI_1_3_PLUGIN, **env)
    assert r.returncode == 0, r.stderr
    fell_back = r.stdout.strip()
    if ops == "1.3":
        assert fell_back == (
            "['aten::_index_put_impl_', 'aten::all.out', 'aten::bitwise_and.Tensor_out', "
            "'aten::cumsum.out', 'aten::gather.out', 'aten::index.Tensor_out']"
        ), fell_back
    else:
        assert fell_back == "[]", fell_back


def test_advanced_indexing_takes_cpu_indices_as_pytorch_does():
    """x[cpu_index] on a device tensor (logits[torch.arange(n), labels], a
    CPU mask) is allowed by PyTorch on any device; it was refused as
    tensors on two devices. Writes and gradients through it too; other
    operators (index_select) still refuse a CPU index, as on CUDA."""
    d = torch.device("polychip", 0)
    x = torch.arange(6.0).to(d)
    assert x[torch.tensor([0, 2])].device == d
    assert x[torch.tensor([0, 2])].cpu().tolist() == [0.0, 2.0]
    assert x[torch.arange(6) % 2 == 0].cpu().tolist() == [0.0, 2.0, 4.0]
    logits, labels = torch.randn(3, 5), torch.tensor([0, 4, 2])
    assert torch.equal(logits.to(d)[torch.arange(3), labels].cpu(), logits[torch.arange(3), labels])
    y = x.clone()
    y[torch.tensor([0, 3])] = 7.0
    assert y.cpu().tolist() == [7.0, 1.0, 2.0, 7.0, 4.0, 5.0]
    w = torch.zeros(6, device=d, requires_grad=True)
    w[torch.tensor([1, 1, 4])].sum().backward()
    assert w.grad.cpu().tolist() == [0.0, 2.0, 0.0, 0.0, 1.0, 0.0]
    with pytest.raises(RuntimeError, match="same device"):
        x.index_select(0, torch.tensor([1]))


def test_torch_compile_says_which_backend_works():
    """torch.compile's default backend (Inductor) generates kernels of its
    own and failed with "KeyError: 'polychip'"; it now says so and names
    the backend that runs (aot_eager, whose graph runs on the plugin)."""
    d = torch.device("polychip", 0)
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).to(d)
    x = torch.randn(4, 8).to(d)
    with pytest.raises(Exception, match="backend=\"aot_eager\""):
        torch.compile(m)(x)
    y = torch.compile(m, backend="aot_eager")(x)
    y.sum().backward()
    torch.testing.assert_close(y.cpu(), m(x).cpu())
    assert all(p.grad is not None for p in m.parameters())
    # A loss inside the compiled function: the fused cross-entropy kernel
    # is traced with fake tensors, which have no device memory (it failed
    # so); they take PyTorch's decomposition.
    labels = torch.tensor([0, 1, 1, 0])
    step = torch.compile(lambda x, t: torch.nn.functional.cross_entropy(m(x), t), backend="aot_eager")
    loss = step(x, labels.to(d))
    torch.testing.assert_close(loss.cpu(), torch.nn.functional.cross_entropy(m(x), labels.to(d)).cpu())
    loss.backward()
    # torch.func's transforms over the loss take the decomposition too.
    logits = torch.randn(6, 5)
    t = torch.randint(0, 5, (6,), generator=torch.Generator().manual_seed(2))
    g = torch.func.grad(torch.nn.functional.cross_entropy)(logits.to(d), t.to(d))
    torch.testing.assert_close(g.cpu(), torch.func.grad(torch.nn.functional.cross_entropy)(logits, t))


def test_views_of_no_elements_past_their_storage_run():
    """A chunk of an empty tensor starts past its storage's end (an LSTM on
    a batch of none chunks its gates so): operators take it, as PyTorch's
    CPU does. Before, viewing it failed ("byte offset 16 is past the end of
    the tensor's 0-byte buffer")."""
    d = torch.device("polychip", 0)
    x = torch.empty(5, 0, 16, device=d)
    last = x.chunk(4, 2)[3]
    assert last.storage_offset() > 0 and last.numel() == 0
    with pt.strict():
        y = torch.tanh(last) * 2.0 + last
    assert y.shape == (5, 0, 4)
    lstm = torch.nn.LSTM(3, 4).to(d)
    out, (h, c) = lstm(torch.randn(5, 0, 3, device=d))
    assert out.shape == (5, 0, 4) and h.shape == (1, 0, 4)


@pytest.mark.parametrize("index", [FERRITE, COBALT])
def test_a_copy_into_no_elements_still_checks_the_shapes(index):
    """copy_ into an empty destination of a shape the source does not
    broadcast to fails, as on the CPU (it returned early, copying nothing
    and raising nothing); one it broadcasts to is still nothing to do."""
    d = torch.device("polychip", index)
    for dst, src in (
        (torch.empty(0, device=d), torch.ones(3, 4, device=d)),
        (torch.empty(0, device=d), torch.ones(3, 4)),
        (torch.empty(0), torch.ones(3, 4, device=d)),
        (torch.empty(2, 0, device=d), torch.ones(3, 1, device=d)),
    ):
        with pytest.raises(RuntimeError):
            torch.empty(dst.shape).copy_(torch.ones(src.shape))  # the CPU refuses it
        with pytest.raises(RuntimeError):
            dst.copy_(src)
    assert torch.empty(0, 4, device=d).copy_(torch.ones(4, device=d)).shape == (0, 4)
    assert torch.empty(0, device=d).copy_(torch.ones(1)).shape == (0,)


def test_a_script_ending_right_after_a_backward_pass_exits_cleanly():
    """PyTorch runs a device's backward pass on a thread of its own, which
    may release the finished graph (and Python objects with it) after
    backward() returns; were the interpreter already finalizing, the process
    aborted ("terminate called without an active exception") in 18 of 40
    runs of a script like this one before polychip.torch let that thread
    finish at exit (and this test failed two times in three)."""
    code = (
        "import torch, polychip.torch\n"
        "grads = []\n"
        "for d in ('cpu', 'polychip:0'):\n"
        "    torch.manual_seed(0)\n"
        "    m = torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True).to(d)\n"
        "    m(torch.randn(2, 5, 16).to(d)).square().mean().backward()\n"
        "    grads.append({n: p.grad.cpu() for n, p in m.named_parameters()})\n"
        "for n in grads[0]:\n"
        "    print(n, float((grads[0][n] - grads[1][n]).abs().max()))\n"
    )
    # Six runs, two at a time (most of each is importing torch, one core).
    for _ in range(3):
        procs = [
            subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)
        ]
        errs = [p.communicate(timeout=300)[1] for p in procs]
        for p, err in zip(procs, errs):
            assert p.returncode == 0, (p.returncode, err[-2000:])


def test_import_torch_autoloads_the_device():
    r = run("import torch; print(torch.ones(2, device='polychip:0').sum().item())")
    assert r.returncode == 0 and r.stdout.strip() == "2.0", r.stderr
    r = run("import torch; torch.ones(2, device='polychip:0')", TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert r.returncode != 0


def test_modules_move_with_generated_methods():
    m = torch.nn.Linear(4, 3)
    x = torch.randn(2, 4)
    want = m(x)
    m.polychip(FERRITE)
    assert next(m.parameters()).device == torch.device("polychip", FERRITE)
    got = m(x.polychip(FERRITE))
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)


def test_bad_input_fails_clearly_and_nothing_runs_across_devices():
    a = torch.randn(3, device=f"polychip:{FERRITE}")
    b = torch.randn(3, device=f"polychip:{COBALT}")
    same = "Expected all tensors to be on the same device"
    for f in (lambda: a + b, lambda: a + torch.randn(3), lambda: torch.cat([a, b]), lambda: torch.cumsum(a, 0) + b):
        with pytest.raises(RuntimeError, match=same):
            f()
    assert (a + torch.tensor(2.0)).device == a.device  # a 0-d CPU tensor is a scalar
    with pytest.raises(RuntimeError, match="allocating device memory.*out of memory"):
        torch.empty(10**12, device=f"polychip:{COBALT}")
    # PyTorch keeps device indices in 8 bits: polychip:128 arrives as -128,
    # which landed on the current device; it is refused, saying why.
    with pytest.raises(RuntimeError, match="device index -128 is not a device.*wrap around"):
        torch.zeros(2, device="polychip:128")
    # The plugins check indices, never a read out of bounds: the CPU's
    # IndexError, caused by the plugin's error naming the operator.
    with pytest.raises(IndexError, match="index out of range in self") as e:
        torch.nn.functional.embedding(torch.tensor([5], device=a.device), torch.randn(3, 2, device=a.device))
    assert isinstance(e.value.__cause__, polychip.errors.InvalidArgument)
    assert re.search("embedding.*(outside|out of range)", str(e.value.__cause__))
    with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
        a.add_(torch.randn(2, 3, device=a.device))


def test_polychip_tensors_on_private_memory_reach_torch_zero_copy(cobalt):
    """torch.from_dlpack of a polychip tensor in private device memory
    (kDLExtDev) gives a polychip:N tensor over the same memory; its first
    use refused it ("no memory the polychip allocator has live") until the
    backend imported such storages through libpolychip's DLPack."""
    t = polychip.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], device=cobalt)
    tt = torch.from_dlpack(t)
    assert tt.device == torch.device("polychip", COBALT) and tt.shape == (2, 3)
    assert torch.equal((tt[:, 1:] * 2).cpu(), torch.tensor([[4.0, 6.0], [10.0, 12.0]]))
    tt[1].add_(10)
    assert t.numpy().tolist() == [[1.0, 2.0, 3.0], [14.0, 15.0, 16.0]], "writes by torch reach polychip"
    polychip.ops.scale(t, 2.0)
    assert tt.cpu().tolist() == [[2.0, 4.0, 6.0], [28.0, 30.0, 32.0]], "and polychip's reach torch"
    # Its storage is the producer's: not resized away from it (as PyTorch
    # refuses for any storage it does not own).
    with pytest.raises(RuntimeError, match="not resizable"):
        tt.resize_(100)
    assert tt.shape == (2, 3)
    del t  # torch's tensor keeps the memory
    gc.collect()
    assert tt.sum().item() == 102.0
    # Back again: polychip sees its own memory.
    back = polychip.from_dlpack(tt)
    assert back.device == cobalt and back.numpy().tolist() == tt.cpu().tolist()


def test_resize_grows_keeps_and_refuses_impossible_sizes_unchanged():
    x = torch.arange(3.0, device=f"polychip:{COBALT}")
    x.resize_(10)
    assert x.shape == (10,) and x[:3].cpu().tolist() == [0.0, 1.0, 2.0]
    for sizes, message in [((-1,), "negative dimension -1"), ((2**62, 2**62), "Storage size calculation overflowed")]:
        with pytest.raises(RuntimeError, match=message):
            x.resize_(*sizes)
        assert x.shape == (10,), "a refused resize leaves the sizes"


@pytest.mark.parametrize(
    "dtype",
    [torch.int8, torch.int16, torch.uint16, torch.uint32, torch.uint64, torch.complex64, torch.complex128,
     torch.float8_e4m3fn, torch.float8_e5m2],
)
def test_a_tensor_of_any_dtype_is_stored_moved_and_computed_on_the_cpu(dtype):
    """The device stores every dtype (its operators take float32, float16,
    bfloat16, float64, int32, int64, uint8 and bool): moves, strided copies,
    fills and moves between vendors carry the bytes exactly, and the
    operators run through the CPU fallback (an int8 tensor or Meta's
    complex rotary embedding stopped with "not supported on the device")."""
    f, c = f"polychip:{FERRITE}", f"polychip:{COBALT}"
    base = torch.tensor([[1, -2, 3, 4], [5, 6, -7, 8]])
    x = base.to(dtype) if not dtype.is_complex else (base + 1j * base.flip(1)).to(dtype)
    bits = lambda t: t.cpu().reshape(-1).contiguous().view(torch.uint8)
    d = x.to(f)
    assert d.dtype == dtype and d.device == torch.device(f)
    assert torch.equal(bits(d), bits(x))
    assert torch.equal(bits(d.to(c)), bits(x))  # between vendors
    assert torch.equal(bits(d[:, ::2].clone()), bits(x[:, ::2]))  # strided, on the device
    assert torch.equal(bits(d.t().contiguous()), bits(x.t().contiguous()))
    e = torch.empty_like(d)
    e.copy_(d)
    assert torch.equal(bits(e), bits(x))
    z = torch.zeros(3, dtype=dtype, device=f)
    assert torch.equal(bits(z), bits(torch.zeros(3, dtype=dtype)))
    assert bits(d[0, 1]).tolist() == bits(x[0, 1]).tolist()
    if dtype in (torch.int8, torch.int16, torch.complex64, torch.complex128):
        pt.reset_fallback_report()
        got = (d * 2 + d).sum(dim=1)
        want = (x * 2 + x).sum(dim=1)
        assert got.device == torch.device(f) and torch.equal(got.cpu(), want)
        assert pt.fallback_report().total > 0


def test_metas_complex_rotary_embedding_matches_the_cpu_and_complex_views_alias():
    """LLaMA's reference code rotates with complex numbers
    (``torch.polar``, ``view_as_complex``, ``view_as_real``)."""
    torch.manual_seed(0)
    freqs = torch.polar(torch.ones(6, 8), torch.randn(6, 8))
    x = torch.randn(2, 6, 4, 16, requires_grad=True)

    def rope(x, f):
        xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(xc * f.view(1, 6, 1, 8)).flatten(3).type_as(x)

    want = rope(x, freqs)
    want.square().sum().backward()
    xd = x.detach().to(f"polychip:{FERRITE}").requires_grad_()
    got = rope(xd, freqs.to(f"polychip:{FERRITE}"))
    got.square().sum().backward()
    torch.testing.assert_close(got.cpu(), want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(xd.grad.cpu(), x.grad, rtol=1e-5, atol=1e-5)
    # The views share the tensor's memory, as on the CPU.
    r = torch.randn(4, 8, 2, device=f"polychip:{FERRITE}")
    cx = torch.view_as_complex(r)
    torch.view_as_real(cx)[0, 0, 1] = 7.0
    assert r[0, 0, 1].item() == 7.0 and cx[0, 0].imag.item() == 7.0


def test_conjugate_and_negative_views_are_copied_resolved():
    """A lazy ``conj()`` (autograd makes one in a complex product's
    backward) and the negative view of its imaginary part are resolved
    when copied, read, written into and moved between vendors (copying one
    recursed without end, a segmentation fault)."""
    f, c = f"polychip:{FERRITE}", f"polychip:{COBALT}"
    x = torch.tensor([1 + 2j, 3 - 4j, -5 + 6j])
    xd = x.to(f)
    assert torch.equal(xd.conj().cpu(), x.conj().resolve_conj())
    assert xd.conj().imag.is_neg() and torch.equal(xd.conj().imag.cpu(), x.conj().imag.resolve_neg())
    assert torch.equal(xd.conj().to(c).cpu(), x.conj().resolve_conj())
    assert torch.equal(xd.conj().clone().cpu(), x.conj().resolve_conj())
    y, yd = x.clone(), xd.clone()
    new = torch.tensor([7 + 1j, 8, 9j])
    y.conj().copy_(new)
    yd.conj().copy_(new.to(f))
    assert torch.equal(yd.cpu(), y)
    y.conj().imag.copy_(torch.tensor([1.0, 2, 3]))
    yd.conj().imag.copy_(torch.tensor([1.0, 2, 3], device=f))
    assert torch.equal(yd.cpu(), y)
    assert torch.equal((xd.conj() * xd).cpu(), x.conj() * x)


class _MaskedAttention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = torch.nn.MultiheadAttention(16, 4, kdim=8, vdim=12)

    def forward(self, q, k, v):
        padding = torch.zeros(2, 7, dtype=torch.bool, device=q.device)
        padding[0, 5:] = True
        banned = torch.triu(torch.ones(5, 7, dtype=torch.bool, device=q.device), 3)
        return self.attn(q, k, v, key_padding_mask=padding, attn_mask=banned, average_attn_weights=False)[0]


class _PackedLSTM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = torch.nn.LSTM(8, 12, num_layers=2, bidirectional=True, batch_first=True)

    def forward(self, x):
        packed = torch.nn.utils.rnn.pack_padded_sequence(x, torch.tensor([5, 3, 2]), batch_first=True)
        return torch.nn.utils.rnn.pad_packed_sequence(self.lstm(packed)[0], batch_first=True)[0]


IDIOMS = {
    # key padding and attention masks together, separate key/value sizes
    "multihead_attention": (_MaskedAttention, [(5, 2, 16), (7, 2, 8), (7, 2, 12)]),
    "transformer": (lambda: torch.nn.Transformer(16, 2, 1, 1, 32, dropout=0.0, batch_first=True),
                    [(2, 6, 16), (2, 5, 16)]),
    "packed_bidirectional_lstm": (_PackedLSTM, [(3, 5, 8)]),
    "conv_transpose_group_norm": (lambda: torch.nn.Sequential(
        torch.nn.Conv1d(4, 8, 3, padding="same", dilation=2), torch.nn.GroupNorm(2, 8), torch.nn.GELU(),
        torch.nn.Conv1d(8, 6, 5, stride=2, groups=2, padding=2, padding_mode="reflect"),
        torch.nn.ConvTranspose1d(6, 4, 4, stride=2, padding=1)), [(2, 4, 20)]),
    "channels_last_conv": (lambda: torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8), torch.nn.Hardswish(),
        torch.nn.Conv2d(8, 8, 3, groups=8, padding=1), torch.nn.InstanceNorm2d(8, affine=True),
        torch.nn.ConvTranspose2d(8, 2, 2, stride=2, groups=2)).to(memory_format=torch.channels_last),
        [(2, 3, 6, 6)]),
}


@pytest.mark.parametrize("idiom", list(IDIOMS))
def test_training_idioms_match_cpu(idiom):
    """Modules built of PyTorch's own layers train on the device as on the
    CPU (two SGD steps: outputs and every gradient): masked multi-head
    attention, nn.Transformer, a packed bidirectional LSTM, dilated,
    reflect-padded, grouped and transposed convolutions with group norm
    (transposed convolutions run on the CPU, counted), a channels-last
    convolution stack with batch and instance norm."""
    make, shapes = IDIOMS[idiom]
    # Ferrite and Cobalt in turn.
    device = torch.device("polychip", (FERRITE, COBALT)[list(IDIOMS).index(idiom) % 2])
    g = torch.Generator().manual_seed(0)
    inputs = [torch.randn(*s, generator=g) for s in shapes]
    torch.manual_seed(0)
    cpu, dev = make(), make()
    dev.load_state_dict(cpu.state_dict())
    dev.to(device)
    runs = []
    for model, on in ((cpu, "cpu"), (dev, device)):
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        steps = []
        for _ in range(2):
            out = model(*[x.to(on) for x in inputs])
            weights = torch.linspace(-1, 1, out.numel(), device=on).reshape(out.shape)
            (out * weights).sum().backward()
            steps.append((out.detach().cpu(), [p.grad.cpu() for p in model.parameters()]))
            opt.step()
            opt.zero_grad()
        runs.append(steps)
    scale = max(p.abs().max().item() for p in runs[0][0][1])
    for (out, grads), (got, got_grads) in zip(*runs):
        torch.testing.assert_close(got, out, rtol=1e-4, atol=1e-5)
        # A gradient that is zero but for rounding (a key bias under
        # softmax, a bias before a norm) is compared against the largest.
        for (name, _), p, q in zip(cpu.named_parameters(), grads, got_grads):
            torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-6 * scale, msg=name)


def test_safetensors_and_per_sample_gradients():
    """safetensors saves device tensors (read through the CPU) and loads
    them back onto the device by index (it refuses device names it does
    not know, `polychip:0` among them, before PyTorch sees them);
    torch.func's vmap over grad (per-sample gradients) runs on the
    device."""
    safetensors_torch = pytest.importorskip("safetensors.torch")
    import tempfile

    from torch.func import functional_call, grad, vmap

    device = torch.device("polychip", COBALT)
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
    dev = copy.deepcopy(cpu).to(device)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "m.safetensors")
        safetensors_torch.save_file(dev.state_dict(), path)
        on_cpu = safetensors_torch.load_file(path)
        assert all(torch.equal(on_cpu[k], v) for k, v in cpu.state_dict().items())
        back = safetensors_torch.load_file(path, device=COBALT)
        assert all(v.device == device and torch.equal(v.cpu(), on_cpu[k]) for k, v in back.items())
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(1))

    def per_sample(model, xs):
        params = {k: v.detach() for k, v in model.named_parameters()}
        loss = lambda p, row: functional_call(model, p, (row[None],)).pow(2).sum()  # noqa: E731
        return vmap(grad(loss), in_dims=(None, 0))(params, xs)

    want, got = per_sample(cpu, x), per_sample(dev, x.to(device))
    for k in want:
        torch.testing.assert_close(got[k].cpu(), want[k], rtol=1e-5, atol=1e-6, msg=k)
