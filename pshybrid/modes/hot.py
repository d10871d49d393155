"""Hot rows replicated on every worker (``--replicate-rows N``): the N most frequent rows of
the fused table live on every worker; their gradients are summed with an Allreduce over the
workers beside the dense one, and every worker applies the sparse optimizer to the rows some
worker touched, exactly as their owner would have (the same formulas, lazily; sums in another
order: float rounding). Every other row stays sharded. The owners' copies of the hot rows are
brought up to date before a checkpoint reads them (``write_back``).

``HotReplicated`` wraps a worker's ``ServerSparse``: a batch's hot ids go to ``HotRows``,
the others (the batch's plan) to the wrapped strategy, which never sees a hot id.
"""

from __future__ import annotations

import numpy as np

from ..batches import read_ids
from ..kernels import gather, scatter_add
from ..transport import iallreduce
from .strategy import SparseStrategy, delegate

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
                                 self.state, step, threads=self.ctx.apply_threads)


class HotReplicated:
    """A worker's sparse strategy with ``hot`` (``HotRows``) replicated: ``prepare`` splits
    the ids (the wrapped ``ServerSparse`` plans the cold ones; ``Batch.hot`` = (mask of the
    hot ids, their slots)), ``lookup`` merges both reads, ``start``/``finish`` hand each
    part its gradient rows (the hot sums go on the wire beside the dense Allreduce and are
    applied in ``finish``). Every other member is the wrapped strategy's."""

    def __init__(self, inner, hot: HotRows):
        self.inner, self.hot = inner, hot
        self.live, self.server_step = inner.live, inner.server_step
        self.prepare_uses_mpi = inner.prepare_uses_mpi
        self._cold = None  # the step's cold gradient rows, from ``start`` to ``finish``
        delegate(self, inner, SparseStrategy)

    def __getattr__(self, name):  # the rest: the wrapped strategy's
        return getattr(self.inner, name)

    def ready(self) -> None:
        """After start-up and any resume: the hot rows from their owners."""
        self.inner.ready()
        self.hot.load(self.inner.store)

    def set_rule(self, **changes) -> None:
        self.inner.set_rule(**changes)
        self.hot.opt = self.inner.opt

    def prepare(self, ids):
        mask, slots = self.hot.split(ids)
        batch = self.inner.prepare(ids[~mask])  # the plan covers the other ids: (n_cold,)
        batch.hot = (mask, slots)
        return batch

    def lookup(self, batch):
        mask, slots = batch.hot
        spec = self.inner.layout.table
        emb = np.empty(mask.shape + (spec.dim,), spec.dtype)
        emb[~mask] = self.inner.lookup(batch)
        with self.inner.ctx.timers.time("pull"):
            emb[mask] = self.hot.lookup(slots)
        return emb

    def start(self, batch, demb, step: int) -> None:
        mask, slots = batch.hot
        with self.inner.ctx.timers.time("push"):  # the hot sums: on the wire now
            self.hot.start(slots, demb[mask])
        self._cold = demb[~mask]
        self.inner.start(batch, self._cold, step)

    def finish(self, batch, demb, step: int) -> None:
        self.inner.finish(batch, self._cold, step)
        self._cold = None
        self.hot.finish(step)

    def before_checkpoint(self) -> None:
        """Worker 0: the owners' copies of the hot rows brought up to date."""
        topo = self.inner.ctx.topo
        if topo.rank == topo.worker_ranks[0]:
            self.hot.write_back(self.inner.store)
        self.inner.before_checkpoint()

    def full_table(self) -> np.ndarray:
        out = self.inner.full_table()
        out[self.hot.ids] = self.hot.w
        return out

    def traffic(self) -> dict:
        return {**self.inner.traffic(), "hot_allreduce_bytes": self.hot.allreduce_bytes}
