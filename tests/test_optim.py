"""Optimizer formulas against hand-written scalar recurrences."""

import math

import numpy as np
import pytest

from pshybrid.errors import ConfigError
from pshybrid.optim import Optimizer


def scalar_run(kind, w, grads, lr, b1=0.9, b2=0.999, eps=1e-8):
    a = m = v = 0.0
    for t, g in enumerate(grads, start=1):
        if kind == "sgd":
            w = w - lr * g
        elif kind == "adagrad":
            a += g * g
            w = w - lr * g / (math.sqrt(a) + eps)
        else:
            m = b1 * m + (1 - b1) * g
            v = b2 * v + (1 - b2) * g * g
            w = w - lr * (m / (1 - b1**t)) / (math.sqrt(v / (1 - b2**t)) + eps)
    return w


@pytest.mark.parametrize("kind", ["sgd", "adagrad", "adam"])
def test_update_matches_scalar_recurrence(kind):
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal(6)
    grads = rng.standard_normal((4, 6))
    opt = Optimizer(kind, lr=0.1)
    w = w0.copy()
    state = {k: np.zeros(6) for k in opt.slots}
    for t, g in enumerate(grads, start=1):
        opt.update(w, g, state, t)
    want = [scalar_run(kind, w0[i], grads[:, i], 0.1) for i in range(6)]
    np.testing.assert_allclose(w, want, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("kind", ["sgd", "adagrad", "adam"])
def test_update_rows_is_lazy(kind):
    rng = np.random.default_rng(1)
    w = rng.standard_normal((5, 3))
    opt = Optimizer(kind, lr=0.5)
    state = {k: np.zeros((5, 3)) for k in opt.slots}
    full_w, full_state = w.copy(), {k: v.copy() for k, v in state.items()}
    rows = np.array([3, 0])
    g = rng.standard_normal((2, 3))
    opt.update_rows(w, rows, g, state, step=1)
    # touched rows == dense update of those rows; untouched rows and their state unchanged
    sub = full_w[rows].copy()
    opt.update(sub, g, {k: v[rows].copy() for k, v in full_state.items()}, 1)
    np.testing.assert_array_equal(w[rows], sub)
    np.testing.assert_array_equal(w[[1, 2, 4]], full_w[[1, 2, 4]])
    for k in opt.slots:
        assert not state[k][[1, 2, 4]].any() and state[k][rows].any()


def test_unknown_optimizer():
    with pytest.raises(ConfigError, match="rmsprop"):
        Optimizer("rmsprop", lr=0.1)


@pytest.mark.parametrize("kind", ["sgd", "adagrad", "adam"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fused_rows_kernel_equals_numpy_rows(kind, dtype, monkeypatch):
    from pshybrid import kernels

    assert kernels.numba_active()
    rng = np.random.default_rng(3)
    w0 = rng.standard_normal((20, 4)).astype(dtype)
    rows = np.array([7, 2, 19, 0])
    opt = Optimizer(kind, lr=0.3)
    out = {}
    for fused in (True, False):
        if not fused:
            monkeypatch.setattr(kernels, "numba_active", lambda: False)
        w = w0.copy()
        state = {k: np.zeros_like(w) for k in opt.slots}
        for t in (1, 2, 3):
            opt.update_rows(w, rows, np.full((4, 4), 0.1 * t, dtype), state, t)
        out[fused] = (w, state)
    np.testing.assert_allclose(out[True][0], out[False][0], rtol=1e-6 if dtype == np.float32
                               else 1e-15)
    np.testing.assert_array_equal(out[True][0][[1, 3]], w0[[1, 3]])  # untouched rows
