"""Embedding kernels: gather rows by index, deduplicate ids, scatter-add rows with duplicate ids.

Each kernel has an ``xp`` reference twin that is its test oracle:
``gather_ref`` / ``scatter_add_ref`` (the plainest NumPy/CuPy code, also the oracles of the
CUDA kernels in ``kernels/*.cu`` that ``gather`` / ``scatter_add`` run on CuPy arrays through
``pshybrid.cuda``), and the NumPy sort-based ``segment_sum_numpy`` / ``unique_inverse_numpy``
(``dedup``), which are also the fallback on GPU arrays and where numba is missing.

CPU fast path: numba kernels (``@njit(cache=True, nogil=True)``, serial: MPI ranks already
fill the cores). numba is imported and the kernels are compiled lazily, on the first call
that needs them, so importing ``pshybrid`` does not pay for numba. Dedup (``dedup``: the
distinct ids, ``unique_inverse``, and ``segment_sum``'s) is a bitmap or a hash map plus a
radix sort; rows are summed into their slot **in input order**, so results equal
``np.add.at`` bit for bit (float32 and float64), whatever the hash layout. ``gather`` and
the row optimizers (``optim``) prefetch each row a few rows before they touch it
(``prefetch``): their rows are scattered over large tables, and the misses then overlap.
"""

from __future__ import annotations

import glob
import os
import stat
import sys
import tempfile
import threading

import numpy as np

from . import dedup, prefetch
from .backend import array_module
from .dedup import unique_inverse_numpy  # noqa: F401 (the twin, beside its kernel)

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
_FAR_TABLE = 1 << 22  # gather: tables of at least this many bytes miss the caches
_MERGE_PARTS = 6      # merge_sum: more parts than this, and the dedup + sort is as fast


# -- references (oracles) ------------------------------------------------------------------
def gather_ref(rows, index):
    """rows: (N, D); index: any-shape int64 in [0, N) -> index.shape + (D,)."""
    return rows[index]


def scatter_add_ref(index, values, n: int):
    """index: (B,) int64 in [0, n); values: (B, D) -> (n, D), out[i] = sum of values[index == i]
    (``np.add.at``: strictly in input order)."""
    xp = array_module(values)
    out = xp.zeros((n,) + values.shape[1:], dtype=values.dtype)
    xp.add.at(out, index, values)
    return out


def segment_sum_numpy(keys, values):
    """``xp`` twin of ``segment_sum``: stable argsort, then ``add.reduceat`` over the runs.

    Same keys and, for exactly representable sums (integer-valued rows), the same sums.
    Float rounding differs on runs of 3+ rows: ``reduceat`` adds ``first + (pairwise sum of
    the rest)``, not strictly in input order (``np.add.at`` and ``segment_sum`` do).
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


# -- public kernels ------------------------------------------------------------------------
def gather(rows, index, out=None):
    """rows: (N, D); index: any shape int64 -> index.shape + (D,). Same result as ``gather_ref``.
    ``out`` (NumPy, a (index.size, D) array of ``rows``' dtype, any strides): written in
    place and returned (a GPU worker's pull straight into its pinned buffer).

    CPU: from a float32/float64 table of ``_FAR_TABLE`` bytes or more, the numba kernel,
    which prefetches the rows it will copy a few rows ahead (index checked: ``IndexError``
    out of range, as ``np.take``); else ``np.take`` (near memcpy speed from cached rows).
    The ``kernels/embedding.cu`` kernel (``pshybrid.cuda``) for
    float32/float64 CuPy arrays.
    """
    xp = array_module(rows)
    if xp is np:
        if not (rows.ndim == 2 and rows.nbytes >= _FAR_TABLE and rows.dtype in _FLOATS
                and rows.flags.c_contiguous and np.asarray(index).size and numba_active()):
            got = np.take(rows, index, axis=0)
            if out is None:
                return got
            out[...] = got.reshape(out.shape)
            return out
        flat, n = np.ascontiguousarray(index, dtype=np.int64).ravel(), rows.shape[0]
        lo, hi = min_max(flat)
        if lo < -n or hi >= n:
            raise IndexError(f"gather: index in [{lo}, {hi}] for {n} rows")
        if lo < 0:  # negative ids count from the end, as in np.take
            flat = np.where(flat < 0, flat + n, flat)
        if out is None:
            out = np.empty(np.shape(index) + rows.shape[1:], rows.dtype)
        else:
            assert out.shape == (flat.size, rows.shape[1]) and out.dtype == rows.dtype
        _nb_gather(rows, flat, out.reshape(flat.size, rows.shape[1]))  # (a view either way)
        return out
    if rows.dtype in _FLOATS:
        from . import cuda

        return cuda.gather(rows, index)
    return rows[index]


def scatter_add(index, values, n: int):
    """index: (B,) int64 in [0, n); values: (B, D) -> (n, D) sums of rows per index.
    CPU: ``segment_sum`` (input order, equal to ``scatter_add_ref``); float32/float64 CuPy
    arrays: the atomic ``kernels/embedding.cu`` kernel (``pshybrid.cuda``; order not fixed)."""
    xp = array_module(values)
    if xp is not np and values.dtype in _FLOATS:
        from . import cuda

        return cuda.scatter_add(index, values, n)
    out = xp.zeros((n,) + values.shape[1:], dtype=values.dtype)
    if index.size == 0:
        return out
    if xp is np and values.dtype in _FLOATS and numba_active():
        index = np.ascontiguousarray(index, dtype=np.int64).ravel()
        lo, hi = min_max(index)
        if values.shape[0] != index.size or lo < 0 or hi >= n:
            raise IndexError(f"scatter_add: index of {index.size} in [{lo}, {hi}] for "
                             f"{values.shape[0]} rows into {n}")
        width = out[:1].size
        _nb_scatter_add(index, np.ascontiguousarray(values).reshape(index.size, width),
                        out.reshape(n, width))  # input order, as segment_sum: same bits
        return out
    uniq, sums = segment_sum(index, values)
    out[uniq] = sums
    return out


def segment_sum(keys, values):
    """Sum the rows of ``values`` that share a key.

    keys: (B,) int64; values: (B, D). Returns ``(uniq, sums)``: uniq (U,) sorted int64,
    sums (U, D) with sums[u] = sum of values[keys == uniq[u]]. The numba path adds strictly
    in input order: deterministic and bit for bit equal to ``scatter_add_ref`` (``np.add.at``)
    in float32 and float64. The NumPy fallback rounds long runs differently (see its twin).
    """
    if (array_module(keys, values) is np and values.dtype in _FLOATS
            and keys.size <= dedup.MAX_KEYS and numba_active()):
        keys = np.ascontiguousarray(keys, dtype=np.int64).ravel()
        assert values.shape[0] == keys.shape[0], (values.shape, keys.shape)
        if keys.size == 0:
            return keys, values[:0]
        width = int(np.prod(values.shape[1:], dtype=np.int64))
        uniq, sums = dedup._nb_segment_sum(keys,
                                           np.ascontiguousarray(values).reshape(keys.size, width))
        return uniq, sums.reshape((uniq.size,) + values.shape[1:])
    return segment_sum_numpy(keys, values)


def merge_sum(parts):
    """``segment_sum`` of the concatenated ``parts`` = [(keys (n,) int64, values (n, D))]
    whose keys are strictly increasing within each part (the same result, the same bits):
    one merge of up to ``_MERGE_PARTS`` parts (numba; it scans every part's head per key),
    else ``segment_sum`` itself."""
    keys = np.concatenate([k for k, _ in parts])
    values = np.concatenate([v for _, v in parts])
    if not (len(parts) <= _MERGE_PARTS and values.dtype in _FLOATS and values.ndim == 2
            and keys.size and numba_active()):
        return segment_sum(keys, values)
    starts = np.cumsum([0] + [k.size for k, _ in parts]).astype(np.int64)
    return dedup._nb_merge_sum(keys.astype(np.int64, copy=False), values, starts)


def min_max(keys) -> tuple[int, int]:
    """(min, max) of a non-empty int64 array: one numba call (two vectorised loops), else
    NumPy's two reductions."""
    if array_module(keys) is np and numba_active():
        lo, hi = dedup._nb_min_max(np.ascontiguousarray(keys, dtype=np.int64).ravel())
        return int(lo), int(hi)
    return int(keys.min()), int(keys.max())


def unique_inverse(keys, m: int = 1, extent: tuple[int, int] | None = None):
    """Distinct keys, the inverse index, and the groups of equal ``key % m``.

    keys: any-shape int64; m >= 1. Returns ``(uniq, inverse, bounds)``: uniq (U,) int64
    distinct keys sorted by key, or with ``m > 1`` by ``(key % m, key // m)`` (the owner-major
    order of a cyclic partition over m servers); inverse (keys.size,) int64 with
    ``uniq[inverse] == keys.ravel()``; bounds (m+1,) int64 so that the keys with
    ``key % m == r`` are ``uniq[bounds[r]:bounds[r+1]]``. Same result as ``unique_inverse_numpy``.
    With m > 1 the keys' span must leave room for the sort key: max - min + m < 2**63.
    ``extent``: the keys' (min, max) where the caller has them (``min_max``): one pass less.
    """
    assert m >= 1, m
    if array_module(keys) is np and keys.size <= dedup.MAX_KEYS and numba_active():
        keys = np.ascontiguousarray(keys, dtype=np.int64).ravel()
        if keys.size == 0:
            return keys, np.empty(0, np.int64), np.zeros(m + 1, np.int64)
        lo, hi = dedup._nb_min_max(keys) if extent is None else extent
        return dedup._nb_unique_inverse(keys, int(m), dedup._BITMAP_SPAN * keys.size, lo, hi)
    return dedup.unique_inverse_numpy(keys, m)


# -- numba plumbing: import + jit on first use, NumPy twins when numba is unavailable --------
_NUMBA: bool | None = None  # None: not tried yet
_NUMBA_LOCK = threading.Lock()
_JITTED = ("_ftz", "_nb_gather", "_nb_uniform_rows", "_nb_sgd_rows", "_nb_adagrad_rows",
           "_nb_adam_rows", "_nb_scatter_add")


def numba_cache_cold() -> bool:
    """True when this process will compile the CPU kernels: numba serves them and none of
    this package's compiled kernels is cached yet where numba keeps them (its locator's
    directory: the package's ``__pycache__``, or ``NUMBA_CACHE_DIR``'s): a first run in
    this environment, a few seconds longer. False where numba is missing, or compiles
    nothing (``NUMBA_DISABLE_JIT=1``: its kernels are the plain functions)."""
    py_func = getattr(_nb_gather, "py_func", None)
    if not numba_active() or py_func is None:
        return False
    from numba.core import caching

    cache = caching.FunctionCache(py_func)._cache_path
    return not glob.glob(os.path.join(cache, "kernels.*.nbi"))


def _cache_somewhere(numba) -> bool:
    """Whether numba can cache this package's kernels: where it has nowhere to write (a
    read-only install and a read-only HOME: a container; ``njit(cache=True)`` then raised
    "no locator available"), ``NUMBA_CACHE_DIR`` is pointed at a directory of this user's
    in the temporary directory; False (with a warning) if even that cannot be made."""
    from numba.core import caching

    try:
        caching.FunctionCache(_nb_gather)  # finds a locator as njit(cache=True) does
        return True
    except RuntimeError:
        path = os.path.join(tempfile.gettempdir(), f"pshybrid-numba-{os.getuid()}")
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.lstat(path)  # numba's index files are pickles: a directory another user
        if (not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid()  # made or can write
                or st.st_mode & 0o022):                                 # could plant code
            raise PermissionError(f"{path} is not a directory of this user's that only it "
                                  "can write")
        if not os.access(path, os.W_OK | os.X_OK):
            raise PermissionError(path)
    except OSError as e:
        sys.stderr.write(f"pshybrid: warning: numba has nowhere to cache its kernels (the "
                         f"package's directory and HOME are read-only; {path}: {e}): the "
                         "CPU kernels run as NumPy, slower; set NUMBA_CACHE_DIR to a "
                         "writable directory of your own\n")
        return False
    numba.config.CACHE_DIR = os.environ["NUMBA_CACHE_DIR"] = path
    return True


def numba_active() -> bool:
    """True when the numba kernels serve the CPU paths (imports numba on the first call).

    The module-level ``_nb_*`` functions (here and in ``dedup``) are plain Python until
    then; here they are replaced in place by their ``njit`` dispatchers (compiled per
    signature on first call, cached on disk), so the kernels that call each other see
    dispatchers and stay cacheable.
    """
    global _NUMBA
    if _NUMBA is None:
        with _NUMBA_LOCK:
            if _NUMBA is None:
                try:
                    import numba
                except Exception:  # not installed, or does not support this NumPy/Python
                    _NUMBA = False
                else:
                    if not _cache_somewhere(numba):
                        _NUMBA = False
                        return _NUMBA
                    # error_model="numpy": no per-division zero check (it kept the
                    # optimizer loops from vectorising); no kernel divides by zero.
                    jit = numba.njit(cache=True, nogil=True, error_model="numpy")
                    g = globals()
                    g["_prefetch_row"] = prefetch.hint(numba)  # before the kernels compile
                    for name in _JITTED:
                        g[name] = jit(g[name])
                    for name in dedup._JITTED:  # (the dedup kernels: one switch for both)
                        setattr(dedup, name, jit(getattr(dedup, name)))
                    _NUMBA = True
    return _NUMBA


# -- numba kernels (plain Python until ``numba_active()`` jits them) -----------------------
_AHEAD = prefetch.AHEAD
_prefetch_row = None  # the cache hint ``prefetch.build`` makes (numba_active sets it)


def _nb_gather(rows, index, out):
    """out[i] = rows[index[i]], each row prefetched ``_AHEAD`` rows early (misses overlap)."""
    n = index.size
    for i in range(n):
        if i + _AHEAD < n:
            _prefetch_row(rows, index[i + _AHEAD])
        r = index[i]
        for j in range(rows.shape[1]):
            out[i, j] = rows[r, j]


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # splitmix64's increment (initializers.py)
_INIT_M1 = np.uint64(0xBF58476D1CE4E5B9)
_INIT_M2 = np.uint64(0x94D049BB133111EB)  # splitmix64 constants (initializers.py)


def _nb_uniform_rows(out, ids, key, scale):
    """``initializers.uniform_rows``'s formula, one element at a time: out (n, dim) from
    global ids (n,), table key (uint64) and scale."""
    n, dim = out.shape
    for i in range(n):
        base = np.uint64(ids[i]) * np.uint64(dim)
        for c in range(dim):
            x = (base + np.uint64(c + 1)) * _GOLDEN + key
            x ^= x >> np.uint64(30)
            x *= _INIT_M1
            x ^= x >> np.uint64(27)
            x *= _INIT_M2
            x ^= x >> np.uint64(31)
            out[i, c] = scale * (float(x >> np.uint64(11)) * 2.0 ** -52 - 1.0)


# Fused lazy optimizer steps on rows (optim.Optimizer.update_rows): the same operations in
# the same order as the vectorised formulas, with the scalars already in the arrays' dtype,
# one pass over the touched rows instead of a gather, ~6 temporaries and a scatter.
def _nb_scatter_add(index, values, out):
    """out[index[i]] += values[i] for i in input order (out zeroed by the caller)."""
    for i in range(index.size):
        r = index[i]
        for j in range(values.shape[1]):
            out[r, j] += values[i, j]


# Row optimizers: w[rows[i]] (and its state rows) from gradient row g[k], k = i, or
# k = rows[i] when ``consume`` (g is a gradient-sum slot shaped like w: the row is read,
# then zeroed, in the same pass). Same operations in the same order as ``Optimizer``.
def _ftz(x, tiny):
    # a value below ``tiny`` becomes 0 (optim: flush to zero; ``Optimizer.flush_bound``):
    # Adam's moments always, every weight and state value with l2 != 0
    return x if abs(x) >= tiny else x * 0


def _nb_sgd_rows(w, rows, g, consume, lr, l2, tiny):
    # l2 != 0: the gradient is g + l2 * w (w before the step), as in optim's NumPy form
    n = rows.size
    for i in range(n):
        if i + _AHEAD < n:  # the row _AHEAD on: its misses overlap this row's work
            _prefetch_row(w, rows[i + _AHEAD])
            if consume:
                _prefetch_row(g, rows[i + _AHEAD])
        r = rows[i]
        k = r if consume else i
        for j in range(w.shape[1]):
            x = g[k, j] + l2 * w[r, j] if l2 != 0 else g[k, j]
            w[r, j] = _ftz(w[r, j] - lr * x, tiny) if l2 != 0 else w[r, j] - lr * x
        if consume:
            g[k, :] = 0


def _nb_adagrad_rows(w, acc, rows, g, consume, lr, eps, l2, tiny):
    n = rows.size
    for i in range(n):
        if i + _AHEAD < n:  # the row _AHEAD on: its misses overlap this row's work
            _prefetch_row(w, rows[i + _AHEAD])
            _prefetch_row(acc, rows[i + _AHEAD])
            if consume:
                _prefetch_row(g, rows[i + _AHEAD])
        r = rows[i]
        k = r if consume else i
        for j in range(w.shape[1]):
            x = g[k, j] + l2 * w[r, j] if l2 != 0 else g[k, j]
            a = acc[r, j] + x * x
            nw = w[r, j] - lr * x / (np.sqrt(a) + eps)
            if l2 != 0:
                a, nw = _ftz(a, tiny), _ftz(nw, tiny)
            acc[r, j] = a
            w[r, j] = nw
        if consume:
            g[k, :] = 0


def _nb_adam_rows(w, m, v, rows, g, consume, b1, one_b1, b2, one_b2, inv_sqrt_c2, eps, lr_c1,
                  l2, tiny):
    n = rows.size
    for i in range(n):
        if i + _AHEAD < n:  # the row _AHEAD on: its misses overlap this row's work
            _prefetch_row(w, rows[i + _AHEAD])
            _prefetch_row(m, rows[i + _AHEAD])
            _prefetch_row(v, rows[i + _AHEAD])
            if consume:
                _prefetch_row(g, rows[i + _AHEAD])
        r = rows[i]
        k = r if consume else i
        for j in range(w.shape[1]):
            x = g[k, j] + l2 * w[r, j] if l2 != 0 else g[k, j]
            mm = m[r, j] * b1 + one_b1 * x
            vv = v[r, j] * b2 + x * x * one_b2
            nw = w[r, j] - mm / (np.sqrt(vv) * inv_sqrt_c2 + eps) * lr_c1
            if l2 != 0:
                nw = _ftz(nw, tiny)
            m[r, j] = _ftz(mm, tiny)  # (always: they decay where the gradient is 0)
            v[r, j] = _ftz(vv, tiny)
            w[r, j] = nw
        if consume:
            g[k, :] = 0

