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
``SLURM_NTASKS_PER_NODE``). Pure apart from the final ``os.environ`` update.

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
    cores, else the node's cores / ranks on this node (below 1 when oversubscribed)."""
    if usable_cores < node_cores:  # the launcher bound this rank: trust the binding
        return float(usable_cores)
    return node_cores / ranks_per_node(environ)


def thread_limits(environ, usable_cores: int, node_cores: int) -> dict[str, str]:
    """The variables to set (empty if the user set any of them)."""
    if any(v in environ for v in THREAD_VARS):
        return {}
    n = max(1, int(cores_per_rank(environ, usable_cores, node_cores)))
    return {v: str(n) for v in THREAD_VARS}


def _cores() -> tuple[int, int]:
    """(cores this process may run on, cores of the node)."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return usable or 1, os.cpu_count() or 1


def rank_cores() -> float:
    """``cores_per_rank`` of this process."""
    return cores_per_rank(os.environ, *_cores())


def sizing_rule(environ, usable_cores: int, node_cores: int) -> str:
    """Which branch of ``cores_per_rank`` applies, in words."""
    if usable_cores < node_cores:
        return f"bound to {usable_cores} of the node's {node_cores} cores"
    k = ranks_per_node(environ)
    return f"{node_cores} cores / {k} rank{'s' if k > 1 else ''} on the node"


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
