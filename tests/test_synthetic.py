"""The synthetic stream (``pshybrid.synthetic``): rows are a pure function of (seed, row), the
numba generator equals its NumPy twin bit for bit, and the laws are the stated ones (Zipf
ids, log1p-exponential dense columns by the documented formula, labels from the planted model)."""

import numpy as np
import pytest

from pshybrid import datakernels
from pshybrid.metrics import auc
from pshybrid.synthetic import (HEAD, SyntheticCTR, alias_counts, alias_pmf, alias_table,
                                zipf_alias)

# Every kind of field: one alias table (7, 30), head + tail tables (5000 > HEAD), and the
# continuous power law (> 2**20 ids).
GEN = SyntheticCTR(seed=5, n_dense=3, cardinalities=(7, 30, 5000, 3 << 20), zipf=1.3)
GEN_ONE = SyntheticCTR(seed=2, n_dense=2, cardinalities=(3 << 20, 4097), zipf=1.0)


def zipf_law(C, a):
    w = np.arange(1, C + 1, dtype=np.float64) ** -a
    return w / w.sum()


def twin(monkeypatch):
    monkeypatch.setattr(datakernels, "_active", lambda: False)


@pytest.mark.parametrize("gen", [GEN, GEN_ONE])
def test_rows_are_a_function_of_the_row_index(gen):
    a, b = 1000, 2300
    whole = gen.rows(a, b) + (gen.planted_probability(a, b),)
    cuts = [a, a + 1, a + 2, 1024, 1537, b]
    parts = [gen.rows(x, y) + (gen.planted_probability(x, y),) for x, y in zip(cuts, cuts[1:])]
    for w, p in zip(whole, zip(*parts)):
        np.testing.assert_array_equal(w, np.concatenate(p))
    one = gen.rows(1536, 1537)
    for w, o in zip(whole, one):
        np.testing.assert_array_equal(w[536:537], o)
    again = SyntheticCTR(seed=gen.seed, n_dense=gen.n_dense, cardinalities=gen.cardinalities,
                         zipf=gen.zipf).rows(a, b)  # a fresh generator: the same rows
    for w, g in zip(whole, again):
        np.testing.assert_array_equal(w, g)
    other = SyntheticCTR(seed=gen.seed + 1, n_dense=gen.n_dense,
                         cardinalities=gen.cardinalities, zipf=gen.zipf).rows(a, b)
    assert not np.array_equal(whole[2], other[2])  # the seed matters


def test_types_and_ranges():
    label, dense, sparse = GEN.rows(0, 4000)
    assert label.dtype == np.float32 and label.shape == (4000,)
    assert set(np.unique(label)) == {0.0, 1.0}
    assert dense.dtype == np.float32 and dense.shape == (4000, 3) and (dense >= 0).all()
    assert sparse.dtype == np.int64 and sparse.shape == (4000, 4)
    assert (sparse >= 0).all() and (sparse < np.array(GEN.cardinalities)).all()
    assert sparse[:, 3].max() > 1 << 20 - 4  # the big field reaches its tail
    assert (sparse[:, 2] >= HEAD).any() and (sparse[:, 2] < HEAD).any()
    for x in GEN.rows(7, 7):
        assert len(x) == 0


@pytest.mark.parametrize("gen", [GEN, GEN_ONE])
@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("n", [1, 128, 129, 3000])  # the kernel's blocks: 128 rows
def test_numba_equals_numpy_twin_bit_for_bit(monkeypatch, gen, fused, n):
    if not datakernels._active():
        pytest.skip("numba not available: the twin is the only path")
    F = len(gen.cardinalities)

    def fill():
        out = (np.empty(n, np.float32), np.empty((n, gen.n_dense), np.float32),
               np.empty((n, F), np.int64))
        p = gen.fill(123_456_789_012, *out, fused=fused)
        return out + (p,)

    fast = fill()
    twin(monkeypatch)
    slow = fill()
    for x, y in zip(fast, slow):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(x, y)
    assert n < 100 or (fast[0].any() and not fast[0].all())


def test_the_kernels_prefetch_compiles_here():
    """The tail draws' prefetch is LLVM's intrinsic on this numba, not the silent no-op
    fallback (values are the same either way: the twin test above)."""
    if not datakernels._active():
        pytest.skip("numba not available")
    assert "intrinsic" in repr(datakernels._prefetch)


def test_fused_ids_add_the_field_offsets():
    from pshybrid.schema import field_offsets

    n = 500
    out = (np.empty(n, np.float32), np.empty((n, 3), np.float32), np.empty((n, 4), np.int64))
    GEN.fill(40, *out, fused=True)
    label, dense, sparse = GEN.rows(40, 40 + n)
    np.testing.assert_array_equal(out[0], label)
    np.testing.assert_array_equal(out[1], dense)
    np.testing.assert_array_equal(out[2], sparse + field_offsets(GEN.cardinalities))


@pytest.mark.parametrize("C,a", [(1, 1.1), (2, 1.1), (7, 1.3), (50, 0.5), (HEAD + 1, 1.05),
                                 (100_000, 1.1), (1 << 20, 1.2)])
def test_alias_table_is_the_truncated_zipf_law(C, a):
    """The law the table draws, read off the table (not sampled): exactly its integer
    weights W (sum C * 2**32), which are the truncated Zipf law rounded (< 1 unit each)."""
    table = zipf_alias(C, a)
    counts = alias_counts(table)
    assert counts.sum() == C * 2**32 and (counts >= 0).all()
    target = zipf_law(C, a) * (C * 2.0**32)
    assert np.all(np.abs(counts - target) < 1 + 1e-6 * target)
    assert np.all(alias_pmf(table) > 0)


def test_alias_table_any_weights():
    rng = np.random.default_rng(3)
    for w in (rng.random(1000), rng.random(1000) ** 8, np.ones(17), np.r_[1e-12, 1.0, 5.0],
              np.r_[0.0, 1.0, 0.0, 3.0], np.r_[1.0]):
        C = w.size
        counts = alias_counts(alias_table(w))
        assert counts.sum() == C * 2**32
        assert np.all(np.abs(counts - w / w.sum() * C * 2.0**32) < 1 + 1e-6 * counts)
        assert np.all(counts[w == 0] == 0)


def chi_square(ids, law, bins):
    """Pearson's statistic of the counts of ``ids`` in ``bins`` (edges) against ``law``."""
    counts = np.histogram(ids, bins)[0]
    cum = np.concatenate(([0.0], np.cumsum(law)))
    expected = ids.size * (cum[bins[1:]] - cum[bins[:-1]])
    return float(((counts - expected) ** 2 / expected).sum()), bins.size - 2


@pytest.mark.parametrize("f,C", [(0, 7), (1, 30), (2, 5000)])
def test_sampled_zipf_frequencies_match_the_law(f, C):
    """Chi-square of 200k sampled ids (field 2: a head table and a tail table) against the
    truncated law: below df + 6 sqrt(2 df) (a 6-sigma bound), where the law with the
    exponent off by 0.03 or the ids off by one is far above it."""
    ids = GEN.rows(0, 200_000)[2][:, f]
    bins = np.unique(np.r_[np.arange(min(C, 40)), np.geomspace(40, C, 30).astype(int), C]) \
        if C > 40 else np.arange(C + 1)
    bound = lambda df: df + 6 * np.sqrt(2 * df)  # noqa: E731
    stat, df = chi_square(ids, zipf_law(C, GEN.zipf), bins)
    assert stat < bound(df), (stat, df)
    wrong, _ = chi_square(ids, zipf_law(C, GEN.zipf + 0.03), bins)
    shifted, _ = chi_square(np.minimum(ids + 1, C - 1), zipf_law(C, GEN.zipf), bins)
    assert wrong > bound(df) and shifted > bound(df), (wrong, shifted, df)
    if C > HEAD:  # the tail's share is the law's
        tail = zipf_law(C, GEN.zipf)[HEAD:].sum()
        assert abs((ids >= HEAD).mean() - tail) < 6 * np.sqrt(tail * (1 - tail) / ids.size)


def test_big_field_follows_the_power_law():
    """Fields of more than 2**20 ids: P(id < k) = ((k+1)^(1-a) - 1) / ((C+1)^(1-a) - 1)."""
    ids = GEN.rows(0, 100_000)[2][:, 3]
    C, a = GEN.cardinalities[3], GEN.zipf
    for k in (1, 10, 1000, 100_000):
        want = ((k + 1) ** (1 - a) - 1) / ((C + 1) ** (1 - a) - 1)
        assert abs((ids < k).mean() - want) < 6 * np.sqrt(want * (1 - want) / ids.size), k


def test_dense_columns_are_log1p_exponential():
    """Column means vs E[log1p(s X)], X ~ Exp(1), = integral of s e^-x / (1 + s x) dx (by
    parts; a fine trapezoid), within 6 standard errors."""
    gen = SyntheticCTR(seed=1, n_dense=5, cardinalities=(3,))
    dense = gen.rows(0, 200_000)[1].astype(np.float64)
    x = np.linspace(0.0, 60.0, 2_000_001)
    trapezoid = getattr(np, "trapezoid", None) or np.trapz  # (NumPy 2 renamed it; 1.26: trapz)
    for j in range(5):
        s = 10.0 ** (2.0 * j / 4)
        want = trapezoid(s * np.exp(-x) / (1 + s * x), x)
        se = dense[:, j].std() / np.sqrt(dense.shape[0])
        assert abs(dense[:, j].mean() - want) < 6 * se, (j, dense[:, j].mean(), want)
        np.testing.assert_allclose(gen._model().mean[j], want, rtol=2e-3)  # the centring
        # the law, not just the mean: P(d <= t) = 1 - exp(-(e^t - 1) / s)
        t = float(np.median(dense[:, j]))
        assert abs(np.mean(dense[:, j] <= t) - (1 - np.exp(-np.expm1(t) / s))) < 0.01


def test_dense_values_are_the_documented_formula():
    """docs/data.md's rule, from its hash (written here with Python's integers): 1 - u is
    exact, E = -log(1 - u), d = log(w) - ((w - 1) - y) / w with y = s_j E, w = 1 + y (NumPy's
    log), and d is log1p(y) to within an ulp of float64 (the C library's log1p); the planted
    probability from those float64 values, bit for bit (the ids as drawn: their law is
    tested above)."""
    import math

    from pshybrid.initializers import table_key, uniform_rows

    gen = SyntheticCTR(seed=3, n_dense=4, cardinalities=(9, 5000))
    r0, n, K, mask = 10**12 + 5, 300, 4 + 2 + 1, (1 << 64) - 1
    _, dense, ids, p = gen._rows(r0, r0 + n)
    key = int(table_key(3, "synthetic"))
    u = np.empty((n, 4))
    for i in range(n):
        for j in range(4):
            z = (key + ((r0 + i) * K + j + 1) * 0x9E3779B97F4A7C15) & mask
            z ^= z >> 30
            z = (z * 0xBF58476D1CE4E5B9) & mask
            z ^= z >> 27
            z = (z * 0x94D049BB133111EB) & mask
            u[i, j] = (z ^ (z >> 31)) >> 11
    u *= 2.0 ** -53
    scales = 10.0 ** (2.0 * np.arange(4) / 3)

    def law(u):
        y = -np.log(1.0 - u) * scales
        w = 1.0 + y
        return np.log(w) - ((w - 1.0) - y) / w, y

    d, y = law(u)
    np.testing.assert_array_equal(dense, d.astype(np.float32))
    exact = np.array([[math.log1p(v) for v in row] for row in y])
    assert (np.abs(d - exact) <= np.spacing(exact)).all()
    mean = law(((np.arange(4096) + 0.5) / 4096)[:, None])[0].T.copy().mean(1)
    wf, v = np.empty((9 + 5000, 1)), np.empty((4, 1))
    uniform_rows(wf, np.arange(9 + 5000), 3, "planted", gen.field_scale)
    uniform_rows(v, np.arange(4), 3, "planted:dense", gen.dense_scale)
    logit = np.full(n, gen.bias)
    for f, off in enumerate((0, 9)):
        logit += wf[ids[:, f] + off, 0]
    for j in range(4):
        logit += v[j, 0] * (d[:, j] - mean[j])
    np.testing.assert_array_equal(p, 1.0 / (1.0 + np.exp(-logit)))


def test_planted_model_labels():
    """Labels come from the planted model: its AUC on its own labels is well above 0.5,
    the base rate near 0.3, and the mean label matches the mean planted probability."""
    gen = SyntheticCTR(seed=4)
    label, _, _ = gen.rows(0, 100_000)
    p = gen.planted_probability(0, 100_000)
    assert auc(p, label) > 0.75
    assert 0.2 < label.mean() < 0.4
    assert abs(label.mean() - p.mean()) < 6 * np.sqrt(p.mean() * (1 - p.mean()) / label.size)
    assert 0.45 < auc(np.random.default_rng(0).random(label.size), label) < 0.55


def test_prep_synthetic_writes_the_streams_rows_at_zipf_1(tmp_path):
    """``prep synthetic --zipf 1`` (the law's edge, handled by its own formula) writes the
    stream's rows: the file == SyntheticCTR with the same seed, exponent and capped
    cardinalities."""
    import h5py

    from pshybrid.cli import main
    from pshybrid.synthetic import CRITEO_LIKE

    out = tmp_path / "z.h5"
    assert main(["prep", "synthetic", str(out), "--rows", "700", "--zipf", "1", "--seed",
                 "4", "--max-cardinality", "5000"]) == 0
    want = SyntheticCTR(seed=4, zipf=1.0,
                        cardinalities=tuple(min(c, 5000) for c in CRITEO_LIKE)).rows(0, 700)
    with h5py.File(out) as f:
        for name, w in zip(("label", "dense", "sparse"), want):
            np.testing.assert_array_equal(f[name][...], w)


def test_prep_synthetic_caps_criteo_kaggles_cardinalities_not_the_default_table(tmp_path):
    """--max-cardinality caps Criteo Kaggle's own cardinalities (up to 10,131,227), so a cap
    above the default 100,000 makes larger fields (it was a no-op: the list it capped was
    already capped at 100,000)."""
    import h5py

    from pshybrid.cli import main
    from pshybrid.synthetic import CRITEO_KAGGLE, CRITEO_LIKE

    cards = []
    for cap in ("100000", "300000"):
        path = str(tmp_path / f"c{cap}.h5")
        assert main(["prep", "synthetic", path, "--rows", "50", "--max-cardinality", cap]) == 0
        with h5py.File(path) as f:
            cards.append(tuple(int(c) for c in f.attrs["cardinalities"]))
    assert cards[0] == CRITEO_LIKE
    assert cards[1] == tuple(min(c, 300_000) for c in CRITEO_KAGGLE) and max(cards[1]) == 300_000


def test_write_synthetic_holds_9_bytes_a_row_for_the_planted_auc(tmp_path, monkeypatch):
    """The planted AUC needs every row's probability and label: they were kept as lists of
    chunks and concatenated (24 B a row held when the AUC began; prep synthetic of 100M
    rows needed ~8 GB). Oracles: what is held beside the start when the AUC is called,
    by tracemalloc, is under 10 B a row (float64 probability + bool label), and the
    attribute is that AUC of the file's own labels and of the stream's probabilities."""
    import tracemalloc

    import h5py

    from pshybrid import metrics
    from pshybrid.synthetic import SyntheticCTR, write_synthetic

    n, held, real = 300_000, [], metrics.auc

    def watched(scores, labels):
        held.append(tracemalloc.get_traced_memory()[0])
        return real(scores, labels)

    out, kw = str(tmp_path / "s.h5"), dict(seed=2, n_dense=2, cardinalities=(50, 7))
    write_synthetic(str(tmp_path / "warm.h5"), 2048, chunk=1024, **kw)  # (imports, numba)
    monkeypatch.setattr(metrics, "auc", watched)
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        got = write_synthetic(out, n, chunk=1024, **kw)[out][1]
    finally:
        tracemalloc.stop()
    assert (held[0] - start) / n < 10, (held[0] - start) / n
    p = SyntheticCTR(**kw)._rows(0, n)[3]
    with h5py.File(out, "r") as f:
        assert f.attrs["planted_auc"] == got == real(p, f["label"][...])
