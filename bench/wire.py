"""modes_bench's wire-only runs (``--wire-only``): the model's compute replaced by a zero-cost
stand-in, so a run moves what the real one moves -- pulls, pushes, Allreduce, the servers'
optimizers, every byte counter -- without the CPU compute a GPU worker runs on its GPU:
the model (``WireOnly``), the dense optimizer (``DeviceOptimizer``), and the sparse rows'
expansion to (B, F, E) and gradient sums per distinct id (``DeviceRows``). What a GPU
worker's host does instead stays: it packs the step's inputs for its one host->device copy
(``Packed``).
Bench-only: ``wire_only`` swaps what the train module builds and restores it on exit."""

from __future__ import annotations

import contextlib

import numpy as np

import pshybrid.train as train_module
from pshybrid.graphs import padded_width
from pshybrid.modes.dense import AllreduceDense
from pshybrid.modes.sparse import ReplicatedSparse, ServerSparse

WIRE = " wire"  # the name suffix of the wire-only runs ("hybrid wire")


class WireOnly:
    """A zero-cost stand-in of ``model`` for the wire-only runs: its first forward/backward
    (a warm-up step) is the real one, recording the ParamSpace's readiness reports; after
    that forward returns zero logits (B,) and backward replays those reports in the same
    order (the Allreduce buckets start as in the real run) and returns a zero demb of the
    real shape (B, F, E), made once. The dense gradients are zeroed once and stay zero (a GPU
    worker zeroes them on its GPU: no per-step memset of P floats on the CPU). forward packs
    the dense features as a GPU worker's host does (``Packed``)."""

    def __init__(self, model, params):
        self.model, self.params, self.order, self.demb = model, params, None, {}
        self.packed = Packed()

    def forward(self, dense, emb, *bags):
        if self.order is None:
            return self.model.forward(dense, emb, *bags)
        self.shape = emb.shape
        self.packed.put_dense(dense)  # (a GPU worker's host packs it for its H2D copy)
        return np.zeros(dense.shape[0], dense.dtype)

    def backward(self, dlogits):
        params = self.params
        if self.order is None:
            self.order, report = [], params.grads_ready
            params.grads_ready = lambda *names: (self.order.append(names), report(*names))
            try:
                demb = self.model.backward(dlogits)
            finally:
                del params.grads_ready  # the class's method again
            return demb
        if "zero_grad" not in vars(params):  # the first stand-in step: zero, then never again
            params.flat_grad[...] = 0
            params.zero_grad = lambda: None
        for names in self.order:
            params.grads_ready(*names)
        demb = self.demb.get(self.shape)
        if demb is None:  # made once per shape (not per step: 6.8 MB at b4096 x 26 x 16)
            demb = self.demb[self.shape] = np.zeros(self.shape, dlogits.dtype)
        return demb


class DeviceOptimizer:
    """The workers' dense optimizer in the wire-only runs: a GPU worker's runs on its GPU,
    so its CPU does nothing (``update``: no-op); everything else, and any server's
    optimizer (ps's dense Adam), is the real one."""

    def __init__(self, opt):
        self.opt = opt

    def __getattr__(self, name):
        return getattr(self.opt, name)

    def update(self, *args, **kw) -> None:
        pass


class Packed:
    """A GPU worker's host copies of a step's inputs into its pinned buffer
    (``graphs.DeviceStep``): the rows padded to whole 16-byte vectors (as for WDL, DeepFM
    and DCN), the inverse index and the dense features, into buffers reused every step."""

    def __init__(self):
        self.bufs = {}
        self.pad_zeroed = (None, 0)  # (rows' buffer, rows): their pad is 0

    def _buf(self, name: str, shape, dtype) -> np.ndarray:
        n, b = int(np.prod(shape)), self.bufs.get(name)
        if b is None or b.size < n or b.dtype != dtype:
            b = self.bufs[name] = np.empty(n, dtype)
        return b[:n].reshape(shape)

    def rows_out(self, U: int, E: int, dtype) -> np.ndarray:
        """The (U, E) columns of the padded rows' buffer, the pad zeroed (once per buffer,
        as ``DeviceStep``: only zeros are written there): where the pull writes the rows
        (``DeviceStep.rows_out``)."""
        dst = self._buf("rows", (U, padded_width(E, dtype)), dtype)
        buf, done = self.pad_zeroed
        done = done if buf is self.bufs["rows"] else 0
        if done < U:
            dst[done:, E:] = 0
            self.pad_zeroed = (self.bufs["rows"], U)
        return dst[:, :E]

    def put(self, rows, inverse) -> None:
        """The rows (unless pulled into ``rows_out``'s place) and the inverse index."""
        if not np.may_share_memory(rows, self.bufs.get("rows", rows[:0])):
            np.copyto(self.rows_out(*rows.shape, rows.dtype), rows)
        np.copyto(self._buf("inverse", (inverse.size,), np.int64), inverse.reshape(-1))

    def put_dense(self, dense) -> None:
        np.copyto(self._buf("dense", dense.shape, dense.dtype), dense)


class DeviceRows:
    """The workers' sparse strategy in the wire-only runs (``ServerSparse`` or
    ``ReplicatedSparse`` wrapped): what a GPU worker's host does of it. ``lookup`` reads the
    batch's distinct rows (the Get or gather its host runs), packs them and the inverse index
    as its host does for the copy to the device (``Packed``), and hands the stand-in a
    zero-cost (B, F, E) view instead of expanding them (a GPU worker expands on its
    device); the step's (U, E) gradient sums are zeros handed over as a GPU worker's staged
    ones (``given_sums``) instead of summed from demb on the host. Every other member is the
    wrapped strategy's."""

    def __init__(self, inner):
        self.inner = inner
        self.live, self.server_step = inner.live, inner.server_step
        self.prepare_uses_mpi = inner.prepare_uses_mpi
        dim, dtype = inner.grad_row
        self.zeros = np.zeros((0, dim), dtype)
        self.packed = Packed()

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def lookup(self, batch):
        inner, U = self.inner, batch.unique.size
        dim, dtype = inner.grad_row
        out = self.packed.rows_out(U, dim, dtype)  # as a GPU worker's pinned buffer
        rows = inner.unique_rows(batch, out)  # the Get or gather its host runs, into it
        self.packed.put(rows, batch.inverse)  # and the rest of its packing for the H2D copy
        if self.zeros.shape[0] < U:
            self.zeros = np.zeros((U,) + self.zeros.shape[1:], self.zeros.dtype)
        inner.given_sums(self.zeros[:U])
        return np.broadcast_to(self.zeros[:1], batch.ids.shape + self.zeros.shape[1:])


@contextlib.contextmanager
def wire_only(on: bool):
    """Within: the train module builds ``WireOnly`` models and gives the workers' dense
    Allreduce strategies a ``DeviceOptimizer`` (bench-only; restored on exit)."""
    build_model, build_mode = train_module.build_model, train_module.build_mode

    def wire_model(name, schema, dim, mlp, params, *args, **kw):
        model, layout = build_model(name, schema, dim, mlp, params, *args, **kw)
        return WireOnly(model, params), layout

    def wire_mode(*args, **kw):
        mode = build_mode(*args, **kw)
        if isinstance(mode.dense, AllreduceDense):
            mode.dense.opt = DeviceOptimizer(mode.dense.opt)
        if mode.topo.is_worker and type(mode.sparse) in (ServerSparse, ReplicatedSparse):
            mode.sparse = DeviceRows(mode.sparse)
        return mode

    if on:
        train_module.build_model, train_module.build_mode = wire_model, wire_mode
    try:
        yield
    finally:
        train_module.build_model, train_module.build_mode = build_model, build_mode
