"""Partition math and server placement: pure functions, checked at simulated sizes."""

import numpy as np
import pytest

from pshybrid import partition
from pshybrid.errors import ConfigError
from pshybrid.topology import (check_servers, default_servers, launch_mismatch, library_mismatch,
                               place_servers, roles_per_node)

CASES = [(rows, S) for rows in (0, 1, 2, 7, 10, 13, 100, 1001) for S in (1, 2, 3, 5, 16)]


@pytest.mark.parametrize("rows,S", CASES)
def test_shards_cover_every_row_once(rows, S):
    sizes = [partition.shard_rows(rows, S, s) for s in range(S)]
    assert sum(sizes) == rows
    assert max(sizes) - min(sizes) <= 1
    ids = np.concatenate([partition.shard_ids(rows, S, s) for s in range(S)])
    assert sorted(ids.tolist()) == list(range(rows))
    for s in range(S):
        mine = partition.shard_ids(rows, S, s)
        assert len(mine) == sizes[s]
        # every id in shard s is owned by s at its position
        assert (partition.owner(mine, S) == s).all()
        assert (partition.local_row(mine, S) == np.arange(len(mine))).all()
        assert (partition.global_row(np.arange(len(mine)), s, S) == mine).all()


def test_round_trip_large_ids():
    S = 7
    ids = np.array([0, 1, 2**31 - 1, 2**31, 2**40 + 3, 2**62 + 5], dtype=np.int64)
    back = partition.global_row(partition.local_row(ids, S), partition.owner(ids, S), S)
    assert (back == ids).all()


@pytest.mark.parametrize("rows,S", [(10, 3), (1000, 4), (5, 8), (2**33, 3)])
def test_group_by_owner(rows, S):
    rng = np.random.default_rng(rows + S)
    ids = rng.integers(0, rows, size=(50, 3), dtype=np.int64)
    ids[1] = ids[0]  # duplicates for sure
    unique, inverse, bounds = partition.group_by_owner(ids, rows, S)
    assert inverse.shape == ids.shape
    assert (unique[inverse] == ids).all()
    assert sorted(unique.tolist()) == sorted(set(ids.ravel().tolist()))
    assert bounds[0] == 0 and bounds[-1] == len(unique)
    for s in range(S):
        grp = unique[bounds[s]:bounds[s + 1]]
        assert (partition.owner(grp, S) == s).all()
        assert (np.diff(partition.local_row(grp, S)) > 0).all()


def test_sort_key_is_bijection():
    rows, S = 23, 4
    ids = np.arange(rows, dtype=np.int64)
    keys = partition.sort_key(ids, rows, S)
    assert len(set(keys.tolist())) == rows
    assert (partition.key_to_global(keys, rows, S) == ids).all()


def test_bad_partition_arguments():
    with pytest.raises(ValueError):
        partition.shard_rows(10, 0, 0)
    with pytest.raises(ValueError):
        partition.shard_rows(10, 2, 2)


def test_place_servers_spreads_over_nodes_first():
    nodes = [0] * 4 + [1] * 4 + [2] * 4  # 3 nodes x 4 ranks
    assert place_servers(nodes, 3) == [3, 7, 11]        # one per node, highest local rank
    assert place_servers(nodes, 4) == [3, 6, 7, 11]     # a second round: node 0 last again
    assert place_servers(nodes, 0) == []
    assert place_servers([0, 0, 0, 0], 1) == [3]        # rank 0 stays a worker
    assert place_servers([0, 1, 2], 1) == [1]           # ... also alone on its node (it was
    assert place_servers([0, 1, 2], 2) == [1, 2]        # the server: node 0 came first)
    assert place_servers([0, 1, 1, 1], 1) == [3]
    assert place_servers([0, 1, 2], 3) == [0, 1, 2]     # one per node: rank 0 must serve
    # interleaved node order (ranks round-robin over nodes)
    assert place_servers([0, 1, 0, 1], 2) == [2, 3]
    with pytest.raises(ConfigError):
        place_servers([0, 0], 3)


def test_roles_per_node_counts_each_role_and_colocated_ranks_in_both():
    nodes = [0, 0, 0, 1, 1, 2]
    servers = place_servers(nodes, 2)                         # [4, 5]: rank 0's node last
    workers = [r for r in range(6) if r not in servers]
    assert roles_per_node(nodes, workers, servers) == {0: (3, 0), 1: (1, 1), 2: (0, 1)}
    assert roles_per_node(nodes, range(6), range(6)) == {0: (3, 3), 1: (2, 2), 2: (1, 1)}
    assert sum(w for w, _ in roles_per_node(nodes, workers, servers).values()) == 4


def test_a_launcher_that_started_several_tasks_of_one_rank_each_is_named():
    """srun --mpi=none (or pmix) with the mpich wheel, or Open MPI's mpirun starting it:
    every process is a job of one rank. The launcher's own count says so."""
    assert "srun started 4 tasks" in launch_mismatch(1, {"SLURM_STEP_NUM_TASKS": "4"})
    assert "mpirun started 2" in launch_mismatch(1, {"OMPI_COMM_WORLD_SIZE": "2"})
    assert launch_mismatch(4, {"SLURM_STEP_NUM_TASKS": "4"}) is None  # (the job it started)
    assert launch_mismatch(1, {"SLURM_STEP_NUM_TASKS": "1"}) is None
    assert launch_mismatch(1, {"PMI_SIZE": "1", "SLURM_STEP_NUM_TASKS": "2"}) is None  # hydra
    assert launch_mismatch(1, {}) is None  # (python alone)
    # the wheel's mpiexec (Hydra) starting ranks told to load another libmpi: the launcher
    hydra = launch_mismatch(1, {"PMI_SIZE": "3", "MPI4PY_LIBMPI": "libmpi.so.40"})
    # Intel MPI set up, the wheel's MPICH loaded (Intel's mpiexec runs it as one job)
    intel = {"I_MPI_ROOT": "/opt/intel/mpi"}
    assert "set MPI4PY_LIBMPI to its libmpi.so.12" in library_mismatch("MPICH Version: 5.0.2",
                                                                       intel)
    assert library_mismatch("Intel(R) MPI Library 2021.19", intel) is None
    assert library_mismatch("MPICH Version: 5.0.2", {**intel, "MPI4PY_LIBMPI": "x"}) is None
    assert library_mismatch("MPICH Version: 5.0.2", {}) is None
    assert "MPI4PY_LIBMPI=libmpi.so.40 is set: start it with that MPI's own launcher" in hydra


@pytest.mark.parametrize("S,N,need,ok", [
    (1, 2, True, True), (0, 1, False, True), (0, 3, True, False), (-1, 4, True, False),
    (2, 2, True, False), (3, 2, False, False), (4, 5, True, True)])
def test_check_servers(S, N, need, ok):
    if ok:
        check_servers(S, N, need)
    else:
        with pytest.raises(ConfigError) as e:
            check_servers(S, N, need)
        assert "--servers" in str(e.value) and e.value.collective


def test_default_servers():
    assert default_servers(1, 4) == 1
    assert default_servers(4, 16) == 4
    assert default_servers(4, 3) == 2
    assert default_servers(1, 1) == 0


def test_the_default_server_count_of_one_process_is_explained_not_blamed_on_the_user():
    """One process, no --servers: the message says what to do, not '--servers 0'."""
    with pytest.raises(ConfigError) as e:
        check_servers(default_servers(1, 1), 1, need_servers=True, given=False)
    msg = str(e.value)
    assert "--servers 0" not in msg and "mpiexec -n N with N >= 2" in msg
    assert "--mode allreduce" in msg and e.value.collective
    with pytest.raises(ConfigError, match="^--servers 0: this mode"):
        check_servers(0, 1, need_servers=True)  # named by the user: named back


def test_servers_here_counts_the_dedicated_servers_on_the_ranks_node():
    """``Topology.servers_here`` (what sizes a server's share of its node's spare cores):
    the dedicated servers on this rank's node, itself included; 0 on a worker and on a
    colocated rank. Ranks 0-3 on node 0, 4-7 on node 1; this process is world rank 0."""
    from mpi4py import MPI

    from pshybrid.topology import Topology

    nodes = [0] * 4 + [1] * 4

    def topo(servers, workers, me_serves, me_works):
        return Topology(MPI.COMM_SELF, MPI.COMM_SELF,
                        MPI.COMM_SELF if me_serves else MPI.COMM_NULL,
                        MPI.COMM_SELF if me_works else MPI.COMM_NULL,
                        servers, workers, nodes, ["a", "b"])

    assert topo([0, 3, 7], [1, 2, 4, 5, 6], True, False).servers_here == 2
    assert topo([0, 7], [1, 2, 3, 4, 5, 6], True, False).servers_here == 1
    assert topo([3, 7], [0, 1, 2, 4, 5, 6], False, True).servers_here == 0  # a worker
    t = topo([3, 7], [0, 1, 2, 4, 5, 6], False, True)
    assert t.dedicated_servers_on(0) == 1 and t.dedicated_servers_on(1) == 1
    every = list(range(8))
    assert topo(every, every, True, True).servers_here == 0  # colocated: no spare share
