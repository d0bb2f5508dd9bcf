"""Every aten operator polychip registers, against PyTorch's CPU kernels on
the same inputs, on Ferrite (host-visible memory) and Cobalt (private,
encoded memory).

The cases are generated from the registration list: `polychip.torch`'s
registered kernels (`registered_ops()`) and the C++ basics (`_aten.BASICS`).
An operator registered without a sample here fails `test_operator`; a
sample that does not reach its kernel (the kernel's call counter does not
move) fails too; and every sample runs under strict mode, so a CPU
fallback anywhere inside it fails it."""

import math

import pytest
import torch
import torch.nn.functional as F

import polychip.torch as pt
from polychip.torch import _aten

aten = torch.ops.aten


def rand(*shape, dtype=torch.float32, positive=False, seed=0):
    g = torch.Generator().manual_seed(seed + 17 * len(shape) + sum(shape))
    x = torch.randn(*shape, generator=g, dtype=torch.float32)
    if positive:
        x = x.abs() + 0.1
    return x.to(dtype)


A = rand(3, 4)
B = rand(4, seed=1)
P = rand(3, 4, positive=True, seed=2)


def binary(name):
    """Samples of a binary operator's overload."""
    alpha = {"alpha": 2.0} if name in ("add", "sub") else {}

    def functional_tensor(to):
        return getattr(aten, name).Tensor(to(A), to(B), **alpha)

    def functional_scalar(to):
        return getattr(aten, name).Scalar(to(A), 2.5, **alpha)

    def out(to):
        o = to(torch.empty(0))
        getattr(aten, name).out(to(A), to(P), **alpha, out=o)
        return o

    def inplace_tensor(to):
        a = to(A.clone())
        getattr(aten, name + "_").Tensor(a, to(B), **alpha)
        return a

    def inplace_scalar(to):
        a = to(A.clone())
        getattr(aten, name + "_").Scalar(a, 0.5, **alpha)
        return a

    return {
        f"{name}.Tensor": functional_tensor,
        f"{name}.Scalar": functional_scalar,
        f"{name}.out": out,
        f"{name}_.Tensor": inplace_tensor,
        f"{name}_.Scalar": inplace_scalar,
    }


def unary(name, positive=False):
    x = P if positive else A

    def functional(to):
        return getattr(aten, name).default(to(x))

    def out(to):
        o = to(torch.empty(3, 4))
        getattr(aten, name).out(to(x), out=o)
        return o

    def inplace(to):
        a = to(x.clone())
        getattr(aten, name + "_").default(a)
        return a

    return {name: functional, f"{name}.out": out, f"{name}_": inplace}


def grads(fn, *inputs):
    """fn's output and the gradients of its sum (with a fixed cotangent)."""

    def sample(to):
        xs = [to(x.clone()).requires_grad_() for x in inputs]
        y = fn(*xs)
        cot = rand(*y.shape, seed=9)
        (y * to(cot)).sum().backward()
        return [y.detach(), *[x.grad for x in xs]]

    return sample


def foreach(name, *extra, inplace=True, lists=2):
    def sample(to):
        xs = [to(A.clone()), to(P.clone())]
        others = [[to(t.clone()) if isinstance(t, torch.Tensor) else t for t in a] if isinstance(a, list) else a for a in extra]
        op = getattr(aten, name.split(".")[0])
        op = getattr(op, name.split(".")[1]) if "." in name else op.default
        r = op(xs, *others)
        return xs if inplace else r

    return sample


def adamw(lr_tensor):
    def sample(to):
        ps = [to(A.clone()), to(P.clone())]
        gs = [to(rand(3, 4, seed=5)), to(rand(3, 4, seed=6))]
        ms = [to(rand(3, 4, seed=7) * 0.1), to(torch.zeros(3, 4))]
        vs = [to(rand(3, 4, positive=True, seed=8) * 0.01), to(torch.zeros(3, 4))]
        steps = [to(torch.tensor(3.0)), to(torch.tensor(1.0))]
        lr = to(torch.tensor(0.01)) if lr_tensor else 0.01
        op = aten._fused_adamw_.tensor_lr if lr_tensor else aten._fused_adamw_.default
        if lr_tensor and steps[0].device.type == "cpu":
            lr = torch.tensor(0.01)
        op(ps, gs, ms, vs, [], steps, lr=lr, beta1=0.9, beta2=0.999, weight_decay=0.01, eps=1e-8,
           amsgrad=False, maximize=False)
        return ps + ms + vs

    return sample


def attention(to):
    q = to(rand(2, 4, 6, 8, seed=1)).requires_grad_()
    k = to(rand(2, 2, 6, 8, seed=2)).requires_grad_()
    v = to(rand(2, 2, 6, 8, seed=3)).requires_grad_()
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    (y * to(rand(2, 4, 6, 8, seed=4))).sum().backward()
    return [y.detach(), q.grad, k.grad, v.grad]


def cross_entropy(reduction):
    def sample(to):
        x = to(rand(5, 7)).requires_grad_()
        t = to(torch.tensor([1, 0, 6, -100, 3]))
        loss = F.cross_entropy(x, t, ignore_index=-100, reduction=reduction)
        loss.backward()
        return [loss.detach(), x.grad]

    return sample


def layer_norm(to):
    x = to(rand(3, 5)).requires_grad_()
    w = to(rand(5, seed=1)).requires_grad_()
    b = to(rand(5, seed=2)).requires_grad_()
    y = F.layer_norm(x, (5,), w, b, 1e-5)
    (y * to(rand(3, 5, seed=3))).sum().backward()
    return [y.detach(), x.grad, w.grad, b.grad]


def rms_norm_forward(to):
    out, rstd = aten._fused_rms_norm(to(rand(3, 5)), [5], to(rand(5, seed=1)), 1e-6)
    return [out, rstd]


def rms_norm_backward(to):
    x, w, g = rand(3, 5), rand(5, seed=1), rand(3, 5, seed=2)
    rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    if to(x).device.type == "cpu":
        # PyTorch has no CPU kernel: the reference is autograd of the
        # unfused form.
        xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
        (xs * torch.rsqrt(xs.pow(2).mean(-1, keepdim=True) + 1e-6) * ws).mul(g).sum().backward()
        return [xs.grad, ws.grad]
    return list(aten._fused_rms_norm_backward(to(g), to(x), [5], to(rstd), to(w), [True, True]))


def embedding(to):
    w = to(rand(6, 3)).requires_grad_()
    idx = to(torch.tensor([[0, 5, 2], [2, 2, 1]]))
    y = F.embedding(idx, w, padding_idx=1)
    (y * to(rand(2, 3, 3, seed=1))).sum().backward()
    return [y.detach(), w.grad]


def basics():
    def as_strided(to):
        return to(A).as_strided((2, 2), (1, 2), 1).contiguous()

    def resize(to):
        a = to(A.clone().reshape(-1))
        a.resize_(20)
        return a[:12].clone()

    def copy_from_and_resize(to):
        dst = to(torch.empty(0))
        aten._copy_from_and_resize(A, dst) if dst.device.type != "cpu" else dst.resize_(3, 4).copy_(A)
        return dst

    def copy_across(to):
        x = to(A)
        if x.device.type == "cpu":
            return [x.clone(), x.double(), x.to(torch.bfloat16).float()]
        other = torch.device("polychip", (x.device.index + 1) % pt.device_count())
        return [x.to(other).to(x.device), x.double(), x.to(torch.bfloat16).float()]

    def set_tensor(to):
        t = to(torch.empty(0))
        t.set_(to(A))
        return t

    def set_storage(to):
        t = to(torch.empty(0))
        a = to(A)
        t.set_(a.untyped_storage())
        return t[:12].reshape(3, 4)

    def set_storage_offset(to):
        t = to(torch.empty(0))
        a = to(A)
        t.set_(a.untyped_storage(), 2, (2, 2), (4, 1))
        return t.clone()

    def fill_tensor(to):
        a = to(A.clone())
        a.fill_(torch.tensor(2.5))
        return a

    def zero(to):
        a = to(A.clone())
        a.zero_()
        return a

    return {
        "empty.memory_format": lambda to: torch.empty(3, 4, device=to(A).device).fill_(1.5),
        "empty_strided": lambda to: torch.empty_strided((3, 4), (1, 3), device=to(A).device).copy_(A).contiguous(),
        "as_strided": as_strided,
        "resize_": resize,
        "_reshape_alias": lambda to: aten._reshape_alias(to(A), [4, 3], [3, 1]).clone(),
        "_copy_from": copy_across,
        "_copy_from_and_resize": copy_from_and_resize,
        "_local_scalar_dense": lambda to: torch.tensor(to(A)[1, 2].item()),
        "set_.source_Tensor": set_tensor,
        "set_.source_Storage": set_storage,
        "set_.source_Storage_storage_offset": set_storage_offset,
        "view": lambda to: to(A).view(4, 3).clone(),
        "fill_.Scalar": lambda to: to(A.clone()).fill_(-3.0),
        "fill_.Tensor": fill_tensor,
        "zero_": zero,
        "_has_compatible_shallow_copy_type": lambda to: torch.tensor(
            [torch._has_compatible_shallow_copy_type(A, to(A)), torch._has_compatible_shallow_copy_type(to(A), A)]
        ),
    }


def convolutions(to):
    """Conv2d with groups, stride, padding and dilation (windows that
    overlap: the input's gradient is added offset by offset), a patch
    embedding (windows apart: one copy) and a depthwise Conv1d without a
    bias: outputs and every gradient."""
    cases = [
        (lambda x, w, b: F.conv2d(x, w, b, stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2),
         rand(2, 4, 7, 6), rand(6, 2, 3, 2, seed=1), rand(6, seed=2)),
        (lambda x, w, b: F.conv2d(x, w, b, stride=4), rand(2, 3, 8, 8), rand(5, 3, 4, 4, seed=1), rand(5, seed=2)),
        (lambda x, w: F.conv1d(x, w, padding=2, groups=3), rand(2, 3, 9), rand(3, 1, 3, seed=1)),
    ]
    return [grads(fn, *inputs)(to) for fn, *inputs in cases]


def recurrent_cells(to):
    """torch.lstm_cell and gru_cell (PyTorch takes the fused cells on the
    device), with and without biases: outputs and every gradient."""
    n, i, h = 3, 4, 5
    x, h0, c0 = rand(n, i), rand(n, h, seed=1), rand(n, h, seed=2)
    lstm = [rand(4 * h, i, seed=3), rand(4 * h, h, seed=4), rand(4 * h, seed=5), rand(4 * h, seed=6)]
    gru = [rand(3 * h, i, seed=3), rand(3 * h, h, seed=4), rand(3 * h, seed=5), rand(3 * h, seed=6)]
    return [
        grads(lambda x, h, c, *w: torch.cat(torch.lstm_cell(x, (h, c), *w), 1), x, h0, c0, *lstm)(to),
        grads(lambda x, h, c, wi, wh: torch.lstm_cell(x, (h, c), wi, wh)[0], x, h0, c0, *lstm[:2])(to),
        grads(lambda x, h, *w: torch.gru_cell(x, h, *w), x, h0, *gru)(to),
        grads(lambda x, h, wi, wh: torch.gru_cell(x, h, wi, wh), x, h0, *gru[:2])(to),
    ]


SAMPLES = {}
for _name in ("add", "sub", "mul", "div"):
    SAMPLES.update(binary(_name))
for _name in ("neg", "exp", "tanh", "relu", "silu", "sin", "cos"):
    SAMPLES.update(unary(_name))
for _name in ("log", "sqrt", "rsqrt"):
    SAMPLES.update(unary(_name, positive=True))
SAMPLES.update(basics())
# ABI 1.3: select (where), masked_fill, the comparisons, arange.
_MASK = A > 0.2
_ROWMASK = B > 0
SAMPLES.update(
    {
        "where.self": lambda to: aten.where.self(to(_MASK), to(A), to(B)),
        "where.self_out": lambda to: (lambda o: (aten.where.self_out(to(_MASK), to(A), to(P), out=o), o)[1])(
            to(torch.empty(0))
        ),
        "masked_fill.Scalar": lambda to: aten.masked_fill.Scalar(to(A), to(_ROWMASK), -1e9),
        "masked_fill_.Scalar": lambda to: aten.masked_fill_.Scalar(to(A.clone()), to(_MASK), float("-inf")),
        "masked_fill.Tensor": lambda to: aten.masked_fill.Tensor(to(A), to(_MASK), torch.tensor(2.5)),
        "masked_fill_.Tensor": lambda to: aten.masked_fill_.Tensor(to(A.clone()), to(_ROWMASK), torch.tensor(-3.0)),
        "arange.start_out": lambda to: aten.arange.start_out(2, 40, 3, out=to(torch.empty(0, dtype=torch.int64))),
    }
)
for _name in ("eq", "ne", "lt", "le", "gt", "ge"):
    _op = getattr(aten, _name)
    SAMPLES.update(
        {
            f"{_name}.Tensor": (lambda op: lambda to: op.Tensor(to(A.round()), to(B.round())))(_op),
            f"{_name}.Scalar": (lambda op: lambda to: op.Scalar(to(A.round()), 0.0))(_op),
            f"{_name}.Tensor_out": (
                lambda op: lambda to: (lambda o: (op.Tensor_out(to(A), to(P), out=o), o)[1])(
                    to(torch.empty(0, dtype=torch.bool))
                )
            )(_op),
            f"{_name}.Scalar_out": (
                lambda op: lambda to: (lambda o: (op.Scalar_out(to(A), 0.5, out=o), o)[1])(
                    to(torch.empty(0, dtype=torch.bool))
                )
            )(_op),
        }
    )
# ABI 1.4: gather, scatter_add, advanced indexing, cumsum, any/all,
# isneginf/isposinf, bitwise operators. Each `.out` sample passes an empty
# `out` that the kernel resizes.
_IDX = torch.tensor([[2, 0, 1, 2], [1, 1, 0, 0]])
_INTS = torch.tensor([[5, -3, 12, 0], [7, 255, -1, 64]], dtype=torch.int64)


def _out(dtype):
    return lambda to: to(torch.empty(0, dtype=dtype))


def _into(op, dtype, *args, **kwargs):
    """A sample of ``op(*args(to), out=...)`` returning the output."""
    return lambda to: (lambda o: (op(*(a(to) if callable(a) else a for a in args), **kwargs, out=o), o)[1])(
        _out(dtype)(to)
    )


_F = torch.float32
SAMPLES.update(
    {
        "gather.out": _into(aten.gather.out, _F, lambda to: to(A), 1, lambda to: to(_IDX)),
        "scatter_add.out": _into(aten.scatter_add.out, _F, lambda to: to(A), 1, lambda to: to(_IDX), lambda to: to(P)),
        "scatter_add_": lambda to: aten.scatter_add_(to(A.clone()), 1, to(_IDX), to(P)),
        "index.Tensor_out": _into(aten.index.Tensor_out, _F, lambda to: to(A), lambda to: [None, to(_IDX)]),
        "_index_put_impl_": lambda to: aten._index_put_impl_(
            to(A.clone()), [to(torch.tensor([1, 0, 1]))], to(torch.ones(3, A.shape[1])), True
        ),
        "index_select": lambda to: aten.index_select(to(A), 1, to(torch.tensor([3, 0, 3]))),
        "index_select.out": _into(aten.index_select.out, _F, lambda to: to(A), 0, lambda to: to(torch.tensor([1, 1]))),
        "index_add.out": _into(
            aten.index_add.out, _F, lambda to: to(A), 1, lambda to: to(torch.tensor([2, 0, 2])), lambda to: to(P[:, :3])
        ),
        "cumsum.out": _into(aten.cumsum.out, _F, lambda to: to(A), 1),
        "isneginf.out": _into(aten.isneginf.out, torch.bool, lambda to: to(A.log())),
        "isposinf.out": _into(aten.isposinf.out, torch.bool, lambda to: to(1 / A.round())),
        "bitwise_not.out": _into(aten.bitwise_not.out, torch.int64, lambda to: to(_INTS)),
    }
)
for _name in ("any", "all"):
    _op = getattr(aten, _name)
    SAMPLES.update(
        {
            f"{_name}.out": _into(_op.out, torch.bool, lambda to: to(A > 0.3), 1),
            f"{_name}.dims_out": _into(_op.dims_out, torch.bool, lambda to: to(A > 0.3), [0, 1]),
            f"{_name}.all_out": _into(_op.all_out, torch.bool, lambda to: to(A > -5)),
        }
    )
for _name in ("bitwise_and", "bitwise_or", "bitwise_xor"):
    SAMPLES[f"{_name}.Tensor_out"] = _into(
        getattr(aten, _name).Tensor_out, torch.int64, lambda to: to(_INTS), lambda to: to(_INTS[:1] * 3)
    )
SAMPLES.update(
    {
        "rsub.Tensor": lambda to: aten.rsub.Tensor(to(A), to(B), alpha=3.0),
        "rsub.Scalar": lambda to: aten.rsub.Scalar(to(A), 1.0),
        "gelu": lambda to: aten.gelu(to(A), approximate="tanh"),
        "gelu_backward": lambda to: aten.gelu_backward(to(B.expand(3, 4)), to(A), approximate="tanh"),
        "silu_backward": lambda to: aten.silu_backward(to(P), to(A)),
        "threshold_backward": lambda to: aten.threshold_backward(to(P), to(A.relu()), 0),
        "tanh_backward": lambda to: aten.tanh_backward(to(P), to(A.tanh())),
        "sigmoid": lambda to: aten.sigmoid(to(A * 30)),
        "sigmoid_backward": lambda to: aten.sigmoid_backward(to(P), to(A.sigmoid())),
        "unfold": lambda to: [to(rand(3, 4, 5)).unfold(1, 2, 1), to(A).unfold(-1, 3, 2), (lambda x: (x.unfold(1, 2, 2).mul_(3), x)[1])(to(A.clone()))],
        "convolution_overrideable": convolutions,
        "convolution_backward_overrideable": convolutions,
        "_thnn_fused_lstm_cell": recurrent_cells,
        "_thnn_fused_lstm_cell_backward_impl": recurrent_cells,
        "_thnn_fused_gru_cell": recurrent_cells,
        "_thnn_fused_gru_cell_backward": recurrent_cells,
        "pow.Tensor_Scalar": lambda to: aten.pow.Tensor_Scalar(to(P), 2.5),
        "pow_.Scalar": lambda to: aten.pow_.Scalar(to(P.clone()), 3.0),
        "mm": lambda to: aten.mm(to(A), to(rand(4, 5).t().contiguous().t())),
        "bmm": lambda to: aten.bmm(to(rand(2, 3, 4)), to(rand(2, 4, 5).transpose(1, 2).contiguous().transpose(1, 2))),
        # Into rows of a larger buffer, as Hugging Face's grouped expert
        # matmul writes each expert's tokens (and into a transposed one).
        "mm.out": lambda to: [
            (lambda o: (aten.mm.out(to(A), to(rand(4, 5)), out=o[1:4]), o)[1])(to(torch.zeros(5, 5))),
            (lambda o: (aten.mm.out(to(A), to(rand(4, 5)), out=o.t()[2:5]), o)[1])(to(torch.zeros(5, 6))),
        ],
        "bmm.out": lambda to: (lambda o: (aten.bmm.out(to(rand(2, 3, 4)), to(rand(2, 4, 5)), out=o[:, 1:]), o)[1])(
            to(torch.zeros(2, 4, 5))
        ),
        "addmm": lambda to: aten.addmm(to(rand(5)), to(A), to(rand(4, 5)), beta=0.5, alpha=2.0),
        "baddbmm": lambda to: aten.baddbmm(to(rand(2, 3, 5)), to(rand(2, 3, 4)), to(rand(2, 4, 5)), beta=0.5, alpha=2.0),
        "sum": lambda to: aten.sum.default(to(rand(3, 4, 5))),
        "sum.dim_IntList": lambda to: [aten.sum.dim_IntList(to(rand(3, 4, 5)), [0, 2], True), aten.sum.dim_IntList(to(A), [-1])],
        "mean": lambda to: aten.mean.default(to(rand(3, 4, 5))),
        "mean.dim": lambda to: [aten.mean.dim(to(rand(3, 4, 5)), [1]), aten.mean.dim(to(A), [0, 1], True)],
        "amax": lambda to: [aten.amax(to(rand(3, 4, 5)), [0, 2]), aten.amax(to(A), [1], True)],
        "max.dim": lambda to: list(aten.max.dim(to(rand(3, 4, 5)), 1)),
        "argmax": lambda to: [aten.argmax(to(rand(3, 4, 5)), 2), aten.argmax(to(A))],
        "linalg_vector_norm": lambda to: aten.linalg_vector_norm(to(rand(3, 4, 5))),
        "_softmax": lambda to: [aten._softmax(to(A), 1, False), aten._softmax(to(A), 0, False)],
        "_log_softmax": lambda to: [aten._log_softmax(to(A), -1, False), aten._log_softmax(to(A), 0, False)],
        "_softmax_backward_data": lambda to: aten._softmax_backward_data(to(B.expand(3, 4)), to(A.softmax(1)), 1, torch.float32),
        "_log_softmax_backward_data": lambda to: aten._log_softmax_backward_data(to(P), to(A.log_softmax(0)), 0, torch.float32),
        "native_layer_norm": layer_norm,
        "native_layer_norm_backward": layer_norm,
        "_fused_rms_norm": rms_norm_forward,
        "_fused_rms_norm_backward": rms_norm_backward,
        "embedding": embedding,
        "embedding_dense_backward": embedding,
        "_fused_sdp_choice": attention,
        "_scaled_dot_product_fused_attention_overrideable": attention,
        "_scaled_dot_product_fused_attention_overrideable_backward": attention,
        "cross_entropy_loss": lambda to: cross_entropy("mean")(to) + cross_entropy("sum")(to),
        "cat": lambda to: aten.cat([to(A), to(P[:1]), to(torch.empty(0))], 0),
        "stack": lambda to: aten.stack([to(A), to(P)], -1),
        "_fused_adamw_": adamw(False),
        "_fused_adamw_.tensor_lr": adamw(True),
        "lerp_.Scalar": lambda to: aten.lerp_.Scalar(to(A.clone()), to(P), 0.3),
        "addcmul_": lambda to: aten.addcmul_(to(A.clone()), to(P), to(B), value=0.5),
        "addcdiv_": lambda to: aten.addcdiv_(to(A.clone()), to(B), to(P), value=-2.0),
        "_foreach_add_.Scalar": foreach("_foreach_add_.Scalar", 1.5),
        "_foreach_add_.List": foreach("_foreach_add_.List", [B.expand(3, 4), A]),
        "_foreach_add_.Tensor": foreach("_foreach_add_.Tensor", torch.tensor(2.0)),
        "_foreach_add.Scalar": foreach("_foreach_add.Scalar", 1.5, inplace=False),
        "_foreach_add.List": foreach("_foreach_add.List", [P, A], inplace=False),
        "_foreach_sub_.Scalar": foreach("_foreach_sub_.Scalar", 0.25),
        "_foreach_mul_.Scalar": foreach("_foreach_mul_.Scalar", 0.5),
        "_foreach_mul_.List": foreach("_foreach_mul_.List", [P, A]),
        "_foreach_mul_.Tensor": foreach("_foreach_mul_.Tensor", torch.tensor(3.0)),
        "_foreach_mul_.ScalarList": foreach("_foreach_mul_.ScalarList", [0.5, 2.0]),
        "_foreach_mul.Scalar": foreach("_foreach_mul.Scalar", 0.5, inplace=False),
        "_foreach_mul.Tensor": foreach("_foreach_mul.Tensor", torch.tensor(3.0), inplace=False),
        "_foreach_mul.List": foreach("_foreach_mul.List", [P, A], inplace=False),
        "_foreach_div_.Scalar": foreach("_foreach_div_.Scalar", 4.0),
        "_foreach_div_.ScalarList": foreach("_foreach_div_.ScalarList", [0.5, 2.0]),
        "_foreach_div_.List": foreach("_foreach_div_.List", [P, P]),
        "_foreach_div.ScalarList": foreach("_foreach_div.ScalarList", [0.5, 2.0], inplace=False),
        "_foreach_div.List": foreach("_foreach_div.List", [P, P], inplace=False),
        "_foreach_neg": foreach("_foreach_neg", inplace=False),
        "_foreach_neg_": foreach("_foreach_neg_"),
        "_foreach_sqrt": lambda to: aten._foreach_sqrt([to(P), to(P * 2)]),
        "_foreach_sqrt_": lambda to: (lambda xs: (aten._foreach_sqrt_(xs), xs)[1])([to(P.clone()), to(P * 3)]),
        "_foreach_zero_": foreach("_foreach_zero_"),
        "_foreach_lerp_.Scalar": foreach("_foreach_lerp_.Scalar", [P, B.expand(3, 4).contiguous()], 0.25),
        "_foreach_addcmul_.Scalar": foreach("_foreach_addcmul_.Scalar", [P, A], [A, P], 0.5),
        "_foreach_addcmul_.ScalarList": foreach("_foreach_addcmul_.ScalarList", [P, A], [A, P], [0.5, 2.0]),
        "_foreach_addcdiv_.Scalar": foreach("_foreach_addcdiv_.Scalar", [A, A], [P, P], -0.5),
        "_foreach_addcdiv_.ScalarList": foreach("_foreach_addcdiv_.ScalarList", [A, A], [P, P], [0.5, 2.0]),
        "_foreach_copy_": foreach("_foreach_copy_", [P, A]),
        "_foreach_norm.Scalar": foreach("_foreach_norm.Scalar", 2, inplace=False),
    }
)

OPERATORS = sorted(set(_aten.REGISTERED) | set(_aten.BASICS))


def _devices():
    vendors = [pt.device_info(i)["vendor"] for i in range(pt.device_count())]
    return [("Ferrite", vendors.index("Ferrite")), ("Cobalt", vendors.index("Cobalt"))]


def _cpu(x):
    if isinstance(x, (list, tuple)):
        return [_cpu(v) for v in x]
    return x.detach().cpu() if isinstance(x, torch.Tensor) else x


def test_every_sample_belongs_to_a_registered_operator():
    assert not set(SAMPLES) - set(OPERATORS), sorted(set(SAMPLES) - set(OPERATORS))


@pytest.mark.parametrize("vendor,index", _devices(), ids=[v for v, _ in _devices()])
@pytest.mark.parametrize("name", OPERATORS)
def test_operator(name, vendor, index):
    sample = SAMPLES.get(name)
    assert sample is not None, f"aten::{name} is registered for the polychip device but has no sample here"
    device = torch.device("polychip", index)
    expected = _cpu(sample(lambda t: t))
    before = _aten.CALLS.get(name)
    with pt.strict():
        got = _cpu(sample(lambda t: t.to(device)))
    if before is not None:
        assert _aten.CALLS[name] > before, f"the sample for aten::{name} did not reach its kernel"
    torch.testing.assert_close(got, expected, rtol=2e-5, atol=2e-5, equal_nan=True)


def test_elementwise_results_keep_their_inputs_layout():
    # As PyTorch's kernels do: a channels-last or transposed input gives a
    # result of its layout, so views taken of it work as on the CPU.
    d = torch.device("polychip", _devices()[0][1])
    x = rand(2, 3, 4, 5).contiguous(memory_format=torch.channels_last)
    t = rand(3, 4).t()
    with pt.strict():
        for f in (torch.relu, torch.exp, lambda v: v * 2, lambda v: v + v, lambda v: v.pow(2)):
            for v in (x, t):
                got = f(v.to(d))
                assert got.stride() == f(v).stride(), (got.stride(), f(v).stride())
                torch.testing.assert_close(got.cpu(), f(v), rtol=2e-5, atol=2e-5)
        y = torch.relu(x.to(d)).permute(0, 2, 3, 1).view(2, 60)
    torch.testing.assert_close(y.cpu(), torch.relu(x).permute(0, 2, 3, 1).reshape(2, 60))


def test_kernels_accept_strided_and_broadcast_views():
    d = torch.device("polychip", _devices()[1][1])
    x = rand(4, 6)
    y = rand(6, 4)
    with pt.strict():
        got = (x.to(d).t() * y.to(d)[:, :1] + y.to(d)[1:2]).exp().sum(0)
    torch.testing.assert_close(got.cpu(), (x.t() * y[:, :1] + y[1:2]).exp().sum(0), rtol=2e-5, atol=2e-5)


def test_half_precision_runs_on_the_plugin_within_its_rounding():
    d = torch.device("polychip", _devices()[0][1])
    for dtype in (torch.bfloat16, torch.float16):
        x, w = rand(8, 16, dtype=dtype), rand(16, 16, dtype=dtype)
        with pt.strict():
            got = F.silu(x.to(d) @ w.to(d)).softmax(-1)
        want = F.silu(x.float() @ w.float()).softmax(-1)
        tol = 2 ** -7 if dtype == torch.bfloat16 else 2 ** -10
        torch.testing.assert_close(got.cpu().float(), want, rtol=8 * tol, atol=8 * tol)
    assert math.isfinite(float(got.float().sum().cpu()))


@pytest.mark.parametrize("vendor,index", _devices(), ids=[v for v, _ in _devices()])
def test_sigmoid_keeps_its_negative_tail(vendor, index):
    """sigmoid(-20) is 2.06e-9: a formula with a difference of near-equal
    numbers ((tanh(x / 2) + 1) / 2, as first written) gave 0 below -17 and
    lost 12% at -5 in bf16. Relative accuracy over the whole range, f32
    and bf16, forward and backward."""
    d = torch.device("polychip", index)
    x = torch.tensor([-80.0, -20.0, -17.0, -12.0, -5.0, -1e-3, 0.0, 1e-3, 5.0, 20.0])
    for dtype, tol in ((torch.float32, 1e-6), (torch.bfloat16, 2 ** -8)):
        xs = x.to(dtype)
        with pt.strict():
            got = torch.sigmoid(xs.to(d)).cpu()
        torch.testing.assert_close(got, torch.sigmoid(xs), rtol=tol, atol=0)
    xg = x.clone().to(d).requires_grad_()
    with pt.strict():
        torch.sigmoid(xg).sum().backward()
    xc = x.clone().requires_grad_()
    torch.sigmoid(xc).sum().backward()
    torch.testing.assert_close(xg.grad.cpu(), xc.grad, rtol=1e-5, atol=0)


@pytest.mark.parametrize("vendor,index", _devices(), ids=[v for v, _ in _devices()])
def test_exact_gelu_sigmoid_and_tanh_backward_run_on_abi_1_2_operators(vendor, index):
    """nn.GELU's default (the erf form), sigmoid, and the backward passes
    of GELU, sigmoid and tanh (from their outputs) run on the plugin's ABI
    1.2 operators, under strict mode, on strided views, in f32 and bf16,
    and agree with the CPU; `sigmoid_` and friends keep working too."""
    d = torch.device("polychip", index)
    for dtype, tol in ((torch.float32, 2e-6), (torch.bfloat16, 2 ** -7)):
        x = (torch.linspace(-6, 6, 48).reshape(6, 8).t() * 1.5).to(dtype)  # transposed
        g = torch.randn(8, 6, generator=torch.Generator().manual_seed(1)).to(dtype)
        cases = {
            "gelu": lambda t: F.gelu(t),
            "sigmoid": torch.sigmoid,
            "tanh": torch.tanh,
        }
        for name, f in cases.items():
            xc = x.clone().requires_grad_()
            want_y = f(xc)
            (want_g,) = torch.autograd.grad(want_y, xc, g)
            xd = x.to(d).requires_grad_()
            before = dict(_aten.CALLS)
            with pt.strict():
                got_y = f(xd)
                (got_g,) = torch.autograd.grad(got_y, xd, g.to(d))
            torch.testing.assert_close(got_y.cpu(), want_y, rtol=tol, atol=tol, msg=name)
            torch.testing.assert_close(got_g.cpu(), want_g, rtol=tol, atol=tol, msg=name)
            backward = {"gelu": "gelu_backward", "sigmoid": "sigmoid_backward", "tanh": "tanh_backward"}[name]
            assert _aten.CALLS[backward] > before[backward], backward
    # The backward kernels' own ABI entries were taken (the plugin runs
    # ABI 1.2): no 1.1 composition was needed.
    assert not {k for k in _aten._MISSING if k[0] == index}, _aten._MISSING


@pytest.mark.parametrize("vendor,index", _devices(), ids=[v for v, _ in _devices()])
def test_binary_operators_promote_round_and_refuse_as_the_cpu_does(vendor, index):
    """The elementwise kernels' corner cases, each against the CPU bit for
    bit: a number as ``self`` (phimoe's ``torch.add(0.3333, t,
    alpha=0.6667)``, ``torch.div(1.0, t)``: the dispatcher hands it over as
    a Python number, which crashed the kernel), a 0-d CPU tensor that
    promotes as a tensor (an integer tensor plus a 0-d bf16 tensor is bf16,
    not f32), an in-place result of a wider dtype rounded once (bf16 += f32
    was computed in bf16), rsub with a 0-d CPU integer tensor (sent to the
    Scalar overload), a result of a dtype ``out`` cannot hold and `-` on
    bools (both refused on the CPU, computed on the device), an out= of
    another shape through the fallback (left empty), and torch.cat with an
    empty legacy tensor of a wider dtype (it sets the result's dtype)."""
    d = torch.device("polychip", index)
    xf = rand(3, 4) * 3
    cases = {
        "number self add alpha": lambda x: torch.add(0.3333, x, alpha=0.6667),
        "number self add": lambda x: torch.add(0.1, x),
        "number self sub": lambda x: torch.sub(1.1, x),
        "number self mul": lambda x: torch.mul(0.1, x),
        "number self div": lambda x: torch.div(0.3, x),
        "cpu 0-d promotes": lambda x: (x * 10).long() + torch.tensor(0.5, dtype=torch.bfloat16),
        "cpu 0-d rsub": lambda x: torch.rsub((x * 10).long(), torch.tensor(5)),
        "in place rounds once": lambda x: x.to(torch.bfloat16).add_(x * 1.001),
        "in place mixed halves": lambda x: x.to(torch.bfloat16).mul_(x.to(torch.float16)),
        "fallback out resizes": lambda x: torch.neg((x * 10).long(), out=torch.empty(0, dtype=torch.long, device=x.device)),
        "cat empty legacy": lambda x: torch.cat([torch.tensor([], device=x.device), x.to(torch.bfloat16).flatten()]),
    }
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for name, fn in cases.items():
            want = fn(xf.to(dtype))
            got = fn(xf.to(dtype).to(d)).cpu()
            assert got.dtype == want.dtype, (name, dtype, got.dtype, want.dtype)
            if "alpha" in name:
                # a + alpha * b: the CPU fuses the multiply-add (one ulp)
                ulp = torch.finfo(dtype).eps
                torch.testing.assert_close(got, want, rtol=ulp, atol=ulp)
            else:
                assert torch.equal(got, want), (name, dtype, got, want)
    for fn, message in (
        (lambda x: torch.add(x, 1.5, out=torch.empty(3, 4, dtype=torch.long, device=x.device)), "can't be cast"),
        (lambda x: torch.exp(x, out=torch.empty(3, 4, dtype=torch.int32, device=x.device)), "can't be cast"),
        (lambda x: x - (x > 0), "bool tensor is not supported"),
        (lambda x: torch.rsub(x, True), "bool tensor is not supported"),
    ):
        with pytest.raises(RuntimeError, match=message):
            fn(xf)
        with pytest.raises(RuntimeError, match=message):
            fn(xf.to(d))


def test_convolution_refuses_what_the_cpu_refuses_and_keeps_channels_last():
    d = torch.device("polychip", _devices()[0][1])
    x, w = rand(2, 4, 9, 10).to(d), rand(6, 4, 3, 3).to(d)
    for kwargs, message in ((dict(dilation=0), "non-positive dilation"), (dict(stride=(1, 0)), "non-positive stride")):
        with pytest.raises(RuntimeError, match=message):
            F.conv2d(x, w, **kwargs)
    # A channels-last input gives a channels-last output and gradient, as
    # PyTorch's kernels do.
    last = x.contiguous(memory_format=torch.channels_last).detach().requires_grad_()
    y = F.conv2d(last, w, padding=1)
    y.sum().backward()
    assert y.is_contiguous(memory_format=torch.channels_last) and not y.is_contiguous()
    assert last.grad.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(y.cpu(), F.conv2d(x.cpu(), w.cpu(), padding=1), rtol=2e-5, atol=2e-5)


def test_every_registered_operator_is_documented():
    import pathlib

    doc = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "pytorch.md").read_text()
    # Each operator's name, without its overload and in-place underscore.
    missing = [n for n in OPERATORS if f"`{n.split('.')[0].rstrip('_')}" not in doc]
    assert not missing, f"docs/pytorch.md does not list {missing}"


@pytest.mark.parametrize("vendor,index", _devices(), ids=[v for v, _ in _devices()])
def test_a_sum_over_several_dimensions_rounds_once(vendor, index):
    """sum and mean over several dimensions in bf16/f16 give the exact
    result rounded once, as one reduction does (they were reduced one
    dimension at a time, rounding in between: a bf16 mean over (0, 2) came
    out an ulp off the CPU's), for any order of the dimensions, kept or
    not, on a strided input too."""
    d = torch.device("polychip", index)
    torch.manual_seed(1)
    for dtype in (torch.bfloat16, torch.float16):
        x = torch.randn(24, 20, 30).to(dtype)
        for t in (x, x.transpose(0, 2)):
            for dims in ((0, 2), (0, 1), (1, 2), (0, 1, 2), (2, 0)):
                for keepdim in (False, True):
                    for fn in ("sum", "mean"):
                        want = getattr(t.double(), fn)(dims, keepdim=keepdim).to(dtype)
                        got = getattr(t.to(d), fn)(dims, keepdim=keepdim).cpu()
                        assert got.shape == want.shape, (fn, dims, keepdim)
                        assert torch.equal(got, want), (dtype, fn, dims, keepdim)


@pytest.mark.parametrize("vendor,index", _devices(), ids=[v for v, _ in _devices()])
def test_fill_converts_its_value_as_the_cpu_does(vendor, index):
    """fill_, full and zero_ take the value into the tensor's dtype as the
    CPU does: -1 wraps into a uint8's 255, a fraction truncates into an
    int32, and a value the dtype cannot hold raises (300 into uint8, 1e30
    and NaN into int32, 1e6 into f16); the plugin's fill of the double
    clamped or saturated them silently."""
    d = torch.device("polychip", index)
    cases = [
        lambda dev: torch.full((2,), -1, dtype=torch.uint8, device=dev),
        lambda dev: torch.full((2,), 300, dtype=torch.uint8, device=dev),
        lambda dev: torch.empty(2, dtype=torch.int32, device=dev).fill_(1e30),
        lambda dev: torch.empty(2, dtype=torch.int32, device=dev).fill_(float("nan")),
        lambda dev: torch.empty(2, dtype=torch.int32, device=dev).fill_(-2.7),
        lambda dev: torch.empty(2, dtype=torch.float16, device=dev).fill_(1e6),
        lambda dev: torch.empty(1, dtype=torch.float16, device=dev).fill_(1e6),
        lambda dev: torch.empty(2, dtype=torch.bfloat16, device=dev).fill_(1 / 3),
        lambda dev: torch.empty(2, dtype=torch.int64, device=dev).fill_(2**60 + 1),
        lambda dev: torch.empty(2, dtype=torch.bool, device=dev).fill_(0.5),
        lambda dev: torch.ones(2, device=dev).fill_(torch.tensor(2.5)),
    ]
    for i, make in enumerate(cases):
        try:
            want = make("cpu")
        except RuntimeError:
            with pytest.raises(RuntimeError):
                make(d)
            continue
        got = make(d).cpu()
        assert got.dtype == want.dtype and torch.equal(got, want), (i, got, want)


@pytest.mark.parametrize("vendor,index", _devices(), ids=[v for v, _ in _devices()])
def test_fill_of_a_broadcast_view_writes_each_place_once(vendor, index):
    """fill_ and zero_ of an expanded view (zero strides: several elements
    in one place), which the CPU runs: the plugin refuses an output that
    writes an element more than once, so the view is filled as one element
    along each such dimension."""
    d = torch.device("polychip", index)
    results = []
    for dev in ("cpu", d):
        t = torch.arange(12.0, device=dev).reshape(4, 3)
        t[:, :1].expand(4, 3).fill_(7)
        t[1:2, :].expand(5, 3).zero_()
        t[2, 1:2].expand(6).fill_(-1)
        results.append(t.cpu())
    assert torch.equal(results[0], results[1]), results


@pytest.mark.parametrize("vendor,index", _devices(), ids=[v for v, _ in _devices()])
def test_determinants_of_strided_views_differentiate_as_on_the_cpu(vendor, index):
    """det and slogdet of a slice of a wider matrix (a view that is not
    contiguous, whose CPU copy in the fallback was): PyTorch factors A^T
    for a contiguous A, and its backward asks the device's A which of the
    two the saved factors are. The gradient came out transposed."""
    device = torch.device("polychip", index)
    base = rand(2, 3, 7) + torch.eye(3, 7) * 3
    for fn in (torch.linalg.det, lambda a: torch.linalg.slogdet(a)[1], torch.logdet):
        results = []
        for on in ("cpu", device):
            x = base.to(on).requires_grad_()
            a = x[:, :, 1:4]
            assert not a.is_contiguous()
            y = fn(a)
            (g,) = torch.autograd.grad((y * torch.tensor([1.0, -2.0], device=on)).sum(), x)
            results.append((y.detach().cpu(), g.cpu()))
        (want, want_grad), (got, got_grad) = results
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, equal_nan=True)
        torch.testing.assert_close(got_grad, want_grad, rtol=1e-4, atol=1e-5, equal_nan=True)


@pytest.mark.parametrize("vendor,index", _devices(), ids=[v for v, _ in _devices()])
def test_join_and_broadcast_errors_are_the_cpus(vendor, index):
    """cat, stack and the elementwise kernels refuse what the CPU refuses,
    in its words (a wrong size in cat came out as a failed copy into the
    result, naming neither cat nor the tensor; a failed broadcast as
    "shapes ... do not broadcast")."""
    device = torch.device("polychip", index)
    cases = [
        lambda d: torch.cat([torch.ones(3, 4, device=d), torch.ones(3, 4, 1, device=d)]),
        lambda d: torch.cat([torch.ones(3, 4, device=d), torch.ones(3, 4, device=d)], 2),
        lambda d: torch.cat([torch.ones(3, 4, device=d), torch.ones(2, 5, device=d)], 1),
        lambda d: torch.cat([torch.ones(0, device=d), torch.ones(3, 4, device=d), torch.ones(3, 2, device=d)]),
        lambda d: torch.cat([torch.tensor(1.0, device=d)]),
        lambda d: torch.stack([torch.ones(3, 4, device=d), torch.ones(3, 5, device=d)]),
        lambda d: torch.ones(3, 4, device=d) + torch.ones(2, 1, 5, device=d),
        lambda d: torch.ones(3, 4, device=d).mul_(torch.ones(5, device=d)),
    ]
    for case in cases:
        with pytest.raises(Exception) as want:
            case("cpu")
        with pytest.raises(type(want.value)) as got:
            case(device)
        assert str(got.value) == str(want.value)


# ------------------------------------------------------------- ABI 1.3


def _bits_equal(got, want):
    """Equal bit for bit (NaN payloads aside: NaN where NaN), dtype too."""
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape, (got.shape, want.shape)
    if want.dtype.is_floating_point:
        same_nan = torch.isnan(got) == torch.isnan(want)
        assert bool(same_nan.all()), (got, want)
        g, w = got[~torch.isnan(want)], want[~torch.isnan(want)]
        assert torch.equal(g, w), (g, w)
        # -0 and +0 told apart.
        assert torch.equal(torch.signbit(g), torch.signbit(w)), (g, w)
    else:
        assert torch.equal(got, want), (got, want)


_SPECIALS = [float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 1.0, -1.0, 0.5, 3.0e38, 1e-45]


@pytest.mark.parametrize("vendor,index", _devices(), ids=[v for v, _ in _devices()])
def test_abi_1_3_operators_match_the_cpu_bit_for_bit(vendor, index):
    """where, masked_fill (and in place), the six comparisons (tensor and
    scalar, broadcast, NaN, infinities, -0), conversions between every pair
    of dtypes, arange and integer add, sub and mul (wrapping) run on the
    plugin's ABI 1.3 operators under strict mode and give the CPU's bits."""
    d = torch.device("polychip", index)
    g = torch.Generator().manual_seed(3)
    s = torch.tensor(_SPECIALS)
    a, b = s.repeat_interleave(len(_SPECIALS)), s.repeat(len(_SPECIALS))
    mask = torch.rand(a.shape, generator=g) > 0.5
    ints = torch.tensor([-(2**31), 2**31 - 1, -1, 0, 1, 7, 65537], dtype=torch.int32)
    cases = {
        "where": lambda t: torch.where(t(mask), t(a), t(b)),
        "where broadcast": lambda t: torch.where(t(mask.reshape(10, 10)[:, :1]), t(a.reshape(10, 10)), t(b[:10])),
        "where 0-d": lambda t: torch.where(t(mask.reshape(10, 10)), t(a.reshape(10, 10)), torch.tensor(-0.0)),
        "masked_fill": lambda t: t(a).masked_fill(t(mask), float("-inf")),
        "masked_fill_ bf16": lambda t: t(a.bfloat16()).masked_fill_(t(mask), 1.00390625),
        "masked_fill int": lambda t: t(ints).masked_fill(t(ints > 0), -5),
        "arange int64": lambda t: torch.arange(3, 1000, 7, device=t(a).device),
        "arange int32": lambda t: torch.arange(-50, 50, 3, dtype=torch.int32, device=t(a).device),
        "add int32 wraps": lambda t: torch.add(t(ints), t(ints[:, None]), alpha=3),
        "sub int64": lambda t: torch.sub(t(ints.long()), 2**40, alpha=-2),
        "mul int32 wraps": lambda t: t(ints) * t(ints[:, None]),
    }
    for name in ("eq", "ne", "lt", "le", "gt", "ge"):
        cases[name] = (lambda n: lambda t: getattr(torch, n)(t(a), t(b)))(name)
        cases[name + " scalar"] = (lambda n: lambda t: getattr(torch, n)(t(a), 0.0))(name)
        cases[name + " f16 scalar"] = (lambda n: lambda t: getattr(torch, n)(t(a.half()), 0.1))(name)
        cases[name + " int broadcast"] = (lambda n: lambda t: getattr(torch, n)(t(ints), t(ints[:, None])))(name)
    dtypes = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64, torch.uint8,
              torch.bool)
    # Floats to integers inside the integer's range (outside it C leaves
    # the conversion undefined: PyTorch's CPU wraps or gives INT_MIN, the
    # ABI saturates); floats to uint8 stay on the CPU (it wraps negatives).
    # Integers to a narrower integer keep their low bits, as on the CPU.
    values = torch.cat([s[~torch.isinf(s) & (s.abs() < 1e30)], torch.tensor([2.5, -2.5, 254.5, 100.0, -7.0])])
    for src in dtypes:
        for dst in dtypes:
            if src == dst or (src.is_floating_point and dst == torch.uint8):
                continue
            v = values
            if dst in (torch.uint8,) or (src == torch.uint8):
                v = values.abs()
            if src == torch.bool:
                v = values != 0
            cases[f"{src} to {dst}"] = (lambda x, y, v: lambda t: t(v.to(x)).to(y))(src, dst, v)
    for name, f in cases.items():
        want = f(lambda x: x)
        with pt.strict():
            got = f(lambda x: x.to(d)).cpu()
        _bits_equal(got, want)


@pytest.mark.parametrize("vendor,index", _devices(), ids=[v for v, _ in _devices()])
def test_sin_and_cos_are_accurate_for_rotary_tables(vendor, index):
    """A rotary table's angles reach 1e5 rad (positions times its lowest
    frequency): sin and cos there within 1 ULP of f32 of the exact value
    (f64), and the CPU's own within the same."""
    d = torch.device("polychip", index)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 64, 2, dtype=torch.int64).float() / 64))
    pos = torch.arange(0, 100000, 997, dtype=torch.int64).float()
    x = pos[:, None] * inv_freq[None, :]
    for f in (torch.sin, torch.cos):
        exact = f(x.double())
        with pt.strict():
            got = f(x.to(d)).cpu()
        ulp = torch.finfo(torch.float32).eps * exact.abs().clamp_min(2**-126).float()
        err = (got.double() - exact).abs()
        assert bool((err <= 1.0 * ulp.double()).all()), float((err / ulp.double()).max())
        torch.testing.assert_close(got, f(x), rtol=2e-7, atol=1e-7)


# ------------------------------------------------------------- ABI 1.4


@pytest.mark.parametrize("vendor,index", _devices(), ids=[v for v, _ in _devices()])
def test_abi_1_4_operators_match_the_cpu(vendor, index):
    """gather, scatter_add (repeated indices), advanced indexing by integer
    tensors (one, a leading None, two adjacent, negative indices) and its
    accumulating index_put_, cumsum (f32 bit for bit: both accumulate in
    f64; integers), any/all (NaN, -0, empty dims, several dims), isneginf
    and the bitwise operators run on the plugin's ABI 1.4 operators under
    strict mode and give the CPU's results."""
    d = torch.device("polychip", index)
    g = torch.Generator().manual_seed(14)
    x = torch.randn(6, 5, generator=g)
    idx = torch.randint(0, 6, (4, 5), generator=g)
    cols = torch.randint(0, 5, (6, 3), generator=g)
    ints = torch.tensor([-(2**31), 2**31 - 1, -1, 0, 1, 7, 65537], dtype=torch.int32)
    s = torch.tensor(_SPECIALS)
    row = torch.rand(3000, generator=g)
    exact = {
        "gather dim 0": lambda t: torch.gather(t(x), 0, t(idx)),
        "gather dim 1": lambda t: torch.gather(t(x), -1, t(cols)),
        "scatter_add ints": lambda t: torch.zeros(6, 5, dtype=torch.int64, device=t(x).device).scatter_add(
            0, t(idx), t(idx * 3 - 5)
        ),
        "index": lambda t: t(x)[t(torch.tensor([5, 0, -1, 2, 2]))],
        "index leading None": lambda t: t(x)[None, t(torch.tensor([[1, 3], [0, -2]]))],
        "index two": lambda t: t(x)[t(torch.tensor([0, 5, 2])), t(torch.tensor([4, -5, 1]))],
        "index dim 1": lambda t: t(x)[:, t(torch.tensor([4, 0, 0]))],
        "index_select": lambda t: torch.index_select(t(x), 1, t(torch.tensor([4, 0, 0, 2]))),
        "index_select int32 0-d": lambda t: t(x).index_select(-2, t(torch.tensor(5, dtype=torch.int32))),
        "index_add ints": lambda t: torch.zeros(3, 5, dtype=torch.int64, device=t(x).device).index_add(
            0, t(torch.tensor([2, 0, 2, 2])), t(torch.arange(20).reshape(4, 5))
        ),
        "cumsum": lambda t: torch.cumsum(t(x), 1),
        "cumsum long row": lambda t: torch.cumsum(t(row), 0),
        "cumsum int64 of bool": lambda t: torch.cumsum(t(x > 0), 0),
        "cumsum int32 wraps": lambda t: torch.cumsum(t(ints), 0, dtype=torch.int32),
        "cumsum -0": lambda t: torch.cumsum(t(torch.tensor([-0.0, -0.0])), 0),
        "any": lambda t: torch.any(t(s.reshape(2, 5)), 1),
        "all": lambda t: torch.all(t(s.reshape(5, 2)), 1, keepdim=True),
        "all of everything": lambda t: torch.all(t(s[:4])),
        "any empty dim": lambda t: torch.any(t(torch.zeros(3, 0)), 1),
        "all empty dim": lambda t: torch.all(t(torch.zeros(3, 0)), 1),
        "any dims": lambda t: torch.any(t(x > 1.5), dim=(0, 1)),
        "isneginf": lambda t: torch.isneginf(t(s)),
        "isposinf": lambda t: torch.isposinf(t(s.half())),
        "and": lambda t: torch.bitwise_and(t(ints), t(ints[:, None])),
        "or": lambda t: t(ints.long()) | t(ints.long()[:3, None]),
        "xor bool": lambda t: t(x > 0) ^ t(x < 1),
        "not": lambda t: ~t(ints),
        "not bool": lambda t: ~t(x > 0),
        "logical and": lambda t: t(x > 0) & t(x < 1),
    }
    for name, f in exact.items():
        want = f(lambda v: v)
        with pt.strict():
            got = f(lambda v: v.to(d)).cpu()
        _bits_equal(got, want)
    # Floating scatter_add and index_put_ with repeated indices add in
    # another order than the CPU's: equal to rounding.
    close = {
        "scatter_add": lambda t: t(x).scatter_add(1, t(cols), t(torch.ones(6, 3))),
        "index_add_": lambda t: t(x).clone().index_add_(1, t(torch.tensor([3, 3, 0])), t(torch.ones(6, 3))),
        "index_add backward": lambda t: _grad_of_index(t(x), t(torch.tensor([1, 1, 4, 0, 1]))),
    }
    for name, f in close.items():
        want = f(lambda v: v)
        with pt.strict():
            got = f(lambda v: v.to(d)).cpu()
        torch.testing.assert_close(got, want)


def _grad_of_index(x, i):
    """The gradient of ``(x[i] * w).sum()``: an accumulating index_put_."""
    x = x.clone().requires_grad_(True)
    w = torch.arange(x.shape[1], dtype=x.dtype).to(x.device)
    (x[i] * w).sum().backward()
    return x.grad


@pytest.mark.parametrize("vendor,index", _devices(), ids=[v for v, _ in _devices()])
def test_abi_1_4_indices_out_of_range_raise_as_on_the_cpu(vendor, index):
    """An index past the end (or below -n for indexing) raises what
    PyTorch's CPU raises (an IndexError from indexing, a RuntimeError from
    gather, each naming the index, the dimension and its size: until
    hostile sweep 6 the device raised an IndexError quoting the plugin
    for both), and nothing is written."""
    d = torch.device("polychip", index)
    x = torch.arange(12.0).reshape(3, 4)
    for f in (
        lambda t: t(x)[t(torch.tensor([0, 3]))],
        lambda t: torch.gather(t(x), 0, t(torch.tensor([[3]]))),
        lambda t: torch.gather(t(x), 1, t(torch.tensor([[-1]]))),
        lambda t: t(x).index_select(1, t(torch.tensor([4]))),
        lambda t: t(x).index_select(0, t(torch.tensor([-1]))),
        lambda t: t(x).index_add(0, t(torch.tensor([3])), t(torch.ones(1, 4))),
    ):
        with pytest.raises((IndexError, RuntimeError)) as cpu:
            f(lambda v: v)
        with pytest.raises(cpu.type) as got:
            f(lambda v: v.to(d))
        assert str(got.value) == str(cpu.value)
