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
    ({"OMPI_COMM_WORLD_LOCAL_SIZE": "8"}, 8, 16, 2.0),  # 8 ranks bound to their 8-core socket
    ({"MPI_LOCALNRANKS": "2"}, 8, 16, 8.0),          # 2 ranks, a socket each: their own
])
def test_cores_per_rank(env, usable, node, want):
    """Decides the data thread (--prefetch none): 2 batches ahead only from 2 cores up. A
    binding wider than the rank's share of the node, on each of the node's ranks, cannot be
    each one's own (Open MPI binds to a socket past 2 ranks): it took the whole socket, 4x
    as many BLAS threads as cores."""
    assert cores_per_rank(env, usable, node) == pytest.approx(want)


@pytest.mark.parametrize("env,usable,node,override,want", [
    ({"MPI_LOCALNRANKS": "3"}, 2, 2, None, (1, "2 cores / 3 ranks on the node")),
    ({"MPI_LOCALNRANKS": "2"}, 2, 2, None, (1, "2 cores / 2 ranks on the node")),
    ({"MPI_LOCALNRANKS": "4"}, 64, 64, None, (16, "64 cores / 4 ranks on the node")),
    ({}, 2, 2, None, (2, "2 cores / 1 rank on the node")),
    ({"MPI_LOCALNRANKS": "4"}, 6, 64, None, (6, "bound to 6 of the node's 64 cores")),
    ({"OMPI_COMM_WORLD_LOCAL_SIZE": "8"}, 8, 16, None,
     (2, "bound to 8 of the node's 16 cores, shared: 16 cores / 8 ranks on the node")),
    ({"MPI_LOCALNRANKS": "3"}, 2, 2, 2, (2, "--server-threads")),  # the user's word wins
])
def test_server_threads(env, usable, node, override, want):
    """A server's optimizer apply: one thread per core the rank has, at least 1."""
    assert server_threads(env, usable, node, override) == want


@pytest.mark.parametrize("env,usable,node,here,want", [
    # 16 cores, 10 ranks: 1 core a rank, 6 left over, 3 for each of 2 servers
    ({"MPI_LOCALNRANKS": "10"}, 16, 16, 2,
     (4, "16 cores / 10 ranks on the node, + 3 of the 6 left over (2 servers on the node)")),
    ({"MPI_LOCALNRANKS": "3"}, 16, 16, 1,   # 5 a rank, 1 left over
     (6, "16 cores / 3 ranks on the node, + 1 of the 1 left over (1 server on the node)")),
    ({"MPI_LOCALNRANKS": "10"}, 16, 16, 4, (2, "16 cores / 10 ranks on the node, + 1 of the "
                                                "6 left over (4 servers on the node)")),
    ({"MPI_LOCALNRANKS": "10"}, 16, 16, 7, (1, "16 cores / 10 ranks on the node")),  # 6 // 7
    ({"MPI_LOCALNRANKS": "2"}, 16, 16, 1, (8, "16 cores / 2 ranks on the node")),  # none over
    ({"MPI_LOCALNRANKS": "3"}, 2, 2, 1, (1, "2 cores / 3 ranks on the node")),  # oversubscribed
    ({"MPI_LOCALNRANKS": "8"}, 2, 16, 2, (2, "bound to 2 of the node's 16 cores")),  # bound
    ({"MPI_LOCALNRANKS": "10"}, 16, 16, 0, (1, "16 cores / 10 ranks on the node")),  # a worker
])
def test_dedicated_servers_share_the_cores_no_rank_has(env, usable, node, here, want):
    """A dedicated server not bound by the launcher adds its part of the node's cores that
    are left over once every rank has its whole share; bound, a worker, or nothing left
    over: as before. The user's --server-threads still wins."""
    assert server_threads(env, usable, node, None, here) == want
    assert server_threads(env, usable, node, 1, here) == (1, "--server-threads")


def test_blas_threads_name_their_rule():
    env = {"MPI_LOCALNRANKS": "2"}
    applied = thread_limits(env, 8, 8)
    assert blas_threads({**env, **applied}, 8, 8, applied) == (4, "8 cores / 2 ranks on the node")
    user = {**env, **applied, "OPENBLAS_NUM_THREADS": "3"}  # not the value we set
    assert blas_threads(user, 8, 8, applied) == (3, "OPENBLAS_NUM_THREADS set in the environment")
    assert blas_threads({"OMP_NUM_THREADS": "5"}, 8, 8, {}) == \
        (5, "OMP_NUM_THREADS set in the environment")
    assert blas_threads(env, 8, 8, {})[0] is None  # not sized: the library's default


def _cgroup(tmp_path, line: str, files: dict) -> int | None:
    """``cpu_quota`` of a process whose /proc/self/cgroup is ``line`` over a cgroup tree
    of ``files`` ({path under the root: text})."""
    from pshybrid.threads import cpu_quota

    (tmp_path / "cgroup").write_text(line + "\n")
    for rel, text in files.items():
        (tmp_path / "root" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "root" / rel).write_text(text)
    return cpu_quota(str(tmp_path / "cgroup"), str(tmp_path / "root"))


@pytest.mark.parametrize("line,files,want", [
    # cgroup v2: the least of this cgroup's and its parents' cpu.max, whole CPUs
    ("0::/kubepods/pod/c", {"kubepods/cpu.max": "400000 100000",
                            "kubepods/pod/c/cpu.max": "max 100000"}, 4),
    ("0::/kubepods/pod/c", {"kubepods/cpu.max": "800000 100000",
                            "kubepods/pod/c/cpu.max": "250000 100000"}, 2),
    ("0::/", {"cpu.max": "50000 100000"}, 1),             # half a CPU: still one thread
    ("0::/user.slice", {"user.slice/cpu.max": "max 100000"}, None),
    # cgroup v1, the container's cgroup mounted as the hierarchy's root (docker)
    ("4:memory:/x\n3:cpu,cpuacct:/docker/abc", {"cpu,cpuacct/cpu.cfs_quota_us": "300000",
                                                "cpu,cpuacct/cpu.cfs_period_us": "100000"}, 3),
    ("3:cpu,cpuacct:/", {"cpu,cpuacct/cpu.cfs_quota_us": "-1",
                         "cpu,cpuacct/cpu.cfs_period_us": "100000"}, None),
    ("0::/", {"cpu.max": "garbage"}, None),               # unreadable: no quota
    ("0::/", {}, None)])
def test_cpu_quota_of_a_cgroup_and_its_parents(tmp_path, line, files, want):
    assert _cgroup(tmp_path, line, files) == want


def test_a_cpu_quota_caps_the_cores_the_threads_are_sized_from(monkeypatch):
    """``docker --cpus 2`` on a 16-core host, affinity all 16: 2 ranks get 1 BLAS thread each
    (8 before: 16 threads on 2 CPUs' time)."""
    from pshybrid import threads

    monkeypatch.setattr(threads, "cpu_quota", lambda: 2)
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 16)
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: set(range(16)))
    assert threads._cores() == (2, 2)
    assert thread_limits({"MPI_LOCALNRANKS": "2"}, *threads._cores()) == {
        v: "1" for v in THREAD_VARS}


@pytest.mark.parametrize("nodes,bindings,cores,want", [
    ([0, 0], [(0,), (0,)], [2, 2], [((0, 1), [0])]),           # two ranks on one core
    ([0, 1], [(0,), (0,)], [2, 2], []),                         # core 0 of two nodes
    ([0] * 4, [tuple(range(8))] * 4, [16] * 4, []),             # 4 ranks on an 8-core socket
    ([0] * 9, [tuple(range(8))] * 9, [16] * 9, [(tuple(range(9)), list(range(8)))]),
    ([0] * 3, [(0, 1), (1, 2), (2,)], [8] * 3, []),             # overlapping, one core each
    ([0] * 4, [(0, 1), (1,), (0,), (5,)], [8] * 4, [((0, 1, 2), [0, 1])]),  # a chain of 3
    ([0, 0], [(0, 1), (0, 1)], [2, 2], []),                     # not bound: the OS places
])
def test_shared_cores_are_bindings_with_more_ranks_than_cores(nodes, bindings, cores, want):
    from pshybrid.threads import shared_cores

    assert shared_cores(nodes, bindings, cores) == want
