"""Kernels of the input pipeline: the synthetic stream's per-row generator (``synthetic``).

Each numba kernel has a NumPy twin that is its test oracle and the fallback where numba is
missing; both give the same bits. The kernels do only integer hashing, table look-ups,
``+ - *`` and the C library's ``pow`` (fields of more than 2**20 ids; the twin calls
Python's ``math.pow``, the same C function): the transcendental functions of the stream
(``log1p``, ``exp``) run as NumPy ufuncs on the kernels' output in both paths, so NumPy's
SIMD versions (which may differ from the C library in the last bit) are used either way.

Compiled lazily like ``kernels``: ``njit(cache=True, nogil=True, error_model="numpy")`` on
the first call where ``kernels.numba_active()``; the data thread runs them without the GIL.
"""

from __future__ import annotations

import math
import threading

import numpy as np

from . import kernels

GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # the splitmix64 constants of ``initializers``
M1 = np.uint64(0xBF58476D1CE4E5B9)
M2 = np.uint64(0x94D049BB133111EB)
LOW32 = np.uint64(0xFFFFFFFF)
# Field kinds: ids from one alias table; from a head table whose last entry stands for the
# tail, then a tail table (both exact truncated Zipf); or from the continuous power law
# x = (1 - q * p1) ** p2 (zipf != 1), or x = p1 ** q (zipf == 1): id = floor(x) - 1.
ALIAS, ALIAS_TAIL, POWER, POWER_ONE = 0, 1, 2, 3


# -- NumPy twins (oracles, and the path without numba) -------------------------------------
def fmix_numpy(x):
    """splitmix64's finalizer on a uint64 array (a new array)."""
    with np.errstate(over="ignore"):
        x = x ^ (x >> np.uint64(30))
        x *= M1
        x ^= x >> np.uint64(27)
        x *= M2
        x ^= x >> np.uint64(31)
    return x


def alias_numpy(tab, start, size, z):
    """Draws (int64) from the alias table ``tab[start:start + size]`` by the uint64 hashes z."""
    C = np.uint64(size)
    with np.errstate(over="ignore"):
        t = (z >> np.uint64(32)) * C + (((z & LOW32) * C) >> np.uint64(32))
    k = (t >> np.uint64(32)).astype(np.int64)
    e = tab[start + k]
    return np.where((t & LOW32) < (e & LOW32), k, (e >> np.uint64(32)).astype(np.int64))


def synth_rows_numpy(start, key, nd, kinds, cards, tab, start0, size0, start1, size1, p1, p2,
                     pkey, pscale, offsets, fused, bias, nu, ids, logit, ulab):
    """Twin of ``_nb_synth_rows``: rows ``[start, start + n)``, n = ``ids.shape[0]``."""
    n, F = ids.shape
    K = nd + F + 1
    r = np.arange(n, dtype=np.uint64) + np.uint64(start)
    with np.errstate(over="ignore"):
        z = fmix_numpy((r[:, None] * np.uint64(K) + np.arange(1, K + 1, dtype=np.uint64))
                       * GOLDEN + key)
    nu[:] = -((z[:, :nd] >> np.uint64(11)).astype(np.float64) * 2.0 ** -53)
    s = np.full(n, bias, np.float64)
    for f in range(F):
        zf = z[:, nd + f]
        if kinds[f] <= ALIAS_TAIL:
            idf = alias_numpy(tab, start0[f], size0[f], zf)
            if kinds[f] == ALIAS_TAIL:
                tail = idf == size0[f] - 1
                idf[tail] += alias_numpy(tab, start1[f], size1[f], fmix_numpy(zf[tail]))
        else:
            q = (zf >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
            if kinds[f] == POWER:
                x = [math.pow(1.0 - qi * p1[f], p2[f]) for qi in q.tolist()]
            else:
                x = [math.pow(p1[f], qi) for qi in q.tolist()]
            idf = np.clip(np.floor(np.array(x)).astype(np.int64) - 1, 0, int(cards[f]) - 1)
        g = idf + offsets[f]
        ids[:, f] = g if fused else idf
        with np.errstate(over="ignore"):
            w = fmix_numpy((g.astype(np.uint64) + np.uint64(1)) * GOLDEN + pkey)
        s += pscale * ((w >> np.uint64(11)).astype(np.float64) * 2.0 ** -52 - 1.0)
    logit[:] = s
    ulab[:] = (z[:, nd + F] >> np.uint64(11)).astype(np.float64) * 2.0 ** -53


def synth_logit_numpy(dense, v, m, logit):
    """Twin of ``_nb_synth_logit``: ``logit += v_j * (dense_j - m_j)`` for j in order."""
    for j in range(dense.shape[1]):
        logit += v[j] * (dense[:, j] - m[j])


# -- public entry points -------------------------------------------------------------------
def synth_rows(*args) -> None:
    """Integer and table part of rows ``[start, start + n)`` of the synthetic stream, into
    the given buffers (``synthetic`` states the rule). Arguments as ``synth_rows_numpy``:

    start (int), key (uint64: the rows' hash key), nd (dense columns), kinds/cards (per
    field), tab (alias tables concatenated, uint64), start0/size0 (per field: its alias
    table, or head table whose last entry stands for the tail), start1/size1 (its tail
    table), p1/p2 (power-law parameters), pkey (uint64: the planted weights' key), pscale
    (their scale), offsets (F,) int64, fused (ids + offsets when True), bias; out: nu
    (n, nd) float64 ``= -u`` of each dense cell, ids (n, F) int64, logit (n,) float64
    ``= bias + the planted field weights``, ulab (n,) float64 the label's uniform.
    """
    if _active():
        _nb_synth_rows(*args)
    else:
        synth_rows_numpy(*args)


def synth_logit(dense, v, m, logit) -> None:
    """``logit[i] += sum_j v[j] * (dense[i, j] - m[j])``, added one j at a time in order."""
    if _active() and dense.flags.c_contiguous:
        _nb_synth_logit(dense, v, m, logit)
    else:
        synth_logit_numpy(dense, v, m, logit)


# -- numba kernels (plain Python until ``_active()`` jits them) ----------------------------
_JITTED = ("_nb_fmix", "_nb_alias", "_nb_synth_rows", "_nb_synth_logit")
_DONE: bool | None = None
_LOCK = threading.Lock()


def _active() -> bool:
    """True when the numba kernels serve (jits this module's kernels on the first call)."""
    global _DONE
    if _DONE is None:
        with _LOCK:
            if _DONE is None:
                if kernels.numba_active():
                    import numba

                    jit = numba.njit(cache=True, nogil=True, error_model="numpy")
                    g = globals()
                    for name in _JITTED:
                        g[name] = jit(g[name])
                    _DONE = True
                else:
                    _DONE = False
    return _DONE


def _nb_fmix(x):
    x ^= x >> np.uint64(30)
    x *= M1
    x ^= x >> np.uint64(27)
    x *= M2
    x ^= x >> np.uint64(31)
    return x


def _nb_alias(tab, start, size, z):
    C = np.uint64(size)
    t = (z >> np.uint64(32)) * C + (((z & LOW32) * C) >> np.uint64(32))
    k = np.int64(t >> np.uint64(32))
    e = tab[start + k]
    if (t & LOW32) < (e & LOW32):
        return k
    return np.int64(e >> np.uint64(32))


def _nb_synth_rows(start, key, nd, kinds, cards, tab, start0, size0, start1, size1, p1, p2,
                   pkey, pscale, offsets, fused, bias, nu, ids, logit, ulab):
    # In passes over the batch, each a simple loop (the hash loops vectorise); the tail-table
    # loads are gathered into one loop of independent loads, so their cache misses overlap.
    n, F = ids.shape
    K = nd + F + 1
    z = np.empty(n * K, np.uint64)
    x0 = np.uint64(start) * np.uint64(K) + np.uint64(1)
    for c in range(n * K):  # z(r, c) at flat index (r - start) * K + c
        z[c] = _nb_fmix((x0 + np.uint64(c)) * GOLDEN + key)
    for i in range(n):
        for j in range(nd):
            nu[i, j] = -(float(z[i * K + j] >> np.uint64(11)) * 2.0 ** -53)
        ulab[i] = float(z[i * K + K - 1] >> np.uint64(11)) * 2.0 ** -53
    pend = np.empty(n * F, np.int64)  # flat (i, f) of draws that go on to a tail table
    np_ = 0
    for i in range(n):
        for f in range(F):
            zf = z[i * K + nd + f]
            kind = kinds[f]
            if kind <= 1:  # ALIAS, ALIAS_TAIL
                idf = _nb_alias(tab, start0[f], size0[f], zf)
                if kind == 1 and idf == size0[f] - 1:
                    pend[np_] = i * F + f
                    np_ += 1
            else:
                q = float(zf >> np.uint64(11)) * 2.0 ** -53
                if kind == 2:  # POWER
                    x = math.pow(1.0 - q * p1[f], p2[f])
                else:
                    x = math.pow(p1[f], q)
                idf = np.int64(math.floor(x)) - 1
                if idf < 0:
                    idf = 0
                elif idf > cards[f] - 1:
                    idf = cards[f] - 1
            ids[i, f] = idf
    for t in range(np_):
        i, f = divmod(pend[t], F)
        ids[i, f] += _nb_alias(tab, start1[f], size1[f], _nb_fmix(z[i * K + nd + f]))
    for i in range(n):
        logit[i] = bias
    for f in range(F):  # logit = bias + w_0 + w_1 + ..., row by row in field order
        off = offsets[f]
        for i in range(n):
            g = ids[i, f] + off
            w = _nb_fmix((np.uint64(g) + np.uint64(1)) * GOLDEN + pkey)
            logit[i] += pscale * (float(w >> np.uint64(11)) * 2.0 ** -52 - 1.0)
            if fused:
                ids[i, f] = g


def _nb_synth_logit(dense, v, m, logit):
    n, nd = dense.shape
    for i in range(n):
        s = logit[i]
        for j in range(nd):
            s += v[j] * (dense[i, j] - m[j])
        logit[i] = s
