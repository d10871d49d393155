"""``train`` with its last worker stopped (``SIGSTOP``: its own step timer stops with it) after
step ``STEP``'s collective calls, where the log of a ``--log-every`` step begins, with
``stall.WARN_S`` set to ``WARN`` seconds; the rest of the arguments are ``python -m
pshybrid``'s.

mpiexec -n N python tests/jobs/train_stopped_worker.py WARN STEP train [options]
"""

import os
import signal
import sys

import pshybrid.stall
import pshybrid.steplog
from pshybrid.cli import main

pshybrid.stall.WARN_S = float(sys.argv[1])
read_back = pshybrid.steplog.StepLog.read_back


def stopped(log, done):
    topo = log.job.topo
    if topo.worker_index == topo.n_workers - 1 and done == int(sys.argv[2]):
        os.kill(os.getpid(), signal.SIGSTOP)  # (the launcher's SIGKILL ends it)
    return read_back(log, done)


pshybrid.steplog.StepLog.read_back = stopped
sys.exit(main(sys.argv[3:]))
