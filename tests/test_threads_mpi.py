"""The apply threads under a real topology (``Topology.create``, the launcher's ranks per
node): on a node of 16 cores no launcher bound (patched in), a worker and a colocated rank
get their share (16 // ranks), each dedicated server its share plus its part of the cores
left over (``threads.server_threads``); ``pshybrid info`` prints the same figures. Runs at
every world size tests/run.py uses (2 ranks: nothing left over; 3: 1; 5: 1, and 0 each for
2 servers); a training run's ranks apply on those counts."""

import argparse
import contextlib
import io
import os

import pytest

from mpi_util import assert_all
from pshybrid import cli, threads
from pshybrid.topology import Topology

CORES = 16


@pytest.fixture
def node16(monkeypatch, comm):
    if threads.ranks_per_node(os.environ) != comm.size:
        pytest.skip("the launcher did not say the ranks per node (MPI_LOCALNRANKS)")
    monkeypatch.setattr(threads, "_cores", lambda: (CORES, CORES))


def want(size: int, servers: int, dedicated_server: bool) -> int:
    base = CORES // size
    return base + ((CORES - base * size) // servers if dedicated_server else 0)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("servers", [1, 2])
def test_dedicated_servers_take_their_part_of_the_spare_cores(comm, node16, servers):
    if servers >= comm.size:
        pytest.skip(f"{servers} servers leave no worker among {comm.size} ranks")
    topo = Topology.create(comm, servers)
    got = threads.rank_server_threads(None, topo.servers_here)
    expect = want(comm.size, servers, topo.is_server)
    assert_all(comm, got[0] == expect and topo.servers_here == (servers if topo.is_server
                                                                 else 0), (got, expect))
    colocated = Topology.create(comm, colocated=True)
    got = threads.rank_server_threads(None, colocated.servers_here)
    assert_all(comm, got[0] == CORES // comm.size, got)
    colocated.free()
    topo.free()


@pytest.mark.mpi(min_size=2)
def test_info_prints_each_ranks_apply_threads(comm, node16, monkeypatch):
    monkeypatch.setattr("mpi4py.MPI.COMM_WORLD", comm)  # info's topology over this test's ranks
    monkeypatch.setattr(threads, "cpu_quota", lambda: CORES)  # (a container's: said)
    args = argparse.Namespace(servers=1, mode="hybrid", placement="dedicated", device="cpu",
                              cuda_aware="auto", server_threads=None)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        cli.cmd_info(args)
    ok, msg = True, ""
    if comm.rank == 0:
        rows = [ln.split() for ln in out.getvalue().splitlines()
                if ln.split()[:1] and ln.split()[0].isdigit()]
        apply = {r[1]: r[9] for r in rows}
        ok = len(rows) == comm.size and apply["server"] == str(want(comm.size, 1, True)) \
            and apply["worker"] == "-"
        ok &= f"CPU quota       : {CORES} CPUs (cgroup)" in out.getvalue()
        msg = out.getvalue()
    assert_all(comm, ok, msg)


@pytest.mark.mpi(min_size=2)
def test_training_applies_on_those_threads(comm, node16, monkeypatch):
    """The count each rank's mode is built with (``Context.apply_threads``) in a short
    hybrid run with one dedicated server."""
    from pshybrid.config import TrainConfig
    from pshybrid.modes import step
    from pshybrid.train import train

    seen = []

    class Recorded(step.Context):
        def __post_init__(self):
            super().__post_init__()
            seen.append((self.topo.is_server, self.apply_threads))

    monkeypatch.setattr(step, "Context", Recorded)
    cfg = TrainConfig(model="wdl", embedding_dim=4, mlp=(8,), steps=2, batch_size=4, servers=1,
                      mode="hybrid", log_every=1000, progress="none")
    train(cfg, comm, out=io.StringIO())
    ok = len(seen) == 1 and seen[0][1] == want(comm.size, 1, seen[0][0])
    assert_all(comm, ok, seen)
