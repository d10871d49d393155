"""Whole-model backward against central finite differences (float64), for every built-in
model and for the custom-model example in docs/models.md (executed from the doc); and one
training step of the whole pipeline against the documented loss's finite differences."""

import os
import re

import numpy as np
import pytest

from pshybrid import models
from pshybrid.layers import ParamSpace
from pshybrid.schema import Schema

SCHEMA = Schema(n_dense=2, cardinalities=(5, 7, 3))
DOC = os.path.join(os.path.dirname(__file__), "..", "docs", "models.md")


def doc_example(monkeypatch):
    """The doc's class; it registers "sumpool", which the test's end takes out again."""
    monkeypatch.setitem(models.MODELS, "sumpool", models.WDL)  # (the doc's replaces it)
    code = re.search(r"```python\n(.*?)```", open(DOC).read(), re.S).group(1)
    ns = {}
    exec(compile(code, DOC, "exec"), ns)  # registers "sumpool"
    return ns["SumPool"]


def build(name):
    params = ParamSpace()
    model, sparse = models.build_model(name, SCHEMA, 2, (4, 3), params, "float64", cross_layers=2)
    params.build(np, np.float64, seed=1)
    rng = np.random.default_rng(0)
    params.flat[...] = rng.uniform(-0.8, 0.8, params.size)  # nonzero biases too
    return model, sparse, params


@pytest.mark.parametrize("name", [*models.MODELS.builtin, "sumpool"])  # every model
def test_model_backward_matches_finite_differences(name, monkeypatch):
    if name == "sumpool":
        doc_example(monkeypatch)
    model, sparse, params = build(name)
    rng = np.random.default_rng(2)
    B, F, E = 3, 3, sparse.table.dim
    dense = rng.uniform(0.1, 2, (B, 2))
    emb = rng.uniform(-1, 1, (B, F, E))
    g = rng.standard_normal(B)

    def loss():
        return float(np.sum(model.forward(dense, emb) * g))

    loss()
    params.zero_grad()
    demb = model.backward(g)
    dflat = params.flat_grad.copy()
    num_emb = _fd(loss, emb, np.ndindex(emb.shape))
    num_flat = _fd(loss, params.flat, range(params.size))
    np.testing.assert_allclose(demb, num_emb, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(dflat, num_flat, rtol=1e-5, atol=1e-7)
    assert np.abs(dflat).max() > 0 and np.abs(demb).max() > 0


def test_sparse_arch_offsets():
    _, sparse, _ = build("wdl")
    assert sparse.table.rows == 15 and sparse.table.dim == 3
    ids = sparse.global_ids(np.array([[4, 0, 2], [0, 6, 0]]))
    assert ids.tolist() == [[4, 5, 14], [0, 11, 12]]


def test_unknown_model():
    from pshybrid.errors import ConfigError

    with pytest.raises(ConfigError, match="bogus"):
        models.build_model("bogus", SCHEMA, 2, (4,), ParamSpace(), "float64")


@pytest.mark.parametrize("name", [*models.MODELS.builtin, "sumpool"])  # every model
def test_grad_buckets_start_only_final_gradients(name, monkeypatch):
    """GradBuckets (the dense Allreduce started during backward) hands out disjoint spans
    covering flat_grad exactly once, and each span already holds its final gradient when
    it starts; with tiny buckets the models with several layers use several buckets."""
    from mpi4py import MPI

    from pshybrid.modes.buckets import GradBuckets

    if name == "sumpool":
        doc_example(monkeypatch)
    model, sparse, params = build(name)
    base = params.flat_grad.__array_interface__["data"][0]
    started = []

    def start(buf):
        lo = (buf.__array_interface__["data"][0] - base) // buf.itemsize
        started.append((lo, lo + buf.size, buf.copy()))
        return MPI.REQUEST_NULL

    rng = np.random.default_rng(3)
    dense, emb = rng.uniform(0.1, 2, (3, 2)), rng.uniform(-1, 1, (3, 3, sparse.table.dim))
    buckets = GradBuckets(params, start, min_bytes=1)
    params.on_grads_ready = buckets.ready
    for step in range(2):  # the same buckets re-arm after finish()
        started.clear()
        model.forward(dense, emb)
        params.zero_grad()
        model.backward(rng.standard_normal(3))
        assert len(buckets.finish()) == len(started)
        spans = sorted((lo, hi) for lo, hi, _ in started)
        assert spans[0][0] == 0 and spans[-1][1] == params.size
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:])), spans
        for lo, hi, snap in started:
            np.testing.assert_array_equal(snap, params.flat_grad[lo:hi])
        if name in ("wdl", "dcn", "dlrm"):
            assert len(started) >= 3, started  # really overlapped, not one bucket at the end


@pytest.mark.parametrize("min_bytes", [1, 40, 1 << 20])
def test_grad_buckets_start_the_same_spans_in_the_same_order_whatever_finishes(min_bytes):
    """Nonblocking collectives must match in order and size on every worker; the buckets
    were cut where each worker's finished suffix reached min_bytes, so a parameter that one
    worker's batch left unused (a branch, a torch model) cut them elsewhere there: the job
    hung. Oracle: the spans started, in order, by a worker finishing every parameter in
    reverse, one finishing them in a shuffled order and one leaving parameters unused are
    the same list, and it covers the buffer once; and no bucket starts before every
    parameter in it is reported (a zero-element parameter, sorted by name after the next
    one at its offset, started that one's bucket early: weights drifted apart)."""
    from mpi4py import MPI

    from pshybrid.modes.buckets import GradBuckets

    params = ParamSpace()
    for name, shape in [("p0", (3, 4)), ("zz", (0,)), ("p1", (4,)), ("p2", (4, 2)),
                        ("p3", (2,)), ("p4", (5, 5)), ("p5", (1,)), ("zy", (0,))]:
        params.add(name, shape, "zeros")
    params.build(np, np.float64, seed=0)
    base = params.flat_grad.__array_interface__["data"][0]
    names = list(params.names)

    def starts(order):
        got, reported, finishing = [], set(), []

        def start(buf):
            lo = (buf.__array_interface__["data"][0] - base) // buf.itemsize
            got.append((lo, lo + buf.size))
            inside = {n for n in names if lo <= params.offset(n) < lo + buf.size
                      and np.prod(params.shape(n)) > 0}
            assert finishing or inside <= reported, (inside, reported)  # (finish: all go)
            return MPI.REQUEST_NULL
        buckets = GradBuckets(params, start, min_bytes)
        for n in order:
            reported.add(n)
            buckets.ready([n])
        finishing.append(True)
        buckets.finish()
        return got

    rng = np.random.default_rng(0)
    every = starts(names[::-1])
    assert every[0][1] == params.size and every[-1][0] == 0
    assert all(a[0] == b[1] for a, b in zip(every, every[1:])), every
    for order in (list(rng.permutation(names)), names[::-1][:2] + names[::-1][3:], names[:1],
                  [], [n for n in names[::-1] if n != "p1"]):  # (p1: after zz, at its offset)
        assert starts(order) == every, order


def test_grad_buckets_refuse_a_parameter_finished_twice():
    from mpi4py import MPI

    from pshybrid.errors import ConfigError
    from pshybrid.layers import Linear
    from pshybrid.modes.buckets import GradBuckets

    params = ParamSpace()
    lin = Linear(params, "tied", 2, 2)
    params.build(np, np.float64, seed=0)
    params.on_grads_ready = GradBuckets(params, lambda buf: MPI.REQUEST_NULL, 1 << 20).ready
    x = np.ones((1, 2))
    lin.forward(x)
    lin.backward(x)
    with pytest.raises(ConfigError, match="tied.weight.*bucket-mb 0"):
        lin.backward(x)  # the same layer applied twice per step


def test_a_built_in_model_name_cannot_be_given_another_class(monkeypatch):
    """(It trained silently, and its checkpoint then failed to export as the real wdl.)"""
    from pshybrid.errors import ConfigError

    with pytest.raises(ConfigError, match=r"MODELS\['wdl'\]: 'wdl' is a built-in model"):
        models.MODELS["wdl"] = models.DCN
    for change in (lambda m: m.update(wdl=models.DCN), lambda m: m.update({"dcn": models.WDL}),
                   lambda m: m.__ior__({"dlrm": models.DCN}), lambda m: m.pop("wdl"),
                   lambda m: m.__delitem__("deepfm"), lambda m: m.popitem(), lambda m: m.clear()):
        with pytest.raises(ConfigError, match="built-in model"):  # (dict's own skipped it)
            change(models.MODELS)
    assert all(models.MODELS[k] is v for k, v in models.MODELS.builtin.items())
    assert models.MODELS.setdefault("wdl", models.DCN) is models.WDL
    assert models.MODELS["wdl"] is models.WDL
    monkeypatch.setitem(models.MODELS, "wdl_too", models.WDL)   # another name: fine


@pytest.mark.parametrize("thing", ["not a class", lambda *a: None, dict,
                                   type("TwoWide", (models.WDL,), {"wide": 2})])
def test_the_registry_takes_a_model_class_only(thing):
    """A string, a function, another class or wide = 2 failed later, inside the first step
    (``'str' object has no attribute 'cross_layers'``, a matmul's ValueError)."""
    from pshybrid.errors import ConfigError

    with pytest.raises(ConfigError, match=r"MODELS\['mine'\] = .*: a model is a subclass of "
                                          r"pshybrid.models.CTRModel with wide = 0 or 1"):
        models.MODELS["mine"] = thing
    assert "mine" not in models.MODELS


def _fd(f, arr, idxs, h=1e-6):
    """Central differences of the scalar ``f()`` by the elements ``idxs`` of ``arr``."""
    out = np.zeros(arr.shape)
    for i in idxs:
        old = arr[i]
        arr[i] = old + h
        up = f()
        arr[i] = old - h
        out[i] = (up - f()) / (2 * h)
        arr[i] = old
    return out


@pytest.mark.parametrize("name", ["wdl", "deepfm", "dcn", "dcnv2", "dlrm"])
@pytest.mark.parametrize("n_dense,cards,multi,dim,mlp,cross,pooling", [
    (2, (5,), 0, 1, (1,), 0, "sum"),          # one field, dim 1, one unit, no cross layer
    (0, (5, 7), 0, 2, (3, 2, 2), 3, "sum"),   # no dense feature, three layers
    (2, (5, 7, 3, 4), 2, 2, (3,), 1, "sum"),  # multi-hot fields, pooled (models.Pooled)
    (2, (5, 7, 3, 4), 2, 2, (3,), 1, "mean")])
def test_shapes_and_pooled_models_backward_matches_finite_differences(
        name, n_dense, cards, multi, dim, mlp, cross, pooling):
    """The shapes test_model_backward_matches_finite_differences leaves out, and the whole
    pooled model (bags of 1-4 ids) from the flat rows as pulled."""
    schema = Schema(n_dense=n_dense, cardinalities=cards, multi_hot=multi)
    params = ParamSpace()
    model, sparse = models.build_model(name, schema, dim, mlp, params, "float64",
                                       cross_layers=cross, pooling=pooling, bottom_mlp=mlp)
    params.build(np, np.float64, seed=1)
    rng = np.random.default_rng(0)
    params.flat[...] = rng.uniform(-0.8, 0.8, params.size)
    B, E = 3, sparse.table.dim
    lengths = rng.integers(1, 5, (B, multi))
    extra = (lengths,) if multi else ()
    emb = rng.uniform(-1, 1, (B * (len(cards) - multi) + lengths.sum(), E) if multi
                      else (B, len(cards), E))
    dense, g = rng.uniform(0.1, 2, (B, n_dense)), rng.standard_normal(B)

    def loss():
        return float(np.sum(model.forward(dense, emb, *extra) * g))

    loss()
    params.zero_grad()
    demb = model.backward(g)
    np.testing.assert_allclose(demb, _fd(loss, emb, np.ndindex(emb.shape)), rtol=1e-5,
                               atol=1e-7)
    np.testing.assert_allclose(params.flat_grad, _fd(loss, params.flat, range(params.size)),
                               rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name", ["wdl", "deepfm", "dcn", "dcnv2", "dlrm"])
def test_one_training_step_is_sgd_on_the_documented_loss(name):
    """The whole pipeline (data, fused table, lookup, model, loss scale, sparse push, dense
    apply) against docs/models.md alone: one step of plain SGD from the documented
    initialisation moves every dense weight and every row by -lr times the central
    difference of the mean BCE over the batch (duplicate ids in it: their sums)."""
    import io

    from mpi4py import MPI

    from pshybrid.config import TrainConfig
    from pshybrid.initializers import uniform_rows
    from pshybrid.train import train

    schema, n, seed, lr, dlr = Schema(n_dense=2, cardinalities=(3, 4, 2)), 6, 9, 0.3, 0.2
    rng = np.random.default_rng(4)
    y, x = rng.integers(0, 2, n).astype(np.float32), rng.uniform(0, 2, (n, 2)).astype(np.float32)
    ids = np.stack([rng.integers(0, c, n) for c in schema.cardinalities], 1)
    data = type("Rows", (), {"schema": schema, "rows": lambda self, a, b: (y[a:b], x[a:b],
                                                                          ids[a:b])})()
    cfg = TrainConfig(model=name, mode="allreduce", servers=0, embedding_dim=2, mlp=(3,),
                      steps=1, batch_size=n, dtype="float64", lr=lr, dense_lr=dlr, seed=seed,
                      sparse_optimizer="sgd", dense_optimizer="sgd")
    got = train(cfg, MPI.COMM_SELF, dataset=data, collect=True, out=io.StringIO())
    params = ParamSpace()
    model, fused = models.build_model(name, schema, 2, (3,), params, "float64")
    params.build(np, np.float64, seed=seed)
    table = np.empty((fused.table.rows, fused.table.dim))
    uniform_rows(table, np.arange(fused.table.rows), seed, "sparse", 0.05)
    rows, yy, xx = fused.global_ids(ids), y.astype(np.float64), x.astype(np.float64)

    def loss():
        z = model.forward(xx, table[rows])
        return float(np.mean(np.maximum(z, 0) - z * yy + np.log1p(np.exp(-np.abs(z)))))

    want_dense = params.flat - dlr * _fd(loss, params.flat, range(params.size))
    want_table = table - lr * _fd(loss, table, np.ndindex(table.shape))
    for got_, want, before in ((got.dense, want_dense, params.flat), (got.table, want_table,
                                                                       table)):
        moved = np.abs(want - before).max()
        assert moved > 1e-4 and np.abs(got_ - want).max() < 1e-6 * moved


def _doc_forward(name, p, dense, emb, dim, n_mlp, n_bottom):
    """docs/models.md's forward passes, each written in the doc's order of evaluation."""
    def mlp(prefix, x, n, final_relu):
        for i in range(n):
            x = x @ p[f"{prefix}.{i}.weight"] + p[f"{prefix}.{i}.bias"]
            x = np.maximum(x, 0) if i < n - 1 or final_relu else x
        return x

    B, F, _ = emb.shape
    e, w = emb[:, :, :dim], emb[:, :, dim] if emb.shape[2] > dim else None
    x0 = np.concatenate([dense, e.reshape(B, F * dim)], 1)
    if name in ("wdl", "deepfm"):
        lin = "wide.dense" if name == "wdl" else "fm.dense"
        z = ((dense @ p[f"{lin}.weight"] + p[f"{lin}.bias"])[:, 0] + w.sum(1)
             + mlp("over", x0, n_mlp + 1, False)[:, 0])
        if name == "wdl":
            return z
        s = e.sum(1)
        return z + 0.5 * ((s * s).sum(1) - (e * e).sum(axis=(1, 2)))
    if name in ("dcn", "dcnv2"):
        x = x0
        for l in range(2):
            if name == "dcn":
                x = x0 * (x @ p[f"cross.{l}.weight"])[:, None] + p[f"cross.{l}.bias"] + x
            else:
                x = x0 * (x @ p[f"cross.{l}.weight"] + p[f"cross.{l}.bias"]) + x
        x = np.concatenate([x, mlp("deep", x0, n_mlp, True)], 1)
        return (x @ p["over.weight"] + p["over.bias"])[:, 0]
    z = mlp("bottom", dense, n_bottom + 1, True)
    v = np.concatenate([z[:, None], e], 1)
    i, j = np.tril_indices(F + 1, k=-1)
    return mlp("over", np.concatenate([z, (v @ v.transpose(0, 2, 1))[:, i, j]], 1),
               n_mlp + 1, False)[:, 0]


@pytest.mark.parametrize("name", ["wdl", "deepfm", "dcn", "dcnv2", "dlrm"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("pooling", ["sum", "mean"])
def test_the_documented_forward_passes_are_the_models_to_the_bit(name, dtype, pooling):
    """docs/models.md's formulas, in their order, re-implemented in NumPy from the named
    parameters (what an export holds), with the multi-hot fields pooled as documented (the
    ids' rows added in order, then / n): the model's logits to the bit. (DeepFM's fm term
    added first, or summed per k, and DLRM's dots as einsum, differed by ~1e-6 in float32.)"""
    schema, dim, mlp, B = Schema(n_dense=2, cardinalities=(5, 7, 3, 4), multi_hot=2), 3, (4, 3), 6
    params = ParamSpace()
    model, sparse = models.build_model(name, schema, dim, mlp, params, dtype,
                                       cross_layers=2, pooling=pooling, bottom_mlp=(5, 4))
    params.build(np, np.dtype(dtype), seed=1)
    rng = np.random.default_rng(0)
    params.flat[...] = rng.uniform(-0.8, 0.8, params.size)
    E, lengths = sparse.table.dim, rng.integers(1, 5, (B, 2))
    flat = rng.uniform(-1, 1, (B * 2 + lengths.sum(), E)).astype(dtype)  # as pulled
    dense = rng.uniform(0.1, 2, (B, 2)).astype(dtype)
    emb, rows = np.empty((B, 4, E), dtype), iter(flat[B * 2:])         # field-major bags
    emb[:, :2] = flat[:B * 2].reshape(B, 2, E)
    for k in range(2):
        for b in range(B):
            bag = [next(rows) for _ in range(lengths[b, k])]
            acc = bag[0]
            for r in bag[1:]:
                acc = acc + r
            emb[b, 2 + k] = acc / np.dtype(dtype).type(len(bag)) if pooling == "mean" else acc
    p = {n: params.param(n) for n in params.names}
    got = model.forward(dense, flat, lengths)
    want = _doc_forward(name, p, dense, emb, dim, len(mlp), 2)
    assert got.dtype == want.dtype == np.dtype(dtype) and np.array_equal(got, want)


def test_a_backward_without_the_wide_column_is_named(monkeypatch):
    """docs/models.md: ``backward(dlogits) -> demb (B, F, E)``. A model with ``wide = 1``
    whose backward returns (B, F, D), the wide column left out (a likely slip), stopped in
    the update's reshape with a bare ValueError; the error must name backward and both
    shapes. Oracle: the shapes the model was given and returned."""
    import io

    from mpi4py import MPI

    from pshybrid.config import TrainConfig
    from pshybrid.errors import ConfigError
    from pshybrid.train import train

    class Narrow(models.WDL):
        def backward(self, dlogits):
            return super().backward(dlogits)[:, :, :self.dim]

    monkeypatch.setitem(models.MODELS, "narrow", Narrow)
    schema, n = Schema(n_dense=2, cardinalities=(3, 4)), 4
    rng = np.random.default_rng(0)
    y, x = rng.integers(0, 2, n).astype(np.float32), rng.uniform(0, 2, (n, 2)).astype(np.float32)
    ids = np.stack([rng.integers(0, c, n) for c in schema.cardinalities], 1)
    data = type("Rows", (), {"schema": schema, "rows": lambda self, a, b: (y[a:b], x[a:b],
                                                                          ids[a:b])})()
    cfg = TrainConfig(model="narrow", mode="allreduce", servers=0, embedding_dim=2, mlp=(3,),
                      steps=1, batch_size=n)
    want = re.escape(f"backward returned demb of shape {(n, 2, 2)}") + ".*" + re.escape(
        f"{(n, 2, 3)}")
    with pytest.raises(ConfigError, match=want):
        train(cfg, MPI.COMM_SELF, dataset=data, out=io.StringIO())
