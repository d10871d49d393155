"""``train`` with worker 1 slow inside one step: it spends ``SECONDS`` in its ``fwd_bwd``
phase at step 5 (a rank far slower than the others, or stuck), with ``stall.WARN_S`` set
to ``WARN`` seconds; the rest of the arguments are ``python -m pshybrid``'s. Environment:
``SLOW_WORKER`` and ``SLOW_STEP`` (0-based) name another worker and step, ``FIRST_STEP_S``
sets ``stall.FIRST_STEP_S`` (the least limit of a run's first step).

mpiexec -n N python tests/jobs/train_slow_step.py WARN SECONDS train [options]
"""

import os
import sys
import time

import pshybrid.stall
import pshybrid.train
from pshybrid.cli import main

pshybrid.stall.WARN_S = float(sys.argv[1])
pshybrid.stall.FIRST_STEP_S = float(os.environ.get("FIRST_STEP_S", pshybrid.stall.FIRST_STEP_S))
WORKER, STEP = int(os.environ.get("SLOW_WORKER", 1)), int(os.environ.get("SLOW_STEP", 5))
step = pshybrid.train._step


def slow_step(job, at, *args, **kwargs):
    if job.topo.worker_index == WORKER and at == STEP:
        with job.mode.timers.time("fwd_bwd"):
            time.sleep(float(sys.argv[2]))
    return step(job, at, *args, **kwargs)


pshybrid.train._step = slow_step
sys.exit(main(sys.argv[3:]))
