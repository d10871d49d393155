"""``Mode``: a sparse and a dense strategy, driven by one fixed step sequence.

The BSP rule: the pulls of step t+1 see every update of step t, and no update of step t
reaches weights a worker may still be reading for step t. ``update`` keeps it in five moves:

1. ``start``: gradients that no pull can see go on the wire first (the dense Allreduce
   buckets, the dense table's pushes into a server ``"g"`` slot, the Allgather exchange of a
   replicated table) or are made ready (the sparse sums the servers will get);
2. if nothing is ``live``, the servers get their step message now (rows and sums), so they
   apply while the Allreduce still runs;
3. the sync point: after it every worker has finished its pulls of step t (the dense
   Allreduce's completion, or else, when a live push follows, a workers' barrier);
4. ``finish``: the live pushes (direct SGD onto the weights);
5. the servers' step is waited for (each server's zero-byte acknowledgement, sent after
   applying), or, with live pushes and no server step, a workers' barrier: every push is
   complete. With ``--placement colocated`` every rank is a worker owning a shard: it
   receives every worker's step message for its shard and applies the optimizer itself,
   then joins an Ibarrier over the world (the messages were sent after each worker's pulls,
   so all pulls of step t are done when the last one arrives). While the servers apply,
   the worker makes its next step's batch (``update``'s ``idle``: reading and planning,
   which need no weights), so a rank with one core still overlaps input with the wait.

On a GPU worker a move 0 comes first (``stage``): every device->host copy the step's MPI
calls read (the sparse gradient sums; the dense gradient when it is staged or pushed to
the servers) is queued on the current stream into reused pinned host buffers, then the
stream is synchronised ONCE -- the step's only host wait: it waits for backward and for the
copies. Moves 1-5 then hand MPI host buffers (or, with CUDA-aware MPI, device buffers)
with no further wait; what comes back (the Allreduce's sum) goes to the device
asynchronously. A pinned buffer is overwritten by the next step's move 0 only: every MPI
call reading it completed within this step's moves (each strategy's ``stage`` says how).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..backend import HostStaging, array_module, host_waits, synchronize
from ..kernels import numba_active
from ..optim import Optimizer
from ..registry import ModeSpec, is_synchronous
from ..store import EmbeddingStore
from ..threads import rank_server_threads
from ..timers import EventTimers, Timers
from ..topology import Topology
from .dense import DENSE
from .hot import HotReplicated, HotRows
from .servers import ServerLink, apply_step, serve
from .sparse import SPARSE, Batch
from .stale import Pipeline, StaleReads, staleness_bound
from .strategy import DenseStrategy, SparseStrategy


@dataclass
class Context:
    """What the two strategies of a mode share."""

    topo: Topology
    params: object       # the model's ParamSpace
    xp: object           # numpy, or cupy on GPU workers
    timers: Timers
    seed: int
    cuda_aware: bool     # GPU workers: hand device buffers to MPI (else stage them)
    kernel_timers: object = None  # phases that launch kernels: ``timers``, or on GPU
    #                               workers ``EventTimers`` (device time, no host wait)
    staging: HostStaging | None = None  # GPU workers: pinned buffers of the step's D2H
    apply_threads: int = 1  # threads of the optimizer apply on this rank's shard (``pool``)

    def __post_init__(self):
        if self.kernel_timers is None:
            self.kernel_timers = self.timers


@dataclass
class ModeSetup:
    """What a ``Mode`` is built from (``build_mode`` makes it from the registry's name):
    ``spec`` (the catalogue entry), the topology, the fused table's layout, the model's
    ParamSpace, the two optimizers and the seed; then the options: ``bucket_bytes`` (start
    the dense Allreduce in buckets of at least that many bytes during backward; 0: one
    Allreduce after it), ``shared_memory`` (the store's same-node path: None = on when the
    job is on one node), ``cuda_aware``, ``hot_rows`` (sorted fused-table rows replicated on
    every worker, ``modes.hot``; call ``ready()`` once the tables hold their start values),
    ``consistency`` (``bsp``, ``ssp:K``, ``asp``) and ``cache_rows`` (the worker's hot-row
    cache): with a consistency other than ``bsp``, or a cache, workers read the embeddings
    through ``stale.Pipeline`` (``Mode.stale``; the sparse strategy wrapped in
    ``stale.StaleReads``; None otherwise: the bsp path, unchanged),
    ``dense`` (a dense strategy class called as ``DENSE``'s are, ``(ctx, dense_opt,
    bucket_bytes)``, in place of the registry's: ``pshybrid.torch``'s, whose update is the
    torch optimizer's), ``apply_threads`` (threads of the optimizer apply on this rank's
    shard, a server's or a colocated rank's; None: ``threads.rank_server_threads``, one
    per core the rank has, a dedicated server's with its part of the node's spare cores)."""

    spec: ModeSpec
    topo: Topology
    layout: object
    params: object
    sparse_opt: Optimizer
    dense_opt: Optimizer
    seed: int
    bucket_bytes: int = 0
    shared_memory: bool | None = None
    cuda_aware: bool = False
    hot_rows: object = None
    consistency: str = "bsp"
    cache_rows: int = 0
    dense: type | None = None
    apply_threads: int | None = None


class Mode:
    """``setup.spec``'s strategies for one job (collective construction over
    ``topo.world``; ``ModeSetup`` says what each option does)."""

    sparse: SparseStrategy
    dense: DenseStrategy

    def __init__(self, setup: ModeSetup):
        spec, topo, params = setup.spec, setup.topo, setup.params
        self.spec, self.topo, self.layout = spec, topo, setup.layout
        self.timers = Timers()
        # every rank loads the CPU kernels (numba) now, in start-up: a worker that loaded
        # them in its first step (~1 s) held every other worker at the step's Allreduce
        numba_active()
        self.xp = array_module(params.flat)
        gpu = self.xp is not np
        self.kernel_timers = EventTimers(self.timers, self.xp.cuda) if gpu else self.timers
        threads = setup.apply_threads or rank_server_threads(None, topo.servers_here)[0]
        ctx = Context(topo, params, self.xp, self.timers, setup.seed, setup.cuda_aware,
                      self.kernel_timers, HostStaging() if gpu else None, threads)
        self.sparse = SPARSE[spec.sparse](ctx, setup.layout, setup.sparse_opt)
        hot = setup.hot_rows  # --replicate-rows: the hot rows on every worker (modes.hot)
        if hot is not None and hot.size and topo.is_worker:
            table = setup.layout.table
            self.sparse = HotReplicated(self.sparse, HotRows(
                ctx, table.name, hot, table.dim, table.dtype, setup.sparse_opt))
        self.dense = (setup.dense or DENSE[spec.dense])(ctx, setup.dense_opt, setup.bucket_bytes)
        assert isinstance(self.sparse, SparseStrategy) and isinstance(self.dense, DenseStrategy)
        tables = self.sparse.tables() + self.dense.tables()
        self.store = (EmbeddingStore(topo, tables, seed=setup.seed,
                                     shared_memory=setup.shared_memory) if tables else None)
        self.sparse.attach(self.store)
        self.dense.attach(self.store)
        self.server_step = self.sparse.server_step or self.dense.server_step
        self.live = self.sparse.live or self.dense.live
        self.link = ServerLink(topo) if spec.needs_servers else None
        self.stale = None  # the pipeline of StaleReads, which wraps the sparse strategy
        if (not is_synchronous(setup.consistency) or setup.cache_rows) and topo.is_worker:
            assert spec.stale_reads and setup.hot_rows is None, "refused by the config"
            self.stale = Pipeline(self.sparse, staleness_bound(setup.consistency),
                                  setup.cache_rows)
            self.sparse = StaleReads(self.sparse, self.stale, self.timers)

    # -- the step (workers) ----------------------------------------------------------------
    @property
    def prepare_uses_mpi(self) -> bool:
        """Whether ``prepare`` makes MPI calls (a data thread needs MPI_THREAD_MULTIPLE)."""
        return self.sparse.prepare_uses_mpi

    def prepare(self, ids) -> Batch:
        """ids: (B, F) int64 host -> the step's ``Batch`` (dedup, owner groups, datatypes)."""
        return self.sparse.prepare(ids)

    def begin(self, step: int) -> None:
        """Before the forward pass (``ps``: pull the dense weights)."""
        self.dense.begin(step)
        self.sparse.begin(step)

    def lookup(self, batch: Batch):
        """-> emb: batch.ids.shape + (E,) in ``self.xp``."""
        return self.sparse.lookup(batch)

    def unique_rows(self, batch: Batch, out=None):
        """GPU workers: -> the (U, E) host rows of ``batch.unique``, pulled (what ``lookup``
        expands on the device; ``graphs.DeviceStep`` takes them instead), into ``out`` if
        given (``DeviceStep.rows_out``)."""
        return self.sparse.unique_rows(batch, out)

    def update(self, batch: Batch, demb, step: int, idle=None) -> None:
        """Apply step ``step``'s gradients (demb: (B, F, E) in ``self.xp``, or None on a GPU
        worker whose ``batch.dev_sums`` holds their sums; the dense ones in the
        ParamSpace); on return every worker's next lookup sees them (BSP). ``idle()``
        (local work: no communication) runs while the servers apply
        this step, if they have one: the loop makes the next batch then."""
        sparse, dense = self.sparse, self.dense
        if self.xp is not np:                              # 0. GPU: queue every D2H, then
            self.stage(batch, demb, step)                  #    the step's one host wait
        dense.start(step)                                  # 1. nothing a pull can see yet
        sparse.start(batch, demb, step)
        if self.server_step and not self.live:
            self._send_step()                              # 2. servers apply meanwhile
        if not dense.sync(step) and self.live:             # 3. every worker pulled step t
            with self.timers.time("wait"):
                self.topo.workers.Barrier()  # Wire: zero-byte barrier over the workers
        sparse.finish(batch, demb, step)                   # 4. live pushes
        dense.finish(step)
        if self.server_step and self.live:
            self._send_step()
        if self.server_step:
            if self.topo.colocated:
                apply_step(self.topo, self, step)          # 5. this rank's shard, then
            self.link.wait(self.timers, idle)              #    the step is complete
        elif self.live:
            with self.timers.time("wait"):
                self.topo.workers.Barrier()  # Wire: zero-byte barrier: every push completed

    def stage(self, batch: Batch, demb, step: int) -> None:
        """GPU workers, move 0: the strategies queue their device->host copies (pinned,
        asynchronous), then ONE stream synchronisation (it waits for backward too): after
        it every MPI call of the step reads host or device memory without waiting."""
        self.sparse.stage(batch, demb)
        self.dense.stage(step)
        # the step's one host wait (every queued kernel and copy is done)
        synchronize(demb if demb is not None else batch.dev_sums)

    def set_sparse_lr(self, lr: float) -> None:
        """Workers, between steps: the sparse optimizer's learning rate from the next
        ``update`` on, here and, where they run it, on the dedicated servers
        (``pshybrid.torch``: a torch scheduler's rate)."""
        self.sparse.set_rule(lr=lr)
        if self._dedicated and self.sparse.server_step:
            self.link.set_lr(lr)  # Wire: see servers.ServerLink.set_lr

    def _send_step(self) -> None:
        with self.timers.time("push"):
            self.link.step(self.sparse.grads_for)  # Wire: see servers.ServerLink.step

    # -- servers ---------------------------------------------------------------------------
    def serve(self, start_step: int, on_checkpoint, on_wait=None) -> None:
        """Servers: run the steps' optimizers until the workers stop (``servers.serve``;
        ``on_wait()`` is called while waiting for the workers' messages)."""
        serve(self.topo, self, start_step, on_checkpoint, on_wait)

    def server_apply(self, parts, step: int) -> None:
        self.sparse.server_apply(parts, step)
        self.dense.server_apply(step)

    @property
    def _dedicated(self) -> bool:
        """Server ranks that only serve exist (they run ``serve`` and need CKPT/STOP)."""
        return self.link is not None and not self.topo.colocated

    def ready(self) -> None:
        """After start-up and any resume, before the first step (workers)."""
        self.sparse.ready()
        self.waits_at_start = host_waits()

    def host_syncs(self) -> int:
        """GPU workers: the host's waits for the device since ``ready`` (``backend``)."""
        return host_waits() - self.waits_at_start

    def request_checkpoint(self, step: int) -> None:
        """Workers, before ``checkpoint.save`` for ``step``: replicated rows written back to
        their owners; dedicated servers told to join."""
        self.sparse.before_checkpoint()  # (StaleReads: and drained: a BSP point)
        if self._dedicated:
            self.link.checkpoint(step)

    def finish(self) -> None:
        """Collective: stop the servers, free plans and the store's window."""
        self.sparse.close()
        self.dense.close()
        if self.link is not None and self.topo.is_worker:  # Wire: TAG_STOP to every server
            self.link.stop(self.sparse.grad_row)           # (colocated: to every rank)
        if self.store is not None:
            self.store.close()

    # -- state: checkpoints, tests, export -------------------------------------------------
    def sparse_state(self):
        """Holders of sparse rows: (global ids (n,), {slot: (n, E)})."""
        return self.sparse.state()

    def set_sparse_rows(self, ids, values: dict) -> None:
        self.sparse.load_rows(ids, values)

    def owns(self, ids):
        """Mask of the global ids this rank holds."""
        return self.sparse.owns(ids)

    def dense_state_full(self):
        """Workers: (flat (P,), {slot: (P,)}) host arrays."""
        return self.dense.state_full()

    def set_dense_state(self, flat, state: dict) -> None:
        self.dense.load(flat, state)

    def full_dense(self) -> np.ndarray:
        return self.dense.weights()

    def full_table(self) -> np.ndarray:
        return self.sparse.full_table()

    def traffic(self) -> dict:
        """Bytes this rank moved, by kind (the library's own counters)."""
        out = {**self.sparse.traffic(), **self.dense.traffic()}
        if self.store is not None:
            t = self.store.traffic
            out.update(rma_get_bytes=t.get_bytes, shm_read_bytes=t.shm_bytes,
                       rma_acc_bytes=t.acc_bytes)
        if self.link is not None:
            out["p2p_bytes"] = self.link.bytes
        return out
