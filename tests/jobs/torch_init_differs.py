"""``pt.init`` whose last rank passes another argument (``rows``: a table 2 rows smaller;
``mode``: allreduce where the others say hybrid; ``bucket``: another ``bucket_mb`` to
``DistributedOptimizer``). The rows ran to the end with the workers reading and updating
rows outside the server's shard; the mode hung; the buckets' Allreduces would not match.
Each ends with one line naming the argument.

mpiexec -n 3 python tests/jobs/torch_init_differs.py rows|mode|bucket
"""

import sys

import torch
from mpi4py import MPI

import pshybrid.torch as pt

case, last = sys.argv[1], MPI.COMM_WORLD.rank == MPI.COMM_WORLD.size - 1
rows = 280 - 2 * (case == "rows" and last)
mode, servers = ("allreduce", 0) if case == "mode" and last else ("hybrid", 1)
if pt.init(servers=servers, mode=mode, tables=[pt.Table("t", rows=rows, dim=2)]):
    model = torch.nn.Linear(3, 1)
    pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model,
                            bucket_mb=0.5 if case == "bucket" and pt.worker_index() else 1.0)
    pt.shutdown()
print("not reached")
