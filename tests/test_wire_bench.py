"""bench/wire.py (modes_bench --wire-only): the zero-cost stand-in reports the same
parameters ready in the same order, returns gradients of the real shapes, and a wire-only
run moves exactly the bytes of the real one (one process, allreduce mode over COMM_SELF)."""

from __future__ import annotations

import io
import os
import sys
from dataclasses import replace

import numpy as np
import pytest
from mpi4py import MPI

import pshybrid.train as train_module
from pshybrid.config import TrainConfig
from pshybrid.layers import ParamSpace
from pshybrid.models import build_model
from pshybrid.synthetic import SyntheticCTR

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "bench"))
import wire

DATA = SyntheticCTR(seed=5, n_dense=3, cardinalities=(7, 30, 200, 5), zipf=1.3)


def model_and_batch(seed=0):
    params = ParamSpace()
    model, _ = build_model("wdl", DATA.schema, 4, (8, 4), params, "float32")
    params.build(np, np.dtype("float32"), seed)
    rng = np.random.default_rng(seed)
    dense = rng.standard_normal((6, 3)).astype(np.float32)
    emb = rng.standard_normal((6, 4, 5)).astype(np.float32)
    return model, params, dense, emb


def test_stand_in_replays_the_real_backwards_readiness_reports():
    model, params, dense, emb = model_and_batch()
    real = []
    params.on_grads_ready = real.append
    model.forward(dense, emb)
    demb_real = model.backward(np.ones(6, np.float32))
    assert len(real) >= 3  # the MLP's layers and the wide part, one report each

    model, params, dense, emb = model_and_batch()
    got = []
    params.on_grads_ready = got.append
    w = wire.WireOnly(model, params)
    w.forward(dense, emb)
    first = w.backward(np.ones(6, np.float32))  # the real one, recorded
    assert np.allclose(first, demb_real) and got == real and params.flat_grad.any()
    for _ in range(2):
        got.clear()
        params.zero_grad()
        assert not w.forward(dense, emb).any()
        demb = w.backward(np.ones(6, np.float32))
        assert got == real  # the same buckets become final in the same order
        assert demb.shape == demb_real.shape and demb.dtype == demb_real.dtype
        assert not demb.any() and not params.flat_grad.any()
    assert "zero_grad" in vars(params)  # zeroed once, no per-step memset after that


def test_stand_in_steps_allocate_no_demb():
    """After its first stand-in step a step allocates nothing of demb's size: a GPU
    worker's host writes no (B, F, E) array (tracemalloc sees NumPy's buffers)."""
    import tracemalloc

    model, params, _, _ = model_and_batch()
    dense, emb = np.ones((512, 3), np.float32), np.ones((512, 4, 5), np.float32)
    w, dz = wire.WireOnly(model, params), np.ones(512, np.float32)
    for _ in range(2):  # the real step, then the stand-in's first
        w.forward(dense, emb)
        demb = w.backward(dz)
    tracemalloc.start()
    try:
        w.forward(dense, emb)
        assert w.backward(dz) is demb
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < demb.nbytes // 4, (peak, demb.nbytes)


def test_packed_holds_the_rows_padded_with_zeros_and_the_inverse_in_reused_buffers():
    """What a GPU worker's host packs for its one H2D copy (``graphs.DeviceStep``): the
    (U, E) rows in a (U, E padded to 16 bytes) block, zeros after E, and the inverse;
    later steps, smaller and larger, reuse the buffers (their pad zeroed once: a new
    buffer's comes with garbage) and leave no stale values in it."""
    from pshybrid.graphs import padded_width

    p, rng = wire.Packed(), np.random.default_rng(0)
    made = p._buf

    def garbage(name, shape, dtype):  # a new buffer comes with garbage in it
        b = p.bufs.get(name)
        new = b is None or b.size < np.prod(shape) or b.dtype != dtype
        out = made(name, shape, dtype)
        if new:
            p.bufs[name][...] = 3
        return out

    p._buf = garbage
    for U, dtype in ((9, np.float32), (5, np.float32), (12, np.float32), (4, np.float64)):
        rows = rng.standard_normal((U, 5)).astype(dtype)
        inverse = rng.integers(0, U, (6, 4))
        Ep = padded_width(5, dtype)
        old = p.bufs.get("rows")
        if old is not None:  # whatever the last step left in its rows' columns
            old.reshape(-1, padded_width(5, old.dtype))[:, :5] = 7
        p.put(rows, inverse)
        got = p.bufs["rows"][:U * Ep].reshape(U, Ep)
        assert np.array_equal(got[:, :5], rows) and not got[:, 5:].any(), (U, dtype)
        assert np.array_equal(p.bufs["inverse"][:24], inverse.ravel())
    assert Ep == 6 and padded_width(5, np.float32) == 8


def test_device_optimizer_skips_the_workers_update_only():
    calls = []

    class Opt:
        slots = ("m", "v")

        def update(self, *a):
            calls.append(a)

    d = wire.DeviceOptimizer(Opt())
    d.update(1, 2, 3, 4)
    assert calls == [] and d.slots == ("m", "v")


def test_a_wire_only_run_moves_the_real_runs_bytes():
    cfg = TrainConfig(model="wdl", mode="allreduce", servers=0, embedding_dim=4, mlp=(8,),
                      batch_size=8, steps=4, log_every=4, seed=3)
    build = train_module.build_model, train_module.build_mode
    real = train_module.train(cfg, MPI.COMM_SELF, dataset=DATA, out=io.StringIO())
    with wire.wire_only(True):
        got = train_module.train(replace(cfg), MPI.COMM_SELF, dataset=DATA, out=io.StringIO())
    assert (train_module.build_model, train_module.build_mode) == build  # restored
    t, r = got.summary["traffic_per_step"], real.summary["traffic_per_step"]
    assert t == r and any(t.values())


def test_device_rows_read_the_distinct_rows_and_send_given_sums(monkeypatch):
    """The wire-only sparse strategy: no expansion and no host sums (a GPU worker's device
    work), the same bytes on the wire (test above), the distinct rows still read."""
    from pshybrid.modes import sparse

    calls = []
    monkeypatch.setattr(sparse, "scatter_add", lambda *a: calls.append("sums") or 1 / 0)
    cfg = TrainConfig(model="wdl", mode="allreduce", servers=0, embedding_dim=4, mlp=(8,),
                      batch_size=8, steps=3, log_every=3, seed=3)
    with wire.wire_only(True):
        got = train_module.train(cfg, MPI.COMM_SELF, dataset=DATA, out=io.StringIO())
    assert calls == [] and got.summary["traffic_per_step"]["allgather_bytes"] > 0


@pytest.mark.mpi(min_size=2)
def test_a_hybrid_wire_run_moves_the_real_runs_bytes(comm):
    """Hybrid with its server(s), over RMA: pulls (the distinct rows either way), step
    messages and Allreduce bytes of the wire-only run are the real run's. (On one node's
    shared memory a CPU worker with one server reads every id's row, B x F; the stand-in,
    as a GPU worker, the distinct ones.)"""
    from mpi_util import assert_all

    cfg = TrainConfig(model="wdl", mode="hybrid", embedding_dim=4, mlp=(8,), batch_size=8,
                      steps=4, log_every=4, seed=3, shared_memory="off")
    real = train_module.train(cfg, comm, dataset=DATA, out=io.StringIO())
    with wire.wire_only(True):
        got = train_module.train(replace(cfg), comm, dataset=DATA, out=io.StringIO())
    r, g = ((x.summary or {}).get("traffic_per_step") for x in (real, got))
    assert_all(comm, r == g, f"{g} vs {r}")
    assert_all(comm, r is None or any(r.values()), "no traffic counted")
