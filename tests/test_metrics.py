"""AUC: the O(n log n) count equals a brute-force pairwise count (ties = 1/2) and the exact
fraction; its memory and the logloss's stay within what the memory check counts."""

import numpy as np
import pytest

from pshybrid.metrics import auc, base_rate_logloss, logloss, logloss_from_logits


def brute_auc(s, y):
    pos, neg = s[y == 1], s[y == 0]
    wins = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return wins / (len(pos) * len(neg))


@pytest.mark.parametrize("seed", range(5))
def test_auc_equals_brute_force_with_ties(seed):
    rng = np.random.default_rng(seed)
    n = 300
    y = (rng.random(n) < 0.3).astype(np.float32)
    s = np.round(rng.random(n) + 0.3 * y, 1)  # rounding makes many ties
    assert auc(s, y) == pytest.approx(brute_auc(s, y), abs=1e-12)


def test_auc_is_the_exact_ratio_rounded_once_and_its_memory_is_counted(monkeypatch):
    """The wins and ties counted in integers: the result is the exact fraction of the
    pairwise count rounded once (ties across -0.0/0.0 and infinities included, chunk
    boundaries crossed), and auc's and logloss's temporaries stay within
    metrics.AUC_BYTES_PER_ROW (what the memory check counts for evaluation: the argsort,
    sorted copy, ranks and masks took 57 B a row, the logloss's whole-array temporaries 25)."""
    import tracemalloc
    from fractions import Fraction

    from pshybrid import metrics

    rng = np.random.default_rng(7)
    n = 3001
    s = np.round(rng.standard_normal(n), 1)
    s[rng.integers(0, n, 50)] = rng.choice([np.inf, -np.inf, -0.0, 0.0], 50)
    y = rng.random(n) < 0.4
    pos, neg = s[y][:, None], s[~y][None, :]
    twice = int(2 * (pos > neg).sum() + (pos == neg).sum())
    monkeypatch.setattr(metrics, "CHUNK", 64)
    assert auc(s, y) == float(Fraction(twice, 2 * int(y.sum()) * int((~y).sum())))
    monkeypatch.undo()
    z, lab = rng.standard_normal(1_000_000), (rng.random(1_000_000) < 0.3).astype(np.float64)
    for f, most in ((auc, metrics.AUC_BYTES_PER_ROW * z.size), (logloss_from_logits, 2**22)):
        tracemalloc.start()
        f(z, lab)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < most, (f.__name__, peak / z.size)


def test_auc_edges():
    assert auc([0.1, 0.9], [0, 1]) == 1.0
    assert auc([0.9, 0.1], [0, 1]) == 0.0
    assert auc([0.5, 0.5, 0.5], [0, 1, 1]) == 0.5
    assert np.isnan(auc([0.1, 0.2], [1, 1]))


def test_auc_of_nan_scores_is_nan():
    """A NaN score has no rank: the AUC is undefined (a diverged model's all-NaN logits
    were reported as an AUC of 0.51, two of them of one class each as 1.0)."""
    rng = np.random.default_rng(0)
    y = (rng.random(50) < 0.4).astype(np.float32)
    s = rng.random(50)
    assert np.isfinite(auc(s, y))
    for bad in ([7], [0, 13, 49], list(range(50))):
        t = s.copy()
        t[bad] = np.nan
        assert np.isnan(auc(t, y)), bad
    assert np.isnan(auc([np.nan, np.nan], [0, 1]))
    assert auc([np.inf, -np.inf, 0.0], [1, 0, 0]) == brute_auc(np.array([np.inf, -np.inf, 0.0]),
                                                               np.array([1, 0, 0]))


def test_logloss_of_infinite_logits_is_their_limit():
    """An infinite logit's loss is the limit of a large finite one's: 0 when it predicts its
    own label, inf when the other one (inf - inf made both NaN)."""
    finite_z, finite_y = np.array([0.3, -2.0, 5.0]), np.array([1.0, 0.0, 0.0])
    z = np.concatenate((finite_z, [-np.inf, np.inf]))
    y = np.concatenate((finite_y, [0.0, 1.0]))
    want = logloss_from_logits(finite_z, finite_y) * finite_z.size / z.size
    assert logloss_from_logits(z, y) == pytest.approx(want, rel=1e-15)
    assert logloss_from_logits(z, y) == pytest.approx(
        logloss_from_logits(np.where(np.isinf(z), np.sign(z) * 1e300, z), y), rel=1e-15)
    assert logloss_from_logits([np.inf, 0.0], [0, 1]) == np.inf
    assert logloss_from_logits([-np.inf], [1]) == np.inf
    assert np.isnan(logloss_from_logits([np.nan, 0.0], [0, 1]))


def test_logloss_forms_agree():
    z = np.array([-3.0, 0.0, 2.5, 20.0])
    y = np.array([0, 1, 1, 1])
    p = 1 / (1 + np.exp(-z))
    assert logloss_from_logits(z, y) == pytest.approx(logloss(p, y, eps=1e-12), rel=1e-9)
    assert logloss([0.5], [1]) == pytest.approx(np.log(2))


def test_sigmoid_keeps_its_relative_precision_at_both_ends():
    """``sigmoid`` == 1 / (1 + e^-z) in Python floats (exact to an ulp or two where e^-z
    is finite), from z = -700 to 800: the tanh form ``predict`` used wrote 0 below -37
    and had lost 1.7e-4 of its value at -30."""
    import math

    from pshybrid.metrics import sigmoid

    z = np.array([-700.0, -60.0, -38.0, -30.0, -1.0, 0.0, 1e-9, 2.5, 40.0, 800.0])
    want = np.array([1.0 / (1.0 + math.exp(-v)) if v > -709 else math.exp(v) for v in z])
    np.testing.assert_allclose(sigmoid(z), want, rtol=4e-16, atol=0)
    assert sigmoid(np.float32(-50.0)) > 0 and sigmoid(np.array([1e308]))[0] == 1.0


@pytest.mark.parametrize("p", [0.5, 0.3, 0.01])
def test_the_base_rate_logloss_is_a_constant_predictions(p):
    """What always predicting the mean label p scores, by the logloss itself: 10,000
    labels with mean p and the constant logit log(p / (1 - p)); one class scores 0."""
    y = (np.arange(10_000) < round(p * 10_000)).astype(np.float64)
    z = np.full(y.size, np.log(p / (1 - p)))
    assert np.isclose(base_rate_logloss(float(y.mean())), logloss_from_logits(z, y), rtol=1e-12)
    assert base_rate_logloss(0.0) == base_rate_logloss(1.0) == 0.0
