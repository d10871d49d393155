"""Mixed precision with ``torch.amp.GradScaler`` on ``DistributedOptimizer``.

A scaler multiplies the loss by its scale, so every gradient, the tables' too, is that
many times too large until it is unscaled; it then skips the step where a gradient is not
finite and lowers the scale. On W workers both decisions must be the same on every worker
(a worker that skips alone leaves the others waiting; scales that part mix gradients of
different scales in the average). So the loop is::

    scaler.scale(loss).backward()
    opt.synchronize(scaler)  # the Allreduce completed, the tables' gradients unscaled
    scaler.step(opt)         # unscales the dense gradients (the same on every worker)
    scaler.update()

``synchronize(scaler)`` completes the dense Allreduce (each ``.grad`` is the workers'
average, so the scaler's unscaling and its check are the same on every worker) and
divides the tables' gradients by the scale here (the scaler does not see them: they are
no torch parameter); a non-finite one on any worker makes every worker's dense gradients
NaN, so every scaler skips. ``scaler.step(opt)`` without it is refused.
"""

from __future__ import annotations

import numpy as np
import torch
from mpi4py import MPI


def stage(scaler, opt) -> str:
    """The scaler's stage for ``opt`` this step: READY, UNSCALED or STEPPED."""
    return scaler._per_optimizer_states[id(opt)]["stage"].name


def unscale_tables(opt, scale: float):
    """The step's (batch, table gradients / ``scale``, batches to release); a non-finite
    gradient on any worker: NaN in every worker's dense gradients."""
    batch, demb, used = opt._sparse_batch()
    bad = np.array([0 if np.isfinite(demb).all() else 1], np.int32)
    # Wire: Allreduce(MAX) of one int32 over the workers (their own copy); all wait
    opt.flags.Allreduce(MPI.IN_PLACE, bad, op=MPI.MAX)
    if bad[0]:
        with torch.no_grad():
            for _, p in opt.named:
                if p.grad is not None:
                    p.grad.fill_(float("nan"))
    demb *= 1.0 / scale
    return batch, demb, used


def drop_scaled(opt) -> None:
    """A step the scaler skipped: its lookups and the batch ``unscale_tables`` prepared
    are released, and dropped from the session."""
    if opt.scaled is not None:
        old = {id(b) for b in opt.scaled[2]}
        for b in opt.scaled[2]:
            b.release()
        opt.s.entries = [e for e in opt.s.entries if id(e[1]) not in old]
        opt.scaled = None
