"""Convolutions on a polychip device (the backend's im2col and matmul on the
plugin) against the same convolution through the CPU (the tensors copied to
the CPU, PyTorch's CPU kernel, the results copied back: what the fallback
does), side by side in one run, forward and forward + backward, on each
vendor's first device; medians over rounds, ratios CPU path / device path
(above 1: the device path is faster).

    scripts/python-env --release
    .venv/bin/python python/bench/torch_conv.py            # ROUNDS=5
"""

import os
import statistics
import time

import torch
import torch.nn.functional as F

import polychip.torch as pt

ROUNDS = int(os.environ.get("ROUNDS", "5"))
CASES = {
    # name: input shape, weight shape, options
    "ViT patches 8x3x224x224 -> 768, 16x16 stride 16": ((8, 3, 224, 224), (768, 3, 16, 16), dict(stride=16)),
    "3x3 8x64x56x56 -> 64, padding 1": ((8, 64, 56, 56), (64, 64, 3, 3), dict(padding=1)),
    "Whisper Conv1d 4x80x3000 -> 384, k3": ((4, 80, 3000), (384, 80, 3), dict(padding=1)),
}


def seconds(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main():
    devices = {}
    for i in range(pt.device_count()):
        devices.setdefault(pt.device_info(i)["vendor"], i)
    print(f"{'device':<8} {'convolution':<50} {'pass':<10} {'device ms':>10} {'via CPU ms':>11} {'ratio':>6}")
    for vendor, index in devices.items():
        dev = torch.device("polychip", index)
        for name, (xs, ws, kw) in CASES.items():
            conv = F.conv2d if len(ws) == 4 else F.conv1d
            x, w = torch.randn(xs).to(dev), torch.randn(ws).to(dev)
            go = torch.ones_like(conv(x, w, **kw))

            def forward_device():
                conv(x, w, **kw)

            def forward_cpu():
                conv(x.cpu(), w.cpu(), **kw).to(dev)

            def both_device():
                xg, wg = x.detach().requires_grad_(), w.detach().requires_grad_()
                torch.autograd.grad(conv(xg, wg, **kw), (xg, wg), go)

            def both_cpu():
                xg, wg = x.cpu().requires_grad_(), w.cpu().requires_grad_()
                for g in torch.autograd.grad(conv(xg, wg, **kw), (xg, wg), go.cpu()):
                    g.to(dev)

            for label, on_device, via_cpu in (("forward", forward_device, forward_cpu),
                                              ("fwd+bwd", both_device, both_cpu)):
                on_device(), via_cpu()  # warm-up
                times = [(seconds(on_device), seconds(via_cpu)) for _ in range(ROUNDS)]
                d = statistics.median(t[0] for t in times) * 1e3
                c = statistics.median(t[1] for t in times) * 1e3
                print(f"{vendor:<8} {name:<50} {label:<10} {d:>10.1f} {c:>11.1f} {c / d:>6.2f}", flush=True)


if __name__ == "__main__":
    main()
