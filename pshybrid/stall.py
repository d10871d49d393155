"""A time limit on the collective calls of the workers: in a program that drives them itself
(``pshybrid.torch``), workers that call them out of step (one makes fewer steps, or calls
``pt.checkpoint`` where the others step) would otherwise wait in them for good; in ``train``
(its steps), a rank stopped or stuck (``SIGSTOP``, a hung file system) would hang the job.

``Watch`` is a daemon thread over one slot, the call this rank is inside (its name, its step
and since when); the calls set and clear it (``inside``: two attribute writes a call). A call
that lasts ``WARN_S`` gets one warning line naming it; one that lasts ``timeout`` seconds
ends the job with one line naming it (exit status 2), as ``torch.distributed``'s timeout
does (not one marked ``ends=False``: a wait by design); the time the whole process stood
still (stopped and continued: a suspended job) does not count. The thread makes no MPI call but
``MPI_Abort``, and that only under ``MPI_THREAD_MULTIPLE``; at a lower thread level it
ends this process (``os._exit``) and the launcher ends the others."""

from __future__ import annotations

import os
import sys
import threading
import time

from mpi4py import MPI

from .timers import OWN_WORK, WAITING
from .transport import abort, release_shared_memory

WARN_S = 60.0  # the warning's delay (none when the timeout comes first)
# A poll this much later than asked: the process was stopped (a job suspended with SIGSTOP
# and continued, as Slurm's ``scontrol suspend``/gang scheduling do to every rank): the time
# it stood still is not counted, so a resumed job goes on instead of ending at once
STOPPED_S = 2.0

ADVICE = ("the other workers (workers out of step wait for each other: every worker must make "
          "the same number of steps and call opt.step(), opt.synchronize(), pt.checkpoint and "
          "pt.shutdown alike)")

STEP_ADVICE = (f"the other ranks, or for its own work ({', '.join(OWN_WORK)}: this rank is "
               f"the slow one; {', '.join(WAITING)}: others; a rank printing no such line is "
               "stopped or stuck: SIGSTOP, swapping, a hung file system)")


class Watch:
    """Times the calls of this rank made ``with watch.inside(name, step):``."""

    def __init__(self, comm: MPI.Comm, who: str, timeout: float | None, advice: str = ADVICE,
                 setting: str = "pt.init(timeout=...)", phase=lambda: None):
        """``advice``: whom the calls wait for and why, in the lines; ``setting``: what
        sets the limit; ``phase()``: the part of the call this rank is in, if known."""
        self.comm, self.who, self.timeout, self.warn_s = comm, who, timeout, WARN_S
        self.advice, self.setting, self.phase = advice, setting, phase
        self._slot = None  # (name, step, since, ends) of the call this rank is inside
        self._next = None  # (name, step, ends) of the call ``inside`` names, until entered
        self._outer: list = []  # the slot each entered call found (nested: the outer's)
        self._stop = threading.Event()
        limits = [t for t in (timeout, self.warn_s) if t]
        self._thread = None
        if limits and comm.size > 1:
            self._poll = min(1.0, max(0.01, min(limits) / 10))  # (pt.init(timeout=1e-9))
            self._thread = threading.Thread(target=self._run, name="pshybrid-stall",
                                            daemon=True)
            self._thread.start()

    def inside(self, name: str, step: int, ends: bool = True) -> "Watch":
        """``ends`` False: a call that may wait long by design (``pt.shutdown`` while worker
        0 evaluates alone) gets the warning, never the end."""
        self._next = (name, step, ends)
        return self

    def __enter__(self):
        """(Inside a call already: the outer call stays the one timed.)"""
        name, step, ends = self._next
        self._outer.append(self._slot)
        if self._slot is None:
            self._slot = (name, step, time.monotonic(), ends)
        return self

    def __exit__(self, *exc):
        self._slot = self._outer.pop()
        return False

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self) -> None:
        warned = lost_in = None
        lost, last = 0.0, time.monotonic()
        while not self._stop.wait(self._poll):
            now = time.monotonic()
            late, last = now - last - self._poll, now
            slot = self._slot
            if slot is None:
                continue
            if slot is not lost_in:
                lost_in, lost = slot, 0.0
            if late > STOPPED_S:  # this process did not run: stopped, then continued
                lost += min(late, now - slot[2])
            waited, ends = now - slot[2] - lost, self.timeout if slot[3] else None
            if ends and waited >= ends:
                self._end(slot, waited)
            if self.warn_s and waited >= self.warn_s and warned is not slot and (
                    not ends or self.warn_s < ends):
                warned = slot
                self._write(f"pshybrid: warning ({self.who}): {self._where(slot, waited)}"
                            + (f"; the job ends at {ends:g} s" if ends else ""))

    def _where(self, slot, waited: float) -> str:
        name, step = slot[:2]
        phase = self.phase()
        part = f" (its {phase} phase)" if phase else ""
        return f"{waited:.0f} s inside {name} at step {step}{part}, waiting for {self.advice}"

    def _write(self, line: str) -> None:
        err = sys.__stderr__ or sys.stderr
        err.write(line + "\n")
        err.flush()

    def _end(self, slot, waited: float) -> None:
        self._write(f"pshybrid: error ({self.who}): {self._where(slot, waited)}; "
                    f"{self.setting} sets this limit")
        if MPI.Query_thread() == MPI.THREAD_MULTIPLE:
            abort(self.comm, 2)  # Wire: MPI_Abort ends every rank; nobody waits
        release_shared_memory()  # (what abort does first; the launcher ends the others)
        time.sleep(0.3)
        os._exit(2)
