"""The threaded optimizer apply (``pool``): chunks of distinct rows on several threads give
the serial kernel's bits exactly (oracle: the same call with one thread)."""

import threading

import numpy as np
import pytest

from pshybrid import kernels, pool
from pshybrid.optim import Optimizer

OPTS = {"sgd+l2": Optimizer("sgd", lr=0.1, l2=0.01),
        "adagrad": Optimizer("adagrad", lr=0.1),
        "adagrad+l2": Optimizer("adagrad", lr=0.1, l2=0.01),
        "adam": Optimizer("adam", lr=0.01),
        "adam+l2": Optimizer("adam", lr=0.01, l2=0.01)}
N, D = 64, 5  # shard rows, row width


@pytest.mark.parametrize("n,threads,lo,want", [
    (0, 2, 4, [(0, 0)]),
    (7, 2, 4, [(0, 7)]),                   # below 2 x the minimum: one chunk
    (8, 2, 4, [(0, 4), (4, 8)]),
    (9, 2, 4, [(0, 4), (4, 9)]),
    (11, 3, 4, [(0, 5), (5, 11)]),         # 3 threads asked, room for 2
    (12, 3, 4, [(0, 4), (4, 8), (8, 12)]),
    (13, 3, 4, [(0, 4), (4, 8), (8, 13)]),
    (100, 1, 4, [(0, 100)]),
    (5, 4, 1, [(0, 1), (1, 2), (2, 3), (3, 5)]),  # lengths differ by at most one
])
def test_spans(n, threads, lo, want):
    assert pool.spans(n, threads, lo) == want


@pytest.mark.parametrize("n", [0, 1, 5, 17, 1000])
@pytest.mark.parametrize("threads", [1, 2, 3, 7])
def test_spans_cover_in_order(n, threads):
    s = pool.spans(n, threads, 3)
    assert s[0][0] == 0 and s[-1][1] == n and len(s) <= max(1, threads)
    assert all(a < b for a, b in s) or n == 0
    assert all(s[i][1] == s[i + 1][0] for i in range(len(s) - 1))
    assert max(b - a for a, b in s) - min(b - a for a, b in s) <= 1


def _shard(dtype, opt, seed):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((N, D)).astype(dtype)
    w[::7] *= 1e-21  # below sqrt(tiny) after a step: the flush-to-zero branch (l2)
    state = {k: np.abs(rng.standard_normal((N, D))).astype(dtype) for k in opt.slots}
    return w, state


def _steps(opt, dtype, rows_per_step, threads, consume):
    """Three steps of ``opt`` on a shard, each on distinct random rows; returns the arrays."""
    w, state = _shard(dtype, opt, 0)
    rng = np.random.default_rng(1)
    for step in (1, 2, 3):
        rows = np.sort(rng.choice(N, rows_per_step, replace=False)).astype(np.int64)
        rng.shuffle(rows)  # any order: distinct is what the threads need
        g = rng.standard_normal((rows.size, D)).astype(dtype)
        if consume:
            slot = np.zeros((N, D), dtype)
            slot[rows] = g
            opt.apply_slot(w, slot, state, step, rows, threads=threads)
            assert not slot.any()
        else:
            opt.update_rows(w, rows, g, state, step, threads=threads)
    return w, state


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of a few rows (values), so tests of a few dozen rows cross the boundaries."""
    monkeypatch.setattr(pool, "MIN_ROWS_PER_THREAD", 4)
    monkeypatch.setattr(pool, "MIN_VALUES_PER_THREAD", 8)


@pytest.mark.parametrize("name", list(OPTS))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rows", [1, 3, 7, 8, 9, 11, 12, 13, 50])
@pytest.mark.parametrize("consume", [False, True])
def test_threaded_rows_equal_serial_bit_for_bit(name, dtype, rows, consume, small_chunks):
    assert kernels.numba_active()
    opt = OPTS[name]
    w1, s1 = _steps(opt, dtype, rows, 1, consume)
    for threads in (2, 3):
        w, s = _steps(opt, dtype, rows, threads, consume)
        assert w.tobytes() == w1.tobytes(), (name, threads)
        for k in opt.slots:
            assert s[k].tobytes() == s1[k].tobytes(), (name, threads, k)


@pytest.mark.parametrize("name", list(OPTS))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("size", [7, 16, 17, 25, 100])
def test_threaded_whole_buffer_equals_serial_bit_for_bit(name, dtype, size, small_chunks):
    """``apply_slot`` without rows (ps mode's dense table on a server)."""
    opt = OPTS[name]
    out = {}
    for threads in (1, 2, 3):
        rng = np.random.default_rng(2)
        w = rng.standard_normal(size).astype(dtype)
        w[::5] *= 1e-21
        state = {k: np.abs(rng.standard_normal(size)).astype(dtype) for k in opt.slots}
        for step in (1, 2):
            g = rng.standard_normal(size).astype(dtype)
            opt.apply_slot(w, g, state, step, threads=threads)
            assert not g.any()
        out[threads] = [w.tobytes()] + [state[k].tobytes() for k in opt.slots]
    assert out[2] == out[1] and out[3] == out[1]


def test_chunks_run_on_several_threads(small_chunks, monkeypatch):
    """The oracle above would pass with one thread too: here the chunks are seen on
    more than one thread, and every row once."""
    seen, real = [], pool.run

    def spy(fn, chunks):
        def wrapped(a, b):
            seen.append((threading.get_ident(), a, b))
            fn(a, b)
        real(wrapped, chunks)

    monkeypatch.setattr(pool, "run", spy)
    _steps(OPTS["adam"], np.float32, 30, 3, consume=False)
    # the caller takes the first chunk, the pool's threads the others (a pool thread that
    # is done may take the next one)
    assert {t for t, a, _ in seen if a == 0} == {threading.get_ident()}
    assert len({t for t, _, _ in seen}) >= 2
    assert sorted((a, b) for _, a, b in seen) == sorted([(0, 10), (10, 20), (20, 30)] * 3)


def test_error_in_a_pool_thread_is_raised():
    def fn(a, b):
        if a:
            raise ValueError(f"chunk {a}")

    with pytest.raises(ValueError, match="chunk 5"):
        pool.run(fn, [(0, 5), (5, 10)])


def _parts(rng, n_parts, rows, dtype, increasing=True):
    """Workers' parts on a shard of N rows: each its own distinct rows (sorted unless not
    ``increasing``), overlapping the others'."""
    out = []
    for _ in range(n_parts):
        r = np.sort(rng.choice(N, rows, replace=False)).astype(np.int64)
        if not increasing:
            rng.shuffle(r)
        out.append((r, rng.standard_normal((rows, D)).astype(dtype)))
    return out


@pytest.mark.parametrize("name", ["sgd+l2", "adagrad", "adam+l2"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n_parts", [1, 2, 3])
@pytest.mark.parametrize("rows", [1, 3, 4, 9, 40])
@pytest.mark.parametrize("increasing", [True, False])
def test_server_apply_of_parts_equals_serial(name, dtype, n_parts, rows, increasing,
                                             small_chunks):
    """``ServerSparse``'s apply of the workers' parts (one part: no segment sum; several:
    each thread sums and updates its own range of rows) == one thread (one segment sum of
    the concatenated parts, then the update), bit for bit; and one thread == the segment
    sum and ``update_rows`` written out."""
    from pshybrid.kernels import segment_sum
    from pshybrid.modes.sparse import apply_parts

    opt = OPTS[name]
    out = {}
    for threads in ("oracle", 1, 2, 3):
        w, state = _shard(dtype, opt, 0)
        rng = np.random.default_rng(4)
        for step in (1, 2, 3):
            parts = _parts(rng, n_parts, rows, dtype, increasing)
            if threads == "oracle":
                u, g = segment_sum(np.concatenate([r for r, _ in parts]),
                                   np.concatenate([s for _, s in parts]))
                opt.update_rows(w, u, g, state, step)
            else:
                apply_parts(opt, w, state, parts, step, threads)
        out[threads] = [w.tobytes()] + [state[k].tobytes() for k in opt.slots]
    assert out[1] == out["oracle"] and out[2] == out[1] and out[3] == out[1]
