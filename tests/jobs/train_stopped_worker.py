"""``train`` with its last worker stopped (``SIGSTOP``: its own step timer stops with it) after
step ``STEP``'s collective calls, where the log of a ``--log-every`` step begins, or with
``STEP:checkpoint`` inside checkpoint ``STEP``, its files written, before the collective
call that ends their writing; with ``stall.WARN_S`` set to ``WARN`` seconds; the rest of the
arguments are ``python -m pshybrid``'s.

mpiexec -n N python tests/jobs/train_stopped_worker.py WARN STEP[:checkpoint] train [options]
"""

import os
import signal
import sys

import pshybrid.checkpoint
import pshybrid.stall
import pshybrid.steplog
from pshybrid.cli import main

pshybrid.stall.WARN_S = float(sys.argv[1])
STEP, _, WHERE = sys.argv[2].partition(":")
read_back = pshybrid.steplog.StepLog.read_back
write_files = pshybrid.checkpoint._write_files


def stop_last_worker(topo, step):
    if topo.worker_index == topo.n_workers - 1 and step == int(STEP):
        os.kill(os.getpid(), signal.SIGSTOP)  # (the launcher's SIGKILL ends it)


def stopped(log, done):
    stop_last_worker(log.job.topo, done)
    return read_back(log, done)


def stopped_writing(tmp, step, cfg, topo, *args, **kw):
    write_files(tmp, step, cfg, topo, *args, **kw)
    stop_last_worker(topo, step)


if WHERE == "checkpoint":
    pshybrid.checkpoint._write_files = stopped_writing
else:
    pshybrid.steplog.StepLog.read_back = stopped
sys.exit(main(sys.argv[3:]))
