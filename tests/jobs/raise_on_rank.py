"""Fault injection for the launcher test.

mpiexec -n 4 python tests/jobs/raise_on_rank.py RANK KIND
KIND: 'crash' (RuntimeError), 'user' (a PshybridError on that rank alone).
Every other rank waits in a barrier that can never complete: only an abort ends the job.
"""

import sys

from mpi4py import MPI

from pshybrid.errors import InputError
from pshybrid.launch import run


def main(argv):
    bad, kind = int(argv[0]), argv[1]
    world = MPI.COMM_WORLD.Dup()
    world.Barrier()
    if world.rank == bad:
        if kind == "crash":
            raise RuntimeError(f"injected failure on rank {bad}")
        raise InputError(f"injected bad row 42 on rank {bad}")
    world.Barrier()  # never completes
    return 0


if __name__ == "__main__":
    sys.exit(run(main, sys.argv[1:]))
