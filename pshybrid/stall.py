"""A time limit on the collective calls of the workers: in a program that drives them itself
(``pshybrid.torch``), workers that call them out of step (one makes fewer steps, or calls
``pt.checkpoint`` where the others step) would otherwise wait in them for good; in ``train``
(its steps), a rank stopped or stuck (``SIGSTOP``, a hung file system) would hang the job.

``Watch`` is a daemon thread over one slot, the call this rank is inside (its name, its step
and since when); the calls set and clear it (``inside``: two attribute writes a call). A call
that lasts ``WARN_S`` gets one warning line naming it; one that lasts ``timeout`` seconds
ends the job with one line naming it (exit status 2), as ``torch.distributed``'s timeout
does (not one marked ``ends=False``: a wait by design); the time the whole process stood
still (stopped and continued: a suspended job) does not count. The thread makes no MPI
call but ``MPI_Abort``, ``Pulse``'s beats (zero-byte ``Isend``s) and its judge's probes
(``Iprobe``: a call that can never end, told before the timeout), and those only under
``MPI_THREAD_MULTIPLE``; at a lower thread level it sends no beat, and for the end it ends
this process (``os._exit``) and the launcher ends the others. ``Pulse``: those beats,
heard by the dedicated servers (a thread of theirs) and by the next worker (its ``Watch``
thread), which end the job when a worker's beats stop."""

from __future__ import annotations

import os
import sys
import threading
import time
from contextlib import contextmanager

import numpy as np
from mpi4py import MPI

from .timers import OWN_WORK, WAITING
from .transport import abort, release_shared_memory

WARN_S = 60.0  # the warning's delay (none when the timeout comes first)
# A poll this much later than asked: the process was stopped (a job suspended with SIGSTOP
# and continued, as Slurm's ``scontrol suspend``/gang scheduling do to every rank): the time
# it stood still is not counted, so a resumed job goes on instead of ending at once
STOPPED_S = 2.0
# A run's first step compiles kernels and touches pages first: it may last this long at
# least, whatever the timeout (it got the warning alone: a rank stuck in it, its thread
# beating, hung the job for good)
FIRST_STEP_S = 600.0
FIRST = "first"  # ``Watch.inside``'s ``ends`` for a run's first step
# A call this long is asked about by ``Watch``'s judge (a wait that cannot end: told before
# the timeout; sooner, a server's own line on it would race with the judge's)
JUDGE_S = 2.0

ADVICE = ("the other workers (workers out of step wait for each other: every worker must make "
          "the same number of steps and call opt.step(), opt.synchronize(), pt.checkpoint and "
          "pt.shutdown alike)")

STEP_ADVICE = (f"the other ranks, or for its own work ({', '.join(OWN_WORK)}: this rank is "
               f"the slow one; {', '.join(WAITING)}: others; a rank printing no such line is "
               "stopped or stuck: SIGSTOP, swapping, a hung file system)")


class Watch:
    """Times the calls of this rank made ``with watch.inside(name, step):``."""

    def __init__(self, comm: MPI.Comm, who: str, timeout: float | None, advice: str = ADVICE,
                 setting: str = "pt.init(timeout=...)", phase=lambda: None,
                 pulse: "Pulse | None" = None, judge=None):
        """``advice``: whom the calls wait for and why, in the lines; ``setting``: what
        sets the limit; ``phase()``: the part of the call this rank is in, if known;
        ``pulse``: the thread sends its beats (``Pulse.beat``); ``judge(name, step)``,
        asked each poll of a call that lasts ``JUDGE_S``: why it can never end, or None
        (the same line at two polls in a row ends the job)."""
        self.comm, self.who, self.timeout, self.warn_s = comm, who, timeout, WARN_S
        self.pulse, self.judge = pulse, judge
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

    def inside(self, name: str, step: int, ends: bool | str = True) -> "Watch":
        """``ends`` False: a call that may wait long by design (``pt.shutdown`` while worker
        0 evaluates alone) gets the warning, never the end; ``FIRST``: a run's first step,
        ended at ``FIRST_STEP_S`` if that is more than the timeout."""
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
        warned = lost_in = judged = None
        lost, last = 0.0, time.monotonic()
        while not self._stop.wait(self._poll):
            now = time.monotonic()
            late, last = now - last - self._poll, now
            if self.pulse is not None:
                self.pulse.tick(now, self._poll)
            slot = self._slot
            if slot is None:
                continue
            if slot is not lost_in:
                lost_in, lost = slot, 0.0
            if late > STOPPED_S:  # this process did not run: stopped, then continued
                lost += min(late, now - slot[2])
            waited, ends = now - slot[2] - lost, self.timeout if slot[3] else None
            first = slot[3] == FIRST and ends
            if first:
                ends = max(ends, FIRST_STEP_S)
            if ends and waited >= ends:
                self._end(f"{self._where(slot, waited)}; {self.setting} sets this limit"
                          + (f" (at least {FIRST_STEP_S:g} s for a run's first step)"
                             if first else ""))
            if self.judge is not None and waited >= JUDGE_S:
                why = self.judge(*slot[:2])
                if why and judged == (slot, why):  # (twice, a poll apart: still inside)
                    self._end(why)
                judged = (slot, why)
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

    def _end(self, why: str) -> None:
        self._write(f"pshybrid: error ({self.who}): {why}")
        if MPI.Query_thread() == MPI.THREAD_MULTIPLE:
            abort(self.comm, 2)  # Wire: MPI_Abort ends every rank; nobody waits
        release_shared_memory()  # (what abort does first; the launcher ends the others)
        time.sleep(0.3)
        os._exit(2)


def step_watch(topo, timeout: float | None, timers, pulse: Pulse | None) -> Watch:
    """A ``train`` worker's step timer: a warning after ``WARN_S`` inside one step (or an
    evaluation, a checkpoint), the job's end after ``timeout`` (``--step-timeout``) inside
    one step; ``timers.current``: the phase it is in; it sends ``pulse``'s beats."""
    return Watch(topo.world, f"rank {topo.rank}, worker {topo.worker_index}", timeout,
                 STEP_ADVICE, "--step-timeout", lambda: timers.current, pulse)


BEATS = 4       # a worker's beats per --step-timeout
CHECK_S = 0.1   # how often a listener looks at them
SILENT = 2      # a listener ends the job after no beat for this many --step-timeouts (where
#                 other workers wait for a stopped one in a step, their step timers, which
#                 name the step and the phase, end it first)
_NOTHING = np.empty(0, np.uint8)  # a beat's (empty) buffer


class Pulse:
    """The workers' processes watched by each other and by the dedicated servers. A worker's
    steps are timed by its ``Watch``, and the other workers wait for it in collectives; but
    a sole worker (or all of them) stopped or stuck holding the interpreter is timed by
    nobody (the servers only wait for its messages), nor is one stopped while the others
    wait in a call that may last by design (an evaluation, a checkpoint: ``ends=False``).
    So each worker's ``Watch`` thread sends a zero-byte beat every ``timeout / BEATS``
    seconds to every dedicated server and to the next worker (a ring); a dedicated server
    (on a thread of its own while it serves, ``watching``) and each worker (on its
    ``Watch`` thread, ``tick``) that hears none from a worker it listens to for ``SILENT *
    timeout`` seconds ends the job naming it. A listener's clock leaves out a time its own
    process stood still (a check ``STOPPED_S`` late). Only where the job has a step
    timeout, ``MPI_THREAD_MULTIPLE`` (threads send and receive) and dedicated servers or
    two workers; else every call is a no-op. Collective: the constructor and ``close``
    (over the world)."""

    made = 0  # Pulses made in this process: rank 0's count is each run's tag

    def __init__(self, topo, timeout: float | None, setting: str = "--step-timeout"):
        self.topo, self.timeout, self.setting = topo, timeout, setting
        dedicated = topo.n_servers > 0 and not topo.colocated
        W, me = topo.n_workers, topo.worker_index
        on = bool(timeout) and (dedicated or W > 1) and (
            MPI.Query_thread() == MPI.THREAD_MULTIPLE)
        self.comm = topo.world.Dup() if on else None  # Wire: collective Dup (beats only)
        Pulse.made += 1  # (a beat an earlier run's freed communicator left can never match;
        # Wire: rank 0's count to every rank: a process may run others alone, on COMM_SELF)
        self.tag = self.comm.bcast(Pulse.made % 32768, root=0) if self.comm is not None else 0
        self.to: list[int] = []  # whom this rank beats: dedicated servers, the next worker
        listens: list[int] = topo.worker_ranks  # (a dedicated server: every worker)
        if topo.is_worker:
            ring = [topo.worker_ranks[(me + 1) % W]] if W > 1 else []
            self.to = (list(topo.server_ranks) if dedicated else []) + ring
            listens = [topo.worker_ranks[me - 1]] if W > 1 else []  # (the previous worker)
        self.heard = {r: 0.0 for r in listens}  # the clock at each one's last beat
        self.got: dict[int, int] = {}  # beats received from each
        self._lock = threading.Lock()
        self._sends: list = []  # the beats' requests
        self.sent = 0           # beats sent to each of ``to``
        self._due = 0.0
        self._clock, self._last, self._next = 0.0, None, 0.0

    # -- workers (their Watch thread) ----------------------------------------------------
    def tick(self, now: float, period: float) -> None:
        """Every ``period`` s: a beat when one is due (Wire: a zero-byte Isend to each of
        ``to``; nobody waits), and the beats heard (``_hear``)."""
        if self.comm is None or not self.to or now < self._due:
            self._hear(now, period)
            return
        with self._lock:
            if self.comm is None:  # (closed meanwhile)
                return
            self._due = now + self.timeout / BEATS
            self._sends = [r for r in self._sends if not r.Test()]
            self._sends += [self.comm.Isend([_NOTHING, MPI.BYTE], r, self.tag)
                            for r in self.to]
            self.sent += 1
        self._hear(now, period)

    # -- servers (a thread while they serve) ---------------------------------------------
    @contextmanager
    def watching(self):
        """Dedicated servers, around their loop (``serve``): a thread hears the beats every
        ``CHECK_S`` (``_hear``)."""
        if self.comm is None or self.topo.is_worker:
            yield
            return
        stop = threading.Event()
        thread = threading.Thread(target=self._listen, args=(stop,), daemon=True,
                                  name="pshybrid-pulse")
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def _listen(self, stop: threading.Event) -> None:
        while not stop.wait(CHECK_S):
            self._hear(time.monotonic(), CHECK_S)

    # -- every listener ------------------------------------------------------------------
    def _hear(self, now: float, period: float) -> None:
        """Called every ``period`` s: every ``CHECK_S`` of this listener's clock, receive
        the beats that came, and end the job if one it listens to was silent for
        ``SILENT * timeout`` of it."""
        if self.comm is None or not self.heard:
            return
        gap, self._last = now - (now if self._last is None else self._last), now
        if gap < period + STOPPED_S:  # (longer: this process stood still)
            self._clock += gap
        if self._clock < self._next:
            return
        self._next = self._clock + CHECK_S
        with self._lock:
            if self.comm is None:  # (closed meanwhile)
                return
            st = MPI.Status()
            while self.comm.Iprobe(MPI.ANY_SOURCE, self.tag, st):  # Wire: a worker's beat
                self.comm.Recv([_NOTHING, MPI.BYTE], st.source, self.tag)
                self.heard[st.source] = self._clock
                self.got[st.source] = self.got.get(st.source, 0) + 1
        for r, at in self.heard.items():
            if self._clock - at >= SILENT * self.timeout:
                self._end(r, self._clock - at)

    def _end(self, rank: int, silent: float) -> None:
        topo = self.topo
        me = (f"worker {topo.worker_index}" if topo.is_worker else
              f"server {topo.server_index}")
        sys.stdout.flush()
        (sys.__stderr__ or sys.stderr).write(
            f"pshybrid: error (rank {topo.rank}, {me}): worker "
            f"{topo.worker_ranks.index(rank)} (rank {rank}) sent no sign of life for "
            f"{silent:.0f} s: its process is stopped or stuck (SIGSTOP, "
            f"swapping, a hung file system); {self.setting} sets this limit\n")
        abort(topo.world, 2)  # Wire: MPI_Abort ends every rank; nobody waits

    # -- every rank ----------------------------------------------------------------------
    def close(self) -> None:
        """Collective over the world, after the workers' last message to the servers:
        every rank arrives (beats go on meanwhile: one may still work alone), then the
        beats stop, and each listener receives every beat still on its way (each worker's
        count), so none outlives the run. Wire: Ibarrier; allgather of one int; Recvs."""
        if self.comm is None:
            return
        arrival = self.comm.Ibarrier()  # Wire: every rank is here (each beats until it is)
        while not arrival.Test():
            time.sleep(CHECK_S / 10)
            if not self.topo.is_worker:  # (a worker's Watch thread hears for it)
                self._hear(time.monotonic(), CHECK_S / 10)
        comm, sends = self._detach()
        sent = comm.allgather(self.sent)
        for r in self.heard:
            for _ in range(sent[r] - self.got.get(r, 0)):
                comm.Recv([_NOTHING, MPI.BYTE], r, self.tag)
        MPI.Request.Waitall(sends)  # (after the receives: a send may wait for its match)
        comm.Free()

    def free(self) -> None:
        """After an error (collective, as ``Topology.free``): no beat is sent from here on;
        those on their way are left (freed with the communicator; another run's tag)."""
        comm, _ = self._detach()
        if comm is not None:
            comm.Free()

    def _detach(self) -> tuple:
        with self._lock:  # (the Watch thread sends no beat after this)
            comm, self.comm = self.comm, None
            sends, self._sends = self._sends, []
        return comm, sends
