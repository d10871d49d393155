"""A ``pshybrid.torch`` script whose workers call differently (hybrid, 1 server):

- ``steps``: the last worker makes one step fewer, then shuts down;
- ``batch``: the last worker passes another ``batch_size`` to ``pt.batches``.

Each ends the job with one line naming what differs (it was the server's assertion
traceback, or overlapping rows read for many steps).

mpiexec -n 3 python tests/jobs/torch_out_of_step.py steps|batch DATA.h5
"""

import sys

import torch

import pshybrid.torch as pt

case, data = sys.argv[1], sys.argv[2]
if pt.init(servers=1, tables=[pt.Table("t", rows=8, dim=2)]):
    last = pt.worker_index() == pt.num_workers() - 1
    model = torch.nn.Linear(2, 1)
    opt = pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
    emb = pt.Embedding("t")
    if case == "batch":
        next(iter(pt.batches(data, 4 if last else 2)))
    for step in range(2 if last else 3):
        opt.zero_grad()
        (model(emb(torch.tensor([1, 2]))).sum()).backward()
        opt.step()
    pt.shutdown()
    print("not reached")
