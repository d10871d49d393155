"""Size each rank's BLAS/OpenMP thread pool to the cores it really has.

Several ranks per node each starting one BLAS thread per core oversubscribe the node: the
ranks' threads deschedule each other and every step waits for the slowest
(docs/benchmarks.md, Threads). ``python -m pshybrid`` calls
``apply_thread_limits()`` before NumPy is imported: unless the user already set
``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS`` or ``MKL_NUM_THREADS``, it sets all three to

    threads = cores this process may run on, if the launcher bound it to fewer than
              all cores (srun --cpu-bind, mpiexec -bind-to), else
              max(1, cores of the node // ranks on this node)

with the ranks per node read from the launcher's environment (MPICH/Hydra
``MPI_LOCALNRANKS``, Open MPI ``OMPI_COMM_WORLD_LOCAL_SIZE``, Slurm
``SLURM_NTASKS_PER_NODE``), and the cores capped by the process's CPU quota where its cgroup
has one (a container's ``docker --cpus``, a Kubernetes CPU limit: ``cpu_quota``), which
the affinity does not show. Pure apart from the final ``os.environ`` update.

``rank_cores()`` (the same arithmetic, unrounded) also decides whether the training
loop prepares batches on a background thread (``--prefetch``): not on a rank with fewer
than 2 cores, where that thread has no core to itself: it only competes with the step,
whose RMA waits then stretch (docs/benchmarks.md, Threads).

``server_threads`` sizes, by the same rule (or ``--server-threads N``), the threads of a
rank's optimizer apply on its shard (``pool``; a server's, or a colocated rank's inside its
step); a dedicated server also takes its part of the node's cores that no rank's share
covers. ``blas_threads`` and ``server_threads`` also name the rule that produced each figure
(``pshybrid info``).
"""

from __future__ import annotations

import os
import re

THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
_LOCAL_SIZE_VARS = ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE")


def ranks_per_node(environ) -> int:
    for var in _LOCAL_SIZE_VARS:
        m = re.match(r"\s*(\d+)", environ.get(var, ""))  # Slurm may say "4(x2)"
        if m and int(m.group(1)) > 0:
            return int(m.group(1))
    return 1


def cores_per_rank(environ, usable_cores: int, node_cores: int) -> float:
    """Cores one rank may use: its binding when the launcher bound it to fewer than all
    cores, but no more than the node's cores / ranks on this node where bindings that wide
    cannot all be apart (Open MPI's to a socket or NUMA domain: 8 ranks of a 16-core node,
    each bound to its 8-core socket, have 2 each); else the node's cores / ranks on this
    node (below 1 when oversubscribed)."""
    if own_binding(environ, usable_cores, node_cores):
        return float(usable_cores)
    return node_cores / ranks_per_node(environ)


def own_binding(environ, usable_cores: int, node_cores: int) -> bool:
    """The launcher bound this rank to fewer cores than the node's, and no wider than each
    of the node's ranks could have to itself: ``cores_per_rank`` trusts it."""
    return usable_cores < node_cores and usable_cores * ranks_per_node(environ) <= node_cores


def thread_limits(environ, usable_cores: int, node_cores: int) -> dict[str, str]:
    """The variables to set (empty if the user set any of them)."""
    if any(v in environ for v in THREAD_VARS):
        return {}
    n = max(1, int(cores_per_rank(environ, usable_cores, node_cores)))
    return {v: str(n) for v in THREAD_VARS}


def cpu_quota(cgroups: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> int | None:
    """Whole CPUs the process's cgroup may use (at least 1), the least quota over its cgroup
    and the ones above it: cgroup v2 ``cpu.max`` ("QUOTA PERIOD", or "max"), v1
    ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (-1: none); None where none is set or
    none can be read."""
    try:
        with open(cgroups) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    found = []
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        v2 = controllers == ""
        if not (v2 or "cpu" in controllers.split(",")):
            continue
        base = root if v2 else os.path.join(root, controllers)
        parts = [p for p in path.split("/") if p]
        for depth in range(len(parts), -1, -1):  # this cgroup, then its parents, the root
            found.append(_quota(os.path.join(base, *parts[:depth]), v2))
    quotas = [q for q in found if q is not None]
    return max(1, int(min(quotas))) if quotas else None


def _quota(directory: str, v2: bool) -> float | None:
    """One cgroup's CPU quota in CPUs, None if it has none (or it cannot be read)."""
    try:
        if v2:
            with open(os.path.join(directory, "cpu.max")) as f:
                quota, period = f.read().split()[:2]
        else:
            with open(os.path.join(directory, "cpu.cfs_quota_us")) as f:
                quota = f.read().strip()
            with open(os.path.join(directory, "cpu.cfs_period_us")) as f:
                period = f.read().strip()
        return int(quota) / int(period) if quota not in ("max", "-1") and int(period) else None
    except (OSError, ValueError):
        return None


def _cores() -> tuple[int, int]:
    """(cores this process may run on, cores of the node), each capped by a CPU quota."""
    usable, node, quota = len(binding()) or os.cpu_count() or 1, os.cpu_count() or 1, cpu_quota()
    return (usable, node) if quota is None else (min(usable, quota), min(node, quota))


def rank_cores() -> float:
    """``cores_per_rank`` of this process."""
    return cores_per_rank(os.environ, *_cores())


def sizing_rule(environ, usable_cores: int, node_cores: int) -> str:
    """Which branch of ``cores_per_rank`` applies, in words."""
    k = ranks_per_node(environ)
    if own_binding(environ, usable_cores, node_cores):
        return f"bound to {usable_cores} of the node's {node_cores} cores"
    share = f"{node_cores} cores / {k} rank{'s' if k > 1 else ''} on the node"
    return (f"bound to {usable_cores} of the node's {node_cores} cores, shared: {share}"
            if usable_cores < node_cores else share)


def server_threads(environ, usable_cores: int, node_cores: int,
                   override: int | None = None, servers_here: int = 0) -> tuple[int, str]:
    """(threads of this rank's optimizer apply, the rule): ``override`` (``--server-threads``)
    when given, else one per core the rank has, at least 1; ``servers_here`` > 0 (this rank
    is one of that many dedicated servers on its node, and not bound by the launcher): plus
    its part of the cores left over once every rank on the node has its whole share, which
    no rank's threads use otherwise (16 cores / 10 ranks: 6 left over, 3 for each of 2
    servers: a server's apply is what every worker of the step waits for)."""
    if override is not None:
        return int(override), "--server-threads"
    n = max(1, int(cores_per_rank(environ, usable_cores, node_cores)))
    rule = sizing_rule(environ, usable_cores, node_cores)
    if servers_here > 0 and usable_cores >= node_cores:
        spare = max(0, node_cores - n * ranks_per_node(environ))
        extra = spare // servers_here
        if extra:
            return n + extra, (f"{rule}, + {extra} of the {spare} left over "
                               f"({servers_here} server{'s' if servers_here > 1 else ''} "
                               "on the node)")
    return n, rule


def blas_threads(environ, usable_cores: int, node_cores: int,
                 applied: dict[str, str]) -> tuple[int | None, str]:
    """(BLAS/OpenMP threads of this rank, the rule); ``applied``: what
    ``apply_thread_limits`` set. None: nobody sized them (the library's default)."""
    for var in THREAD_VARS:
        if var in environ and applied.get(var) != environ[var]:
            m = re.match(r"\s*(\d+)", environ[var])
            return (int(m.group(1)) if m else None), f"{var} set in the environment"
    if applied:
        return int(applied[THREAD_VARS[0]]), sizing_rule(environ, usable_cores, node_cores)
    return None, "not sized (not started by python -m pshybrid): the library's default"


APPLIED: dict[str, str] = {}  # what ``apply_thread_limits`` set in this process


def rank_server_threads(override: int | None = None, servers_here: int = 0) -> tuple[int, str]:
    """``server_threads`` of this process."""
    return server_threads(os.environ, *_cores(), override, servers_here)


def rank_blas_threads() -> tuple[int | None, str]:
    """``blas_threads`` of this process."""
    return blas_threads(os.environ, *_cores(), APPLIED)


def apply_thread_limits() -> dict[str, str]:
    """Set the limits in ``os.environ`` (call before importing NumPy); returns them."""
    limits = thread_limits(os.environ, *_cores())
    os.environ.update(limits)
    APPLIED.update(limits)
    return limits


def binding() -> tuple[int, ...]:
    """The cores this process may run on (its affinity), in order."""
    cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else ()
    return tuple(sorted(cores))


def shared_cores(node_of_rank, bindings, node_cores) -> list[tuple[tuple[int, ...], list[int]]]:
    """Ranks bound to fewer cores than they are: [(ranks, the cores they are bound to)], a
    group of a node's ranks whose bindings overlap (directly or through another's) and are
    more than the cores of those bindings (two ranks bound to one core take turns on it;
    four bound to one 8-core socket do not). ``bindings[r]``: rank r's ``binding()``;
    ``node_cores[r]``: its node's cores (a rank that may run on all of them is not bound)."""
    groups: list[tuple[set, set]] = []  # (ranks, cores) of each group of overlapping ones
    for r, cores in enumerate(map(set, bindings)):
        if not 0 < len(cores) < node_cores[r]:
            continue
        ranks, cores = {r}, {(node_of_rank[r], c) for c in cores}
        for g in [g for g in groups if g[1] & cores]:  # (it joins every group it overlaps)
            groups.remove(g)
            ranks, cores = ranks | g[0], cores | g[1]
        groups.append((ranks, cores))
    return sorted((tuple(sorted(ranks)), sorted(c for _, c in cores))
                  for ranks, cores in groups if len(ranks) > len(cores))
