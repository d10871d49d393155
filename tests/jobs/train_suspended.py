"""``train`` suspended as a whole after worker 0's step ``STEP`` (where the log of a
``--log-every`` step begins): every rank stopped (``SIGSTOP``) and continued ``SECONDS``
later (``SIGCONT``), as ``scontrol suspend``/``resume`` do to a job; each rank writes its
pid into ``DIR`` first. The rest of the arguments are ``python -m pshybrid``'s.

mpiexec -n N python tests/jobs/train_suspended.py DIR STEP SECONDS train [options]
"""

import os
import signal
import subprocess
import sys

import pshybrid.steplog
from pshybrid.cli import main

folder, step, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
with open(os.path.join(folder, f"pid.{os.getpid()}"), "w") as f:
    f.write(str(os.getpid()))
read_back = pshybrid.steplog.StepLog.read_back


def suspended(log, done):
    if log.job.topo.worker_index == 0 and done == step:
        pids = [int(n.split(".")[1]) for n in os.listdir(folder) if n.startswith("pid.")]
        # (its own session: the continue must not be stopped with the job)
        subprocess.Popen(["sh", "-c", f"sleep {seconds}; kill -CONT {' '.join(map(str, pids))}"],
                         start_new_session=True)
        for pid in sorted(pids, key=lambda p: p == os.getpid()):  # this rank last
            os.kill(pid, signal.SIGSTOP)
    return read_back(log, done)


pshybrid.steplog.StepLog.read_back = suspended
sys.exit(main(sys.argv[4:]))
