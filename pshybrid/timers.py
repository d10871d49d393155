"""Wall time per phase of the training step, accumulated (``Timers().time("pull")``); on a
GPU worker the device time of the phases that launch kernels (``EventTimers``)."""

from __future__ import annotations

import time
from collections import defaultdict

from .backend import wait_event

PHASES = ("data", "pull", "fwd_bwd", "push", "allreduce", "dense_apply", "server_apply", "wait",
          "eval", "checkpoint")  # server_apply: on workers only with --placement colocated
UNTRAINED = ("eval", "checkpoint")  # outside the training clock: samples/s leaves them out
# A worker's phases by whom they wait for: its own work (a rank slow in these is the slow
# one), and the others (the step timer's lines and the summary's slowest worker read them)
OWN_WORK = ("data", "fwd_bwd", "dense_apply", "server_apply")
WAITING = ("pull", "push", "allreduce", "wait")


class _Phase:
    """Context manager adding its block's wall time to ``timers[phase]``; ``timers.current``
    names the phase inside it (the step timer's lines: ``stall``)."""

    __slots__ = ("timers", "phase", "t0", "outer")

    def __init__(self, timers, phase: str):
        self.timers, self.phase = timers, phase

    def __enter__(self):
        self.outer, self.timers.current = self.timers.current, self.phase
        self.t0 = time.perf_counter()

    def __exit__(self, *exc):
        self.timers[self.phase] += time.perf_counter() - self.t0
        self.timers.current = self.outer


class Timers(defaultdict):
    """Seconds per phase, accumulated."""

    def __init__(self):
        super().__init__(float)
        self.current = None  # the phase being timed, if any

    def time(self, phase: str) -> _Phase:
        # one small object per call (a class per call was cyclic garbage: full GC passes)
        return _Phase(self, phase)


class _Span:
    """Context manager recording a CUDA event before and after its block (no host wait)."""

    __slots__ = ("owner", "phase", "start")

    def __init__(self, owner, phase: str):
        self.owner, self.phase = owner, phase

    def __enter__(self):
        self.start = self.owner._event()

    def __exit__(self, *exc):
        pending = self.owner.pending
        pending.append((self.phase, self.start, self.owner._event()))
        if len(pending) > self.owner.bound:  # a long log interval: fold what is reached
            self.owner.fold(wait=False)


class EventTimers:
    """Phase timers of GPU work (``--device cuda``): ``time(phase)`` records a CUDA event on
    the current stream before and after its block, so the phase gets the device time of
    the kernels its block launched, and the host does not wait. ``fold()`` adds every
    recorded pair's elapsed time to ``timers[phase]``: call it where the host has just
    waited for the stream anyway (the log interval's read back, before a checkpoint, at the
    end), so every ``--metrics`` record and the summary see the device times.

    Past ``bound`` recorded spans (a long log interval) the spans whose events the device
    has reached are folded without a wait, so the pending list stays short.

    cuda: ``cupy.cuda`` (``Event``, ``get_elapsed_time`` in ms) or a stand-in."""

    def __init__(self, timers: Timers, cuda, bound: int = 256):
        self.timers, self.cuda, self.bound = timers, cuda, bound
        self.pending: list = []  # (phase, start event, end event), in record order
        self.free: list = []     # events whose times were folded: reused
        self.device_seconds = 0.0  # every folded span's: the device's busy time

    def time(self, phase: str) -> _Span:
        return _Span(self, phase)

    def _event(self):
        event = self.free.pop() if self.free else self.cuda.Event()
        event.record()
        return event

    def fold(self, wait: bool = True) -> None:
        """Add the recorded spans' device seconds to the timers (a wait, counted, only if
        the last event is not reached yet: not after a read back). ``wait=False``: only the
        spans whose end the device has reached (a query, no wait)."""
        if wait and self.pending:
            wait_event(self.pending[-1][2])  # stream order: every earlier event is reached
        n = 0
        for phase, start, end in self.pending:
            if not (wait or end.done):
                break
            seconds = self.cuda.get_elapsed_time(start, end) / 1e3
            self.timers[phase] += seconds
            self.device_seconds += seconds
            self.free += (start, end)
            n += 1
        del self.pending[:n]
