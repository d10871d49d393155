"""Evaluation metrics: exact AUC (ties count 1/2) and logloss. Pure NumPy."""

from __future__ import annotations

import math

import numpy as np


def base_rate_logloss(p: float) -> float:
    """Logloss of always predicting the base rate ``p`` (the mean label): what a model
    that learned nothing scores (0 with one class)."""
    return -(p * math.log(p) + (1 - p) * math.log(1 - p)) if 0 < p < 1 else 0.0


# what ``auc`` allocates beside its inputs, per row, at most: the scores split by label
# (8 B), the label mask and its complement or the NaN test (1 B each); its searches go a
# chunk at a time (tests/test_metrics.py measures it; limits.py counts it for evaluation)
AUC_BYTES_PER_ROW = 10
CHUNK = 65536


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Exact ROC AUC in O(n log n): the Mann-Whitney statistic,
    P(score of a random positive > that of a random negative) + 1/2 P(equal), counted in
    integers (a positive's wins are the negatives below it, its ties the negatives equal to
    it: ``left + right`` of its two searches among the sorted negatives counts 2 wins + ties)
    and divided once, so the result is the exact ratio rounded once whatever n.
    scores, labels: (n,); labels in {0, 1}. NaN if there are no positives or negatives, or
    if a score is NaN (it has no rank: a diverged model's all-NaN logits scored 0.51)."""
    scores = np.asarray(scores, np.float64).ravel()
    pos = np.asarray(labels).ravel() > 0.5
    n_pos = int(np.count_nonzero(pos))
    n_neg = pos.size - n_pos
    if n_pos == 0 or n_neg == 0 or np.isnan(scores).any():
        return float("nan")
    neg = scores[~pos]
    neg.sort()
    twice = 0  # 2 x (wins + ties / 2), exact in Python's integers
    for s in range(0, scores.size, CHUNK):
        p = scores[s:s + CHUNK][pos[s:s + CHUNK]]
        twice += int(neg.searchsorted(p, "left").sum() + neg.searchsorted(p, "right").sum())
    return twice / (2 * n_pos * n_neg)


def logloss(p: np.ndarray, labels: np.ndarray, eps: float = 1e-7) -> float:
    """Mean binary cross-entropy of probabilities ``p`` (clipped to [eps, 1-eps])."""
    p = np.clip(np.asarray(p, np.float64), eps, 1 - eps)
    y = np.asarray(labels, np.float64)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def logloss_from_logits(z: np.ndarray, labels: np.ndarray) -> float:
    """Mean binary cross-entropy from logits, computed stably (no clipping), a chunk of
    rows at a time (its temporaries are a chunk's, not the whole array's). An infinite
    logit's loss is 0 where its label is the one it predicts with certainty, else inf
    (the formula's inf - inf gave NaN); NaN if a logit is NaN."""
    z, y = np.asarray(z).ravel(), np.asarray(labels).ravel()
    total = 0.0
    for s in range(0, z.size, CHUNK):
        zc, yc = z[s:s + CHUNK].astype(np.float64), y[s:s + CHUNK].astype(np.float64)
        with np.errstate(invalid="ignore"):
            loss = np.maximum(zc, 0) - zc * yc + np.log1p(np.exp(-np.abs(zc)))
        total += float(np.where(np.isinf(zc), np.where(yc == (zc > 0), 0.0, np.inf), loss).sum())
    return total / z.size if z.size else float("nan")


def sigmoid(z: np.ndarray) -> np.ndarray:
    """``1 / (1 + exp(-z))`` in float64 without overflow and to full relative precision
    for z << 0 too (``(1 + tanh(z/2)) / 2`` cancels there: 0 below z = -37)."""
    z = np.asarray(z, np.float64)
    e = np.exp(-np.abs(z))
    return np.where(z >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
