"""Sparse-update strategies: where the embedding rows live and how their gradients move.

Each strategy offers the workers ``prepare(ids) -> Batch`` (any thread where it allows:
``prepare_uses_mpi``), ``lookup(batch)``, ``start(batch, demb, step)`` (gradients no pull can
see yet are made ready or go on the wire), ``finish(batch, demb, step)`` (pushes onto the
live weights, after the step's sync point), ``grads_for(s)`` (what server s gets with the
step message: local rows and their gradient sums) and the servers ``server_apply(parts,
step)``. ``live`` and ``server_step`` as in ``dense``.

Workers on a GPU (``ctx.xp`` is cupy): rows stay on the host store or table; a lookup
copies the U distinct rows and the inverse index host->device once and expands them there
(gather kernel); an update sums the rows of each distinct id on the device (scatter-add
kernel) and queues the copy of the (U, E) sums device->host (``stage``, move 0 of
``modes.step``: the step's one stream sync follows; ``start`` and ``finish`` read them).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from mpi4py import MPI

from .. import partition, pool
from ..backend import to_device
from ..initializers import uniform_range
from ..kernels import (gather, merge_sum, numba_active, scatter_add, segment_sum,
                       unique_inverse)
from ..optim import Optimizer
from ..schema import FusedTable, TableSpec
from ..transport import mpi_type


class Batch:
    """One step's embedding ids, prepared for the wire (TorchRec's input_dist): made by
    ``Mode.prepare(ids)``, used by the step's ``lookup`` and ``update``, then ``release``d.

    ids: (B, F) int64 host; plan: the store's ``Plan`` (server modes: dedup, owner groups,
    row datatypes; with replicated hot rows, of the other ids only) or None; unique (U,) /
    inverse: the distinct ids and ``unique[inverse] == ids`` (of the plan's ids);
    dev_inverse: the inverse on the GPU (GPU workers); dev_sums: the (U, E) gradient sums
    on the GPU when the step's device work made them (``graphs.DeviceStep``); hot: (mask
    of the ids that are hot rows, their slots) with ``--replicate-rows``, else None.
    """

    __slots__ = ("ids", "plan", "unique", "inverse", "dev_inverse", "dev_sums", "hot")

    def __init__(self, ids, plan=None, unique=None, inverse=None, hot=None):
        self.ids, self.plan, self.hot = ids, plan, hot
        if plan is not None:
            unique, inverse = plan.unique, plan.inverse
        self.unique, self.inverse, self.dev_inverse, self.dev_sums = unique, inverse, None, None

    def release(self) -> None:
        """Free the plan's datatypes (after the step's last push)."""
        if self.plan is not None:
            self.plan.free()
            self.plan = None


def _device_rows(ctx, batch: Batch, rows):
    """GPU worker: (U, E) host rows -> (B, F, E) on the device (H2D of U rows and of the
    inverse index, then the gather kernel)."""
    xp = ctx.xp
    batch.dev_inverse = to_device(xp, batch.inverse.ravel())  # H2D: 8 B per id (pinned, async)
    return gather(to_device(xp, rows), batch.dev_inverse).reshape(batch.ids.shape + rows.shape[1:])


def _stage_sums(ctx, batch: Batch, demb):
    """GPU worker: (B, F, E) device gradients -> (U, E) host sums per distinct id, in a
    pinned buffer, readable after the step's stream sync (``modes.step``). Its readers (the
    step message's Isend, completed in the step's last move; the Accumulate, flushed; the
    Allgatherv, blocking) are done before the next step's copy overwrites it."""
    sums = batch.dev_sums
    if sums is None:  # (made by graphs.DeviceStep, or here)
        sums = scatter_add(batch.dev_inverse, demb.reshape(batch.dev_inverse.size, -1),
                           batch.unique.size)
    return ctx.staging.stage(ctx.xp, "sparse_sums", sums)  # D2H queued: U rows, no wait


def _increasing(rows) -> bool:
    """rows (n,): strictly increasing (so distinct)."""
    return bool(np.all(rows[1:] > rows[:-1]))


def apply_parts(opt: Optimizer, w, state: dict, parts, step: int, threads: int = 1) -> None:
    """``opt`` on the rows of ``w`` (N, E) (and ``state``) that ``parts`` = [(rows (n,)
    int64, sums (n, E))] touch, each row once with its sums added in part order: the bits
    of ``segment_sum`` over the concatenated parts, then ``update_rows``, for any
    ``threads``. As ``grads_for`` sends them, each part's rows are strictly increasing (a
    plan's distinct ids of one owner, in local-row order); then one part is already the
    union (no sum), several are merged (``kernels.merge_sum``: no dedup, no sort), and with
    threads, thread i takes the rows in its own range of row values: it merges its slice of
    every part and updates them, no two threads touching one row. Other parts (not
    increasing): one segment sum, then the update on the threads (``pool``: chunks of the
    distinct rows)."""
    n = sum(r.size for r, _ in parts)
    chunks = pool.spans(n, threads, pool.MIN_ROWS_PER_THREAD)
    increasing = all(_increasing(r) for r, _ in parts)
    if len(parts) == 1 and increasing:
        opt.update_rows(w, parts[0][0], parts[0][1], state, step, threads=threads)
    elif len(chunks) > 1 and increasing and numba_active():
        longest = max((r for r, _ in parts), key=len)
        cuts = ([np.iinfo(np.int64).min]
                + [int(longest[len(longest) * i // len(chunks)]) for i in range(1, len(chunks))]
                + [np.iinfo(np.int64).max])  # thread i: rows cuts[i] <= r < cuts[i + 1]

        def sum_and_update(lo: int, hi: int) -> None:  # the rows lo <= r < hi
            mine = [(r[a:b], s[a:b]) for r, s in parts for a, b in [np.searchsorted(r, (lo, hi))]]
            opt.update_rows(w, *merge_sum(mine), state, step)

        pool.run(sum_and_update, list(zip(cuts[:-1], cuts[1:])))
    else:
        rows, g = (merge_sum(parts) if increasing else
                   segment_sum(np.concatenate([r for r, _ in parts]),
                               np.concatenate([s for _, s in parts])))
        opt.update_rows(w, rows, g, state, step, threads=threads)


class _StagedSums:
    """GPU workers: ``stage`` (move 0 of ``modes.step``) queues the copy of the step's
    (U, E) gradient sums to pinned host memory; ``_staged`` is it (valid after the sync).
    Where it is set, ``start``/``finish`` send it instead of summing ``demb`` on the host
    (``given_sums``). Both strategies: ``set_lr``, ``lookup``."""

    _staged = None

    def begin(self, step: int) -> None:
        """Before the forward pass: nothing (``stale.StaleReads`` counts the steps here)."""

    def set_rule(self, **changes) -> None:
        """The optimizer's fields from the next step on (``pshybrid.torch``: a torch
        scheduler's ``lr``, ``Mode.set_sparse_lr``; a resumed run's ``steps_before``)."""
        self.opt = replace(self.opt, **changes)

    def stage(self, batch: Batch, demb) -> None:
        """GPU workers, before the step's sync: the sums' device->host copy queued."""
        with self.ctx.kernel_timers.time("push"):
            self._staged = _stage_sums(self.ctx, batch, demb)

    def lookup(self, batch: Batch):
        """-> the batch's rows, ``batch.ids.shape + (E,)``: on the host the strategy's
        ``_expanded``; on a GPU worker its distinct rows (``unique_rows``) expanded there."""
        if self.ctx.xp is not np:
            rows = self.unique_rows(batch)
            with self.ctx.timers.time("pull"):
                return _device_rows(self.ctx, batch, rows)
        with self.ctx.timers.time("pull"):
            return self._expanded(batch)

    def given_sums(self, sums) -> None:
        """This step's (U, E) gradient sums, made elsewhere (what ``stage`` does on a GPU
        worker; bench/wire.py's stand-in of one): sent as they are."""
        self._staged = sums


class ServerSparse(_StagedSums):
    """The fused table sharded row-wise on the servers (``store``): one indexed Get per
    server to pull (on one node: a gather from the servers' shared memory). A non-SGD
    optimizer runs on the servers: each worker sends each server, with the step message, the
    local rows it touched and their gradient sums (two-sided, contiguous: no datatype), and
    the server sums the workers' parts and applies the optimizer; plain SGD (no ``--l2``:
    it needs the weights) instead pushes
    ``-lr * g`` straight onto the weights with one Accumulate per server (``live``)."""

    prepare_uses_mpi = True  # the plan may commit MPI datatypes

    def __init__(self, ctx, layout: FusedTable, opt: Optimizer):
        self.ctx, self.layout, self.opt = ctx, layout, opt
        self.name = layout.table.name
        self.server_step = opt.needs_weights
        self.live = not self.server_step
        self.grad_row = (layout.table.dim, np.dtype(layout.table.dtype))  # a sums row
        self.store = None
        self.pull_types = True  # the plan's datatypes serve pulls (not when a cache splits them)
        self._sent = None  # (plan, (U, E) host sums) of the step, for grads_for

    def tables(self) -> list[TableSpec]:
        spec = self.layout.table
        slots = self.opt.slots if self.server_step else ()
        return [TableSpec(spec.name, spec.rows, spec.dim, spec.dtype, spec.init,
                          spec.init_scale, slots)]

    def attach(self, store) -> None:
        self.store = store

    def ready(self) -> None:
        """After start-up and any resume (``hot.HotReplicated``: its rows from the owners)."""

    def prepare(self, ids) -> Batch:
        # row datatypes only where an RMA operation uses them: Gets without shared memory,
        # and the direct-SGD Accumulate
        types = self.live or (not self.store.shared and self.pull_types)
        return Batch(ids, plan=self.store.plan(self.name, ids, types=types))

    def _expanded(self, batch: Batch):
        return self.store.pull(self.name, batch.plan)

    def unique_rows(self, batch: Batch, out=None):
        """GPU workers: the (U, E) host rows of ``batch.unique`` (one Get per server), into
        ``out`` if given (``graphs.DeviceStep.rows_out``: its pinned buffer)."""
        with self.ctx.timers.time("pull"):
            return self.store.pull(self.name, batch.plan, unique=True, out=out)

    def _sums(self, batch: Batch, demb):
        """(U, E) host gradient sums of ``batch.plan.unique``."""
        if self._staged is None:  # (a CPU worker)
            return batch.plan.sum_rows(demb)
        # Wire: the staged pinned sums go out in the step message's Isend (completed in the
        # step's last move) or the Accumulate (flushed): done before the next step's copy
        return self._staged

    def start(self, batch: Batch, demb, step: int) -> None:
        if self.server_step:
            with self.ctx.timers.time("push"):
                self._sent = (batch.plan, self._sums(batch, demb))

    def finish(self, batch: Batch, demb, step: int) -> None:
        if self.live:
            with self.ctx.timers.time("push"):
                self.store.push(self.name, batch.plan, self._sums(batch, demb),
                                scale=-self.opt.lr_at(step), unique=True)

    def before_checkpoint(self) -> None:
        """Before a checkpoint reads the shards (``hot.HotReplicated``: its rows written)."""

    def grads_for(self, server: int):
        """(local rows (n,) int64, their gradient sums (n, E)) of ``server`` from the step's
        ``start`` (none without a server step: the servers have nothing to apply)."""
        if not self.server_step or self._sent is None:
            return np.zeros(0, np.int64), np.zeros((0,) + self.grad_row[:1], self.grad_row[1])
        plan, sums = self._sent
        a, b = plan.bounds[server], plan.bounds[server + 1]
        return partition.local_row(plan.unique[a:b], self.ctx.topo.n_servers), sums[a:b]

    def server_apply(self, parts, step: int) -> None:
        """Servers: ``parts`` = every worker's (local rows, sums), in worker order; the
        optimizer runs once on the union of the rows with the summed gradients (summed in
        worker order: the same bits every run), on ``ctx.apply_threads`` threads
        (``apply_parts``)."""
        if self.server_step:
            shard = self.store.shard
            state = {k: shard(self.name, k) for k in self.opt.slots}
            apply_parts(self.opt, shard(self.name), state, parts, step, self.ctx.apply_threads)

    def close(self) -> None:
        self._sent = self._staged = None

    # -- checkpoints, tests, export ------------------------------------------------------
    def state(self):
        """Servers: (global ids (n,): a range, {slot: (n, E)}) of the rows they hold."""
        self.store.win.Sync()  # see the workers' completed Accumulates (direct SGD)
        slots = {"w": self.store.shard(self.name)}
        if self.server_step:
            slots.update({k: self.store.shard(self.name, k) for k in self.opt.slots})
        topo = self.ctx.topo
        return partition.shard_range(self.layout.table.rows, topo.n_servers,
                                     topo.server_index), slots

    def load_rows(self, ids, values: dict) -> None:
        local = partition.local_row(ids, self.ctx.topo.n_servers)
        for slot, arr in values.items():
            self.store.shard(self.name, slot)[local] = arr
        self.store.win.Sync()  # publish before any worker's Get

    def owns(self, ids):
        topo = self.ctx.topo
        return partition.owner(ids, topo.n_servers) == topo.server_index

    def full_table(self) -> np.ndarray:
        """Workers: the whole fused table, pulled in chunks."""
        spec = self.layout.table
        out = np.empty((spec.rows, spec.dim), spec.dtype)
        for a in range(0, spec.rows, 1 << 16):
            b = min(spec.rows, a + (1 << 16))
            out[a:b] = self.store.pull(spec.name, np.arange(a, b, dtype=np.int64))
        return out

    def traffic(self) -> dict:
        return {}


class ReplicatedSparse(_StagedSums):
    """Every worker holds the whole fused table. Each worker's gradient rows, summed per
    distinct id, are exchanged with Allgather (ids + rows, Horovod style) and every worker
    applies the same optimizer update to its copy (on ``ctx.apply_threads`` threads)."""

    live = server_step = False
    prepare_uses_mpi = False

    def __init__(self, ctx, layout: FusedTable, opt: Optimizer):
        self.ctx, self.layout, self.opt = ctx, layout, opt
        spec = layout.table
        self.table = np.empty((spec.rows, spec.dim), spec.dtype)
        uniform_range(self.table, 0, 1, ctx.seed, spec.name, spec.init_scale)
        self.state_arrays = {k: np.zeros_like(self.table) for k in opt.slots}
        self.grad_row = (spec.dim, self.table.dtype)
        self.gather_bytes = 0

    def tables(self) -> list[TableSpec]:
        return []

    def attach(self, store) -> None:
        pass

    def ready(self) -> None:
        pass

    def before_checkpoint(self) -> None:
        pass

    def prepare(self, ids) -> Batch:
        unique, inverse, _ = unique_inverse(ids)
        return Batch(ids, unique=unique, inverse=inverse)

    def _expanded(self, batch: Batch):
        return gather(self.table, batch.ids)

    def unique_rows(self, batch: Batch, out=None):
        """GPU workers: the (U, E) host rows of ``batch.unique``, from the local table (into
        ``out`` if given)."""
        with self.ctx.timers.time("pull"):
            return gather(self.table, batch.unique, out=out)

    def sums(self, batch: Batch, demb):
        """(U, E) host gradient sums of ``batch.unique`` (input order within an id)."""
        if self._staged is None:  # (a CPU worker)
            dim = self.table.shape[1]
            return scatter_add(batch.inverse.ravel(), demb.reshape(-1, dim), batch.unique.size)
        return self._staged  # Wire: read by the blocking Allgatherv, before the next copy

    def start(self, batch: Batch, demb, step: int) -> None:
        with self.ctx.timers.time("push"):
            ids, rows = self.exchange(batch.unique, self.sums(batch, demb))
            self.opt.update_rows(self.table, ids, rows, self.state_arrays, step,
                                 threads=self.ctx.apply_threads)

    def exchange(self, uids, sums):
        """Every worker's (ids, summed rows) -> the distinct ids of all and their sums."""
        comm, dim = self.ctx.topo.workers, self.table.shape[1]
        # Wire: Allgather of counts, then Allgatherv of ids (8 B/row) and rows (itemsize*dim
        # B/row) over the workers; all workers wait.
        counts = np.array(comm.allgather(uids.size))
        all_ids = np.empty(counts.sum(), np.int64)
        comm.Allgatherv(uids, [all_ids, counts, MPI.INT64_T])
        all_rows = np.empty((counts.sum(), dim), self.table.dtype)
        T = mpi_type(self.table.dtype)
        comm.Allgatherv(np.ascontiguousarray(sums), [all_rows, counts * dim, T])
        self.gather_bytes += all_ids.nbytes + all_rows.nbytes
        return segment_sum(all_ids, all_rows)

    def finish(self, batch: Batch, demb, step: int) -> None:
        pass

    def grads_for(self, server: int):
        return np.zeros(0, np.int64), np.zeros((0, self.table.shape[1]), self.table.dtype)

    def server_apply(self, parts, step: int) -> None:
        pass

    def close(self) -> None:
        pass

    # -- checkpoints, tests, export: every worker holds every row (worker 0 writes them) --
    def state(self):
        return range(self.table.shape[0]), {"w": self.table, **self.state_arrays}

    def load_rows(self, ids, values: dict) -> None:
        self.table[ids] = values["w"]
        for k, arr in self.state_arrays.items():
            arr[ids] = values[k]

    def owns(self, ids):
        return np.ones(ids.shape, bool)

    def full_table(self) -> np.ndarray:
        return self.table.copy()

    def traffic(self) -> dict:
        return {"allgather_bytes": self.gather_bytes}


SPARSE = {"servers": ServerSparse, "replicated": ReplicatedSparse}
