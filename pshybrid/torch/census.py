"""The workers' census: each collective call of ``pshybrid.torch`` but the step's starts
with every worker saying which call it is in, at which step, on a communicator of its own
(``Session.arrivals``), so workers out of step are named at once instead of matching each
other's collectives."""

from __future__ import annotations

import time

import numpy as np

from pshybrid.errors import ConfigError

CALLS = ("pt.shutdown()", "pt.checkpoint", "pt.batches()", "DistributedOptimizer()",
         "pt.load_rows")
FAILED = -1  # the step a worker's pt.shutdown during an exception posts (``session._all_here``)


def census(s, call: str, step: int, wait_s: float | None = None) -> bool:
    """Workers of session ``s``, collectively, first thing in each collective call but the
    step's: every worker is inside ``call`` at ``step``, else a ``ConfigError`` naming where
    each is. It runs on a communicator of its own (``s.arrivals``), so a call the others do not make
    waits here (up to ``pt.init``'s timeout) instead of matching their step's collectives
    (which gave garbage). ``wait_s``: False when not every worker came within it (shutdown
    during an exception: the others may be blocked in a step)."""
    return arrived(s, arrive(s, call, step), wait_s=wait_s)


def arrive(s, call: str, step: int):
    """``census``'s first half: this worker's (call, step) posted; ``arrived`` completes
    it. None with one worker."""
    if s.topo.n_workers == 1:
        return None
    mine = np.array([CALLS.index(call), step], np.int64)
    every = np.empty((s.topo.n_workers, 2), np.int64)
    # Wire: Iallgather of (call, step), 16 B a worker, over the workers (their own copy)
    return s.arrivals.Iallgather(mine, every), every, call, step


def arrived(s, posted, wait_s: float | None = None, ends: bool = True) -> bool:
    """``census``'s second half (``ends`` False: past the time limit a warning, never the
    end: ``pt.shutdown`` may wait for worker 0 evaluating alone)."""
    if posted is None:
        return True
    req, every, call, step = posted
    if wait_s is None:
        with s.watch.inside(call, step, ends=ends):
            req.Wait()
    else:
        end = time.monotonic() + wait_s
        while not req.Test():
            if time.monotonic() > end:
                return False
            time.sleep(0.01)
    if (every != every[0]).any():
        if call == CALLS[0] and step != FAILED and (every[:, 1] == FAILED).any():
            return True  # another worker's exception ends the job (its traceback says why)
        where = ", ".join(f"worker {w} in {CALLS[c]} at step {t}" for w, (c, t) in
                          enumerate(every.tolist()))
        raise ConfigError(f"the workers are out of step: {where}: every worker makes the same "
                          "steps, checkpoints and shutdown", collective=True)
    return True
