"""A ``pshybrid.torch`` script whose workers call differently:

- ``steps``: the last worker makes one step fewer, then shuts down;
- ``batch``: the last worker passes another ``batch_size`` to ``pt.batches``;
- ``checkpoint``: worker 0 alone calls ``pt.checkpoint`` (a DDP habit), then steps on;
- ``phase``: worker 0 calls ``pt.checkpoint`` where the others start a ``pt.batches`` pass;
- ``last``: worker 0 alone calls ``pt.checkpoint`` after the loop, the others
  ``pt.shutdown()``;
- ``slow``: worker 0 takes 2 s before its last step (in step: a warning after
  ``stall.WARN_S``, set to 0.5 s here, and the job ends as usual);
- ``eval``: worker 0 takes 4 s alone after the loop (scoring a validation file, say)
  while the others wait in ``pt.shutdown()``: past ``TIMEOUT``, a warning and no end;
- ``zero``: worker 0 alone runs a batch more, ``opt.zero_grad()`` between its backward
  and its step (the backward's Allreduce, started, waits for the others);
- ``late``: every worker calls ``opt.step(); opt.zero_grad(); pt.checkpoint`` (in step),
  and the last worker's ``zero_grad`` would take 5 s where it waited for the wire (a
  stalled process): the others' checkpoint is no sign of a worker out of step;
- ``stop``: the last worker stops (``SIGSTOP``) before its second step: with one worker,
  nobody but the servers (their ``stall.Pulse``) can see it.

In ``hybrid`` mode the servers (colocated: every rank, each a worker with a shard) see the
first and end the job with one line naming what differs (it was their assertion traceback;
colocated, it waited for the timeout); the second and ``phase`` are one line from
the workers' census (it read overlapping rows for many steps), and so is ``last`` (it waited
for the timeout: ``pt.shutdown`` took no census); where a worker waits inside a step
(``checkpoint``; ``steps`` and ``zero`` in ``allreduce`` mode) its step's timer hears the
other's call and ends the job in seconds, naming both (they waited for good, then for
``pt.init``'s ``timeout``, seconds); ``stop`` ends at that timeout.

mpiexec -n N python tests/jobs/torch_out_of_step.py CASE hybrid|allreduce|colocated DATA TIMEOUT
"""

import os
import signal
import sys
import time

import torch

import pshybrid.stall
import pshybrid.torch as pt

case, mode, data, timeout = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
pshybrid.stall.WARN_S = 0.5 if case in ("slow", "eval") else pshybrid.stall.WARN_S
colocated = mode == "colocated"  # (hybrid, every rank a worker holding a shard)
if pt.init(servers=None if colocated else 1 if mode == "hybrid" else 0,
           mode="hybrid" if colocated else mode, timeout=timeout,
           placement="colocated" if colocated else "dedicated",
           tables=[pt.Table("t", rows=8, dim=2)]):
    first, last = pt.worker_index() == 0, pt.worker_index() == pt.num_workers() - 1
    model = torch.nn.Linear(2, 1)
    opt = pt.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model)
    emb = pt.Embedding("t")
    if case == "late" and last:
        from pshybrid.modes.dense import AllreduceDense
        settle = AllreduceDense.settle
        AllreduceDense.settle = lambda self: (time.sleep(5.0), settle(self))
    if case == "batch":
        next(iter(pt.batches(data, 4 if last else 2)))
    for step in range(2 if last and case == "steps" else 3):
        if case == "stop" and last and step == 1:
            os.kill(os.getpid(), signal.SIGSTOP)  # (the launcher's SIGKILL ends it)
        if case == "slow" and first and step == 2:
            time.sleep(2.0)
        opt.zero_grad()
        (model(emb(torch.tensor([1, 2]))).sum()).backward()
        opt.step()
        if case == "late" and step == 1:
            opt.zero_grad()
            pt.checkpoint(data + ".ckpt")
        if case in ("checkpoint", "phase") and first and step == 1:
            pt.checkpoint(data + ".ckpt")
        elif case == "phase" and step == 1:
            next(iter(pt.batches(data, 2)))
    if case == "eval" and first:
        time.sleep(4.0)
    if case == "last" and first:
        pt.checkpoint(data + ".ckpt")
    if case == "zero" and first:
        (model(emb(torch.tensor([1, 2]))).sum()).backward()
        opt.zero_grad()
        opt.step()
    pt.shutdown()
    print("done")
