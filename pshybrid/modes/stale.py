"""Bounded-staleness embedding reads (``--consistency ssp:K|asp``) and the worker's hot-row
cache (``--cache-rows N``), for the fused table on the servers (``ServerSparse``).

Versions. A worker counts its completed steps: after ``Mode.update`` of step ``s``
(1-based) returns, every worker's updates of steps ``<= s`` are visible to every pull
(the dense side stays synchronous, so all workers are at the same count). A row read while
``c`` steps are complete has **version** ``c``: it reflects every update of the first ``c``
steps (and may reflect more). Read for the 0-based step ``t``, its **staleness** is
``t - c``; BSP reads have staleness 0. ``ssp:K`` promises staleness ``<= K`` for every
row a worker reads; ``asp`` promises none.

Enforcement (``Pipeline``):

- **pull-ahead**: with a bound ``K >= 1`` (and ``asp``), the pull of step ``t + 1``'s
  rows is issued at step ``t``'s lookup (``c = t``, staleness 1), right after step ``t``'s
  own rows are complete, and completed at step ``t + 1``'s lookup: the Gets travel while
  step ``t`` computes and updates. With ``K = 0`` (``bsp``, ``ssp:0``) every pull is
  issued at its own step's lookup, as without this module.
- **cache** (``RowCache``): a row is served from the worker's cache, without a pull, when
  its cached version ``v`` meets the bound for the step it is read for (``t - v <= K``;
  ``asp``: ``t - v <= ASP_AGE``); otherwise it is pulled and the cache refreshed. Under
  ``bsp``/``ssp:0`` no cached row ever qualifies (``v < t`` always): the cache never
  serves, so the numbers are BSP's.
- gradients are untouched: every worker sends the sums of every row it read (cached or
  pulled) to the rows' owners as in BSP, so each update reaches the servers exactly once
  and server-side Adagrad/Adam stay correct.
- a checkpoint (``drain``) completes the pull in flight, discards it and empties the
  cache: the run continues exactly as a run resumed from that checkpoint does.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from ..kernels import gather
from ..registry import parse_consistency
from ..store import Plan
from .strategy import SparseStrategy, delegate

ASP_AGE = 32  # asp: a cached row is refreshed once it is this many steps old
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


class StaleReads:
    """The sparse strategy of a worker under ``--consistency ssp:K|asp`` or ``--cache-rows``:
    ``ServerSparse`` wrapped so that the loop's training reads (the batch the pipeline
    announced) go through ``pipeline`` (pull-ahead, cache); a checkpoint and the end drain it
    (no read in flight, no cached row: a BSP point); its read counters join ``traffic``.
    Every other member is the wrapped strategy's."""

    def __init__(self, inner, pipeline: Pipeline, timers):
        self.inner, self.pipeline, self.timers = inner, pipeline, timers
        self.live, self.server_step = inner.live, inner.server_step
        self.prepare_uses_mpi = inner.prepare_uses_mpi
        delegate(self, inner, SparseStrategy)  # (prepare, stage, start, finish, grads_for, ...)

    def __getattr__(self, name):  # the rest: the wrapped strategy's
        return getattr(self.inner, name)

    def begin(self, step: int) -> None:
        self.pipeline.begin(step)

    def lookup(self, batch):
        if batch is self.pipeline.current:  # a training step's read
            with self.timers.time("pull"):
                return self.pipeline.lookup(batch)
        return self.inner.lookup(batch)

    def before_checkpoint(self) -> None:
        self.inner.before_checkpoint()
        self.pipeline.drain()

    def close(self) -> None:
        self.pipeline.drain()
        self.inner.close()

    def traffic(self) -> dict:
        return {**self.inner.traffic(), **self.pipeline.traffic()}


def staleness_bound(consistency: str) -> int | None:
    """``bsp`` -> 0, ``ssp:K`` -> K, ``asp`` -> None (no bound); parsed by the catalogue."""
    return parse_consistency(consistency).bound


class RowCache:
    """A direct-mapped cache of ``n`` rows (dim, dtype): row id -> slot by a multiplicative
    hash; each slot holds one row, its values and its version.

    Admission (LFU-style, TinyLFU): a frequency sketch of ``4 n`` counters (a second hash)
    counts the distinct reads of each row; a pulled row takes its slot when the slot is
    empty or its count exceeds the resident row's (ties keep the resident); among the
    pulled rows of one step that want the same slot, the most frequent. Every ``10 n``
    counted reads the counters are halved (old popularity fades)."""

    def __init__(self, n: int, dim: int, dtype):
        self.n = n
        self.ids = np.full(n, -1, np.int64)
        self.rows = np.zeros((n, dim), dtype)
        self.version = np.zeros(n, np.int64)
        self.counts = np.zeros(4 * n, np.int64)
        self._counted = 0

    def clear(self) -> None:
        self.ids[:] = -1
        self.counts[:] = 0
        self._counted = 0

    def _hash(self, ids, size: int, shift: int):
        h = (ids.astype(np.uint64) * _GOLDEN) >> np.uint64(shift)
        return (h % np.uint64(size)).astype(np.int64)

    def slots(self, ids):
        return self._hash(ids, self.n, 32)

    def count(self, ids) -> None:
        """ids: (U,) distinct rows read this step."""
        np.add.at(self.counts, self._hash(ids, self.counts.size, 17), 1)
        self._counted += ids.size
        if self._counted >= 10 * self.n:
            self.counts >>= 1
            self._counted = 0

    def find(self, ids, min_version: int):
        """(U,) ids -> (mask of the ids cached with version >= min_version, their slots)."""
        slots = self.slots(ids)
        hit = (self.ids[slots] == ids) & (self.version[slots] >= min_version)
        return hit, slots[hit]

    def _best_per_slot(self, slots, key):
        """Ascending indices of the candidates of largest ``key`` in each slot (keys are
        distinct): through a cache-sized array where the cache is small beside the offer,
        else by sorting the offer (the array cost O(cache rows) a step: 1.8 ms at 4M)."""
        if self.n <= 32 * slots.size:
            best = np.full(self.n, -1, np.int64)
            np.maximum.at(best, slots, key)
            return np.flatnonzero(best[slots] == key)
        order = np.lexsort((key, slots))        # by slot, then key: each slot's best last
        by_slot = slots[order]
        return np.sort(order[np.append(by_slot[1:] != by_slot[:-1], True)])

    def admit(self, ids, rows, version: int) -> None:
        """Offer freshly pulled rows (ids (m,) distinct, rows (m, dim)) read at ``version``."""
        if not ids.size:
            return
        slots = self.slots(ids)
        freq = self.counts[self._hash(ids, self.counts.size, 17)]
        resident = self.ids[slots] == ids
        # the best candidate per slot: most frequent, a resident being refreshed on ties,
        # then the first offered (a unique key per candidate)
        key = ((2 * freq + resident) * ids.size + (ids.size - 1 - np.arange(ids.size)))
        first = self._best_per_slot(slots, key)
        cur = self.ids[slots[first]]
        cur_freq = self.counts[self._hash(np.maximum(cur, 0), self.counts.size, 17)]
        take = first[(cur < 0) | resident[first] | (freq[first] > cur_freq)]
        s = slots[take]
        self.ids[s], self.rows[s], self.version[s] = ids[take], rows[take], version


def _subplan(plan: Plan, mask) -> Plan:
    """The plan of ``plan.unique[mask]`` (still grouped by owner, in the same order)."""
    unique = plan.unique[mask]
    ends = np.concatenate([[0], np.cumsum(mask)])[plan.bounds]
    return Plan(plan.store, plan.table, unique, unique, np.arange(unique.size), ends)


class _Pending:
    __slots__ = ("batch", "handle", "hit", "hit_age", "hit_rows", "plan", "step", "version")


class Pipeline:
    """A worker's reads of ``ServerSparse``'s table under ``bound`` (None: asp) with a cache
    of ``cache_rows`` rows (0: none); see the module text."""

    def __init__(self, sparse, bound: int | None, cache_rows: int):
        self.sparse, self.store, self.name = sparse, sparse.store, sparse.name
        self.bound = bound
        self.depth = 0 if bound == 0 else 1  # steps a pull is issued ahead
        spec = sparse.layout.table
        self.cache = RowCache(cache_rows, spec.dim, spec.dtype) if cache_rows else None
        if self.cache is not None:
            sparse.pull_types = False  # the pulls use sub-plans of the rows not cached
        self.row_bytes = spec.dim * np.dtype(spec.dtype).itemsize
        self.step = 0            # the 0-based step being run (``begin``)
        self.current = None      # this step's Batch (``ahead``): the one ``lookup`` serves
        self.upcoming = None     # the next step's Batch, once known (``ahead``)
        self.pending = None      # the pull in flight
        # counters: [cache rows, pulled rows, staleness sum], max staleness; window and run
        self.window, self.window_max = np.zeros(3), 0
        self.total, self.total_max = np.zeros(3), 0

    def ahead(self, batches, prepare):
        """Wrap the loop's batches ``(label, dense, ids, bags, Batch or None)``: each is
        prepared one step early and announced as the next step's batch (pull-ahead)."""
        def ready(item):
            *head, batch = item
            return (*head, prepare(item[2]) if batch is None else batch)

        nxt = next(batches, None)
        nxt = None if nxt is None else ready(nxt)
        while nxt is not None:
            cur, nxt = nxt, next(batches, None)
            nxt = None if nxt is None else ready(nxt)
            self.current, self.upcoming = cur[-1], None if nxt is None else nxt[-1]
            yield cur

    def begin(self, step: int) -> None:
        """Step ``step`` (0-based) starts: ``step`` steps are complete."""
        self.step = step

    def lookup(self, batch):
        """-> emb (B, F, E): step ``self.step``'s rows; then the next step's pull starts."""
        t = self.step
        pending, self.pending = self.pending, None
        if pending is None or pending.batch is not batch:
            if pending is not None:
                self._complete(pending)  # (not this batch's: an unexpected order)
            pending = self._issue(batch, t, t)
        rows = self._complete(pending)
        if self.depth and self.upcoming is not None:
            self.pending = self._issue(self.upcoming, t + 1, t)
        self.upcoming = None
        return gather(rows, batch.inverse)

    def _issue(self, batch, step: int, version: int) -> _Pending:
        p = _Pending()
        p.batch, p.step, p.version = batch, step, version
        plan, unique = batch.plan, batch.plan.unique
        p.hit, p.hit_rows, p.hit_age, p.plan = None, None, None, plan
        if self.cache is not None:
            age = ASP_AGE if self.bound is None else self.bound
            hit, slots = self.cache.find(unique, step - age)
            self.cache.count(unique)
            if hit.any():
                p.hit, p.hit_rows = hit, self.cache.rows[slots]
                p.hit_age = step - self.cache.version[slots]
                p.plan = _subplan(plan, ~hit)
        p.handle = self.store.pull_start(self.name, p.plan)
        return p

    def _complete(self, p: _Pending):
        """-> (U, E) rows of ``p.batch.plan.unique``: the pulled ones and the cached ones."""
        pulled = self.store.pull_wait(p.handle)
        if p.hit is None:
            rows, missed = pulled, p.batch.plan.unique
        else:
            p.plan.free()
            rows = np.empty((p.hit.size, pulled.shape[1]), pulled.dtype)
            rows[p.hit], rows[~p.hit] = p.hit_rows, pulled
            missed = p.plan.unique
        if self.cache is not None:
            self.cache.admit(missed, pulled, p.version)
        ages = [p.step - p.version] if missed.size else []
        if p.hit is not None:
            ages.append(int(p.hit_age.max()))
        n_hit = 0 if p.hit is None else p.hit_rows.shape[0]
        age_sum = missed.size * (p.step - p.version) + (0 if p.hit is None else p.hit_age.sum())
        counts = np.array([n_hit, missed.size, age_sum], float)
        self.window += counts
        self.total += counts
        worst = max(ages, default=0)
        self.window_max, self.total_max = max(self.window_max, worst), max(self.total_max, worst)
        return rows

    def drain(self) -> None:
        """A consistent point (before a checkpoint, at the end): the pull in flight completed
        and discarded, the cache emptied."""
        if self.pending is not None:
            pending, self.pending = self.pending, None
            self.store.pull_wait(pending.handle)
            if pending.hit is not None:
                pending.plan.free()
        if self.cache is not None:
            self.cache.clear()

    def log(self, comm) -> dict:
        """Collective over the workers: the reads since the last call, summed over the
        workers (largest staleness: the max). Wire: one Allreduce of 3 doubles and one of
        one int."""
        sums = comm.allreduce(self.window, op=MPI.SUM)
        worst = comm.allreduce(self.window_max, op=MPI.MAX)
        self.window[:], self.window_max = 0, 0
        return {"cache_rows": int(sums[0]), "pulled_rows": int(sums[1]),
                "pulled_bytes": int(sums[1]) * self.row_bytes, "max_staleness": int(worst)}

    def traffic(self) -> dict:
        """This worker's run totals (``report`` turns them into the summary's ``reads``)."""
        return {"reads": {"cache_rows": int(self.total[0]), "pulled_rows": int(self.total[1]),
                          "pulled_bytes": int(self.total[1]) * self.row_bytes,
                          "staleness_sum": int(self.total[2]),
                          "max_staleness": int(self.total_max)}}
