"""torch.distributed's `polychip` backend: every collective across two
ranks on two vendors' devices (Ferrite and Cobalt) under `polychip launch`
and under torchrun, CPU tensors too, Work semantics, and
DistributedDataParallel training Hugging Face's LLaMA with one rank per
vendor, whose loss equals one process on the whole batch."""

import json
import subprocess
import sys
import textwrap

import pytest

from conftest import PROFILE_DIR

COLLECTIVES = textwrap.dedent(
    """
    import torch, torch.distributed as dist
    import polychip.torch as pt
    from polychip.torch.distributed import device_for_rank

    dist.init_process_group("polychip")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert dist.get_backend() == "polychip"
    dev = device_for_rank(vendors=["Ferrite", "Cobalt"])
    assert pt.device_info(dev.index)["vendor"] == ["Ferrite", "Cobalt"][rank]

    def eq(t, want):
        got = t.cpu().tolist()
        assert got == want, (rank, got, want)

    for op, want in [(dist.ReduceOp.SUM, 3.0), (dist.ReduceOp.AVG, 1.5), (dist.ReduceOp.MAX, 2.0), (dist.ReduceOp.MIN, 1.0)]:
        t = torch.full((5,), float(rank + 1), device=dev)
        dist.all_reduce(t, op=op)
        eq(t, [want] * 5)
    cpu = torch.full((3,), float(rank + 1))  # CPU tensors are staged through the device
    dist.all_reduce(cpu)
    eq(cpu, [3.0] * 3)
    strided = torch.arange(6.0, device=dev).view(2, 3).t()  # non-contiguous
    dist.all_reduce(strided)
    eq(strided, (torch.arange(6.0).view(2, 3).t() * 2).tolist())
    r = torch.full((2,), float(rank), device=dev)
    dist.reduce(r, dst=1)
    if rank == 1:
        eq(r, [1.0, 1.0])
    out = torch.empty(4, device=dev)
    dist.all_gather_into_tensor(out, torch.full((2,), float(rank), device=dev))
    eq(out, [0.0, 0.0, 1.0, 1.0])
    outs = [torch.empty(2, device=dev) for _ in range(world)]
    dist.all_gather(outs, torch.full((2,), float(rank), device=dev))
    assert [o.cpu().tolist() for o in outs] == [[0.0, 0.0], [1.0, 1.0]]
    b = torch.tensor([7.0 if rank == 1 else 0.0], device=dev)
    dist.broadcast(b, src=1)
    eq(b, [7.0])
    rs = torch.empty(2, device=dev)
    dist.reduce_scatter_tensor(rs, torch.arange(4.0, device=dev))
    eq(rs, [0.0, 2.0] if rank == 0 else [4.0, 6.0])
    rl = torch.empty(2, device=dev)
    dist.reduce_scatter(rl, [torch.full((2,), 1.0, device=dev), torch.full((2,), 2.0, device=dev)])
    eq(rl, [2.0, 2.0] if rank == 0 else [4.0, 4.0])
    a2a = torch.empty(4, device=dev)
    dist.all_to_all_single(a2a, torch.arange(4.0, device=dev) + 10 * rank)
    eq(a2a, [0.0, 1.0, 10.0, 11.0] if rank == 0 else [2.0, 3.0, 12.0, 13.0])
    parts = [torch.empty(1, device=dev) for _ in range(world)]
    dist.all_to_all(parts, [torch.tensor([float(10 * rank + p)], device=dev) for p in range(world)])
    assert [p.item() for p in parts] == [float(rank), float(10 + rank)]
    g = [torch.empty(1, device=dev) for _ in range(world)] if rank == 0 else None
    dist.gather(torch.tensor([float(rank + 5)], device=dev), g, dst=0)
    if rank == 0:
        assert [x.item() for x in g] == [5.0, 6.0]
    s = torch.empty(1, device=dev)
    dist.scatter(s, [torch.tensor([3.0], device=dev), torch.tensor([4.0], device=dev)] if rank == 0 else None, src=0)
    eq(s, [3.0 + rank])
    if rank == 0:
        dist.send(torch.tensor([42.0], device=dev), 1)
    else:
        got = torch.zeros(1, device=dev)
        dist.recv(got, 0)
        eq(got, [42.0])
    work = dist.all_reduce(torch.ones(2, device=dev), async_op=True)
    assert work.wait() and work.get_future().wait()[0].cpu().tolist() == [2.0, 2.0]
    fut = work.get_future()
    assert fut.done() and fut.value()[0].cpu().tolist() == [2.0, 2.0]
    p = torch.full((2,), float(rank + 2), device=dev)
    dist.all_reduce(p, op=dist.ReduceOp.PRODUCT)
    eq(p, [6.0, 6.0])
    for op, want in ((dist.ReduceOp.BAND, 5 & 6), (dist.ReduceOp.BOR, 5 | 6), (dist.ReduceOp.BXOR, 5 ^ 6)):
        b = torch.full((3,), rank + 5, dtype=torch.int32, device=dev)
        dist.all_reduce(b, op=op)
        eq(b, [want] * 3)
    try:
        dist.all_reduce(torch.ones(1, device=dev), op=dist.ReduceOp.BAND)
        raise AssertionError("a bitwise and of floats should be refused")
    except Exception as e:
        assert "band is bitwise: it reduces integer and bool tensors, not f32" in str(e), e
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank} collectives ok", flush=True)
    """
)

DDP = textwrap.dedent(
    """
    import json, torch, torch.distributed as dist, transformers
    import polychip.torch as pt
    from polychip.torch.distributed import device_for_rank

    dist.init_process_group("polychip")
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = device_for_rank(vendors=["Ferrite", "Cobalt"])
    cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to(dev)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    ids = torch.randint(0, 96, (4, 16), generator=torch.Generator().manual_seed(1))
    mine = ids[rank * 2:(rank + 1) * 2].to(dev)
    losses = []
    for step in range(5):
        loss = ddp(mine, labels=mine).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        whole = loss.detach().clone()
        dist.all_reduce(whole, op=dist.ReduceOp.AVG)
        losses.append(whole.item())
    if rank == 0:
        print("LOSSES " + json.dumps(losses), flush=True)
    dist.destroy_process_group()
    """
)


UNUSED_AND_TIMEOUT = textwrap.dedent(
    """
    import time
    from datetime import timedelta
    import torch, torch.distributed as dist
    import polychip.torch
    from polychip.torch.distributed import device_for_rank

    dist.init_process_group("polychip")
    rank = dist.get_rank()
    dev = device_for_rank(vendors=["Ferrite", "Cobalt"])
    # DDP's reducer asks the device for pinned host memory for its map of
    # used parameters, and asserts that it got it.
    class Two(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.used, self.unused = torch.nn.Linear(4, 2), torch.nn.Linear(4, 2)
        def forward(self, x):
            return self.used(x)
    torch.manual_seed(0)
    model = Two().to(dev)
    ddp = torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=True)
    ddp(torch.ones(3, 4, device=dev) * (rank + 1)).sum().backward()
    assert model.unused.weight.grad is None
    g = model.used.weight.grad.cpu()
    assert torch.allclose(g, torch.full((2, 4), 4.5)), g
    print(f"rank {rank} unused ok", flush=True)
    # A process group's timeout is its communicator's: rank 1 comes 8 s
    # late, rank 0 gives up after 3. (A group made here, where the ranks are
    # in step: 3 s for the whole job would also bound its start, which a
    # loaded machine can spread further.)
    short = dist.new_group(timeout=timedelta(seconds=3))
    if rank == 1:
        time.sleep(8)
    else:
        start = time.monotonic()
        try:
            dist.all_reduce(torch.ones(2, device=dev), group=short)
        except Exception as e:
            print(f"rank 0 timed out after {time.monotonic() - start:.1f}: {e}", flush=True)
    """
)


SYNC_BATCH_NORM = textwrap.dedent(
    """
    import torch, torch.distributed as dist
    import polychip.torch
    from polychip.torch.distributed import device_for_rank

    dist.init_process_group("polychip")
    rank = dist.get_rank()
    dev = device_for_rank(vendors=["Ferrite", "Cobalt"])
    torch.manual_seed(0)
    def net():
        return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU())
    whole, mine = net(), net()
    mine.load_state_dict(whole.state_dict())
    ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.SyncBatchNorm.convert_sync_batchnorm(mine).to(dev))
    x = torch.randn(4, 3, 5, 5, generator=torch.Generator().manual_seed(1))
    out = ddp(x[2 * rank:2 * rank + 2].to(dev))
    (out * out).sum().backward()
    # One process on the whole batch: the same statistics, so the same
    # outputs, running statistics and (DDP averages over two) gradients.
    want = whole(x)
    (want * want).sum().backward()
    torch.testing.assert_close(out.detach().cpu(), want[2 * rank:2 * rank + 2].detach(), rtol=1e-5, atol=1e-5)
    for p, q in zip(mine.parameters(), whole.parameters()):
        torch.testing.assert_close(p.grad.cpu(), q.grad / 2, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(mine[1].running_mean.cpu(), whole[1].running_mean)
    torch.testing.assert_close(mine[1].running_var.cpu(), whole[1].running_var)
    print(f"rank {rank} sync batch norm ok", flush=True)
    dist.destroy_process_group()
    """
)


SECRET = textwrap.dedent(
    """
    import os, tempfile
    import torch, torch.distributed as dist
    import polychip.torch
    # No secret from the launcher, and each rank its own user secret file
    # (as on two machines): only the secret published through PyTorch's
    # store can let them meet.
    os.environ.pop("POLYCHIP_JOB_SECRET", None)
    os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp()
    dist.init_process_group("polychip")
    t = torch.ones(4)
    dist.all_reduce(t)
    assert t.tolist() == [2.0] * 4, t
    print(f"rank {dist.get_rank()} secret ok", flush=True)
    dist.destroy_process_group()
    """
)


FSDP_AND_FRIENDS = textwrap.dedent(
    """
    import copy, sys
    import torch, torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
    import polychip.torch
    from polychip.torch.distributed import device_for_rank

    dist.init_process_group("polychip")
    rank = dist.get_rank()
    dev = device_for_rank(vendors=["Ferrite", "Cobalt"])
    torch.polychip.set_device(dev)
    # In place, as FSDP gathers and reduce-scatters: this rank's part of
    # the output is the input.
    out = torch.zeros(4, device=dev)
    out[2 * rank:2 * rank + 2] = rank + 1.0
    dist.all_gather_into_tensor(out, out[2 * rank:2 * rank + 2])
    assert out.cpu().tolist() == [1.0, 1.0, 2.0, 2.0], out
    inp = torch.arange(4.0, device=dev) + rank
    dist.reduce_scatter_tensor(inp[2 * rank:2 * rank + 2], inp)
    assert inp[2 * rank:2 * rank + 2].cpu().tolist() == [[1.0, 3.0], [5.0, 7.0]][rank], inp
    # Objects holding device tensors pickle (the object collectives do).
    got = [None, None]
    dist.all_gather_object(got, {"rank": rank, "x": torch.full((2,), float(rank), device=dev)})
    assert [g["x"].cpu().tolist() for g in got] == [[0.0, 0.0], [1.0, 1.0]], got
    def train_both(whole, mine, part):
        # Three SGD steps: `whole` on the batch here, `mine` on `part` of it
        # on the device.
        opt_w = torch.optim.SGD(whole.parameters(), lr=0.1)
        opt_m = torch.optim.SGD(mine.parameters(), lr=0.1)
        for step in range(3):
            x = torch.randn(4, 6, generator=torch.Generator().manual_seed(step))
            opt_w.zero_grad(), opt_m.zero_grad()
            (whole(x) ** 2).mean().backward()
            (mine(part(x).to(dev)) ** 2).mean().backward()
            opt_w.step(), opt_m.step()

    # FSDP (its storages shrink to nothing and grow back) trains as one
    # process on the whole batch.
    for strategy in (ShardingStrategy.FULL_SHARD, ShardingStrategy.SHARD_GRAD_OP, ShardingStrategy.NO_SHARD):
        torch.manual_seed(0)
        whole = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
        mine = FSDP(copy.deepcopy(whole), sharding_strategy=strategy, device_id=dev)
        train_both(whole, mine, lambda x: x[2 * rank:2 * rank + 2])
        with FSDP.summon_full_params(mine):
            for p, q in zip(mine.parameters(), whole.parameters()):
                torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-5, atol=1e-6)
        print(f"rank {rank} {strategy.name} ok", flush=True)
    # Distributed checkpointing (it asks the accelerator for its streams).
    path = sys.argv[1]
    dcp.save({"w": torch.arange(4.0, device=dev) + rank * 0}, checkpoint_id=path)
    back = {"w": torch.zeros(4, device=dev)}
    dcp.load(back, checkpoint_id=path)
    assert back["w"].cpu().tolist() == [0.0, 1.0, 2.0, 3.0], back
    # A device mesh, and what is built on it: FSDP2 and tensor parallelism.
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
    mesh = init_device_mesh("polychip", (2,))
    for how in ("fsdp2", "tensor parallel"):
        torch.manual_seed(0)
        whole = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
        mine = copy.deepcopy(whole).to(dev)
        if how == "fsdp2":
            fully_shard(mine[0], mesh=mesh), fully_shard(mine[2], mesh=mesh), fully_shard(mine, mesh=mesh)
            part = lambda x: x[2 * rank:2 * rank + 2]
        else:
            parallelize_module(mine, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
            part = lambda x: x
        train_both(whole, mine, part)
        for p, q in zip(mine.parameters(), whole.parameters()):
            torch.testing.assert_close(p.full_tensor().cpu(), q.detach(), rtol=1e-5, atol=1e-6)
        print(f"rank {rank} {how} ok", flush=True)
    # Batched sends and receives: swaps of 3 floats and of 8 MiB each way
    # (past 1 MiB, one send after another would wait for the other's
    # receive), two messages a direction, a CPU tensor among them.
    for n in (3, 2 << 20):
        send, recv = torch.full((n,), float(rank), device=dev), torch.zeros(n, device=dev)
        extra, extra_in = torch.arange(5.0) + rank, torch.zeros(5)
        ops = [dist.P2POp(dist.isend, send, 1 - rank), dist.P2POp(dist.isend, extra, 1 - rank),
               dist.P2POp(dist.irecv, recv, 1 - rank), dist.P2POp(dist.irecv, extra_in, 1 - rank)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        assert torch.equal(recv.cpu(), torch.full((n,), 1.0 - rank)), recv
        assert extra_in.tolist() == (torch.arange(5.0) + 1 - rank).tolist(), extra_in
    # Ranks that disagree on a broadcast's root fail, each saying so (last:
    # the communicator is unusable after).
    try:
        dist.broadcast(torch.full((4,), float(rank), device=dev), src=rank)
        print(f"rank {rank} broadcast from disagreeing roots returned", flush=True)
    except Exception as e:
        print(f"rank {rank} disagreeing roots refused: {e}", flush=True)
    print(f"rank {rank} fsdp and friends ok", flush=True)
    """
)


GLOO_BESIDE = textwrap.dedent(
    """
    import torch, torch.distributed as dist
    import polychip.torch
    from polychip.torch.distributed import device_for_rank

    dev = device_for_rank(rank=int(__import__("os").environ["RANK"]), vendors=["Ferrite", "Cobalt"])
    # gloo for CPU tensors and polychip for the device's, bound to this
    # rank's device (both used to fail: the gloo half was dropped, and
    # device_id recursed).
    dist.init_process_group("cpu:gloo,polychip:polychip", device_id=dev)
    rank = dist.get_rank()
    t = torch.tensor([1, 2, 3], dtype=torch.int8) * (rank + 1)
    dist.broadcast(t, 1)
    assert t.tolist() == [2, 4, 6], t
    d = torch.ones(2, device=dev)
    dist.all_reduce(d)
    assert d.cpu().tolist() == [2.0, 2.0], d
    dist.monitored_barrier()
    print(f"rank {rank} gloo beside ok", flush=True)
    dist.destroy_process_group()
    """
)


def launch(tmp_path, code, how, *args):
    script = tmp_path / "ranks.py"
    script.write_text(code)
    if how == "polychip launch":
        cmd = [str(PROFILE_DIR / "polychip"), "launch", "-n", "2", "--", sys.executable, str(script), *args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", str(script), *args]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    return run.stdout


@pytest.mark.parametrize("how", ["polychip launch", "torchrun"])
def test_every_collective_across_two_vendors(tmp_path, how):
    out = launch(tmp_path, COLLECTIVES, how)
    assert "rank 0 collectives ok" in out and "rank 1 collectives ok" in out, out


def test_ddp_finds_unused_parameters_and_the_group_timeout_holds(tmp_path):
    out = launch(tmp_path, UNUSED_AND_TIMEOUT, "torchrun")
    assert "rank 0 unused ok" in out and "rank 1 unused ok" in out, out
    waited = float(out.split("rank 0 timed out after ", 1)[1].split(":", 1)[0])
    assert 2.5 <= waited < 7.5, out


def test_sync_batch_norm_across_two_vendors_matches_the_whole_batch(tmp_path):
    out = launch(tmp_path, SYNC_BATCH_NORM, "torchrun")
    assert "rank 0 sync batch norm ok" in out and "rank 1 sync batch norm ok" in out, out


def test_fsdp_in_place_collectives_checkpoints_and_disagreeing_roots_across_two_vendors(tmp_path):
    out = launch(tmp_path, FSDP_AND_FRIENDS, "torchrun", str(tmp_path / "dcp"))
    for rank in (0, 1):
        for strategy in ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "fsdp2", "tensor parallel"):
            assert f"rank {rank} {strategy} ok" in out, out
        assert f"rank {rank} disagreeing roots refused" in out, out
        assert f"rank {1 - rank} called broadcast of 4 x f32, root {1 - rank}" in out, out
        assert f"rank {rank} fsdp and friends ok" in out, out


DTYPES = textwrap.dedent(
    """
    import torch, torch.distributed as dist
    import polychip.torch
    from polychip.torch.distributed import device_for_rank

    dist.init_process_group("polychip")
    rank = dist.get_rank()
    dev = device_for_rank(vendors=["Ferrite", "Cobalt"])
    mine = lambda dtype: (torch.arange(4) * (rank + 1) - 3).to(dtype)
    both = [torch.arange(4) * (r + 1) - 3 for r in range(2)]
    # float64, uint8 and bool reduce on the device and on the CPU (uint8
    # wraps; bool sums and maxima are or, minima and); int8, int16 and
    # uint16 CPU tensors, which the device does not hold, reduce widened.
    for dtype in (torch.float64, torch.uint8, torch.bool, torch.int8, torch.int16, torch.uint16):
        places = ["cpu", dev] if dtype in (torch.float64, torch.uint8, torch.bool) else ["cpu"]
        for where in places:
            for op, combine in ((dist.ReduceOp.SUM, lambda a, b: a + b), (dist.ReduceOp.MAX, torch.maximum),
                                (dist.ReduceOp.MIN, torch.minimum)):
                t = mine(dtype).to(where)
                dist.all_reduce(t, op=op)
                # In int64 (the CPU has no uint16 arithmetic), wrapped back.
                wide = [b.to(dtype).to(torch.float64 if dtype.is_floating_point else torch.int64) for b in both]
                want = combine(*wide) if dtype != torch.bool else {
                    dist.ReduceOp.SUM: both[0].bool() | both[1].bool(), dist.ReduceOp.MAX: both[0].bool() | both[1].bool(),
                    dist.ReduceOp.MIN: both[0].bool() & both[1].bool()}[op]
                assert torch.equal(t.cpu(), want.to(dtype)), (dtype, where, op, t, want)
    # Moves of dtypes the device's operators do not take travel as bytes,
    # from the CPU or stored on the device; their reductions widened.
    for dtype in (torch.int8, torch.int16, torch.float8_e4m3fn, torch.complex64):
        for where in ("cpu", dev):
            t = mine(dtype).to(where)
            dist.broadcast(t, 1)
            assert t.device.type == torch.device(where).type
            assert torch.equal(t.cpu().view(torch.uint8), both[1].to(dtype).view(torch.uint8)), (dtype, t)
            out = torch.empty(8, dtype=dtype, device=where)
            dist.all_gather_into_tensor(out, mine(dtype).to(where))
            assert torch.equal(out.cpu().view(torch.uint8), torch.cat(both).to(dtype).view(torch.uint8)), (dtype, out)
            got = torch.empty(4, dtype=dtype, device=where)
            ops = [dist.P2POp(dist.isend, mine(dtype).to(where), 1 - rank), dist.P2POp(dist.irecv, got, 1 - rank)]
            for w in dist.batch_isend_irecv(ops):
                w.wait()
            assert torch.equal(got.cpu().view(torch.uint8), both[1 - rank].to(dtype).view(torch.uint8)), (dtype, got)
    t = mine(torch.int8).to(dev)
    dist.all_reduce(t)
    assert t.device == dev and torch.equal(t.cpu(), (both[0] + both[1]).to(torch.int8)), t
    # An expanded view cannot take the result: refused before either rank
    # communicates (the all-reduce ran, then its write-back failed), so
    # the next collective still pairs up.
    try:
        dist.all_reduce(torch.ones(1, device=dev).expand(4))
        raise AssertionError("an expanded tensor was reduced into")
    except RuntimeError as e:
        assert "holds some elements more than once" in str(e), e
    t = mine(torch.float64).to(dev)
    dist.all_reduce(t)
    assert torch.equal(t.cpu(), (both[0] + both[1]).to(torch.float64)), t
    try:
        dist.all_reduce(mine(torch.float8_e4m3fn))
    except ValueError as e:
        assert "does not reduce torch.float8_e4m3fn" in str(e), e
        print(f"rank {rank} dtypes ok", flush=True)
    """
)


def test_reductions_and_moves_of_every_dtype_across_two_vendors(tmp_path):
    out = launch(tmp_path, DTYPES, "torchrun")
    assert "rank 0 dtypes ok" in out and "rank 1 dtypes ok" in out, out


REFUSED = textwrap.dedent(
    """
    import time, traceback
    import torch, torch.distributed as dist
    import polychip.torch
    from polychip.torch.distributed import device_for_rank

    start = time.monotonic()
    dist.init_process_group("polychip")
    rank = dist.get_rank()
    dev = device_for_rank(vendors=["Ferrite", "Cobalt"])
    def check(fn):
        try:
            fn()
        except Exception as e:
            assert "receives 1 from it" in str(e), e
            traceback.print_exc()
    def refused():
        # A receive from this rank with no send: refused before anything moves.
        if rank == 1:
            r = torch.zeros(1, device=dev)
            dist.recv(r, src=1)
    check(refused)
    t = torch.ones(2, device=dev)
    dist.all_reduce(t)
    assert t.cpu().tolist() == [2.0, 2.0], t
    dist.destroy_process_group()
    print(f"rank {rank} ended at {time.monotonic() - start:.1f} s", flush=True)
    """
)


def test_a_refused_receive_leaves_nothing_that_holds_the_communicator_open(tmp_path, monkeypatch):
    # The refusal's traceback, kept by the receive's future through
    # PyTorch's C++, held the backend: its communicator stayed open past
    # destroy_process_group, and the peer's final barrier waited out the
    # whole timeout (20 s here; 30 minutes by default).
    monkeypatch.setenv("POLYCHIP_COMM_TIMEOUT_SECS", "20")
    out = launch(tmp_path, REFUSED, "torchrun")
    for rank in (0, 1):
        ended = float(out.split(f"rank {rank} ended at ", 1)[1].split(" s", 1)[0])
        assert ended < 15, out


PIPELINING = textwrap.dedent(
    """
    import copy
    import torch, torch.distributed as dist
    import polychip.torch
    from polychip.torch.distributed import device_for_rank
    from torch.distributed.pipelining import (
        PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble,
        ScheduleLoopedBFS,
    )

    dist.init_process_group("polychip")
    rank = dist.get_rank()
    dev = device_for_rank(vendors=["Ferrite", "Cobalt"])
    # Early receives, then sends, then waits (4 MiB each way): receives
    # that blocked would wait on each other.
    a, b = torch.full((1 << 20,), float(rank), device=dev), torch.zeros(1 << 20, device=dev)
    received, sent = dist.irecv(b, 1 - rank), dist.isend(a, 1 - rank)
    received.wait(), sent.wait()
    assert torch.equal(b.cpu(), torch.full((1 << 20,), float(1 - rank))), b
    print(f"rank {rank} early receives ok", flush=True)
    # A send queued on one group is run by a wait on another (the peer
    # answers on the second only once it has the first).
    other = dist.new_group([0, 1])
    x, y = torch.full((4,), 1.0 + rank, device=dev), torch.zeros(4, device=dev)
    if rank == 0:
        w = dist.isend(x, 1)
        dist.recv(y, 1, group=other)
        w.wait()
    else:
        dist.recv(y, 0)
        dist.send(x, 0, group=other)
    assert y.cpu().tolist() == [2.0 - rank] * 4, y
    # More sends and receives queued than one group takes (4,096).
    if rank == 0:
        works = [dist.isend(torch.full((1,), float(i)), 1) for i in range(4500)]
    else:
        got = [torch.zeros(1) for _ in range(4500)]
        works = [dist.irecv(g, 0) for g in got]
    for w in works:
        w.wait()
    assert rank == 0 or [g.item() for g in got] == [float(i) for i in range(4500)]
    print(f"rank {rank} queues ok", flush=True)
    torch.manual_seed(0)
    whole = torch.nn.Sequential(
        torch.nn.Linear(16, 512),
        torch.nn.Sequential(torch.nn.GELU(), torch.nn.Linear(512, 512)),
        torch.nn.Sequential(torch.nn.Tanh(), torch.nn.Linear(512, 512)),
        torch.nn.Sequential(torch.nn.GELU(), torch.nn.Linear(512, 8)),
    )
    # Micro-batches of 1,024 x 512 floats (2 MiB) each way between the
    # stages: more than a plain send holds before its receive.
    x, y = torch.randn(4096, 16), torch.randn(4096, 8)
    loss_fn = torch.nn.MSELoss()
    ref = copy.deepcopy(whole)
    losses = [loss_fn(ref(xc), yc) for xc, yc in zip(x.chunk(4), y.chunk(4))]
    (sum(losses) / 4).backward()  # the schedules scale gradients by the micro-batch count
    # One stage a rank (parts 0-1 on Ferrite, 2-3 on Cobalt), then two
    # (0 and 2 on Ferrite, 1 and 3 on Cobalt), every hop between vendors.
    single = [(ScheduleGPipe, "GPipe"), (Schedule1F1B, "1F1B")]
    looped = [(ScheduleInterleaved1F1B, "Interleaved1F1B"), (ScheduleInterleavedZeroBubble, "InterleavedZeroBubble"),
              (ScheduleLoopedBFS, "LoopedBFS")]
    for schedule, name in single + looped:
        if (schedule, name) in single:
            mine = [[0, 1], [2, 3]][rank]
            parts = [copy.deepcopy(whole[mine[0]:mine[1] + 1]).to(dev)]
            stages = [PipelineStage(parts[0], rank, 2, dev)]
            refs = [ref[mine[0]:mine[1] + 1]]
        else:
            mine = [rank, rank + 2]
            parts = [copy.deepcopy(whole[i]).to(dev) for i in mine]
            stages = [PipelineStage(p, i, 4, dev) for p, i in zip(parts, mine)]
            refs = [ref[i] for i in mine]
        sched = schedule(stages[0] if len(stages) == 1 else stages, n_microbatches=4, loss_fn=loss_fn)
        got = []
        if rank == 0:
            sched.step(x.to(dev))
        else:
            sched.step(target=y.to(dev), losses=got)
            torch.testing.assert_close(sum(l.cpu() for l in got), sum(losses).detach(), rtol=1e-5, atol=1e-6)
        for part, r in zip(parts, refs):
            for p, q in zip(part.parameters(), r.parameters()):
                torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-4, atol=1e-6)
        print(f"rank {rank} {name} ok", flush=True)
    dist.destroy_process_group()
    """
)

SCHEDULES = ("early receives", "queues", "GPipe", "1F1B", "Interleaved1F1B", "InterleavedZeroBubble", "LoopedBFS")


def test_torch_pipelining_across_two_vendors_matches_one_process(tmp_path):
    # torch.distributed.pipelining sends each stage's activations and
    # gradients with isend/irecv and batch_isend_irecv, receives posted
    # before the sends they wait for: the backend queues them and runs them
    # as one group at the wait.
    out = launch(tmp_path, PIPELINING, "torchrun")
    for rank in (0, 1):
        for name in SCHEDULES:
            assert f"rank {rank} {name} ok" in out, out


def test_gloo_for_cpu_tensors_beside_polychip_and_a_bound_device(tmp_path):
    out = launch(tmp_path, GLOO_BESIDE, "torchrun")
    assert "rank 0 gloo beside ok" in out and "rank 1 gloo beside ok" in out, out


def test_without_a_secret_from_the_launcher_the_ranks_share_one_through_the_torch_store(tmp_path):
    out = launch(tmp_path, SECRET, "torchrun")
    assert "rank 0 secret ok" in out and "rank 1 secret ok" in out, out


def test_ddp_across_two_vendors_matches_one_process_on_the_whole_batch(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    out = launch(tmp_path, DDP, "polychip launch")
    got = json.loads(out.split("LOSSES ", 1)[1].splitlines()[0])
    cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    ids = torch.randint(0, 96, (4, 16), generator=torch.Generator().manual_seed(1))
    want = []
    for _ in range(5):
        # The whole batch's mean loss is the mean of the halves' (equal token
        # counts), so DDP's averaged gradients are this one's.
        loss = model(ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        want.append(loss.item())
    for a, b in zip(got, want):
        assert abs(a - b) <= 2e-5 * abs(b), (got, want)
    assert want[-1] < want[0]
