"""Optimizer formulas against hand-written scalar recurrences."""

import math

import numpy as np
import pytest

from pshybrid.errors import ConfigError
from pshybrid.optim import FUSED, SLOTS, Optimizer


def scalar_run(kind, w, grads, lr, b1=0.9, b2=0.999, eps=1e-8, l2=0.0, factor=None):
    """With ``l2``: the gradient is g + l2*w; with ``factor``: step t's lr is lr*factor(t)."""
    a = m = v = 0.0
    for t, g in enumerate(grads, start=1):
        g, eta = g + l2 * w, lr * (factor(t) if factor else 1.0)
        if kind == "sgd":
            w = w - eta * g
        elif kind == "adagrad":
            a += g * g
            w = w - eta * g / (math.sqrt(a) + eps)
        elif kind == "adam":
            m = b1 * m + (1 - b1) * g
            v = b2 * v + (1 - b2) * g * g
            w = w - eta * (m / (1 - b1**t)) / (math.sqrt(v / (1 - b2**t)) + eps)
        else:  # a new optimizer in optim.SLOTS: its reference update goes here
            raise NotImplementedError(f"no scalar recurrence for optimizer {kind!r}")
    return w


@pytest.mark.parametrize("kind", sorted(SLOTS))
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


@pytest.mark.parametrize("kind", sorted(SLOTS))
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


@pytest.mark.parametrize("kind", sorted(FUSED))
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


@pytest.mark.parametrize("kind", sorted(FUSED))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_fused_dense_update_equals_numpy(kind, dtype):
    """update() on contiguous NumPy buffers runs the fused kernel over a (1, n) view; the
    array-expression form (_update_xp, also CuPy's path) is its oracle. A strided buffer
    takes the array path and must agree too."""
    from pshybrid import kernels

    assert kernels.numba_active()
    rng = np.random.default_rng(4)
    w0 = rng.standard_normal((3, 50)).astype(dtype)
    grads = rng.standard_normal((3, 3, 50)).astype(dtype)
    opt = Optimizer(kind, lr=0.05)
    runs = {}
    for how in ("fused", "xp", "strided"):
        w = w0.copy() if how != "strided" else np.repeat(w0, 2, axis=1)[:, ::2]
        state = {k: np.zeros_like(w) for k in opt.slots}
        for t, g in enumerate(grads, start=1):
            (opt._update_xp if how == "xp" else opt.update)(w, g, state, t)
        runs[how] = (np.array(w), {k: np.array(v) for k, v in state.items()})
    tol = 1e-6 if dtype == np.float32 else 1e-14
    for how in ("xp", "strided"):
        np.testing.assert_allclose(runs["fused"][0], runs[how][0], rtol=tol, atol=tol)
        for k in opt.slots:
            np.testing.assert_allclose(runs["fused"][1][k], runs[how][1][k], rtol=tol, atol=tol)
    assert not np.array_equal(runs["fused"][0], w0)  # it moved


@pytest.mark.parametrize("kind", sorted(SLOTS))
@pytest.mark.parametrize("numba_on", [True, False])
def test_apply_slot_equals_update_then_zero(kind, numba_on, monkeypatch):
    """Servers' apply_slot (fused read-and-zero of a gradient-sum slot) == update_rows of
    the gathered rows (or update of the whole buffer), then zeroing those rows only."""
    from pshybrid import kernels

    if not numba_on:
        monkeypatch.setattr(kernels, "numba_active", lambda: False)
    rng = np.random.default_rng(5)
    opt = Optimizer(kind, lr=0.2)
    w0, g0 = rng.standard_normal((9, 5)), rng.standard_normal((9, 5))
    rows = np.array([1, 4, 8])
    for sel in (rows, None):
        w, g = w0.copy(), g0.copy()
        state = {k: np.full_like(w, 0.5) for k in opt.slots}
        opt.apply_slot(w, g, state, 2, sel)
        rw, rstate = w0.copy(), {k: np.full_like(w0, 0.5) for k in opt.slots}
        if sel is None:
            opt._update_xp(rw, g0.copy(), rstate, 2)
            want_g = np.zeros_like(g0)
        else:
            sub, ss = rw[sel], {k: v[sel] for k, v in rstate.items()}
            opt._update_xp(sub, g0[sel], ss, 2)
            rw[sel] = sub
            for k in opt.slots:
                rstate[k][sel] = ss[k]
            want_g = g0.copy()
            want_g[sel] = 0
        np.testing.assert_allclose(w, rw, rtol=1e-14, atol=1e-15)
        for k in opt.slots:
            np.testing.assert_allclose(state[k], rstate[k], rtol=1e-14, atol=1e-15)
        np.testing.assert_array_equal(g, want_g)


# -- L2 and learning-rate schedules ----------------------------------------------------------

def scalar_factor(kind, s, K, T):
    """The documented schedule, written out per case."""
    if K > 0 and s <= K:
        return s / K
    if kind == "constant" or T <= K:
        return 1.0
    p = min(max((s - K - 1) / (T - K), 0.0), 1.0)
    return 1.0 - p if kind == "warmup-linear" else (1 + math.cos(math.pi * p)) / 2


def test_schedule_factors():
    from pshybrid.optim import Schedule

    for kind in ("constant", "warmup-linear", "cosine"):
        for K, T in ((0, 10), (3, 10), (4, 4), (0, 1)):
            sch = Schedule(kind, K, T)
            got = [sch.factor(s) for s in range(1, T + 1)]
            assert got == [scalar_factor(kind, s, K, T) for s in range(1, T + 1)]
    # anchor points of the formulas: warm-up ramp, first step after it at 1, decay
    assert Schedule("cosine", 2, 6).factor(3) == 1.0
    assert Schedule("warmup-linear", 0, 4).factor(4) == 0.25
    assert Schedule("cosine", 0, 2).factor(2) == pytest.approx(0.5)
    with pytest.raises(ConfigError, match="step-decay"):
        Schedule("step-decay")


@pytest.mark.parametrize("kind", ["sgd", "adagrad", "adam"])
@pytest.mark.parametrize("schedule", ["constant", "warmup-linear", "cosine"])
@pytest.mark.parametrize("numba_on", [True, False])
def test_l2_and_schedule_match_scalar_recurrence(kind, schedule, numba_on, monkeypatch):
    """Dense update, sparse update_rows and the servers' apply_slot (fused kernels and their
    NumPy twins) == the scalar recurrence with g + l2*w and lr * factor(step)."""
    from pshybrid import kernels
    from pshybrid.optim import Schedule

    if not numba_on:
        monkeypatch.setattr(kernels, "numba_active", lambda: False)
    rng = np.random.default_rng(6)
    w0 = rng.standard_normal((4, 3))
    grads = rng.standard_normal((6, 2, 3))  # 6 steps, rows 1 and 3 touched
    sch = Schedule(schedule, 2, 6)
    opt = Optimizer(kind, lr=0.1, l2=0.3, schedule=sch)
    rows = np.array([3, 1])
    w_rows, w_slot = w0.copy(), w0.copy()
    st_rows = {k: np.zeros_like(w0) for k in opt.slots}
    st_slot = {k: np.zeros_like(w0) for k in opt.slots}
    w_dense, st_dense = w0[rows].copy(), {k: np.zeros((2, 3)) for k in opt.slots}
    for t, g in enumerate(grads, start=1):
        opt.update_rows(w_rows, rows, g, st_rows, t)
        slot = np.zeros_like(w0)
        slot[rows] = g
        opt.apply_slot(w_slot, slot, st_slot, t, rows)
        opt.update(w_dense, g, st_dense, t)
    for i, r in enumerate(rows):
        for j in range(3):
            want = scalar_run(kind, w0[r, j], grads[:, i, j], 0.1, l2=0.3, factor=sch.factor)
            for got in (w_rows[r, j], w_slot[r, j], w_dense[i, j]):
                assert got == pytest.approx(want, rel=1e-12, abs=1e-14)
    # untouched rows get no L2 decay (lazy)
    np.testing.assert_array_equal(w_rows[[0, 2]], w0[[0, 2]])
    np.testing.assert_array_equal(w_slot[[0, 2]], w0[[0, 2]])


def test_needs_weights():
    assert not Optimizer("sgd", 0.1).needs_weights  # a blind -lr*g push is enough
    assert Optimizer("sgd", 0.1, l2=1e-4).needs_weights
    assert Optimizer("adagrad", 0.1).needs_weights


@pytest.mark.parametrize("kind", ["sgd", "adagrad", "adam"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("numba_on", [True, False])
def test_l2_flushes_values_below_sqrt_tiny_to_zero(kind, dtype, numba_on, monkeypatch):
    """With L2, weights and state below sqrt(finfo.tiny) after the step become 0 (dense,
    rows and servers' slots, fused and NumPy forms); the others follow the recurrence;
    without L2 nothing moves (a zero gradient, zero state: Adam's moments stay 0; their
    flush without L2 is the next test's). Values: one far below the bound, one just above
    it."""
    from pshybrid import kernels

    if not numba_on:
        monkeypatch.setattr(kernels, "numba_active", lambda: False)
    bound = np.sqrt(np.finfo(dtype).tiny)
    w0 = np.array([[bound * 1e-3, -bound * 1e-3, 4 * bound, 0.5]], dtype)
    g = np.zeros_like(w0)
    for l2 in (0.0, 0.25):
        opt = Optimizer(kind, lr=0.1, l2=l2)
        outs = []
        for how in ("dense", "rows", "slot"):
            w, st = w0.copy(), {k: np.zeros_like(w0) for k in opt.slots}
            if how == "dense":
                opt.update(w, g.copy(), st, 1)
            elif how == "rows":
                opt.update_rows(w, np.array([0]), g.copy(), st, 1)
            else:
                opt.apply_slot(w, g.copy(), st, 1, np.array([0]))
            outs.append((w, st))
        for w, st in outs:
            if not l2:  # zero gradient, no L2: nothing moves, nothing is flushed
                np.testing.assert_array_equal(w, w0)
                continue
            if kind == "sgd":  # w * (1 - lr * l2): the tiny ones flushed, the others kept
                np.testing.assert_array_equal(w[0, :2], 0)
                np.testing.assert_array_equal(w[0, 2:], w0[0, 2:] * dtype(1 - 0.1 * 0.25))
            for a in (w, *st.values()):  # adaptive: the tiny ones' (l2*w)^2 state flushed
                assert not np.any((a != 0) & (np.abs(a) < bound)), a
            np.testing.assert_array_equal(w, outs[0][0])  # the three paths agree


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("numba_on", [True, False])
def test_adams_moments_decay_to_zero_never_to_subnormals(dtype, numba_on, monkeypatch):
    """Without L2, where the gradient is 0 Adam's moments follow ``m *= beta1``, ``v *=
    beta2`` (bit for bit, from a recurrence run here) until below the smallest normal number
    (finfo.tiny), then are 0: never subnormal (float32's ``m`` would sit at its smallest
    subnormal for good, 0.9 times it rounding back to it). Values between tiny and
    sqrt(tiny) (L2's bound) are kept; so is a tiny weight (dense, rows and servers' slots;
    fused and NumPy forms)."""
    from pshybrid import kernels

    if not numba_on:
        monkeypatch.setattr(kernels, "numba_active", lambda: False)
    tiny, opt = dtype(np.finfo(dtype).tiny), Optimizer("adam", lr=1e-3)
    w0 = np.array([[0.5, -0.25, tiny, 1.0]], dtype)  # a weight at tiny: kept
    start = {"m": np.array([[1e-4, -3e-5, 0.0, tiny * 2]], dtype),
             "v": np.array([[1e-6, 1e-9, 1e-25, tiny * 1.0005]], dtype)}
    steps = 1200 if dtype == np.float32 else 7500  # m[0] past tiny (float64: 2.2e-308)
    for how in ("dense", "rows", "slot"):
        w, st = w0.copy(), {k: a.copy() for k, a in start.items()}
        m_ref, v_ref, seen = start["m"].copy(), start["v"].copy(), set()
        for step in range(1, steps + 1):
            g = np.zeros_like(w0)
            if how == "dense":
                opt.update(w, g, st, step)
            elif how == "rows":
                opt.update_rows(w, np.array([0]), g, st, step)
            else:
                opt.apply_slot(w, g, st, step, np.array([0]))
            m_ref *= dtype(opt.beta1)
            v_ref *= dtype(opt.beta2)
            m_ref[np.abs(m_ref) < tiny] = 0
            v_ref[np.abs(v_ref) < tiny] = 0
            for a in st.values():
                assert not np.any((a != 0) & (np.abs(a) < tiny)), (how, step)
            seen.update(np.flatnonzero(st["m"][0] == 0).tolist())
        np.testing.assert_array_equal(st["m"], m_ref)
        np.testing.assert_array_equal(st["v"], v_ref)
        assert seen == {0, 1, 2, 3} and not st["m"].any(), (how, st["m"])  # every m reached 0
        assert st["v"][0, 3] == 0 and (st["v"][0, :3] != 0).all()  # past tiny / above it
        np.testing.assert_array_equal(w[0, 2:], w0[0, 2:])  # tiny w kept; moments ~0 move


def test_an_optimizer_without_fused_kernels_runs_its_array_form(monkeypatch):
    """A new optimizer (docs/architecture.md): its slots in SLOTS and its rule in
    ``_update_xp``, no fused kernel: the servers' apply_slot, update_rows and update run
    that rule (an unknown kind used to fall through to Adam's kernel, or crash it); without
    a default rate the config asks for --lr."""
    from dataclasses import replace

    from pshybrid import optim
    from pshybrid.config import TrainConfig

    monkeypatch.setitem(optim.SLOTS, "rms", ("s",))
    xp_rule = Optimizer._update_xp

    def update_xp(self, w, g, state, step):
        if self.kind != "rms":
            return xp_rule(self, w, g, state, step)
        state["s"] *= 0.9
        state["s"] += 0.1 * g * g
        w -= self.lr * g / (np.sqrt(state["s"]) + self.eps)

    monkeypatch.setattr(Optimizer, "_update_xp", update_xp)
    rng = np.random.default_rng(1)
    w0, g0 = rng.standard_normal((7, 3)), rng.standard_normal((7, 3))
    rows = np.array([0, 5])
    s = 0.1 * g0[rows] ** 2
    want = w0.copy()
    want[rows] -= 0.1 * g0[rows] / (np.sqrt(s) + 1e-8)
    opt = Optimizer("rms", lr=0.1)
    for run in ("apply_slot", "update_rows"):
        w, g, state = w0.copy(), g0.copy(), {"s": np.zeros_like(w0)}
        if run == "apply_slot":
            opt.apply_slot(w, g, state, 1, rows, threads=2)
        else:
            opt.update_rows(w, rows, g[rows], state, 1)
        np.testing.assert_allclose(w, want, rtol=1e-13)
        np.testing.assert_allclose(state["s"][rows], s, rtol=1e-13)
    w = w0[rows].copy()
    opt.update(w, g0[rows].copy(), {"s": np.zeros_like(w)}, 1)
    np.testing.assert_allclose(w, want[rows], rtol=1e-13)
    with pytest.raises(ConfigError, match="--sparse-optimizer rms has no default rate"):
        TrainConfig(sparse_optimizer="rms").validate()
    replace(TrainConfig(), sparse_optimizer="rms", lr=0.1).validate()


def test_a_kind_added_to_the_slots_literal_asks_for_no_fused_kernel(monkeypatch):
    """docs/architecture.md: a new optimizer is its slots in ``optim.SLOTS`` and its rule in
    ``_update_xp``; fused kernels are not needed. Oracle: optim.py's own source with a kind
    written into the SLOTS literal, as a contributor does. FUSED was ``frozenset(SLOTS)``, so
    the new kind counted as fused and every update raised "has no fused kernels"; it must
    reach the array form (here without a rule yet: the error naming the step to do)."""
    import inspect
    import re
    import sys
    import types

    from pshybrid import optim

    src = inspect.getsource(optim)
    literal = re.search(r"^SLOTS = \{.*\}$", src, re.M).group(0)
    edited = types.ModuleType("pshybrid.optim_edited")
    edited.__package__ = "pshybrid"
    monkeypatch.setitem(sys.modules, edited.__name__, edited)  # (dataclasses look it up)
    src = src.replace(literal, literal[:-1] + ', "rms": ("s",)}')
    exec(compile(src, optim.__file__, "exec"), edited.__dict__)
    assert edited.FUSED == optim.FUSED
    opt = edited.Optimizer("rms", lr=0.1)
    w, g = np.ones((4, 3)), np.ones((2, 3))
    for run in (lambda: opt.update_rows(w, np.array([0, 2]), g, {"s": np.zeros_like(w)}, 1),
                lambda: opt.update(w[:2], g, {"s": np.zeros_like(g)}, 1)):
        with pytest.raises(ConfigError, match=r"no rule in Optimizer\._update_xp"):
            run()
