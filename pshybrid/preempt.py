"""Stopping a run early on a signal, at a step boundary, in every mode and placement.

A cluster ends a job with a signal: Slurm's ``--signal=USR1@120``, a preemption's grace
period or a time limit send SIGTERM (or SIGUSR1) to every rank, or to the launcher, which
forwards it; a person presses Ctrl-C (SIGINT). For the whole of ``train`` every rank --
worker or server -- catches SIGUSR1, SIGTERM and SIGINT (``Signals``; not one it was
started with ignored, ``stopping.catch``): the handler only records the signal. Then
(``Preemption``):

- a server that caught one tells every worker (one int each, two-sided) from its loop;
- at each step boundary the workers agree whether any rank was signalled (an Iallreduce of
  one int started at one boundary and completed at the next: it costs no wait of its own);
- all workers stop at the same boundary, write that step's checkpoint when the run has a
  ``--checkpoint-dir`` (servers join it from their loop), end the job normally, and every
  rank exits with the same status (``exit_status``): 75 (EX_TEMPFAIL, "try again": a batch
  system requeues; rerun with ``--resume DIR``) after a checkpoint, 130 after SIGINT, else
  128 + the signal's number, after one line and no traceback.

Signals within ``SAME_REQUEST_S`` of a rank's first are the same request (a launcher
forwarding what the batch system already sent every rank). A later one ends that rank at
once (the signal's default action, after removing the job's shared memory on its node):
the job then ends without a new checkpoint, and ``latest`` still names a complete one.
Each signal is timed when it arrives (a thread reads the numbers Python's C-level handler
writes to the wakeup fd), not when Python runs its handler: that waits for the main thread
to come back from a wait in MPI, seconds later while a server writes its checkpoint, which
made a repeat within the window look like a later signal.
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time

import numpy as np
from mpi4py import MPI

from . import stopping
from .modes.servers import TAG_SIGNAL  # (one int32: the signal's number)
from .transport import release_shared_memory

PREEMPTED = 75  # exit status of a run stopped by a signal after writing its checkpoint
SIGNALS = (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)
SAME_REQUEST_S = 2.0


class Signals:
    """The process's catcher of ``SIGNALS`` (main thread only). ``install``/``uninstall``
    nest (``--mode auto`` runs trials inside a run); the outermost ``uninstall`` restores
    the previous handlers and forgets the signal. ``signum``: the first signal caught."""

    def __init__(self):
        self.signum: int | None = None
        self.signals: tuple = SIGNALS  # those the outermost ``install`` catches
        self.first = 0.0
        self._old: dict = {}
        self._depth = 0
        self._pipe: tuple[int, int] | None = None  # (read, write): the watcher's wakeup fd
        self._old_fd = -1

    @property
    def installed(self) -> bool:
        return self._depth > 0

    def install(self, signals: tuple = SIGNALS) -> None:
        """Catch ``signals`` (the outermost call's; a nested one keeps them)."""
        if threading.current_thread() is not threading.main_thread():
            return
        if self._depth == 0:
            self.signum, self.signals = None, tuple(signals)
            self._old = stopping.catch(self.signals, self._caught)
            self._watch()
        self._depth += 1

    def uninstall(self) -> None:
        if self._depth == 0:
            return
        self._depth -= 1
        if self._depth == 0:
            stopping.restore(self._old)
            if self._pipe is not None:  # the watcher reads the end of its pipe and ends
                signal.set_wakeup_fd(self._old_fd)
                os.close(self._pipe[1])
                self._pipe = None
            self._old, self.signum = {}, None

    def _watch(self) -> None:
        """Time each signal as it arrives: Python's C-level handler writes its number to the
        wakeup fd at once, which a thread reads (else the handler classifies, when it runs)."""
        r, w = os.pipe()
        os.set_blocking(w, False)
        try:
            self._old_fd = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        except (ValueError, OSError):
            os.close(r)
            os.close(w)
            return
        self._pipe = (r, w)
        threading.Thread(target=self._read, args=(r,), name="pshybrid-signals",
                         daemon=True).start()

    def _read(self, r: int) -> None:
        try:
            while data := os.read(r, 64):
                for signum in data:  # (every signal Python handles: SIGINT too)
                    if signum in self.signals:
                        self._arrived(signum, time.monotonic())
        finally:
            os.close(r)

    def _caught(self, signum, frame) -> None:
        if self._pipe is None or self.signum is None:  # (else the watcher timed it)
            self._arrived(signum, time.monotonic())

    def _arrived(self, signum: int, now: float) -> None:
        if self.signum is None:
            self.signum, self.first = signum, now
            return
        if now - self.first <= SAME_REQUEST_S:
            return  # the same request, forwarded once more
        # A later signal: end this rank now (os.write: no buffered I/O in a handler).
        os.write(2, f"pshybrid: {signal.Signals(signum).name} again "
                    f"{now - self.first:.1f} s after the first: ending now\n".encode())
        release_shared_memory()
        _default_action(signum)


def _default_action(signum: int) -> None:
    """End this process by ``signum``'s default action (from any thread: the C library's
    ``signal``, where Python's may only be called on the main thread)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.signal.argtypes, libc.signal.restype = [ctypes.c_int, ctypes.c_void_p], ctypes.c_void_p
    libc.signal(signum, None)  # SIG_DFL
    os.kill(os.getpid(), signum)
    time.sleep(1)  # (delivered at once; never past this)


CAUGHT = Signals()


def finish_quietly() -> None:
    """A process that ends after a run, its catcher still installed: MPI finalized now,
    while a signal is still the same request (mpi4py finalizes it at the interpreter's very
    end, after Python has put the signals' default actions back: a SIGTERM then killed the
    rank and left the job's shared memory), then ``SIGNALS`` ignored to the exit."""
    if MPI.Is_initialized() and not MPI.Is_finalized():
        MPI.Finalize()  # Wire: every rank of the job finalizes (each after its run)
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


class Preemption:
    """One run's stop decision over ``topo``. Workers call ``stop()`` at every step boundary
    (collective over the workers, same call sequence on each); servers call ``poll()``
    while they wait in their loop; every rank calls ``close()`` after the loop and then
    ``outcome()`` (collective over the world)."""

    def __init__(self, topo, catcher: Signals = CAUGHT):
        self.topo, self.caught = topo, catcher
        self.seen = np.zeros(1, np.int32)   # the agreement in flight: the largest signal
        self.agreed = 0                     # the signal the workers stopped on (0: none)
        self._req: MPI.Request | None = None
        self._told: list = []               # servers: the notices' requests and buffer
        self._heard: set[int] = set()       # workers: the servers whose notice arrived
        self._notice = np.zeros(1, np.int32)

    def _local(self) -> int:
        return self.caught.signum or 0

    # -- servers ---------------------------------------------------------------------------
    def poll(self) -> None:
        """Servers, while waiting: the first time a signal is seen here, tell every worker.
        Wire: Isend of one int32 (TAG_SIGNAL) to each worker; completed in ``close``."""
        if self._told or not self._local():
            return
        buf = np.array([self._local()], np.int32)
        self._told = [buf] + [self.topo.world.Isend([buf, MPI.INT32_T], r, TAG_SIGNAL)
                              for r in self.topo.worker_ranks]

    # -- workers ---------------------------------------------------------------------------
    def _hear(self, blocking_from=()) -> int:
        """The largest signal number the servers' notices carry (those that arrived, and a
        blocking receive from each server in ``blocking_from``)."""
        world, st, best = self.topo.world, MPI.Status(), 0
        while world.Iprobe(MPI.ANY_SOURCE, TAG_SIGNAL, st):
            self._recv_notice(st.source)
            best = max(best, int(self._notice[0]))
        for r in blocking_from:
            if r not in self._heard:
                self._recv_notice(r)
                best = max(best, int(self._notice[0]))
        return best

    def _recv_notice(self, source: int) -> None:
        # Wire: a server's one-int notice (TAG_SIGNAL); it was sent, so this returns soon
        self.topo.world.Recv([self._notice, MPI.INT32_T], source, TAG_SIGNAL)
        self._heard.add(source)

    def stop(self) -> bool:
        """At a step boundary: True when every worker is to stop here (some rank was
        signalled before the previous boundary). Wire: completes the Iallreduce(MAX) of one
        int32 started at the previous boundary, starts the next; all workers take part."""
        heard = self._hear() if self.topo.n_servers and not self.topo.colocated else 0
        if self._req is not None:
            self._req.Wait()
            self.agreed = int(self.seen[0])
        if self.agreed:
            self._req = None
            return True
        self.seen[0] = max(self._local(), heard)
        self._req = self.topo.workers.Iallreduce(MPI.IN_PLACE, [self.seen, MPI.INT32_T],
                                                 op=MPI.MAX)
        return False

    # -- every rank ------------------------------------------------------------------------
    def close(self, complete: bool = True) -> None:
        """After the loop. ``complete``: finish the agreement in flight and the notices
        sent (not on an error: the other ranks may never join, and the job is aborted)."""
        if complete:
            if self._req is not None:
                self._req.Wait()  # Wire: the last agreement's Iallreduce, on every worker
            if self._told:
                MPI.Request.Waitall(self._told[1:])  # Wire: the notices' sends complete
        self._req = None

    def outcome(self, stopped_at: int | None) -> tuple[int | None, int]:
        """Collective over the world, after ``close``: (the step the workers stopped at or
        None, the signal they stopped on or 0), the same on every rank. Workers receive
        every notice still on its way, so no message outlives the run.
        Wire: allgather of (stopped step, signal, notified?) from every rank; all wait."""
        topo = self.topo
        rows = topo.world.allgather((stopped_at, self.agreed, bool(self._told)))
        if topo.is_worker:
            self._hear([r for r in topo.server_ranks if rows[r][2] and not topo.colocated])
        step, sig, _ = rows[topo.worker_ranks[0]]
        return step, sig


def exit_status(signum: int, saved: bool) -> int:
    """The exit status of a run stopped by ``signum``: 130 for SIGINT (a person's Ctrl-C),
    else ``PREEMPTED`` after a checkpoint, else 128 + the signal's number."""
    if signum == signal.SIGINT:
        return 130
    return PREEMPTED if saved else 128 + signum


def notice(signum: int, step: int, checkpoint_dir: str | None) -> str:
    """The line worker 0 prints when the run stops on a signal."""
    name = signal.Signals(signum).name
    if not checkpoint_dir:
        return (f"pshybrid: stopped by {name} at step {step}; no --checkpoint-dir, so "
                f"nothing was saved (exit status {exit_status(signum, False)})")
    return (f"pshybrid: stopped by {name} at step {step}: checkpoint "
            f"{checkpoint_dir}/step-{step} written; continue with --resume {checkpoint_dir} "
            f"(exit status {exit_status(signum, True)})")


def launcher_grace(environ) -> str | None:
    """Why a signal to this job's launcher cannot leave a checkpoint, or None: Open MPI 4's
    ``mpirun`` (ORTE: ``OMPI_MCA_orte_hnp_uri`` in its ranks) passes a SIGTERM or SIGINT on
    as SIGTERM and kills the ranks ``odls_base_sigkill_timeout`` seconds later, 1 unless
    set (a set value is the user's choice)."""
    if "OMPI_MCA_orte_hnp_uri" not in environ or \
            "OMPI_MCA_odls_base_sigkill_timeout" in environ:
        return None
    return ("Open MPI's mpirun passes a SIGTERM or SIGINT on to the ranks 1 s late and kills "
            "them 1 s after that, too soon to write a checkpoint: stop the job with SIGUSR1 "
            "(passed on at once), or launch with --mca odls_base_sigkill_timeout S, S the "
            "seconds a checkpoint needs (docs/clusters.md)")
