"""The workers' census: each collective call of ``pshybrid.torch`` but the step's starts
with every worker saying which call it is in, at which step, on a communicator of its own
(``Session.arrivals``), so workers out of step are named at once instead of matching each
other's collectives. Each also sends its (call, step) to every other worker, which a worker
inside a step hears on its ``Watch`` thread (``out_of_step``): one calling ``pt.checkpoint``
alone (a DDP habit) while the others step is named in seconds, not at the timeout."""

from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from pshybrid.errors import ConfigError

CALLS = ("pt.shutdown()", "pt.checkpoint", "pt.batches()", "DistributedOptimizer()",
         "pt.load_rows")
FAILED = -1  # the step a worker's pt.shutdown during an exception posts (``session._all_here``)
_CYCLE = 4  # an announcement's tag: CALLS index * (_CYCLE + 1) + step % _CYCLE (_CYCLE: FAILED)


def _tag(call: int, step: int) -> int:
    return call * (_CYCLE + 1) + (_CYCLE if step == FAILED else step % _CYCLE)


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
    tag, me = _tag(CALLS.index(call), step), s.arrivals.rank
    # Wire: an empty Isend to each other worker, tagged with (call, step): heard by one in a
    #   step (``out_of_step``), else received once the census is complete (``_taken``)
    told = [s.arrivals.Isend(_NOTHING, w, tag) for w in range(s.topo.n_workers) if w != me]
    # Wire: Iallgather of (call, step), 16 B a worker, over the workers (their own copy)
    return s.arrivals.Iallgather(mine, every), every, call, step, told


def arrived(s, posted, wait_s: float | None = None, ends: bool = True) -> bool:
    """``census``'s second half (``ends`` False: past the time limit a warning, never the
    end: ``pt.shutdown`` may wait for worker 0 evaluating alone)."""
    if posted is None:
        return True
    req, every, call, step, told = posted
    if wait_s is None:
        with s.watch.inside(call, step, ends=ends):
            req.Wait()
    else:
        end = time.monotonic() + wait_s
        while not req.Test():
            if time.monotonic() > end:
                return False
            time.sleep(0.01)
    _taken(s, every, told)
    if (every != every[0]).any():
        if call == CALLS[0] and step != FAILED and (every[:, 1] == FAILED).any():
            return True  # another worker's exception ends the job (its traceback says why)
        where = ", ".join(f"worker {w} in {CALLS[c]} at step {t}" for w, (c, t) in
                          enumerate(every.tolist()))
        raise ConfigError(f"the workers are out of step: {where}: every worker makes the same "
                          "steps, checkpoints and shutdown", collective=True)
    return True


_NOTHING = np.empty(0, np.uint8)  # an announcement's (empty) buffer: its tag says it all


def _taken(s, every, told) -> None:
    """The census complete: every other worker's announcement of the call it is in (sent
    before its part of the census) received, this worker's own sends complete."""
    for w, (c, t) in enumerate(every.tolist()):
        if w != s.arrivals.rank:
            s.arrivals.Recv(_NOTHING, w, _tag(c, t))  # Wire: (already sent; a local match)
    MPI.Request.Waitall(told)


JUDGED = ("opt.step()", "opt.zero_grad()")  # the waits ``out_of_step`` judges


def out_of_step(s, name: str, step: int) -> str | None:
    """``Watch``'s judge (its thread) of a worker inside ``name`` at ``step``: if that is
    ``opt.step()`` or ``opt.zero_grad()`` waiting for a backward's Allreduce (neither takes
    a census) and another worker has announced a census call at the steps before it
    (``step - 1``), that one will never join: the line that ends the job. (A worker a step
    ahead, already in its next call as this one leaves the step, is at ``step``; none is
    further apart. ``opt.synchronize()`` is not judged: a worker may leave it for a call
    at ``step - 1`` while this one is still inside.)
    Wire: ``Iprobe`` for each other worker's announcement, nothing received; no wait."""
    if name not in JUDGED or s.closed:
        return None
    status, me = MPI.Status(), s.topo.worker_index
    for w in range(s.topo.n_workers):
        try:
            if w == me or not s.arrivals.Iprobe(w, MPI.ANY_TAG, status):
                continue
        except MPI.Exception:  # (freed by a shutdown begun since the watch read the slot)
            return None
        call, at = divmod(status.Get_tag(), _CYCLE + 1)
        if at == (step - 1) % _CYCLE:
            return (f"the workers are out of step: worker {me} in {name} at step {step}, "
                    f"worker {w} in {CALLS[call]} at step {step - 1}: every worker makes "
                    "the same steps, checkpoints and shutdown")
    return None
