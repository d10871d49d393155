"""``pt.shutdown()`` called while an exception is about (mpiexec -n N python THIS MODE CASE):

- ``one``: the last worker raises inside ``try: ... finally: pt.shutdown()`` while the
  others go on to their next step (a collective): the exception ends the whole job (it
  hung: shutdown's collectives on one worker, the step's on the others);
- ``after``: the last worker raises after the loop, inside ``try: ... finally:
  pt.shutdown()``, while the others are in ``pt.shutdown()`` (their census saw its
  exception's and reported the workers out of step);
- ``all``: every worker raises the same early stop and handles it with ``pt.shutdown()``
  in its ``except``: the job ends normally (status 0);
- ``exit``: every worker calls ``sys.exit(3)`` inside ``try: ... finally: pt.shutdown()``:
  status 3.

A third argument, TIMEOUT: ``pt.init(timeout=TIMEOUT)``, and ``SHUTDOWN_WAIT_S`` left at its
default (30 s, past TIMEOUT: the wait is then TIMEOUT / 2), instead of 3 s within the
default timeout.
"""

import sys

import torch

import pshybrid.torch as pt
import pshybrid.torch.session

mode, case = sys.argv[1], sys.argv[2]
timeout = float(sys.argv[3]) if len(sys.argv) > 3 else 600.0
if len(sys.argv) == 3:
    pshybrid.torch.session.SHUTDOWN_WAIT_S = 3.0  # (the test's: 30 s by default)


class EarlyStop(Exception):
    pass


if pt.init(servers=1 if mode == "hybrid" else 0, mode=mode, timeout=timeout,
           tables=[pt.Table("t", rows=8, dim=2)]):
    model = torch.nn.Linear(2, 1)
    opt = pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
    try:
        for step in range(3):
            if step == 1 and case == "exit":
                sys.exit(3)
            if step == 1 and case == "all":
                raise EarlyStop()
            if step == 1 and case == "one" and pt.worker_index() == pt.num_workers() - 1:
                raise ValueError("the last worker's bug")
            opt.zero_grad()
            model(torch.ones(4, 2)).sum().backward()
            opt.step()
        if case == "after" and pt.worker_index() == pt.num_workers() - 1:
            raise ValueError("the last worker's bug")
    except EarlyStop:
        pt.shutdown()
        print("stopped early")
    finally:
        pt.shutdown()
    if case == "one" or case == "after" and pt.worker_index() == pt.num_workers() - 1:
        print("not reached")
