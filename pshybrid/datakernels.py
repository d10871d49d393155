"""Kernels of the input pipeline: the synthetic stream's per-row generator (``synthetic``).

Each numba kernel has a NumPy twin that is its test oracle and the fallback where numba is
missing; both give the same bits. The kernels do only integer hashing, table look-ups,
``+ - * /``, comparisons, the float32 rounding of the dense values and the C library's
``pow`` (fields of more than 2**20 ids; the twin calls Python's ``math.pow``, the same C
function): the transcendental functions of the stream (``log``, ``exp``) run as NumPy
ufuncs between the kernels (``SyntheticCTR.fill``) in both paths, so NumPy's SIMD versions
(which may differ from the C library in the last bit) are used either way.

Compiled lazily like ``kernels``: ``njit(cache=True, nogil=True, error_model="numpy")`` on
the first call where ``kernels.numba_active()``; the data thread runs them without the GIL.
"""

from __future__ import annotations

import math
import threading

import numpy as np

from . import kernels, prefetch

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
                     pkey, pscale, offsets, fused, bias, ou, ids, logit, ulab):
    """Twin of ``_nb_synth_rows``: rows ``[start, start + n)``, n = ``ids.shape[0]``."""
    n, F = ids.shape
    K = nd + F + 1
    r = np.arange(n, dtype=np.uint64) + np.uint64(start)
    with np.errstate(over="ignore"):
        z = fmix_numpy((r[:, None] * np.uint64(K) + np.arange(1, K + 1, dtype=np.uint64))
                       * GOLDEN + key)
    ou[:] = 1.0 - ((z[:, :nd] >> np.uint64(11)).astype(np.float64) * 2.0 ** -53).T
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


def log1p_args_numpy(cols, s, corr):
    """Twin of ``_nb_log1p_args``: with ``y = s[j] * cols[j]``, ``w = 1 + y``: ``cols[j] = w``
    and ``corr[j] = ((w - 1) - y) / w``, so ``log(w) - corr`` is ``log1p(y)`` (y >= 0)."""
    y = cols * s[:, None]
    np.add(y, 1.0, out=cols)
    np.subtract(cols, 1.0, out=corr)
    corr -= y
    corr /= cols


def synth_logit_numpy(cols, corr, v, m, logit, dense):
    """Twin of ``_nb_synth_logit``: ``cols`` becomes ``d = cols - corr``, ``logit += v_j *
    (d_j - m_j)`` for j in order, then ``logit = -logit``; ``dense`` = ``d.T`` in float32."""
    cols -= corr
    dense[...] = cols.T
    for j in range(cols.shape[0]):
        logit += v[j] * (cols[j] - m[j])
    np.negative(logit, out=logit)


def synth_labels_numpy(e, ulab, label):
    """Twin of ``_nb_synth_labels``: ``e = 1 / (1 + e)`` in place, ``label = ulab < e``."""
    e += 1.0
    np.divide(1.0, e, out=e)
    np.less(ulab, e, out=label)


# -- public entry points -------------------------------------------------------------------
def synth_rows(*args) -> None:
    """Integer and table part of rows ``[start, start + n)`` of the synthetic stream, into
    the given buffers (``synthetic`` states the rule). Arguments as ``synth_rows_numpy``:

    start (int), key (uint64: the rows' hash key), nd (dense columns), kinds/cards (per
    field), tab (alias tables concatenated, uint64), start0/size0 (per field: its alias
    table, or head table whose last entry stands for the tail), start1/size1 (its tail
    table), p1/p2 (power-law parameters), pkey (uint64: the planted weights' key), pscale
    (their scale), offsets (F,) int64, fused (ids + offsets when True), bias; out: ou
    (nd, n) float64 ``= 1 - u`` of each dense cell (exact: u is a multiple of 2**-53),
    column by column (so the NumPy passes over it, and ``synth_logit``'s, run along rows),
    ids (n, F) int64, logit (n,) float64 ``= bias + the planted field weights``, ulab (n,)
    float64 the label's uniform.
    """
    if _active():
        _nb_synth_rows(*args)
    else:
        synth_rows_numpy(*args)


def log1p_args(cols, s, corr) -> None:
    """The two parts of ``log1p(y)``, ``y = s[j] * cols[j, :]`` (>= 0), that leave one
    ``log`` to NumPy: ``cols`` becomes ``w = 1 + y`` and ``corr`` ``((w - 1) - y) / w``, the
    rounding of ``1 + y`` divided by ``w``; then ``log(w) - corr`` is ``log1p(y)`` to the
    last bit or so. cols, corr (nd, n) float64, s (nd,)."""
    if _active() and cols.flags.c_contiguous and corr.flags.c_contiguous:
        _nb_log1p_args(cols, s, corr)
    else:
        log1p_args_numpy(cols, s, corr)


def synth_logit(cols, corr, v, m, logit, dense) -> None:
    """``cols`` becomes the dense values ``d = cols - corr``; ``logit[i] += sum_j v[j] *
    (d[j, i] - m[j])``, added one j at a time in order, then negated (``logit`` becomes
    ``-logit``, for ``exp``); and ``dense[i, j] = d[j, i]`` in float32: cols, corr (nd, n)
    float64, dense (n, nd)."""
    if (_active() and cols.flags.c_contiguous and corr.flags.c_contiguous
            and dense.flags.c_contiguous):
        _nb_synth_logit(cols, corr, v, m, logit, dense)
    else:
        synth_logit_numpy(cols, corr, v, m, logit, dense)


def synth_labels(e, ulab, label) -> None:
    """From ``e = exp(-logit)`` (n,) float64: ``e`` becomes ``p = 1 / (1 + e)`` and
    ``label`` (n,) float32 ``ulab < p`` (1 or 0)."""
    if _active() and label.flags.c_contiguous:
        _nb_synth_labels(e, ulab, label)
    else:
        synth_labels_numpy(e, ulab, label)


# -- numba kernels (plain Python until ``_active()`` jits them) ----------------------------
_JITTED = ("_nb_fmix", "_nb_field_draws", "_nb_weights", "_nb_synth_rows", "_nb_log1p_args",
           "_nb_synth_logit", "_nb_synth_labels")
_INLINED = ("_nb_field_draws", "_nb_weights")
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

                    opts = dict(cache=True, nogil=True, error_model="numpy")
                    g = globals()
                    g["_prefetch"] = prefetch.hint(numba)
                    for name in _JITTED:  # (the per-block helpers inlined: ~5% faster)
                        g[name] = numba.njit(**opts, inline="always" if name in _INLINED
                                             else "never")(g[name])
                    _DONE = True
                else:
                    _DONE = False
    return _DONE


_prefetch = None  # the cache hint ``prefetch.build`` makes (``_active`` sets it): a tail
#                   draw's table cell starts loading while the head draws go on


def _nb_fmix(x):
    x ^= x >> np.uint64(30)
    x *= M1
    x ^= x >> np.uint64(27)
    x *= M2
    x ^= x >> np.uint64(31)
    return x


_BLOCK = 128  # rows a block of _nb_synth_rows (its hashes: (nd + F + 1) * 128 * 8 bytes)


def _nb_synth_rows(start, key, nd, kinds, cards, tab, start0, size0, start1, size1, p1, p2,
                   pkey, pscale, offsets, fused, bias, ou, ids, logit, ulab):
    # Blocks of _BLOCK rows, each in passes over columns: hashes column by column, each
    # field's draws over the block's rows (simple loops that vectorise, one table at a time),
    # the tail draws' table indices, then their loads alone (independent: their cache
    # misses overlap), then the planted weights field by field (the sum of each row in
    # field order, as the twin).
    n, F = ids.shape
    K = nd + F + 1
    R = _BLOCK
    z = np.empty(K * R, np.uint64)  # z[c * R + r]: hash of column c of row i0 + r
    idb = np.empty(F * R, np.int64)  # idb[f * R + r]: the block's ids, field by field
    pend = np.empty(F * R, np.int64)  # flat f * R + r of draws that go on to a tail table
    cell = np.empty(F * R, np.int64)
    tt = np.empty(F * R, np.uint64)
    s = np.empty(R, np.float64)
    for i0 in range(0, n, R):
        m = min(R, n - i0)
        x0 = np.uint64(start + i0) * np.uint64(K) + np.uint64(1)
        for c in range(K):  # z(r, c) = fmix((r * K + c + 1) * GOLDEN + key)
            xc = x0 + np.uint64(c)
            for r in range(m):
                z[c * R + r] = _nb_fmix((xc + np.uint64(r) * np.uint64(K)) * GOLDEN + key)
        for j in range(nd):
            for r in range(m):
                ou[j, i0 + r] = 1.0 - float(z[j * R + r] >> np.uint64(11)) * 2.0 ** -53
        for r in range(m):
            ulab[i0 + r] = float(z[(K - 1) * R + r] >> np.uint64(11)) * 2.0 ** -53
        np_ = 0
        for f in range(F):
            np_ = _nb_field_draws(f, m, z[(nd + f) * R:(nd + f + 1) * R], kinds, cards, tab,
                                  start0, size0, start1, size1, p1, p2, idb, pend, np_)
        for t in range(np_):  # tail draws: the cell and threshold part of each...
            f = pend[t] // R
            zt = _nb_fmix(z[(nd + f) * R + pend[t] - f * R])
            C = np.uint64(size1[f]) & LOW32
            tt[t] = (zt >> np.uint64(32)) * C + (((zt & LOW32) * C) >> np.uint64(32))
            cell[t] = start1[f] + np.int64(tt[t] >> np.uint64(32))
        for t in range(np_):  # ...the loads alone: ``cell`` becomes the table entries...
            cell[t] = np.int64(tab[cell[t]])
        for t in range(np_):  # ...and the draws
            f = pend[t] // R
            e, k = np.uint64(cell[t]), np.int64(tt[t] >> np.uint64(32))
            idb[pend[t]] += k if (tt[t] & LOW32) < (e & LOW32) else np.int64(e >> np.uint64(32))
        _nb_weights(m, F, offsets, fused, bias, pkey, pscale, idb, s)
        for r in range(m):
            logit[i0 + r] = s[r]
            for f in range(F):
                ids[i0 + r, f] = idb[f * R + r]


def _nb_field_draws(f, m, zf, kinds, cards, tab, start0, size0, start1, size1, p1, p2,
                    idb, pend, np_):
    """Field f's ids of a block's ``m`` rows by their hashes ``zf`` into ``idb[f * R:]``;
    the draws of the tail entry listed in ``pend`` (returns their new count), their tail
    table cells prefetched."""
    R = _BLOCK
    kind = kinds[f]
    if kind <= 1:  # ALIAS, ALIAS_TAIL
        a0, C = start0[f], np.uint64(size0[f]) & LOW32  # (< 2**21: 32-bit products)
        for r in range(m):
            t = (zf[r] >> np.uint64(32)) * C + (((zf[r] & LOW32) * C) >> np.uint64(32))
            k = np.int64(t >> np.uint64(32))
            e = tab[a0 + k]
            idb[f * R + r] = k if (t & LOW32) < (e & LOW32) else np.int64(e >> np.uint64(32))
        if kind == 1:
            last, C1 = size0[f] - 1, np.uint64(size1[f]) & LOW32
            for r in range(m):
                if idb[f * R + r] == last:
                    pend[np_] = f * R + r
                    np_ += 1
                    zt = _nb_fmix(zf[r])  # (its tail cell, as _nb_synth_rows computes it)
                    t1 = (zt >> np.uint64(32)) * C1 + (((zt & LOW32) * C1) >> np.uint64(32))
                    _prefetch(tab, start1[f] + np.int64(t1 >> np.uint64(32)))
        return np_
    for r in range(m):
        q = float(zf[r] >> np.uint64(11)) * 2.0 ** -53
        if kind == 2:  # POWER
            x = math.pow(1.0 - q * p1[f], p2[f])
        else:
            x = math.pow(p1[f], q)
        idf = np.int64(math.floor(x)) - 1
        if idf < 0:
            idf = 0
        elif idf > cards[f] - 1:
            idf = cards[f] - 1
        idb[f * R + r] = idf
    return np_


def _nb_weights(m, F, offsets, fused, bias, pkey, pscale, idb, s):
    """``s[r] = bias + w[g_0] + w[g_1] + ...`` (in field order) of a block's rows; with
    ``fused`` the ids in ``idb`` become the fused rows ``g = offset_f + id``."""
    R = _BLOCK
    for r in range(m):
        s[r] = bias
    for f in range(F):
        off = offsets[f]
        for r in range(m):
            g = idb[f * R + r] + off
            w = _nb_fmix((np.uint64(g) + np.uint64(1)) * GOLDEN + pkey)
            s[r] += pscale * (float(w >> np.uint64(11)) * 2.0 ** -52 - 1.0)
            if fused:
                idb[f * R + r] = g


def _nb_log1p_args(cols, s, corr):
    for j in range(cols.shape[0]):
        sj = s[j]
        for i in range(cols.shape[1]):
            y = cols[j, i] * sj
            w = y + 1.0
            cols[j, i] = w
            corr[j, i] = ((w - 1.0) - y) / w


def _nb_synth_logit(cols, corr, v, m, logit, dense):
    nd, n = cols.shape
    for j in range(nd):  # each row's sum in j order, as the twin
        vj, mj = v[j], m[j]
        for i in range(n):
            d = cols[j, i] - corr[j, i]
            cols[j, i] = d
            logit[i] += vj * (d - mj)
    for i in range(n):
        logit[i] = -logit[i]
        for j in range(nd):
            dense[i, j] = np.float32(cols[j, i])


def _nb_synth_labels(e, ulab, label):
    for i in range(e.size):
        p = 1.0 / (e[i] + 1.0)
        e[i] = p
        label[i] = np.float32(1.0) if ulab[i] < p else np.float32(0.0)
