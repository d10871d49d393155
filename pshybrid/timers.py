"""Wall time per phase of the training step, accumulated (``Timers().time("pull")``)."""

from __future__ import annotations

import time
from collections import defaultdict


class _Phase:
    """Context manager adding its block's wall time to ``timers[phase]``."""

    __slots__ = ("timers", "phase", "t0")

    def __init__(self, timers, phase: str):
        self.timers, self.phase = timers, phase

    def __enter__(self):
        self.t0 = time.perf_counter()

    def __exit__(self, *exc):
        self.timers[self.phase] += time.perf_counter() - self.t0


class Timers(defaultdict):
    """Seconds per phase, accumulated."""

    def __init__(self):
        super().__init__(float)

    def time(self, phase: str) -> _Phase:
        # one small object per call (a class per call was cyclic garbage: full GC passes)
        return _Phase(self, phase)
