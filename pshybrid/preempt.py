"""Stopping a run early on a signal, at a step boundary, with a checkpoint.

A cluster ends a job with a signal: Slurm's ``--signal=USR1@120`` (and a preemption's
grace period, or a time limit) send SIGUSR1 or SIGTERM to every rank a while before
SIGKILL. When the run writes checkpoints (``--checkpoint-dir``), the training loop catches
both: the handler only raises a flag; at each step boundary the workers agree whether any
of them was signalled (an Iallreduce of one int started at one boundary and completed at
the next, so the agreement costs no wait of its own: it finishes under the next step), and
all stop at the same step, write the checkpoint of that step, end the job normally and exit
with status ``PREEMPTED`` (75, EX_TEMPFAIL: "try again"). Rerunning the command with
``--resume DIR`` continues from it (``jobs/`` scripts do that themselves).

A signal that reaches only the servers is not seen (launchers send it to every rank). A
second SIGTERM ends the process at once (the default action is restored by the first).
Without ``--checkpoint-dir`` nothing is installed: the signals keep their default action.
"""

from __future__ import annotations

import signal
import threading

import numpy as np
from mpi4py import MPI

PREEMPTED = 75  # exit status of a run stopped by a signal after writing its checkpoint
SIGNALS = (signal.SIGUSR1, signal.SIGTERM)


class Preemption:
    """The workers' stop decision. ``install()`` before the loop, ``stop()`` at every step
    boundary (collective over ``workers``, same call sequence on every worker),
    ``close()`` after the loop (completes the agreement in flight, restores the handlers).
    ``signal``: the name of the first signal this rank caught, or None."""

    def __init__(self, workers: MPI.Comm, enabled: bool):
        self.workers, self.enabled = workers, enabled
        self.flag = np.zeros(1, np.int32)   # set by the handler
        self.seen = np.zeros(1, np.int32)   # the agreement in flight: any worker's flag
        self.signal: str | None = None
        self._req: MPI.Request | None = None
        self._old: dict = {}

    def install(self) -> None:
        if not self.enabled or threading.current_thread() is not threading.main_thread():
            return
        for sig in SIGNALS:
            self._old[sig] = signal.signal(sig, self._caught)

    def _caught(self, signum, frame) -> None:
        self.flag[0] = 1
        if self.signal is None:
            self.signal = signal.Signals(signum).name
        if signum == signal.SIGTERM:  # a second SIGTERM: the default action (end now)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)

    def stop(self) -> bool:
        """At a step boundary: True when every worker is to stop here (some worker was
        signalled before the previous boundary). Wire: completes the Iallreduce(MAX) of one
        int32 started at the previous boundary, starts the next; all workers take part."""
        if not self.enabled:
            return False
        agreed = False
        if self._req is not None:
            self._req.Wait()
            agreed = bool(self.seen[0])
        if not agreed:
            self.seen[:] = self.flag
            self._req = self.workers.Iallreduce(MPI.IN_PLACE, [self.seen, MPI.INT32_T],
                                                op=MPI.MAX)
        else:
            self._req = None
        return agreed

    def close(self, complete: bool = True) -> None:
        """Restore the handlers; ``complete``: also finish the agreement in flight (not on
        an error: the other workers may never join it, and the job is being aborted)."""
        if self._req is not None and complete:
            self._req.Wait()  # Wire: the last agreement's Iallreduce completes on every worker
        self._req = None
        for sig, old in self._old.items():
            signal.signal(sig, signal.SIG_DFL if old is None else old)
        self._old = {}


def notice(signame: str | None, step: int, checkpoint_dir: str) -> str:
    """The line worker 0 prints when the run stops on a signal."""
    return (f"pshybrid: stopped by {signame or 'a signal'} at step {step}: checkpoint "
            f"{checkpoint_dir}/step-{step} written; continue with --resume {checkpoint_dir} "
            f"(exit status {PREEMPTED})")
