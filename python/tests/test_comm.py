"""Two ranks under `polychip launch`, each on another vendor's device,
running collectives through polychip.comm."""

import subprocess
import sys
import textwrap

from conftest import PROFILE_DIR

SCRIPT = textwrap.dedent(
    """
    import numpy as np
    import polychip

    comm = polychip.comm.init()
    rank, world = comm.rank, comm.world_size
    vendor = "Ferrite" if rank == 0 else "Cobalt"
    dev = next(d for d in polychip.devices() if d.vendor == vendor)
    t = polychip.tensor(np.full(1000, rank + 1, dtype=np.float32), device=dev)
    comm.all_reduce(t)
    assert (t.numpy() == 3).all(), t.numpy()[:4]
    gathered = polychip.empty((world * 2,), device=dev)
    comm.all_gather(polychip.tensor([rank, rank], dtype="float32", device=dev), gathered)
    assert gathered.numpy().tolist() == [0, 0, 1, 1]
    b = polychip.tensor([7.0 if rank == 1 else 0.0], device=dev)
    comm.broadcast(b, root=1)
    assert b.numpy().tolist() == [7.0]
    # A swap of 2 MiB each way, each rank sending first: one group.
    mine = polychip.tensor(np.full(1 << 19, rank, dtype=np.float32), device=dev)
    theirs = polychip.empty((1 << 19,), device=dev)
    comm.p2p_group([("send", mine, 1 - rank), ("recv", theirs, 1 - rank)])
    assert (theirs.numpy() == 1 - rank).all(), theirs.numpy()[:4]
    half = comm.split(color=0, key=world - rank)
    assert half.world_size == 2 and half.rank == world - 1 - rank
    comm.barrier()
    comm.close()
    print(f"rank {rank} of {world} on {vendor}: ok", flush=True)
    """
)


def test_two_ranks_all_reduce_across_vendors(tmp_path):
    script = tmp_path / "ranks.py"
    script.write_text(SCRIPT)
    run = subprocess.run(
        [str(PROFILE_DIR / "polychip"), "launch", "-n", "2", "--", sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "rank 0 of 2 on Ferrite: ok" in run.stdout and "rank 1 of 2 on Cobalt: ok" in run.stdout, run.stdout


def test_a_peer_out_of_range_and_a_closed_comm_are_refused_clearly(cobalt):
    import pytest

    import polychip
    from polychip import errors

    comm = polychip.comm.init(rank=0, world_size=1)
    t = polychip.tensor([1.0], device=cobalt)
    # Used to panic in the transport (an index out of bounds).
    for call in (comm.send, comm.recv):
        with pytest.raises(errors.InvalidArgument, match=r"peer 3 is not a rank of this communicator \(ranks 0 to 0\)"):
            call(t, 3)
    with pytest.raises(ValueError, match=r'ops\[1\] is a "sned", not a "send" or a "recv"'):
        comm.p2p_group([("recv", t, 0), ("sned", t, 0)])
    with pytest.raises(errors.InvalidArgument, match=r"sends this rank 0 message\(s\) and receives 1"):
        comm.p2p_group([("recv", t, 0)])
    comm.p2p_group([])
    # A send to this rank goes to its receive from this rank.
    back = polychip.tensor([0.0], device=cobalt)
    comm.p2p_group([("send", t, 0), ("recv", back, 0)])
    assert back.numpy().tolist() == [1.0]
    comm.close()
    # Used to say "comm is NULL".
    for call in (lambda: comm.all_reduce(t), lambda: comm.rank, lambda: comm.split(0)):
        with pytest.raises(errors.InvalidArgument, match="the Comm was closed"):
            call()
    comm.close()
