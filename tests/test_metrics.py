"""AUC: the O(n log n) reference equals a brute-force pairwise count (ties = 1/2)."""

import numpy as np
import pytest

from pshybrid.metrics import auc, logloss, logloss_from_logits


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


def test_auc_edges():
    assert auc([0.1, 0.9], [0, 1]) == 1.0
    assert auc([0.9, 0.1], [0, 1]) == 0.0
    assert auc([0.5, 0.5, 0.5], [0, 1, 1]) == 0.5
    assert np.isnan(auc([0.1, 0.2], [1, 1]))


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
