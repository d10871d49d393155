"""Thread-pool sizing: pure function of the environment and core counts."""

import pytest

from pshybrid.threads import THREAD_VARS, cores_per_rank, ranks_per_node, thread_limits


@pytest.mark.parametrize("env,usable,node,want", [
    ({"MPI_LOCALNRANKS": "4"}, 2, 2, 1),             # oversubscribed: one thread each
    ({"MPI_LOCALNRANKS": "4"}, 64, 64, 16),          # 64 cores, 4 ranks
    ({"OMPI_COMM_WORLD_LOCAL_SIZE": "8"}, 64, 64, 8),
    ({"SLURM_NTASKS_PER_NODE": "4(x2)"}, 32, 32, 8),
    ({}, 8, 8, 8),                                    # not under a launcher: all cores
    ({"MPI_LOCALNRANKS": "4"}, 6, 64, 6),            # bound by the launcher: its binding
])
def test_thread_limits(env, usable, node, want):
    assert thread_limits(env, usable, node) == {v: str(want) for v in THREAD_VARS}


def test_user_setting_wins():
    assert thread_limits({"OMP_NUM_THREADS": "3", "MPI_LOCALNRANKS": "4"}, 8, 8) == {}


def test_ranks_per_node_garbage():
    assert ranks_per_node({"MPI_LOCALNRANKS": "x"}) == 1


@pytest.mark.parametrize("env,usable,node,want", [
    ({"MPI_LOCALNRANKS": "3"}, 2, 2, 2 / 3),         # oversubscribed: no spare core
    ({"MPI_LOCALNRANKS": "4"}, 64, 64, 16.0),
    ({"MPI_LOCALNRANKS": "4"}, 1, 64, 1.0),          # bound to one core
    ({}, 8, 8, 8.0),
])
def test_cores_per_rank(env, usable, node, want):
    """Decides the data thread (--prefetch none): 2 batches ahead only from 2 cores up."""
    assert cores_per_rank(env, usable, node) == pytest.approx(want)
