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


def apply_thread_limits() -> dict[str, str]:
    """Set the limits in ``os.environ`` (call before importing NumPy); returns them."""
    limits = thread_limits(os.environ, *_cores())
    os.environ.update(limits)
    return limits
