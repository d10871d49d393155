#!/usr/bin/env python3
"""mpiexec -n 2 python bench/rma_leak.py [--ops 200000] [--rows 50]

Does this MPI library keep memory for each one-sided operation? Rank 0 issues ``--ops``
operations into rank 1's window, each of ``--rows`` scattered rows as pshybrid's pushes and
pulls are (an hindexed datatype at the target, flushed at once), and prints the growth of
its resident memory per operation after the first 20% (warm-up), beside the same count of
contiguous Accumulates and of indexed Gets (the references). 0 B/op: nothing kept. MPICH
5.0.2 (the ``mpich`` wheel) keeps 128 B per indexed Accumulate between ranks of one node
(``docs/clusters.md``).
"""

from __future__ import annotations

import argparse

import numpy as np
from mpi4py import MPI

from timing import at_least, description  # bench/timing.py (a sibling)


def rss_kb() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def growth(win, op, n: int) -> float:
    """Bytes of resident memory per call of ``op`` after the first 20% of ``n``."""
    marks = []
    for i in range(n):
        if i == n // 5:
            marks.append(rss_kb())
        op()
        win.Flush(1)  # Wire: the operation completes at rank 1; only rank 0 waits
    return (rss_kb() - marks[0]) * 1024 / (n - n // 5)


def main() -> None:
    p = argparse.ArgumentParser(description=description(__doc__))
    # (every rank refuses alike: --ops 0 failed on rank 0 alone, and rank 1 hung)
    p.add_argument("--ops", type=at_least(5), default=200_000, help="operations timed")
    p.add_argument("--rows", type=at_least(1), default=50)
    a = p.parse_args()
    comm, dim, table = MPI.COMM_WORLD, 8, 10_000
    if comm.size != 2:
        raise SystemExit("run with mpiexec -n 2")
    # Wire: collective window creation; rank 1 exposes a table of float32 rows
    win = MPI.Win.Allocate(table * dim * 4 if comm.rank == 1 else 0, 4, comm=comm)
    win.Lock_all()
    buf = np.zeros((a.rows, dim), np.float32)
    rows = np.sort(np.random.default_rng(0).choice(table, a.rows, replace=False))
    scattered = MPI.FLOAT.Create_hindexed_block(dim, (rows * dim * 4).tolist()).Commit()
    ops = {  # Wire (each): rank 0 -> rank 1's window, one-sided
        "Accumulate, indexed rows": lambda: win.Accumulate(buf, 1, [0, 1, scattered],
                                                           op=MPI.SUM),
        "Accumulate, contiguous": lambda: win.Accumulate(buf, 1, [0, buf.size, MPI.FLOAT],
                                                         op=MPI.SUM),
        "Get, indexed rows": lambda: win.Get(buf, 1, [0, 1, scattered]),
    }
    if comm.rank == 0:
        print(f"{MPI.Get_library_version().splitlines()[0]}; {a.ops:,} operations of "
              f"{a.rows} rows x {dim} float32 each, rank 0 -> rank 1")
        for name, op in ops.items():
            print(f"  {name:26s} {growth(win, op, a.ops):8.1f} B/op kept")
    comm.Barrier()  # Wire: rank 1 waits for rank 0's operations to end
    win.Unlock_all()
    scattered.Free()
    win.Free()


if __name__ == "__main__":
    main()
