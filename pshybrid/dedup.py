"""Deduplication of ids: the distinct keys of a batch, its inverse index and its groups by
owner (``unique_inverse``: the store's plans, ``partition.group_by_owner``), and the dedup
under ``kernels.segment_sum``.

numba kernels with a NumPy twin (``unique_inverse_numpy``: one argsort of the sort key),
their test oracle and the path without numba. ``kernels`` jits them with its own
(``kernels.numba_active``) and holds their entry points (``kernels.unique_inverse``,
``kernels.min_max``, ``kernels.segment_sum``). ``unique_inverse``: a bitmap of the sort
keys where they span at most ``_BITMAP_SPAN`` bits per key (no data-dependent branch,
sorted output), else a hash map (key -> slot in first-occurrence order) plus an LSD radix
argsort of the U distinct keys. Both give the twin's result exactly.
"""

from __future__ import annotations

import numpy as np

from .backend import array_module

MAX_KEYS = 2**31 - 1  # the numba kernels number slots and ranks in int32


def unique_inverse_numpy(keys, m: int = 1):
    """``xp`` twin of ``unique_inverse``: one unstable argsort of the (cyclic) sort key (faster
    than ``np.unique(return_inverse=True)``), then a cumulative sum of run starts."""
    xp = array_module(keys)
    keys = keys.ravel()
    skey = keys
    if m > 1 and keys.size:
        lo = int(keys.min()) // m
        div, mod = xp.divmod(keys, m)
        skey = mod * (int(keys.max()) // m - lo + 1) + (div - lo)
    order = xp.argsort(skey)
    sorted_keys = keys[order]
    first = xp.empty(sorted_keys.shape, bool)
    first[:1] = True
    xp.not_equal(sorted_keys[1:], sorted_keys[:-1], out=first[1:])
    inverse = xp.empty(keys.shape, xp.int64)
    inverse[order] = xp.cumsum(first) - 1
    uniq = sorted_keys[first]
    bounds = xp.searchsorted(uniq % m, xp.arange(m + 1, dtype=xp.int64)).astype(xp.int64)
    return uniq, inverse, bounds


# -- numba kernels (plain Python until ``kernels.numba_active()`` jits them) --------------
_JITTED = ("_nb_hash_dedup", "_nb_radix_argsort", "_nb_cyclic", "_nb_sorted_dedup",
           "_nb_popcount", "_nb_min_max", "_nb_bitmap_unique", "_nb_unique_inverse",
           "_nb_segment_sum", "_nb_merge_sum")
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing multiplier, 2^64 / golden ratio
_RADIX_BITS = 11                          # 2048-bucket histograms (16 KiB) stay in L1
_RADIX_MASK = np.uint64((1 << _RADIX_BITS) - 1)
# unique_inverse: a bitmap of the sort keys' span instead of the hash map + radix sort when
# the span is at most this many bits per key (its clearing and scan then cost less than the
# hash map's probes: 0.8 -> 0.5 ms for 106k ids over 5.6M rows, docs/benchmarks.md)
_BITMAP_SPAN = 128


def _nb_hash_dedup(keys):
    """keys (B,) int64 -> (slot (B,) int32, ukeys (U,) int64): slot[i] numbers keys[i] by first
    occurrence, ukeys[slot[i]] == keys[i]. Open addressing, linear probing, load <= 1/2."""
    n = keys.size
    bits = 4
    while (1 << bits) < 2 * n:
        bits += 1
    mask = (1 << bits) - 1
    shift = np.uint64(64 - bits)
    table = np.full(1 << bits, -1, np.int32)
    slot = np.empty(n, np.int32)
    ukeys = np.empty(n, np.int64)
    u = 0
    for i in range(n):
        k = keys[i]
        h = np.intp((np.uint64(k) * _GOLDEN) >> shift)
        while True:
            s = table[h]
            if s < 0:
                table[h] = u
                ukeys[u] = k
                slot[i] = u
                u += 1
                break
            if ukeys[s] == k:
                slot[i] = s
                break
            h = (h + 1) & mask
    return slot, ukeys[:u]


def _nb_radix_argsort(keys):
    """Stable argsort of (n,) int64 keys: LSD radix on ``key - min`` (uint64, so any span),
    11 bits a pass, only as many passes as the span has bits."""
    n = keys.size
    order = np.arange(n)
    if n < 2:
        return order
    base = np.uint64(keys.min())
    span = np.uint64(keys.max()) - base
    u = np.empty(n, np.uint64)
    for i in range(n):
        u[i] = np.uint64(keys[i]) - base
    order2 = np.empty(n, order.dtype)
    u2 = np.empty(n, np.uint64)
    count = np.empty((1 << _RADIX_BITS) + 1, np.intp)
    shift = np.uint64(0)
    while span:
        count[:] = 0
        for i in range(n):
            count[np.intp((u[i] >> shift) & _RADIX_MASK) + 1] += 1
        for b in range(1 << _RADIX_BITS):
            count[b + 1] += count[b]
        for i in range(n):
            b = np.intp((u[i] >> shift) & _RADIX_MASK)
            p = count[b]
            count[b] = p + 1
            order2[p] = order[i]
            u2[p] = u[i]
        order, order2 = order2, order
        u, u2 = u2, u
        shift += np.uint64(_RADIX_BITS)
        span >>= np.uint64(_RADIX_BITS)
    return order


def _nb_cyclic(k, m, inv, fast, lo, per):
    """(k % m, the sort key (k % m) * per + (k // m - lo)) of key k: owner-major order.
    ``fast`` (all keys' |k| < 2^50): floor(k * inv), inv = 1 / m, is off by at most one,
    fixed below; far cheaper than a 64-bit integer division. Larger keys divide exactly."""
    if fast:
        q = np.int64(np.floor(k * inv))
    else:
        q = k // m
    r = k - q * m
    if r < 0:
        q -= 1
        r += m
    elif r >= m:
        q += 1
        r -= m
    return r, r * per + (q - lo)  # r == k % m, q == k // m (floor, as NumPy)


def _nb_sorted_dedup(keys, m):
    """keys (B,) int64, B >= 1 -> (slot (B,) int32, uniq (U,) int64, rank (U,) int64, bounds
    (m+1,) int64): the distinct keys sorted by (key % m, key // m) (plain key order when
    m == 1); ``slot`` as in ``_nb_hash_dedup``; ``rank[slot[i]]`` is the position of keys[i]
    in ``uniq``; group r (key % m == r) is ``uniq[bounds[r]:bounds[r+1]]``."""
    slot, ukeys = _nb_hash_dedup(keys)
    u = ukeys.size
    bounds = np.zeros(m + 1, np.int64)
    if m > 1:  # cyclic order: one division per distinct key, not per row
        kmin, kmax = ukeys.min(), ukeys.max()
        lo = kmin // m
        per = kmax // m - lo + 1
        fast = -(1 << 50) < kmin and kmax < (1 << 50)
        skeys = np.empty(u, np.int64)
        for s in range(u):
            r, skeys[s] = _nb_cyclic(ukeys[s], m, 1.0 / m, fast, lo, per)
            bounds[r + 1] += 1
        for r in range(m):
            bounds[r + 1] += bounds[r]
        order = _nb_radix_argsort(skeys)
    else:
        bounds[1] = u
        order = _nb_radix_argsort(ukeys)
    uniq = np.empty(u, np.int64)
    rank = np.empty(u, np.int64)
    for j in range(u):
        s = order[j]
        uniq[j] = ukeys[s]
        rank[s] = j
    return slot, uniq, rank, bounds


def _nb_popcount(x):
    """Set bits of a uint64 (LLVM makes this one popcnt instruction)."""
    x = x - ((x >> np.uint64(1)) & np.uint64(0x5555555555555555))
    x = (x & np.uint64(0x3333333333333333)) + ((x >> np.uint64(2)) & np.uint64(0x3333333333333333))
    x = (x + (x >> np.uint64(4))) & np.uint64(0x0F0F0F0F0F0F0F0F)
    return np.intp((x * np.uint64(0x0101010101010101)) >> np.uint64(56))


def _nb_min_max(keys):
    lo = keys[0]
    for i in range(keys.size):  # two simple loops: both vectorise
        if keys[i] < lo:
            lo = keys[i]
    hi = keys[0]
    for i in range(keys.size):
        if keys[i] > hi:
            hi = keys[i]
    return lo, hi


def _nb_bitmap_unique(keys, m, lo, per, span, fast):
    """``_nb_unique_inverse`` by a bitmap of the sort keys ``v`` in ``[0, span)`` (``key -
    lo``, or with m > 1 ``_nb_cyclic``'s): one pass sets bit v of each key, a scan counts
    the bits before each 64-bit word, and a second pass over the keys ranks each one (the
    bits below its own) into ``inverse`` and writes it at its rank in ``uniq``. No branch
    depends on the data, and the distinct keys come out sorted."""
    n = keys.size
    one = np.uint64(1)
    nw = (span + 63) >> 6
    bm = np.zeros(nw, np.uint64)
    inverse = np.empty(n, np.int64)  # first the sort keys, then the ranks
    inv = 1.0 / m
    for i in range(n):
        v = keys[i] - lo if m == 1 else _nb_cyclic(keys[i], m, inv, fast, lo, per)[1]
        inverse[i] = v
        bm[v >> 6] |= one << np.uint64(v & 63)
    before = np.empty(nw + 1, np.int32)  # set bits in the words before word w
    t = 0
    for w in range(nw):
        before[w] = t
        t += _nb_popcount(bm[w])
    before[nw] = t
    uniq = np.empty(t, np.int64)
    for i in range(n):
        v = inverse[i]
        w = v >> 6
        r = before[w] + _nb_popcount(bm[w] & ((one << np.uint64(v & 63)) - one))
        inverse[i] = r
        uniq[r] = keys[i]
    bounds = np.empty(m + 1, np.int64)
    for r in range(m + 1):  # the keys of owner r: sort keys in [r * per, (r + 1) * per)
        v = min(r * per, span)
        w = v >> 6
        bounds[r] = t if w >= nw else before[w] + _nb_popcount(
            bm[w] & ((one << np.uint64(v & 63)) - one))
    return uniq, inverse, bounds


def _nb_unique_inverse(keys, m, bitmap_span, kmin, kmax):
    """keys (B,) int64, B >= 1, of min ``kmin`` and max ``kmax`` -> (uniq (U,), inverse
    (B,) int64, bounds (m+1,) int64); as ``_nb_sorted_dedup``. A bitmap
    (``_nb_bitmap_unique``) where the sort keys span at most ``bitmap_span``."""
    limit = np.uint64(bitmap_span)
    if m == 1:
        lo = kmin
        span = np.uint64(kmax) - np.uint64(kmin) + np.uint64(1)  # (wraps: any int64 keys)
        per = np.int64(span) if np.uint64(0) < span <= limit else np.int64(0)
    else:
        lo = kmin // m
        per = kmax // m - lo + 1
        span = np.uint64(per) * np.uint64(m) if np.uint64(per) <= limit else limit + np.uint64(1)
    if np.uint64(0) < span <= limit:
        fast = -(1 << 50) < kmin and kmax < (1 << 50)
        return _nb_bitmap_unique(keys, m, lo, per, np.int64(span), fast)
    slot, uniq, rank, bounds = _nb_sorted_dedup(keys, m)
    inverse = np.empty(keys.size, np.int64)
    for i in range(keys.size):
        inverse[i] = rank[slot[i]]
    return uniq, inverse, bounds


def _nb_segment_sum(keys, values):
    """keys (B,) int64, B >= 1; values (B, D) C-contiguous -> (uniq (U,) sorted, sums (U, D)).

    The first row of a key is copied, later ones are added in input order (the order of
    ``np.add.at``), so the result does not depend on the hash layout.
    """
    slot, uniq, rank, _ = _nb_sorted_dedup(keys, 1)
    n, d = values.shape
    sums = np.empty((uniq.size, d), values.dtype)
    fresh = 0  # slots are numbered by first occurrence: slot == fresh <=> first row of its key
    for i in range(n):
        s = slot[i]
        r = rank[s]
        if s == fresh:
            fresh += 1
            for j in range(d):
                sums[r, j] = values[i, j]
        else:
            for j in range(d):
                sums[r, j] += values[i, j]
    return uniq, sums


def _nb_merge_sum(keys, values, starts):
    """keys (n,) int64: parts ``keys[starts[p]:starts[p + 1]]``, each strictly increasing;
    values (n, D) -> (uniq (U,) sorted, sums (U, D)): ``_nb_segment_sum``'s result on them
    (a key's first row copied, the others added in input order, i.e. part order) by one
    merge of the parts instead of a dedup and a sort."""
    P = starts.size - 1
    d = values.shape[1]
    cur = starts[:P].copy()
    uniq = np.empty(keys.size, np.int64)
    sums = np.empty((keys.size, d), values.dtype)
    u = 0
    while True:
        k, found = np.int64(0), False
        for p in range(P):  # the least key at the parts' heads
            if cur[p] < starts[p + 1] and (not found or keys[cur[p]] < k):
                k, found = keys[cur[p]], True
        if not found:
            break
        first = True
        for p in range(P):  # its rows, in part order
            c = cur[p]
            if c < starts[p + 1] and keys[c] == k:
                for j in range(d):
                    sums[u, j] = values[c, j] if first else sums[u, j] + values[c, j]
                first = False
                cur[p] = c + 1
        uniq[u] = k
        u += 1
    return uniq[:u], sums[:u]
