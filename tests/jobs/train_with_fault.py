"""``python -m pshybrid train`` whose world rank RANK raises after step STEP (a test hook
passed to ``train(on_step=...)``, as a user's callback would be); first it prints the
shared-memory files it maps (``shared memory: PATH...``), which the abort must remove.

mpiexec -n 4 python tests/jobs/train_with_fault.py RANK STEP [train options]
"""

import sys

from mpi4py import MPI

from pshybrid.cli import build_parser
from pshybrid.config import TrainConfig, resolve
from pshybrid.launch import run
from pshybrid.train import train


def main(argv):
    rank, step = int(argv[0]), int(argv[1])
    args = build_parser().parse_args(["train", *argv[2:]])

    def fault(done):
        if MPI.COMM_WORLD.rank == rank and done == step:
            with open("/proc/self/maps") as f:  # the job's shared memory on this node
                shm = sorted({ln.split(None, 5)[5].strip() for ln in f if " /dev/shm/" in ln})
            print("shared memory:", *[p for p in shm if not p.endswith("(deleted)")],
                  file=sys.stderr, flush=True)
            raise RuntimeError(f"injected fault at step {step}")

    train(resolve(TrainConfig, args), MPI.COMM_WORLD, on_step=fault)
    return 0


if __name__ == "__main__":
    sys.exit(run(main, sys.argv[1:]))
