"""Communication modes (DESIGN §3): where embeddings and dense weights live, how they move.

Every mode offers workers the same verbs, so the training loop is one piece of code:
``begin_step`` (ps: pull the dense weights), ``lookup(ids)`` (pull embedding rows),
``update(ids, demb, step)`` (apply sparse and dense gradients; returns with the step's
updates visible to every worker: BSP), ``full_dense``/``full_table`` (gather parameters,
for tests and export) and ``finish``; servers call ``serve``.

- ``hybrid``: embeddings sharded on servers (RMA); dense weights replicated on workers,
  gradients Allreduced over the workers.
- ``ps``: embeddings as hybrid; the dense flat buffer is a table of ``DENSE_ROW``-wide
  rows sharded on the servers, pulled every step and pushed back; its optimizer runs on
  the servers.
- ``allreduce``: every worker holds the whole table; each worker's deduplicated sparse
  gradient rows are exchanged with Allgather (ids + rows, Horovod style) and every worker
  applies the same update; dense gradients Allreduced.

Workers on a GPU (``--device cuda``: the ParamSpace and the model on CuPy, ``self.xp``):
embedding rows and the sparse exchange stay on the host exactly as on CPU; ``lookup`` and
``update`` move them over PCIe once per distinct id (``_lookup_device``/``_update_device``),
and the dense Allreduce takes the device buffer (``transport.iallreduce``: stream synchronised,
CUDA-aware MPI or staged through pinned host memory). Servers are always CPU.

Optimizers with state (and every non-SGD dense optimizer in ``ps``) run on the servers:
workers Accumulate raw gradient sums into a ``"g"`` slot and send each server the local
rows they touched (8 bytes per row); each server takes the union, applies the optimizer
to those rows and zeroes their ``"g"`` rows, then joins an end-of-step barrier. Plain SGD
skips the server step: workers accumulate ``-lr * g`` straight into the weights.
"""

from __future__ import annotations

import time
from collections import defaultdict

import numpy as np
from mpi4py import MPI

from . import partition
from .backend import array_module, synchronize, to_host
from .errors import ConfigError
from .initializers import uniform_rows
from .kernels import gather, scatter_add, segment_sum, unique_inverse
from .layers import ParamSpace
from .optim import Optimizer
from .schema import FusedTable, TableSpec
from .store import EmbeddingStore, Traffic
from .topology import Topology
from .transport import iallreduce, idle_barrier, mpi_type, poll_recv

DENSE_ROW = 256  # width of a row of the dense "table" in ps mode
TAG_STEP, TAG_STOP, TAG_CKPT = 101, 102, 103


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


class GradBuckets:
    """Starts the dense gradient's Allreduce in buckets while backward still runs.

    Parameters sit in ``flat_grad`` in registration order and backward mostly finishes them
    in reverse, so a *suffix* of the buffer becomes final first. ``ready(names)`` (the
    ParamSpace callback) grows the final suffix; once it holds ``min_bytes`` not yet sent,
    that span's Iallreduce starts (in place). ``finish()`` starts whatever is left, in one
    last bucket, and returns every request of the step. Each element is reduced exactly once
    whatever order layers finish in; the buckets only decide how early. Every worker starts
    the same buckets in the same order (same model, same backward).
    """

    def __init__(self, ps: ParamSpace, start, min_bytes: int):
        self.ps, self.start, self.min_bytes = ps, start, min_bytes
        self.spans = sorted((ps.offset(n), n) for n in ps.names)  # (first element, name)
        self.itemsize = ps.flat_grad.dtype.itemsize
        self._reset()

    def _reset(self) -> None:
        self.done: set[str] = set()
        self.k = len(self.spans)     # spans[k:] are final
        self.sent = self.ps.size     # flat_grad[sent:] has been started
        self.reqs = []

    def ready(self, names) -> None:
        again = self.done.intersection(names)
        if again:  # the first report's span may be on the wire already: no silent mix-up
            raise ConfigError(f"parameters {sorted(again)} were reported final twice in one "
                              "backward pass (a layer applied twice per step?): train with "
                              "--bucket-mb 0")
        self.done.update(names)
        while self.k > 0 and self.spans[self.k - 1][1] in self.done:
            self.k -= 1
        lo = self.spans[self.k][0] if self.k < len(self.spans) else self.ps.size
        if (self.sent - lo) * self.itemsize >= self.min_bytes:
            self._send(lo)
        if self.reqs:  # drive the started buckets (MPI progresses inside its calls)
            MPI.Request.Testall([getattr(r, "req", r) for r in self.reqs])

    def _send(self, lo: int) -> None:
        # Wire: Iallreduce(SUM) of flat_grad[lo:sent] over the workers, in place.
        self.reqs.append(self.start(self.ps.flat_grad[lo:self.sent]))
        self.sent = lo

    def finish(self) -> list:
        if self.sent > 0:
            self._send(0)
        reqs = self.reqs
        self._reset()
        return reqs


class Mode:
    name = ""
    dense_on_servers = False  # ps: the dense weights live on the servers (no Allreduce)
    needs_servers = True

    def __init__(self, topo: Topology, sparse: FusedTable, ps: ParamSpace,
                 sparse_opt: Optimizer, dense_opt: Optimizer, seed: int):
        self.topo, self.sparse, self.ps = topo, sparse, ps
        self.sparse_opt, self.dense_opt, self.seed = sparse_opt, dense_opt, seed
        self.timers = Timers()
        self.xp = array_module(ps.flat)  # numpy, or cupy on GPU workers
        self.cuda_aware = False  # GPU workers: hand device buffers to MPI (else stage them)
        self.dense_state = {k: self.xp.zeros_like(ps.flat) for k in dense_opt.slots}
        self.allreduce_bytes = 0
        self.start_step = 0  # the step a resumed run starts from (servers' Adam step count)
        self._pending = None  # GPU workers: (ids, uniq, device inverse) from the last lookup
        self._buckets = None  # GradBuckets when the Allreduce overlaps backward

    # the verbs: host arrays on CPU; on a GPU worker, device arrays in and out
    def prepare(self, ids):
        """Any thread, ahead of the step: the work that depends on the step's ids alone
        (server modes: the store's ``Plan``: dedup, owner groups, row datatypes), handed to
        ``lookup``; None where a mode has none."""
        return None

    def lookup(self, ids, prepared=None):
        """ids: (B, F) int64 (host) -> emb: (B, F, E) in ``self.xp``. ``prepared``:
        ``prepare(ids)`` made ahead (else made here when the mode has one); the step's
        ``update`` with the same ``ids`` reuses it."""
        return self._pull(ids) if self.xp is np else self._lookup_device(ids)

    def update(self, ids, demb, step: int) -> None:
        """Apply step ``step``'s gradients (ids: (B, F) host, demb: (B, F, E) in ``self.xp``,
        the lookup's ids); on return every worker's next lookup sees them (BSP)."""
        if self.xp is np:
            self._apply(ids, demb, step)
        else:
            self._update_device(ids, demb, step)

    def _lookup_device(self, ids):
        """Dedupe on the host, pull the U distinct rows (host), copy them and the inverse
        index host->device, expand to (B, F, E) with the gather kernel."""
        uniq, inverse, _ = unique_inverse(ids)
        rows = self._pull(uniq)  # (U, E) host: store Get / host-table gather, timed as pull
        with self.timers.time("pull"):
            inv = self.xp.asarray(inverse)  # H2D: 8 B per id
            emb = gather(self.xp.asarray(rows), inv)  # H2D: U rows; (B*F, E) on the device
        self._pending = (ids, uniq, inv)
        return emb.reshape(ids.shape + rows.shape[1:])

    def _update_device(self, ids, demb, step: int) -> None:
        """Sum demb's rows per distinct id on the device (scatter-add kernel), copy the
        (U, E) sums device->host, apply them through the host path with the distinct ids."""
        last, uniq, inv = self._pending
        assert last is ids, "update(ids) must follow lookup(ids) of the same step"
        with self.timers.time("push"):
            sums = scatter_add(inv, demb.reshape(inv.size, -1), uniq.size)
            sums = to_host(sums)  # D2H: U rows (waits for the backward pass)
        self._apply(uniq, sums, step)

    # dense weights replicated on workers (hybrid, allreduce)
    def overlap_allreduce(self, min_bytes: int) -> None:
        """Workers of modes with a dense Allreduce: start it in buckets of at least
        ``min_bytes`` during backward (``GradBuckets``); 0: one Allreduce after backward."""
        self._buckets = None
        self.ps.on_grads_ready = None
        if min_bytes > 0 and not self.dense_on_servers and not self.topo.is_server:
            self._buckets = GradBuckets(self.ps, self._iallreduce, min_bytes)
            self.ps.on_grads_ready = self._buckets.ready

    def _iallreduce(self, buf):
        # Wire: Iallreduce(SUM) of buf over the workers (a GPU buffer: after a stream sync,
        # directly or staged; see ``transport.iallreduce``).
        return iallreduce(self.topo.workers, buf, self.cuda_aware)

    def _start_allreduce(self) -> list:
        """Start (the rest of) the dense gradient's Allreduce; finish it with
        ``_finish_allreduce``, so the sparse exchange in between overlaps it."""
        self.allreduce_bytes += self.ps.flat_grad.nbytes
        if self._buckets is not None:
            return self._buckets.finish()
        return [self._iallreduce(self.ps.flat_grad)]

    def _finish_allreduce(self, reqs, step: int) -> None:
        with self.timers.time("allreduce"):
            for r in reqs:
                r.Wait()  # all workers have contributed: also a sync point for BSP
        with self.timers.time("dense_apply"):
            self.dense_opt.update(self.ps.flat, self.ps.flat_grad, self.dense_state, step)
            synchronize(self.ps.flat)  # GPU: time the kernels (no-op on CPU)

    def begin_step(self, step: int) -> None:
        pass

    def full_dense(self) -> np.ndarray:
        return to_host(self.ps.flat).copy()

    def serve(self, on_checkpoint) -> None:
        """Servers: run until the workers finish (no servers in this mode)."""

    def request_checkpoint(self, step: int) -> None:
        """Workers: tell the servers to join ``checkpoint.save`` for ``step``."""

    def finish(self) -> None:
        pass

    # -- state for checkpoints (sparse_state, set_sparse_rows, owns: in the subclasses) --
    def dense_state_full(self):
        """Workers: (flat (P,), {slot: (P,)}) of the dense parameters and their optimizer
        (host arrays; on a GPU worker, copies)."""
        return to_host(self.ps.flat), {k: to_host(a) for k, a in self.dense_state.items()}

    def set_dense_state(self, flat, state: dict) -> None:
        """Every rank of a load calls this; only workers hold the dense buffer here."""
        if self.topo.is_server:
            return
        self.ps.flat[...] = self.xp.asarray(flat)
        for k, arr in self.dense_state.items():
            arr[...] = self.xp.asarray(state[k])

    def traffic(self) -> dict:
        return {"allreduce_bytes": self.allreduce_bytes}


class _ServerMode(Mode):
    """Shared by hybrid and ps: the fused sparse table (and ps's dense table) on servers."""

    def __init__(self, *args):
        super().__init__(*args)
        spec = self.sparse.table
        self.sparse_server_step = self.sparse_opt.kind != "sgd"
        tables = [TableSpec(spec.name, spec.rows, spec.dim, spec.dtype, spec.init, spec.init_scale,
                            (("g",) + self.sparse_opt.slots) if self.sparse_server_step else ())]
        if self.dense_on_servers:
            P = self.ps.size
            self.dense_rows = -(-P // DENSE_ROW)
            self.dense_server_step = self.dense_opt.kind != "sgd"
            tables.append(TableSpec("dense", self.dense_rows, DENSE_ROW, str(self.ps.flat.dtype),
                                    "zeros", 0.0,
                                    (("g",) + self.dense_opt.slots) if self.dense_server_step else ()))
        else:
            self.dense_server_step = False
        self.server_step = self.sparse_server_step or self.dense_server_step
        self.store = EmbeddingStore(self.topo, tables, seed=self.seed)
        self.step_bytes = 0  # two-sided row-id messages sent
        self._prepared = None  # (looked-up ids, their Plan) until the step's update
        self._dense_plan = None  # ps workers: the plan of every dense row (_dense_all)

    def prepare(self, ids):
        if self.xp is not np:
            return None  # GPU workers pull the distinct ids (_lookup_device)
        return self.store.plan(self.sparse.table.name, ids)

    def lookup(self, ids, prepared=None):
        self._release()
        with self.timers.time("pull"):
            prepared = prepared if prepared is not None else self.prepare(ids)
        self._prepared = None if prepared is None else (ids, prepared)
        return super().lookup(ids)

    def _planned(self, ids):
        """The step's plan when ``ids`` is the looked-up array, else ``ids`` itself."""
        p = self._prepared
        return p[1] if p is not None and p[0] is ids else ids

    def _release(self) -> None:
        if self._prepared is not None:
            self._prepared[1].free()
            self._prepared = None

    def _pull(self, ids):
        with self.timers.time("pull"):
            return self.store.pull(self.sparse.table.name, self._planned(ids))

    # ps mode: the dense flat buffer as rows of the "dense" table
    def _dense_all(self):
        """Workers: every row of the dense table, as a Plan made once and reused every step
        (the same ids each time: its datatypes are committed once)."""
        if self._dense_plan is None:
            self._dense_plan = self.store.plan("dense", np.arange(self.dense_rows, dtype=np.int64))
        return self._dense_plan

    def _padded(self, flat):
        out = np.zeros(self.dense_rows * DENSE_ROW, flat.dtype)
        out[:flat.size] = to_host(flat)  # GPU worker: D2H of the dense buffer
        return out.reshape(self.dense_rows, DENSE_ROW)

    def _notify_servers(self, touched) -> None:
        """Wire: to each server, one int64 message of the local sparse rows this worker
        touched (``touched`` = push's (unique, bounds)); the server waits for every worker."""
        unique, bounds = touched
        S = self.topo.n_servers
        rows = [partition.local_row(unique[bounds[s]:bounds[s + 1]], S) for s in range(S)]
        self.step_bytes += sum(r.nbytes for r in rows)
        self._send_to_servers(TAG_STEP, rows)

    def _send_to_servers(self, tag: int, payloads) -> None:
        """Wire: payloads[s] (int64) to server s with ``tag``; waits for the sends only."""
        bufs = [np.ascontiguousarray(p, dtype=np.int64) for p in payloads]  # alive until Waitall
        MPI.Request.Waitall([self.topo.world.Isend([b, MPI.INT64_T], r, tag)
                             for b, r in zip(bufs, self.topo.server_ranks)])

    def _apply(self, ids, demb, step: int) -> None:
        """Apply step ``step``'s gradients; on return every worker's next pull sees them.

        Pushes into a ``"g"`` slot (server-side optimizers) are invisible to pulls and go
        first. Direct-SGD pushes write the live weights, so they wait until every worker
        has pulled this step (BSP): the dense Allreduce is that sync point in hybrid mode,
        a workers' barrier in ps mode.
        """
        sparse, store = self.sparse.table.name, self.store
        ids = self._planned(ids)  # the lookup's plan: no second dedup or datatype
        direct_sparse = not self.sparse_server_step
        direct_dense = self.dense_on_servers and not self.dense_server_step
        touched = None
        allreduce = None if self.dense_on_servers else self._start_allreduce()
        with self.timers.time("push"):
            if self.sparse_server_step:
                touched = store.push(sparse, ids, demb, slot="g")
            if self.dense_on_servers and self.dense_server_step:
                store.push("dense", self._dense_all(), self._padded(self.ps.flat_grad), slot="g")
        notify_early = self.server_step and not (direct_sparse or direct_dense)
        if notify_early:
            self._notify_servers(touched)  # servers start applying while the Allreduce runs
        if allreduce is not None:
            self._finish_allreduce(allreduce, step)
        elif direct_sparse or direct_dense:
            with self.timers.time("wait"):
                store.barrier()  # Wire: workers' zero-byte barrier: everyone has pulled step t
        with self.timers.time("push"):
            if direct_sparse:
                touched = store.push_sgd(sparse, ids, demb, self.sparse_opt.lr)
            if direct_dense:
                store.push_sgd("dense", self._dense_all(), self._padded(self.ps.flat_grad),
                               self.dense_opt.lr)
        if self.server_step and not notify_early:
            self._notify_servers(touched)
        self._release()
        with self.timers.time("wait"):
            if self.server_step:
                # Wire: zero-byte Ibarrier over world; servers join after applying the step.
                self.topo.world.Ibarrier().Wait()
            else:
                store.barrier()  # Wire: workers' zero-byte barrier: every push is complete

    def serve(self, on_checkpoint) -> None:
        """Servers: handle rounds of one message from every worker until STOP:
        STEP (apply the step's optimizer to the union of the rows the workers touched),
        CKPT (call ``on_checkpoint(step)``, collective with the workers)."""
        topo, store, name = self.topo, self.store, self.sparse.table.name
        step = self.start_step
        while True:
            msgs = []
            with self.timers.time("wait"):
                for r in topo.worker_ranks:
                    msgs.append(poll_recv(topo.world, r))  # Wire: one message from worker r
            tags = {tag for _, tag in msgs}
            assert len(tags) == 1, f"workers out of step: tags {tags}"
            tag = tags.pop()
            if tag == TAG_STOP:
                return
            if tag == TAG_CKPT:
                on_checkpoint(int(msgs[0][0][0]))
                continue
            step += 1
            with self.timers.time("server_apply"):
                store.win.Sync()  # see the workers' completed Accumulates
                # the optimizer reads the "g" slot's rows and zeroes them (one fused pass)
                if self.sparse_server_step:
                    rows = unique_inverse(np.concatenate([m for m, _ in msgs]))[0]
                    state = {k: store.shard(name, k) for k in self.sparse_opt.slots}
                    self.sparse_opt.apply_slot(store.shard(name), store.shard(name, "g"),
                                               state, step, rows)
                if self.dense_server_step:
                    state = {k: store.shard("dense", k) for k in self.dense_opt.slots}
                    self.dense_opt.apply_slot(store.shard("dense"), store.shard("dense", "g"),
                                              state, step)
                store.win.Sync()  # publish before the workers' next Get
            with self.timers.time("wait"):
                idle_barrier(topo.world)

    def request_checkpoint(self, step: int) -> None:
        self._send_to_servers(TAG_CKPT, [[step]] * self.topo.n_servers)

    # -- checkpoint state: servers hold the sparse shards; the dense buffer per mode --
    def sparse_state(self):
        name = self.sparse.table.name
        slots = {"w": self.store.shard(name)}
        slots.update({k: self.store.shard(name, k) for k in self.sparse_opt.slots
                      if self.sparse_server_step})
        return self.store.shard_ids(name), slots

    def set_sparse_rows(self, ids, values: dict) -> None:
        name, S = self.sparse.table.name, self.topo.n_servers
        local = partition.local_row(ids, S)
        for slot, arr in values.items():
            self.store.shard(name, slot)[local] = arr
        self.store.win.Sync()  # publish before any worker's Get

    def owns(self, ids):
        return partition.owner(ids, self.topo.n_servers) == self.topo.server_index

    def full_table(self) -> np.ndarray:
        """Workers: the whole fused table, pulled in chunks."""
        spec = self.sparse.table
        out = np.empty((spec.rows, spec.dim), spec.dtype)
        for a in range(0, spec.rows, 1 << 16):
            b = min(spec.rows, a + (1 << 16))
            out[a:b] = self.store.pull(spec.name, np.arange(a, b, dtype=np.int64))
        return out

    def finish(self) -> None:
        self._release()
        if self._dense_plan is not None:
            self._dense_plan.free()
        if not self.topo.is_server:
            self._send_to_servers(TAG_STOP, [[]] * self.topo.n_servers)
        self.store.close()

    def traffic(self) -> dict:
        t = self.store.traffic
        return {"rma_get_bytes": t.get_bytes, "shm_read_bytes": t.shm_bytes,
                "rma_acc_bytes": t.acc_bytes,
                "p2p_bytes": self.step_bytes, "allreduce_bytes": self.allreduce_bytes}


class HybridMode(_ServerMode):
    name = "hybrid"


class PSMode(_ServerMode):
    name = "ps"
    dense_on_servers = True

    def __init__(self, *args):
        super().__init__(*args)
        # Worker 0 writes the initial dense weights into the zeroed dense table.
        if self.topo.rank == self.topo.worker_ranks[0]:
            self.store.push("dense", self._dense_all(), self._padded(self.ps.flat))
            self.store.traffic = Traffic()  # count training steps only
        # Wire: zero-byte barrier over world so nobody pulls before the initial weights landed.
        idle_barrier(self.topo.world)

    def begin_step(self, step: int) -> None:
        with self.timers.time("pull"):
            rows = self.store.pull("dense", self._dense_all())
            self.ps.flat[...] = self.xp.asarray(rows.ravel()[:self.ps.size])  # GPU: H2D

    def full_dense(self) -> np.ndarray:
        self.begin_step(-1)
        return to_host(self.ps.flat).copy()

    def dense_state_full(self):
        P, ids = self.ps.size, self._dense_all()
        flat = self.store.pull("dense", ids).ravel()[:P]
        slots = self.dense_opt.slots if self.dense_server_step else ()
        return flat, {k: self.store.pull("dense", ids, slot=k).ravel()[:P] for k in slots}

    def set_dense_state(self, flat, state: dict) -> None:
        """Servers write their rows of the dense table (weights and optimizer state);
        the caller's collective barrier orders it before any pull."""
        if not self.topo.is_server:
            self.ps.flat[...] = self.xp.asarray(flat)
            return
        mine = self.store.shard_ids("dense")
        self.store.shard("dense")[...] = self._padded(flat)[mine]
        for k in (self.dense_opt.slots if self.dense_server_step else ()):
            self.store.shard("dense", k)[...] = self._padded(state[k])[mine]
        self.store.win.Sync()


class AllreduceMode(Mode):
    name = "allreduce"
    needs_servers = False

    def __init__(self, *args):
        super().__init__(*args)
        spec = self.sparse.table
        self.table = np.empty((spec.rows, spec.dim), spec.dtype)
        uniform_rows(self.table, np.arange(spec.rows, dtype=np.int64), self.seed, spec.name,
                     spec.init_scale)
        self.sparse_state_arrays = {k: np.zeros_like(self.table) for k in self.sparse_opt.slots}
        self.gather_bytes = 0

    def _pull(self, ids):
        with self.timers.time("pull"):
            return gather(self.table, ids)

    def _apply(self, ids, demb, step: int) -> None:
        comm, dim = self.topo.workers, self.table.shape[1]
        allreduce = self._start_allreduce()  # overlaps the sparse exchange below
        with self.timers.time("push"):
            uids, sums = segment_sum(ids.ravel(), demb.reshape(-1, dim))
            # Wire: Allgather of counts, then Allgatherv of ids (8 B/row) and rows (itemsize*dim
            # B/row) over the workers; all workers wait.
            counts = np.array(comm.allgather(uids.size))
            all_ids = np.empty(counts.sum(), np.int64)
            comm.Allgatherv(uids, [all_ids, counts, MPI.INT64_T])
            all_rows = np.empty((counts.sum(), dim), self.table.dtype)
            T = mpi_type(self.table.dtype)
            comm.Allgatherv(np.ascontiguousarray(sums), [all_rows, counts * dim, T])
            self.gather_bytes += all_ids.nbytes + all_rows.nbytes
            rows, g = segment_sum(all_ids, all_rows)
            self.sparse_opt.update_rows(self.table, rows, g, self.sparse_state_arrays, step)
        self._finish_allreduce(allreduce, step)

    def full_table(self) -> np.ndarray:
        return self.table.copy()

    def traffic(self) -> dict:
        return {"allgather_bytes": self.gather_bytes, "allreduce_bytes": self.allreduce_bytes}

    # -- checkpoint state: every worker holds every row (only worker 0 writes them) --
    def sparse_state(self):
        """(global ids (n,), {slot: (n, E) array}) this rank holds; workers of the
        allreduce mode hold every row (only worker 0 writes them)."""
        rows = self.table.shape[0]
        return np.arange(rows, dtype=np.int64), {"w": self.table, **self.sparse_state_arrays}

    def set_sparse_rows(self, ids, values: dict) -> None:
        """Load rows ``ids`` (this rank's) of each slot from ``values``."""
        self.table[ids] = values["w"]
        for k, arr in self.sparse_state_arrays.items():
            arr[ids] = values[k]

    def owns(self, ids):
        """Mask of the global ids this rank holds."""
        return np.ones(ids.shape, bool)


MODES = {"hybrid": HybridMode, "ps": PSMode, "allreduce": AllreduceMode}
