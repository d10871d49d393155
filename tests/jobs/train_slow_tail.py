"""``train`` with worker 0 slow at the end of each checkpoint or evaluation, after the
workers' last collective call of it: it spends ``SECONDS`` pruning old checkpoints
(``checkpoint``) or computing the AUC (``evaluation``), with ``stall.WARN_S`` set to
``WARN`` seconds; the rest of the arguments are ``python -m pshybrid``'s.

mpiexec -n N python tests/jobs/train_slow_tail.py WARN SECONDS checkpoint|evaluation train ...
"""

import sys
import time

import pshybrid.checkpoint
import pshybrid.stall
import pshybrid.steplog
from pshybrid.cli import main

pshybrid.stall.WARN_S = float(sys.argv[1])
module, name = ((pshybrid.checkpoint, "_remove_stale_temps") if sys.argv[3] == "checkpoint"
                else (pshybrid.steplog, "auc"))  # (worker 0 only, after the gather)
work = getattr(module, name)


def slow(*args):
    time.sleep(float(sys.argv[2]))
    return work(*args)


setattr(module, name, slow)
sys.exit(main(sys.argv[4:]))
