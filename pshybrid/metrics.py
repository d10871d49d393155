"""Evaluation metrics: exact AUC (ties count 1/2) and logloss. Pure NumPy."""

from __future__ import annotations

import math

import numpy as np


def base_rate_logloss(p: float) -> float:
    """Logloss of always predicting the base rate ``p`` (the mean label): what a model
    that learned nothing scores (0 with one class)."""
    return -(p * math.log(p) + (1 - p) * math.log(1 - p)) if 0 < p < 1 else 0.0


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Exact ROC AUC in O(n log n): the Mann-Whitney statistic with average ranks for ties,
    i.e. P(score of a random positive > that of a random negative) + 1/2 P(equal).
    scores, labels: (n,); labels in {0, 1}. NaN if there are no positives or negatives, or
    if a score is NaN (it has no rank: a diverged model's all-NaN logits scored 0.51)."""
    scores = np.asarray(scores, np.float64).ravel()
    labels = np.asarray(labels).ravel() > 0.5
    n_pos = int(labels.sum())
    n_neg = labels.size - n_pos
    if n_pos == 0 or n_neg == 0 or np.isnan(scores).any():
        return float("nan")
    order = np.argsort(scores, kind="stable")
    s = scores[order]
    # 1-based average rank of each tie group
    starts = np.flatnonzero(np.concatenate(([True], s[1:] != s[:-1])))
    ends = np.concatenate((starts[1:], [s.size]))
    avg_rank = (starts + 1 + ends) / 2.0
    ranks = np.repeat(avg_rank, ends - starts)
    pos_rank_sum = ranks[labels[order]].sum()
    return float((pos_rank_sum - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def logloss(p: np.ndarray, labels: np.ndarray, eps: float = 1e-7) -> float:
    """Mean binary cross-entropy of probabilities ``p`` (clipped to [eps, 1-eps])."""
    p = np.clip(np.asarray(p, np.float64), eps, 1 - eps)
    y = np.asarray(labels, np.float64)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def logloss_from_logits(z: np.ndarray, labels: np.ndarray) -> float:
    """Mean binary cross-entropy from logits, computed stably (no clipping). An infinite
    logit's loss is 0 where its label is the one it predicts with certainty, else inf
    (the formula's inf - inf gave NaN); NaN if a logit is NaN."""
    z = np.asarray(z, np.float64)
    y = np.asarray(labels, np.float64)
    with np.errstate(invalid="ignore"):
        loss = np.maximum(z, 0) - z * y + np.log1p(np.exp(-np.abs(z)))
    loss = np.where(np.isinf(z), np.where(y == (z > 0), 0.0, np.inf), loss)
    return float(np.mean(loss))


def sigmoid(z: np.ndarray) -> np.ndarray:
    """``1 / (1 + exp(-z))`` in float64 without overflow and to full relative precision
    for z << 0 too (``(1 + tanh(z/2)) / 2`` cancels there: 0 below z = -37)."""
    z = np.asarray(z, np.float64)
    e = np.exp(-np.abs(z))
    return np.where(z >= 0, 1.0 / (1.0 + e), e / (1.0 + e))
