"""Embedding kernels: gather rows by index and scatter-add rows with duplicate ids.

Each kernel has an ``xp`` reference twin (``*_ref``: the plainest NumPy/CuPy code)
that is its test oracle (STYLE.md §6). The CPU fast paths below are sort-based
segment reductions, deterministic (stable order) and much faster than ``np.add.at``.
"""

from __future__ import annotations

import numpy as np

from .backend import array_module


# -- references (oracles) ------------------------------------------------------------------
def gather_ref(rows, index):
    """rows: (N, D); index: any-shape int64 in [0, N) -> index.shape + (D,)."""
    return rows[index]


def scatter_add_ref(index, values, n: int):
    """index: (B,) int64 in [0, n); values: (B, D) -> (n, D) with out[i] = sum of values[index == i]."""
    xp = array_module(values)
    out = xp.zeros((n,) + values.shape[1:], dtype=values.dtype)
    xp.add.at(out, index, values)
    return out


# -- fast paths ----------------------------------------------------------------------------
def gather(rows, index):
    """rows: (N, D); index: any shape int64 -> index.shape + (D,). Same result as ``gather_ref``."""
    xp = array_module(rows)
    if xp is np:
        return np.take(rows, index, axis=0)
    return rows[index]


def scatter_add(index, values, n: int):
    """index: (B,) int64 in [0, n); values: (B, D) -> (n, D) sums of rows per index.

    Sort-based segment sum: stable argsort of ``index`` then ``add.reduceat`` over runs.
    """
    xp = array_module(values)
    out = xp.zeros((n,) + values.shape[1:], dtype=values.dtype)
    if index.size == 0:
        return out
    uniq, sums = segment_sum(index, values)
    out[uniq] = sums
    return out


def segment_sum(keys, values):
    """Sum the rows of ``values`` that share a key.

    keys: (B,) int64; values: (B, D). Returns ``(uniq, sums)``: uniq (U,) sorted int64,
    sums (U, D) with sums[u] = sum of values[keys == uniq[u]] (added in input order).
    """
    xp = array_module(values)
    keys = keys.ravel()
    assert values.shape[0] == keys.shape[0], (values.shape, keys.shape)
    if keys.size == 0:
        return keys[:0], values[:0]
    order = xp.argsort(keys, kind="stable")
    skeys = keys[order]
    starts = xp.flatnonzero(xp.concatenate([xp.ones(1, bool), skeys[1:] != skeys[:-1]]))
    sums = xp.add.reduceat(values[order], starts, axis=0)
    return skeys[starts], sums
