"""A user's own script (no ``python -m mpi4py``, no pshybrid launcher) whose dataset raises
on one worker only: ``train`` itself must end the whole job, never leave the server and
the other worker waiting.

mpiexec -n 3 python tests/jobs/api_dataset_raises.py
"""

import io

from mpi4py import MPI

from pshybrid.config import TrainConfig
from pshybrid.schema import Schema
from pshybrid.synthetic import SyntheticCTR
from pshybrid.train import train


class Flaky:
    """The synthetic stream, except that worker 1's reads fail from row 64 on."""

    def __init__(self):
        self.inner = SyntheticCTR(seed=1, n_dense=2, cardinalities=(5, 7))
        self.schema = Schema(2, (5, 7))

    def rows(self, start, stop):
        if MPI.COMM_WORLD.rank == 1 and stop > 64:
            raise OSError(f"flaky storage: cannot read rows [{start}, {stop})")
        return self.inner.rows(start, stop)


cfg = TrainConfig(steps=50, batch_size=8, embedding_dim=4, mlp=(8,), servers=1, log_every=10)
train(cfg, MPI.COMM_WORLD, dataset=Flaky(), out=io.StringIO())
print("not reached", flush=True)
