"""A ``pshybrid.torch`` script whose worker 1 raises inside ``try: ... finally:
pt.shutdown()`` while worker 0 goes on to its next step (a collective): the exception ends
the whole job (it hung: shutdown's collectives on worker 1, the step's on worker 0).

mpiexec -n 2 python tests/jobs/torch_raise_in_finally.py [hybrid|allreduce]
"""

import sys

import torch

import pshybrid.torch as pt

mode = sys.argv[1] if len(sys.argv) > 1 else "allreduce"
if pt.init(servers=1 if mode == "hybrid" else 0, mode=mode,
           tables=[pt.Table("t", rows=8, dim=2)]):
    model = torch.nn.Linear(2, 1)
    opt = pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
    try:
        for step in range(3):
            if step == 1 and pt.worker_index() == pt.num_workers() - 1:
                raise ValueError("the last worker's bug")
            opt.zero_grad()
            model(torch.ones(4, 2)).sum().backward()
            opt.step()
    finally:
        pt.shutdown()
    print("not reached")
