"""Dense-update strategies: where the dense (MLP) weights live and how their gradients move.

Each strategy offers the workers ``begin(step)`` (before the forward pass), ``start(step)``
(gradients no pull can see yet go on the wire), ``sync(step)`` (True if it is the step's
sync point: it returns only once every worker has finished the step's pulls), ``finish(step)``
(pushes onto the live weights) and the servers ``server_apply(step)``. ``live``: its pushes
write weights other workers may still be reading (they wait for the sync point);
``server_step``: the servers run its optimizer at the end of the step.
"""

from __future__ import annotations

import numpy as np

from ..backend import to_device, to_host
from ..optim import Optimizer
from ..registry import DENSE_ROW
from ..schema import TableSpec
from ..transport import iallreduce, idle_barrier, start_allreduce
from .buckets import GradBuckets


class AllreduceDense:
    """Replicated on every worker: the gradients are summed with an Allreduce over the
    workers (in buckets started during backward, ``GradBuckets``, when ``bucket_bytes`` > 0),
    then every worker applies the same optimizer step to its copy.

    GPU workers: the buckets are cut during backward but started after the step's one
    stream sync (``GradBuckets`` deferred, ``stage``): staged, the whole gradient is copied
    to pinned host memory once and each bucket's Iallreduce runs on its part of that copy;
    CUDA-aware, each bucket is a blocking Allreduce of its device span. Staged, the sums
    come back to the device in one copy once every bucket is complete."""

    live = server_step = False

    def __init__(self, ctx, opt: Optimizer, bucket_bytes: int = 0):
        self.ctx, self.opt = ctx, opt
        self.bytes = 0
        self._reqs: list = []
        self._spans = None  # GPU workers: the step's (device span, pinned copy or None)
        self._back = None   # GPU workers, staged: the pinned gradient whose sums go back
        self.bind(ctx.params, bucket_bytes)

    def bind(self, params, bucket_bytes: int) -> None:
        """Reduce and update ``params`` (its optimizer state zeroed), in buckets of at least
        ``bucket_bytes`` started during backward when > 0. ``pshybrid.torch`` builds its mode
        before the model exists and binds the model's ParamSpace here once it does."""
        self.params = params
        self.state = {k: self.ctx.xp.zeros_like(params.flat) for k in self.opt.slots}
        self._buckets = None
        if bucket_bytes > 0 and self.ctx.topo.is_worker:
            self._buckets = GradBuckets(params, self._iallreduce, bucket_bytes,
                                        deferred=self.ctx.staging is not None)
            params.on_grads_ready = self._buckets.ready

    def tables(self) -> list[TableSpec]:
        return []

    def attach(self, store) -> None:
        pass

    def _iallreduce(self, buf):
        # Wire: Iallreduce(SUM) of buf over the workers (a GPU buffer: after a stream sync,
        # directly or staged; see ``transport.iallreduce``).
        return iallreduce(self.ctx.topo.workers, buf, self.ctx.cuda_aware)

    def begin(self, step: int) -> None:
        pass

    def stage(self, step: int) -> None:
        """GPU workers, before the step's sync: the buckets' spans (one without buckets)
        and, staged, the gradient's copy to pinned host memory queued. That copy is read by
        the Iallreduces (Waited in ``sync``), then by the copies of the sums back to the
        device, queued on the stream before the next step's copy into it."""
        flat = self.params.flat_grad
        spans = self._buckets.finish() if self._buckets is not None else [slice(0, flat.size)]
        host = None
        if not self.ctx.cuda_aware:
            with self.ctx.kernel_timers.time("allreduce"):
                host = self.ctx.staging.stage(self.ctx.xp, "dense_grad", flat)
        self._spans = [(flat[s], None if host is None else host[s]) for s in spans]
        self._back = host

    def start(self, step: int) -> None:
        """Start (the rest of) the Allreduce; ``sync`` completes it, so the sparse exchange
        in between overlaps it."""
        self.bytes += self.params.flat_grad.nbytes
        if self._spans is not None:  # GPU, after the step's sync: no further wait
            # Wire: per bucket, Iallreduce(SUM) of its pinned copy (or a blocking Allreduce
            # of its device span, CUDA-aware) over the workers; ``sync`` waits
            self._reqs = [start_allreduce(self.ctx.topo.workers, d, h, copy_back=False)
                          for d, h in self._spans]
            self._spans = None
            return
        self._reqs = (self._buckets.finish() if self._buckets is not None
                      else [self._iallreduce(self.params.flat_grad)])

    def sync(self, step: int) -> bool:
        self.wait()
        with self.ctx.kernel_timers.time("dense_apply"):  # GPU: device time, no wait
            self.apply(step)
        return True

    def wait(self) -> None:
        """Complete the Allreduce ``start`` started: the sums are in ``flat_grad``."""
        with self.ctx.timers.time("allreduce"):
            for r in self._reqs:
                r.Wait()  # every worker has contributed: the step's sync point
        self._reqs = []
        if self._back is not None:  # GPU, staged: every bucket's sum back in one async H2D
            # (pinned source; read again only by the next step's D2H, queued after it)
            self.params.flat_grad.set(self._back, stream=self.ctx.xp.cuda.get_current_stream())
            self._back = None

    def settled(self) -> bool:
        """Whether ``settle`` has nothing to wait for (no bucket started, or all complete)."""
        b = self._buckets
        return b is None or b.deferred or b.complete()

    def settle(self) -> None:
        """Complete the buckets backward started (their sums land in ``flat_grad``), the
        rest left to ``start``: before the buffer is written while they are on the wire
        (``pshybrid.torch``: ``opt.zero_grad()`` between a backward and its step)."""
        if self._buckets is not None and not self._buckets.deferred:
            for r in self._buckets.reqs:
                r.Wait()  # Wire: the started Iallreduces (each waits for every worker's)

    def apply(self, step: int) -> None:
        """The dense optimizer's step on the summed gradients (``pshybrid.torch``: the torch
        optimizer's)."""
        self.opt.update(self.params.flat, self.params.flat_grad, self.state, step)

    def finish(self, step: int) -> None:
        pass

    def server_apply(self, step: int) -> None:
        pass

    def close(self) -> None:
        """Drop the ParamSpace <-> GradBuckets cycle (the GC is frozen while training)."""
        self.params.on_grads_ready = None
        self._buckets = None

    # -- checkpoints, tests, export (workers) ------------------------------------------------
    def weights(self) -> np.ndarray:
        return to_host(self.params.flat).copy()

    def state_full(self):
        """(flat (P,), {slot: (P,)}) host arrays (on a GPU worker, copies)."""
        return to_host(self.params.flat), {k: to_host(a) for k, a in self.state.items()}

    def load(self, flat, state: dict) -> None:
        if not self.ctx.topo.is_worker:
            return
        xp = self.ctx.xp
        self.params.flat[...] = xp.asarray(flat)
        for k, arr in self.state.items():
            arr[...] = xp.asarray(state[k])

    def traffic(self) -> dict:
        return {"allreduce_bytes": self.bytes}


class ServerDense:
    """The flat dense buffer as the table ``"dense"`` of ``DENSE_ROW``-wide rows sharded on
    the servers (a parameter server): workers pull every row before the forward pass and push
    their gradients back; a non-SGD optimizer runs on the servers (gradients into a ``"g"``
    slot), plain SGD (no ``--l2``) is a direct ``-lr * g`` push onto the weights."""

    def __init__(self, ctx, opt: Optimizer, bucket_bytes: int = 0):
        self.ctx, self.opt, self.params = ctx, opt, ctx.params
        self.rows = -(-self.params.size // DENSE_ROW)
        self.server_step = opt.needs_weights
        self.live = not self.server_step
        self.store = None
        self._plan = None  # every row of the table: one plan, reused every step
        self._staged = None  # GPU workers: the step's padded gradient in pinned host memory

    def tables(self) -> list[TableSpec]:
        slots = (("g",) + self.opt.slots) if self.server_step else ()
        return [TableSpec("dense", self.rows, DENSE_ROW, str(self.params.flat.dtype), "zeros", 0.0,
                          slots)]

    def attach(self, store) -> None:
        """Collective: worker 0 writes the initial weights into the zeroed table."""
        self.store = store
        topo = self.ctx.topo
        if topo.rank == topo.worker_ranks[0]:
            self.store.push("dense", self._all(), self._padded(self.params.flat))
            self.store.reset_traffic()  # count training steps only
        # Wire: zero-byte barrier over world: nobody pulls before the initial weights landed.
        idle_barrier(topo.world)

    def _all(self):
        """Workers: the plan of every row, made once (same ids every step: its datatypes are
        committed once)."""
        if self._plan is None:
            self._plan = self.store.plan("dense", np.arange(self.rows, dtype=np.int64))
        return self._plan

    def _padded(self, flat):
        out = np.zeros(self.rows * DENSE_ROW, flat.dtype)
        out[:flat.size] = to_host(flat)  # GPU worker: D2H of the dense buffer
        return out.reshape(self.rows, DENSE_ROW)

    def begin(self, step: int) -> None:
        with self.ctx.timers.time("pull"):
            rows = self.store.pull("dense", self._all())
            if self.ctx.staging is None:
                self.params.flat[...] = rows.ravel()[:self.params.size]
            else:  # GPU: async H2D through a pinned slot (backend.to_device), no wait
                to_device(self.ctx.xp, rows.ravel()[:self.params.size], self.params.flat.dtype,
                          out=self.params.flat)

    def stage(self, step: int) -> None:
        """GPU workers, before the step's sync: the gradient's copy into a pinned padded
        table queued; its reader (the push's Accumulate, flushed within this step) is done
        before the next step's copy overwrites it."""
        with self.ctx.kernel_timers.time("push"):
            self._staged = self.ctx.staging.stage(
                self.ctx.xp, "dense_grad", self.params.flat_grad,
                total=self.rows * DENSE_ROW).reshape(self.rows, DENSE_ROW)

    def _grads(self):
        """(rows, DENSE_ROW) host gradient: a padded copy, or (GPU) the staged one."""
        # Wire: read by the push's Accumulate, flushed before it returns (then the next copy)
        return self._padded(self.params.flat_grad) if self._staged is None else self._staged

    def start(self, step: int) -> None:
        if self.server_step:
            with self.ctx.timers.time("push"):
                self.store.push("dense", self._all(), self._grads(), slot="g")

    def sync(self, step: int) -> bool:
        return False

    def finish(self, step: int) -> None:
        if self.live:
            with self.ctx.timers.time("push"):
                self.store.push_sgd("dense", self._all(), self._grads(), self.opt.lr_at(step))

    def server_apply(self, step: int) -> None:
        if self.server_step:
            shard = self.store.shard
            state = {k: shard("dense", k) for k in self.opt.slots}
            self.opt.apply_slot(shard("dense"), shard("dense", "g"), state, step,
                                threads=self.ctx.apply_threads)

    def close(self) -> None:
        if self._plan is not None:
            self._plan.free()
            self._plan = None

    # -- checkpoints, tests, export --------------------------------------------------------
    def weights(self) -> np.ndarray:
        """Workers: the current weights, pulled."""
        return self.store.pull("dense", self._all()).ravel()[:self.params.size].copy()

    def state_full(self):
        P, ids = self.params.size, self._all()
        slots = self.opt.slots if self.server_step else ()
        return (self.weights(),
                {k: self.store.pull("dense", ids, slot=k).ravel()[:P] for k in slots})

    def load(self, flat, state: dict) -> None:
        """Servers write their rows of the table (weights and optimizer state), workers their
        local copy (a colocated rank both); the caller's collective barrier orders it before
        any pull."""
        if self.ctx.topo.is_worker:
            self.params.flat[...] = self.ctx.xp.asarray(flat)
        if not self.ctx.topo.is_server:
            return
        mine = self.store.shard_ids("dense")
        self.store.shard("dense")[...] = self._padded(flat)[mine]
        for k in (self.opt.slots if self.server_step else ()):
            self.store.shard("dense", k)[...] = self._padded(state[k])[mine]
        self.store.win.Sync()

    def traffic(self) -> dict:
        return {}


DENSE = {"allreduce": AllreduceDense, "servers": ServerDense}
