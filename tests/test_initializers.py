"""Deterministic initialisation: the documented formula, reimplemented with Python ints."""

import zlib

import numpy as np
import pytest

from pshybrid.initializers import uniform_rows

MASK = 2**64 - 1


def formula(seed, name, r, c, dim, scale):
    """docs/architecture.md's formula, written independently with Python integers."""
    key = ((seed & 0xFFFFFFFF) << 32 | zlib.crc32(name.encode())) & MASK
    x = (key + (r * dim + c + 1) * 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    x = x ^ (x >> 31)
    u = (x >> 11) * 2.0 ** -53
    return scale * (2 * u - 1)


def test_matches_documented_formula():
    ids = np.array([0, 1, 5, 123456789, 2**35 + 1], dtype=np.int64)
    out = np.empty((len(ids), 3))
    uniform_rows(out, ids, seed=7, name="t_user", scale=0.5)
    for i, r in enumerate(ids.tolist()):
        for c in range(3):
            assert out[i, c] == formula(7, "t_user", r, c, 3, 0.5)


def test_independent_of_which_rows_and_chunking():
    full = np.empty((5000, 4), np.float64)
    uniform_rows(full, np.arange(5000, dtype=np.int64), 3, "t", 0.1)
    sub = np.empty((3, 4), np.float64)
    uniform_rows(sub, np.array([4999, 17, 2500]), 3, "t", 0.1)
    np.testing.assert_array_equal(sub, full[[4999, 17, 2500]])
    assert np.abs(full).max() < 0.1
    assert abs(full.mean()) < 0.003 and abs(full.var() - 0.1**2 / 3) < 2e-4


@pytest.mark.parametrize("other", [dict(seed=4), dict(name="u")])
def test_seed_and_name_change_values(other):
    kw = dict(seed=3, name="t", scale=1.0)
    a = np.empty((10, 2))
    uniform_rows(a, np.arange(10), **kw)
    b = np.empty((10, 2))
    uniform_rows(b, np.arange(10), **dict(kw, **other))
    assert not np.isclose(a, b).any()


def test_float32_is_rounded_float64():
    a = np.empty((50, 3), np.float32)
    b = np.empty((50, 3), np.float64)
    uniform_rows(a, np.arange(50), 1, "t", 0.05)
    uniform_rows(b, np.arange(50), 1, "t", 0.05)
    np.testing.assert_array_equal(a, b.astype(np.float32))


def test_numba_and_numpy_paths_agree(monkeypatch):
    from pshybrid import kernels

    ids = np.array([0, 3, 2**33 + 1, 77], dtype=np.int64)
    a = np.empty((4, 5), np.float32)
    assert kernels.numba_active(), "numba path not active"
    uniform_rows(a, ids, 5, "emb", 0.05)
    monkeypatch.setattr(kernels, "numba_active", lambda: False)
    b = np.empty((4, 5), np.float32)
    uniform_rows(b, ids, 5, "emb", 0.05)
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("start,step,rows", [(0, 1, 70_000), (2, 3, 140_001), (5, 7, 1)])
def test_uniform_range_equals_the_rows_of_its_ids(monkeypatch, start, step, rows):
    """A whole table, or a server's cyclic shard, filled a chunk of ids at a time (here
    chunks of 1000 and the default) equals ``uniform_rows`` of all its ids at once."""
    from pshybrid import initializers

    want = np.empty((rows, 3), np.float32)
    uniform_rows(want, np.arange(start, start + rows * step, step, dtype=np.int64), 9, "s", 0.05)
    for chunk in (1000, initializers._RANGE_ROWS):
        monkeypatch.setattr(initializers, "_RANGE_ROWS", chunk)
        got = np.full((rows, 3), np.nan, np.float32)
        initializers.uniform_range(got, start, step, 9, "s", 0.05)
        np.testing.assert_array_equal(got, want)


def test_a_replicated_table_is_initialised_without_a_table_sized_temporary():
    """allreduce mode's whole table, one float32 column (a DCN with --embedding-dim 1): its
    init made np.arange(rows) int64, twice the table, which the memory check does not count
    (2**31 rows: 8 GiB checked, killed by the OOM killer at 24 GiB). Oracle: the peak of
    the arrays allocated building it is the table and its Adagrad state, within 1 MiB."""
    import tracemalloc
    from types import SimpleNamespace

    from pshybrid.modes.sparse import ReplicatedSparse
    from pshybrid.optim import Optimizer
    from pshybrid.schema import FusedTable, Schema

    layout = FusedTable(Schema(1, (1 << 21, 3)), 1, 0, "float32")
    tracemalloc.start()
    try:
        sparse = ReplicatedSparse(SimpleNamespace(seed=1), layout, Optimizer("adagrad", 0.05))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    table = sparse.table.nbytes + sum(a.nbytes for a in sparse.state_arrays.values())
    assert peak <= table + (1 << 20), (peak, table)
    want = np.empty_like(sparse.table)
    uniform_rows(want, np.arange(layout.table.rows), 1, "sparse", 0.05)
    np.testing.assert_array_equal(sparse.table, want)
