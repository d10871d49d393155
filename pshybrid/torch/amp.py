"""Mixed precision with ``torch.amp.GradScaler`` on ``DistributedOptimizer``.

A scaler multiplies the loss by its scale, so every gradient, the tables' too, is that
many times too large until it is unscaled; it then skips the step where a gradient is not
finite and lowers the scale. On W workers both decisions must be the same on every worker
(a worker that skips alone leaves the others waiting; scales that part mix gradients of
different scales in the average). So the loop (docs/torch.md) is ``scaler.scale(loss)
.backward()``, ``opt.synchronize(scaler)``, ``scaler.step(opt)``, ``scaler.update()``:

- ``synchronize(scaler)`` completes the dense Allreduce: each ``.grad`` is the workers'
  average, so every worker's scaler unscales and checks the same numbers;
- it divides the tables' gradients by the scale here (they are no torch parameter: the
  scaler does not see them), and sets the ``.grad`` of ``FLAG``, a private one-element
  tensor in the ``"embeddings"`` param group that the scaler checks with the rest (the
  torch optimizer never sees it), to NaN where a table gradient on any worker is not
  finite, else 0: every scaler skips, or none does;
- ``scaler.step(opt)`` without it, or ``opt.step()`` in place of ``scaler.step(opt)``
  after it, is refused.
"""

from __future__ import annotations

import sys

import numpy as np
import torch
from mpi4py import MPI

from pshybrid.errors import ConfigError


def stage(scaler, opt) -> str:
    """The scaler's stage for ``opt`` this step: READY, UNSCALED or STEPPED."""
    return scaler._per_optimizer_states[id(opt)]["stage"].name


def check_ready(scaler, opt) -> None:
    """``synchronize(scaler)`` comes first in a step's scaler calls."""
    where = stage(scaler, opt)
    if where != "READY":
        raise ConfigError("DistributedOptimizer.synchronize(scaler): " + (
            "scaler.update() was not called after the last scaler.step(opt)"
            if where == "STEPPED" else "call it before scaler.unscale_(opt) and "
            "scaler.step(opt) (they would read each worker's own gradients)"),
            collective=True)


def unscale_tables(opt, scale: float):
    """The step's (batch, table gradients / ``scale``, batches to release); ``opt.flag``'s
    gradient NaN where a table gradient on any worker is not finite, else 0."""
    batch, demb, used = opt._sparse_batch()
    bad = np.array([0 if np.isfinite(demb).all() else 1], np.int32)
    # Wire: Allreduce(MAX) of one int32 over the workers (their own copy); all wait
    opt.flags.Allreduce(MPI.IN_PLACE, bad, op=MPI.MAX)
    opt.flag.grad = torch.full((1,), float("nan") if bad[0] else 0.0)
    demb *= 1.0 / scale
    return batch, demb, used


def check_stepped_by_scaler(opt) -> None:
    """``opt.step()`` after ``synchronize(scaler)`` comes from ``scaler.step(opt)``, which
    has unscaled the dense gradients (the tables' are)."""
    if opt.scaler is not None and stage(opt.scaler, opt) != "UNSCALED":
        raise ConfigError("DistributedOptimizer.step: after opt.synchronize(scaler), call "
                          "scaler.step(opt) (it unscales the dense gradients and skips a "
                          "step whose gradients are not finite), not opt.step()",
                          collective=True)


def called_by_a_scaler() -> bool:
    """Whether the caller's caller is a GradScaler's method (any torch version's class, or
    a subclass of it)."""
    caller = sys._getframe(2).f_locals.get("self")
    return any(c.__name__ == "GradScaler" for c in type(caller).__mro__)


def drop_scaled(opt) -> None:
    """A step not taken (the scaler skipped it): its lookups and the batch
    ``unscale_tables`` prepared are released, and dropped from the session."""
    if opt.scaled is not None:
        old = {id(b) for b in opt.scaled[2]}
        for b in opt.scaled[2]:
            b.release()  # (the lookups' and the batch unscale_tables prepared)
        opt.s.drop(lambda entry: id(entry[1]) in old)
    opt.scaled = opt.scaler = opt.flag.grad = None
