"""A ``pshybrid.torch`` script that a signal stops (tests/test_signal_jobs.py):

- ``check``: checks ``pt.stop_requested()`` after each step and writes ``pt.checkpoint(CK)``
  there with the lr scheduler's state, as docs/torch.md shows; steps until stopped;
- ``ignore``: never checks (a script written before the stop existed); steps until stopped;
- ``resume``: resumes ``CK`` (and its scheduler's state) and steps to STEPS;
- ``fresh``: steps to STEPS uninterrupted;
- ``late``: 5 steps, then 2 s before ``pt.shutdown()`` (the test signals then);
- ``unended``: as ``check``, with no ``pt.shutdown()``; worker 0 logs each step to a file
  it never closes (DIR/log);
- ``goes-on``: as ``check`` with ``exit_servers=False``: after the run every rank meets in
  a world Barrier and exits 75 where the run was stopped.

Worker 0 creates DIR/stepped after step 3 (``late``: after the last; the test signals then), prints "after shutdown"
after ``pt.shutdown()``, and (``resume``, ``fresh``) writes the table's rows and the
model's parameters to DIR/<case>.npz. A step's ids are drawn from a generator seeded by the
step and the worker, so a resumed run reads what an uninterrupted one reads.

CK: $PSHYBRID_CKPT (``jobs/slurm_torch.sh`` sets it), else DIR/ck.

mpiexec -n N python tests/jobs/torch_preempt.py hybrid|allreduce|colocated CASE DIR [STEPS]
"""

import os
import sys
import time

import numpy as np
import torch
from mpi4py import MPI

import pshybrid.torch as pt

mode, case, where = sys.argv[1:4]
end = {"resume": 0, "fresh": 0, "late": 5}.get(case, 10**7) or int(sys.argv[-1])
ck = os.environ.get("PSHYBRID_CKPT") or os.path.join(where, "ck")  # (jobs/slurm_torch.sh's)
checks = case in ("check", "unended", "goes-on")
colocated = mode == "colocated"  # (hybrid, a shard on every rank, each a worker)
worker = pt.init(servers=None if colocated else 1 if mode == "hybrid" else 0,
                 mode="hybrid" if colocated else mode, seed=3,
                 placement="colocated" if colocated else "dedicated",
                 resume=ck if case == "resume" else None, exit_servers=case != "goes-on",
                 tables=[pt.Table("t", rows=64, dim=4, optimizer="adam", dtype=torch.float64)])
first = worker and pt.worker_index() == 0
if worker:
    torch.manual_seed(0)
    emb, model = pt.Embedding("t"), torch.nn.Linear(4, 1).double()
    opt = pt.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01), model)
    lr = torch.optim.lr_scheduler  # (SequentialLR: its constructor resets every rate)
    sched = lr.SequentialLR(opt, [lr.LinearLR(opt, start_factor=0.5, total_iters=4),
                                  lr.ExponentialLR(opt, gamma=0.9)], milestones=[4])
    if case == "resume":
        sched.load_state_dict(pt.resumed_state()["scheduler"])
        opt.restore_settings()  # the checkpoint's rates again, as opt.load_state_dict would
    log = open(os.path.join(where, "log"), "w") if first and case == "unended" else None
    while pt.steps_done() < end:
        g = torch.Generator().manual_seed(1000 * pt.steps_done() + pt.worker_index())
        opt.zero_grad()
        model(emb(torch.randint(0, 64, (8,), generator=g))).pow(2).mean().backward()
        opt.step()
        sched.step()
        if log:
            log.write(f"step {pt.steps_done()}\n")
        if first and pt.steps_done() == 3 and case != "late":
            open(os.path.join(where, "stepped"), "w").close()
        if checks and pt.stop_requested():
            pt.checkpoint(ck, state={"scheduler": sched.state_dict()})
            break
    if case == "late":
        if first:
            open(os.path.join(where, "stepped"), "w").close()
        time.sleep(2.0)
    if case in ("resume", "fresh") and first:
        with torch.no_grad():
            np.savez(os.path.join(where, f"{case}.npz"), rows=emb(torch.arange(64)).numpy(),
                     **{k: v.numpy() for k, v in model.state_dict().items()})
    if case != "unended":
        pt.shutdown()
if case == "goes-on":
    MPI.COMM_WORLD.Barrier()  # every rank meets after the run: none was ended
if first:
    print("after shutdown", pt.stop_requested(), flush=True)
if case == "goes-on":
    sys.exit(75 if pt.stop_requested() else 0)
