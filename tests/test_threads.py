"""Thread-pool sizing: pure function of the environment and core counts."""

import pytest

from pshybrid.threads import (THREAD_VARS, blas_threads, cores_per_rank, ranks_per_node,
                              server_threads, thread_limits)


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


@pytest.mark.parametrize("env,usable,node,override,want", [
    ({"MPI_LOCALNRANKS": "3"}, 2, 2, None, (1, "2 cores / 3 ranks on the node")),
    ({"MPI_LOCALNRANKS": "2"}, 2, 2, None, (1, "2 cores / 2 ranks on the node")),
    ({"MPI_LOCALNRANKS": "4"}, 64, 64, None, (16, "64 cores / 4 ranks on the node")),
    ({}, 2, 2, None, (2, "2 cores / 1 rank on the node")),
    ({"MPI_LOCALNRANKS": "4"}, 6, 64, None, (6, "bound to 6 of the node's 64 cores")),
    ({"MPI_LOCALNRANKS": "3"}, 2, 2, 2, (2, "--server-threads")),  # the user's word wins
])
def test_server_threads(env, usable, node, override, want):
    """A server's optimizer apply: one thread per core the rank has, at least 1."""
    assert server_threads(env, usable, node, override) == want


def test_blas_threads_name_their_rule():
    env = {"MPI_LOCALNRANKS": "2"}
    applied = thread_limits(env, 8, 8)
    assert blas_threads({**env, **applied}, 8, 8, applied) == (4, "8 cores / 2 ranks on the node")
    user = {**env, **applied, "OPENBLAS_NUM_THREADS": "3"}  # not the value we set
    assert blas_threads(user, 8, 8, applied) == (3, "OPENBLAS_NUM_THREADS set in the environment")
    assert blas_threads({"OMP_NUM_THREADS": "5"}, 8, 8, {}) == \
        (5, "OMP_NUM_THREADS set in the environment")
    assert blas_threads(env, 8, 8, {})[0] is None  # not sized: the library's default
