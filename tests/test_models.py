"""Whole-model backward against central finite differences (float64), for every built-in
model and for the custom-model example in docs/models.md (executed from the doc)."""

import os
import re

import numpy as np
import pytest

from pshybrid import models
from pshybrid.layers import ParamSpace
from pshybrid.synthetic import Schema

SCHEMA = Schema(n_dense=2, cardinalities=(5, 7, 3))
DOC = os.path.join(os.path.dirname(__file__), "..", "docs", "models.md")


def doc_example():
    code = re.search(r"```python\n(.*?)```", open(DOC).read(), re.S).group(1)
    ns = {}
    exec(compile(code, DOC, "exec"), ns)  # registers "sumpool"
    return ns["SumPool"]


def build(name):
    ps = ParamSpace()
    model, sparse = models.build_model(name, SCHEMA, 2, (4, 3), ps, "float64", cross_layers=2)
    ps.build(np, np.float64, seed=1)
    rng = np.random.default_rng(0)
    ps.flat[...] = rng.uniform(-0.8, 0.8, ps.size)  # nonzero biases too
    return model, sparse, ps


@pytest.mark.parametrize("name", ["wdl", "deepfm", "dcn", "dlrm", "sumpool"])
def test_model_backward_matches_finite_differences(name):
    if name == "sumpool":
        doc_example()
    model, sparse, ps = build(name)
    rng = np.random.default_rng(2)
    B, F, E = 3, 3, sparse.table.dim
    dense = rng.uniform(0.1, 2, (B, 2))
    emb = rng.uniform(-1, 1, (B, F, E))
    g = rng.standard_normal(B)

    def loss():
        return float(np.sum(model.forward(dense, emb) * g))

    loss()
    ps.zero_grad()
    demb = model.backward(g)
    dflat = ps.flat_grad.copy()
    h = 1e-6
    num_emb = np.zeros_like(emb)
    for idx in np.ndindex(emb.shape):
        old = emb[idx]
        emb[idx] = old + h
        up = loss()
        emb[idx] = old - h
        num_emb[idx] = (up - loss()) / (2 * h)
        emb[idx] = old
    num_flat = np.zeros_like(ps.flat)
    for i in range(ps.size):
        old = ps.flat[i]
        ps.flat[i] = old + h
        up = loss()
        ps.flat[i] = old - h
        num_flat[i] = (up - loss()) / (2 * h)
        ps.flat[i] = old
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
