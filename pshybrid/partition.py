"""Row-wise partition of embedding tables over servers. Pure functions, no MPI.

Scheme: **cyclic** (round-robin) rows. Global row ``r`` of a table lives on server
``owner(r) = r % S`` at local row ``local(r) = r // S``; back: ``r = local * S + owner``.
Server ``s`` holds ``ceil((rows - s) / S)`` rows (0 when ``s >= rows``), so shard sizes
differ by at most one row for any ``rows`` and ``S``, including ``S > rows``.

Why cyclic rather than contiguous blocks: CTR vocabularies are usually built by
frequency, so the hottest (Zipf-head) ids are the smallest. Contiguous blocks would put
all of them on server 0 and make it the bottleneck of every step; cyclic placement
spreads the head evenly. Hashed ids (the hashing trick) are uniform either way.
"""

from __future__ import annotations

import numpy as np

from .kernels import unique_inverse  # numba kernel with a NumPy twin; pure, no MPI


def _check(rows: int, n_servers: int) -> None:
    if n_servers < 1:
        raise ValueError(f"partition needs at least one server, got {n_servers}")
    if rows < 0:
        raise ValueError(f"table rows must be >= 0, got {rows}")


def owner(ids, n_servers: int):
    """Server index of each global row id: ``ids % S``. ``ids``: int or int64 array."""
    return ids % n_servers


def local_row(ids, n_servers: int):
    """Row index inside its owner's shard: ``ids // S``."""
    return ids // n_servers


def global_row(local, server: int, n_servers: int):
    """Inverse of (owner, local_row): ``local * S + server``."""
    return local * n_servers + server


def shard_rows(rows: int, n_servers: int, server: int) -> int:
    """Number of rows of a ``rows``-row table held by ``server``."""
    _check(rows, n_servers)
    if not 0 <= server < n_servers:
        raise ValueError(f"server {server} out of range for {n_servers} servers")
    return max(0, (rows - server + n_servers - 1) // n_servers)


def shard_ids(rows: int, n_servers: int, server: int) -> np.ndarray:
    """Global row ids held by ``server``, in local-row order: (shard_rows,) int64."""
    return np.arange(server, rows, n_servers, dtype=np.int64)


def shard_range(rows: int, n_servers: int, server: int) -> range:
    """``shard_ids`` as a range: no array of the shard's size (a checkpoint writes a
    shard's ids a chunk at a time)."""
    _check(rows, n_servers)
    return range(server, rows, n_servers)


def _per_server(rows: int, n_servers: int) -> int:
    return max(1, -(-rows // n_servers))


def sort_key(ids, rows: int, n_servers: int):
    """Key ordering ids by (owner, local row): ``owner * ceil(rows/S) + local``. A bijection."""
    _check(rows, n_servers)
    if n_servers == 1:
        return ids
    local, own = np.divmod(ids, n_servers)  # one division for both
    return own * _per_server(rows, n_servers) + local


def key_to_global(keys, rows: int, n_servers: int):
    """Inverse of ``sort_key``: global row ids, int64."""
    if n_servers == 1:
        return keys.astype(np.int64, copy=False)
    own, local = np.divmod(keys, _per_server(rows, n_servers))
    return global_row(local, own, n_servers).astype(np.int64, copy=False)


def key_bounds(sorted_keys, rows: int, n_servers: int) -> np.ndarray:
    """(S+1,) offsets: owner s's entries of ``sorted_keys`` are ``[bounds[s], bounds[s+1])``."""
    per = _per_server(rows, n_servers)
    return np.searchsorted(sorted_keys, np.arange(n_servers + 1, dtype=np.int64) * per)


def group_by_owner(ids: np.ndarray, rows: int, n_servers: int,
                   extent: tuple[int, int] | None = None):
    """Deduplicate ids and group them by owner in one sort.

    ids: any-shape int64 array of global rows in ``[0, rows)``; ``extent``: their (min,
    max) where the caller has them (``kernels.min_max``).
    Returns ``(unique, inverse, bounds)``: ``unique`` (U,) int64 global ids sorted by
    (owner, local row); ``inverse`` with ``ids.shape`` so ``unique[inverse] == ids``;
    ``bounds`` (S+1,) int64 so that owner s's ids are ``unique[bounds[s]:bounds[s+1]]``.
    """

    _check(rows, n_servers)
    # One hash dedup + radix sort of the distinct ids in (owner, local row) order (numba;
    # NumPy argsort twin without it): kernels.unique_inverse with m = S is that order,
    # and its bounds are the owners' groups.
    unique, inverse, bounds = unique_inverse(ids, n_servers, extent)
    return unique, inverse.reshape(np.shape(ids)), bounds


def group_by_owner_ref(ids: np.ndarray, rows: int, n_servers: int):
    """NumPy reference twin of ``group_by_owner`` (its oracle, and the pre-numba path):
    one argsort of ``sort_key``, then a cumulative sum of run starts."""
    keys = sort_key(ids, rows, n_servers).ravel()
    order = np.argsort(keys)
    skeys = keys[order]
    first = np.empty(skeys.shape, bool)
    first[:1] = True
    np.not_equal(skeys[1:], skeys[:-1], out=first[1:])
    ukey = skeys[first]
    inverse = np.empty(keys.shape, np.int64)
    inverse[order] = np.cumsum(first) - 1
    return (key_to_global(ukey, rows, n_servers), inverse.reshape(ids.shape),
            key_bounds(ukey, rows, n_servers))
