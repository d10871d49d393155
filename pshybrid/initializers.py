"""Deterministic, placement-independent initialisation of embedding rows. Pure NumPy.

Element ``(r, c)`` of table ``name`` with seed ``seed`` is a function of those values
alone, so a table is identical for any number of servers and any partition:

    key   = (seed * 2**32 + crc32(name)) mod 2**64
    x     = key + (r * dim + c + 1) * 0x9E3779B97F4A7C15           (mod 2**64)
    z     = splitmix64_finalizer(x)
          = ((x ^ x>>30) * 0xBF58476D1CE4E5B9, then ^ >>27, * 0x94D049BB133111EB, ^ >>31)
    u     = (z >> 11) * 2**-53                                      in [0, 1)
    value = scale * (2u - 1)                                        in [-scale, scale)

(``>>`` is a logical shift of the uint64; all arithmetic wraps mod 2**64.)
Written in chunks into the destination, so memory stays bounded for any table size.
"""

from __future__ import annotations

import zlib

import numpy as np

from . import kernels

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_CHUNK = 1 << 20  # elements per chunk
_RANGE_ROWS = 1 << 16  # uniform_range: ids made per chunk (512 KiB of int64)


def table_key(seed: int, name: str) -> np.uint64:
    return np.uint64(((seed & 0xFFFFFFFF) << 32 | zlib.crc32(name.encode())) & (2**64 - 1))


def uniform_rows(out: np.ndarray, global_ids: np.ndarray, seed: int, name: str,
                 scale: float) -> None:
    """Fill ``out`` (n, dim) with the rows ``global_ids`` (n,) of table ``name``.

    A numba kernel when numba is available (one pass per element, without NumPy's
    temporary arrays), else chunked NumPy; both compute the formula above exactly."""
    n, dim = out.shape
    assert global_ids.shape == (n,), (global_ids.shape, out.shape)
    key = table_key(seed, name)
    if out.flags.c_contiguous and kernels.numba_active():
        kernels._nb_uniform_rows(out, np.ascontiguousarray(global_ids, dtype=np.int64), key,
                                 float(scale))
        return
    rows_per_chunk = max(1, _CHUNK // max(dim, 1))
    cols = np.arange(dim, dtype=np.uint64) + np.uint64(1)
    with np.errstate(over="ignore"):
        for a in range(0, n, rows_per_chunk):
            b = min(n, a + rows_per_chunk)
            x = global_ids[a:b].astype(np.uint64)[:, None] * np.uint64(dim) + cols
            x *= _GOLDEN
            x += key
            x ^= x >> np.uint64(30)
            x *= _M1
            x ^= x >> np.uint64(27)
            x *= _M2
            x ^= x >> np.uint64(31)
            x >>= np.uint64(11)
            u = x.astype(np.float64)
            u *= 2.0 ** -52  # = 2u in [0, 2)
            u -= 1.0
            u *= scale
            out[a:b] = u


def uniform_range(out: np.ndarray, start: int, step: int, seed: int, name: str,
                  scale: float) -> None:
    """``uniform_rows`` of the rows ``start, start + step, ...`` (``out``'s rows: a whole
    table, or a server's cyclic shard), making their ids a chunk at a time: an id array of
    the whole table (8 bytes a row) was a temporary as large as a narrow table itself, which
    the memory check does not count."""
    for a in range(0, out.shape[0], _RANGE_ROWS):
        b = min(out.shape[0], a + _RANGE_ROWS)
        ids = np.arange(start + a * step, start + b * step, step, dtype=np.int64)
        uniform_rows(out[a:b], ids, seed, name, scale)
