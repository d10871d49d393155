"""Hot rows replicated on every worker (``--replicate-rows N``): the N most frequent rows of
the fused table live on every worker; their gradients are summed with an Allreduce over the
workers beside the dense one, and every worker applies the sparse optimizer to the rows some
worker touched, exactly as their owner would have (the same formulas, lazily; sums in another
order: float rounding). Every other row stays sharded. The owners' copies of the hot rows are
brought up to date before a checkpoint reads them (``write_back``).
"""

from __future__ import annotations

import numpy as np

from ..batches import read_ids
from ..kernels import gather, scatter_add
from ..transport import iallreduce

SAMPLE_STEPS = 32  # global batches counted to find the hot rows


def hottest_rows(data, plan, layout, n: int, sample_steps: int = SAMPLE_STEPS) -> np.ndarray:
    """The ``n`` most frequent fused-table rows in the first ``sample_steps`` global batches
    of the training order (``plan``), most frequent first, ties by row id; sorted ascending on
    return. Every rank reads the same rows, so every rank finds the same set."""
    steps = sample_steps if plan.steps_per_epoch is None else min(sample_steps,
                                                                   plan.steps_per_epoch)
    ids = np.concatenate([read_ids(data, plan.ranges(t, 0, plan.G), layout.offsets)[2].ravel()
                          for t in range(steps)])
    rows, counts = np.unique(ids, return_counts=True)
    order = np.lexsort((rows, -counts))  # count descending, then id ascending
    return np.sort(rows[order[:n]])


class HotRows:
    """The replicated rows ``ids`` (sorted) of one table, their weights and optimizer state
    on this worker, and the step's gradient sums on the wire."""

    def __init__(self, ctx, name: str, ids: np.ndarray, dim: int, dtype, opt):
        self.ctx, self.name, self.ids, self.opt = ctx, name, ids, opt
        n = ids.size
        self.w = np.zeros((n, dim), dtype)
        self.state = {k: np.zeros((n, dim), dtype) for k in opt.slots}
        # gradient sums, then one column counting the ids of each row (touched: count > 0)
        self.grads = np.zeros((n, dim + 1), dtype)
        self._req = None
        self.allreduce_bytes = 0

    def split(self, ids):
        """ids: any shape int64 -> (mask of hot ids, their slots in ``self.ids``)."""
        pos = np.minimum(np.searchsorted(self.ids, ids), self.ids.size - 1)
        mask = self.ids[pos] == ids
        return mask, pos[mask]

    def load(self, store) -> None:
        """Pull the rows' weights and state from their owners (start-up, after a resume)."""
        self.w[...] = store.pull(self.name, self.ids)
        for k, arr in self.state.items():
            arr[...] = store.pull(self.name, self.ids, slot=k)

    def write_back(self, store) -> None:
        """One worker: put the rows' weights and state onto their owners' copies (before a
        checkpoint reads the shards). Wire: one Accumulate(REPLACE) per owner and slot."""
        store.put(self.name, self.ids, self.w)
        for k, arr in self.state.items():
            store.put(self.name, self.ids, arr, slot=k)

    def lookup(self, slots):
        return gather(self.w, slots)

    def start(self, slots, demb_hot) -> None:
        """Sum this worker's gradient rows per hot row, count the ids, and start their
        Allreduce over the workers (overlapping the rest of the step)."""
        dim = self.w.shape[1]
        sums = scatter_add(slots, demb_hot.reshape(-1, dim).astype(self.w.dtype, copy=False),
                           self.ids.size)
        self.grads[:, :dim] = sums
        self.grads[:, dim] = np.bincount(slots, minlength=self.ids.size)
        self.allreduce_bytes += self.grads.nbytes
        # Wire: Iallreduce(SUM) of the hot rows' sums and counts over the workers.
        self._req = iallreduce(self.ctx.topo.workers, self.grads)

    def finish(self, step: int) -> None:
        """Wait for the sums and apply the optimizer to the rows some worker touched."""
        with self.ctx.timers.time("allreduce"):
            self._req.Wait()
        dim = self.w.shape[1]
        touched = np.flatnonzero(self.grads[:, dim] > 0)
        with self.ctx.timers.time("push"):
            self.opt.update_rows(self.w, touched, np.ascontiguousarray(self.grads[touched, :dim]),
                                 self.state, step)
