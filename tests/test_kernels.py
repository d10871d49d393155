"""CPU kernels against their xp reference twins (the oracle)."""

import numpy as np
import pytest

from pshybrid import dedup, kernels, partition


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(0,), (17,), (6, 5)])
def test_gather_equals_reference(dtype, shape):
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((40, 7)).astype(dtype)
    index = rng.integers(0, 40, size=shape)
    out = kernels.gather(rows, index)
    assert out.shape == shape + (7,) and out.dtype == dtype
    np.testing.assert_array_equal(out, kernels.gather_ref(rows, index))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_scatter_add_equals_reference(dtype):
    rng = np.random.default_rng(1)
    # Zipf-like duplicates, integer values so every summation order is exact
    index = np.minimum(rng.zipf(1.3, size=2000) - 1, 99)
    values = rng.integers(-8, 9, size=(2000, 5)).astype(dtype)
    np.testing.assert_array_equal(kernels.scatter_add(index, values, 100),
                                  kernels.scatter_add_ref(index, values, 100))


def test_scatter_add_float_rounding_close_to_reference():
    rng = np.random.default_rng(2)
    index = rng.integers(0, 30, size=500)
    values = rng.standard_normal((500, 3))
    np.testing.assert_allclose(kernels.scatter_add(index, values, 30),
                               kernels.scatter_add_ref(index, values, 30), rtol=1e-12, atol=1e-12)


def test_scatter_add_empty():
    out = kernels.scatter_add(np.zeros(0, np.int64), np.zeros((0, 4)), 3)
    np.testing.assert_array_equal(out, np.zeros((3, 4)))


def test_segment_sum_matches_scatter_add_reference():
    rng = np.random.default_rng(3)
    keys = rng.integers(0, 1000, size=300)
    values = rng.integers(-5, 6, size=(300, 2)).astype(np.float64)
    uniq, sums = kernels.segment_sum(keys, values)
    assert (np.diff(uniq) > 0).all()
    ref = kernels.scatter_add_ref(keys, values, 1000)
    np.testing.assert_array_equal(sums, ref[uniq])
    assert set(uniq.tolist()) == set(keys.tolist())


# -- numba fast paths against the oracles (np.add.at, the NumPy twins, the old group_by_owner) --
def _zipf_keys(rng, n, a=1.1, rows=1_000_000):
    return ((rng.zipf(a, size=n) - 1) % rows).astype(np.int64)


def _bits(x):
    """Raw bytes of a float array: equality here is bit for bit (no -0.0 == 0.0, NaN-safe)."""
    return np.ascontiguousarray(x).view(np.uint8)


def test_numba_path_is_active():
    # numba is a runtime dependency: a silent fall back to NumPy here must fail CI.
    assert kernels.numba_active()
    kernels.segment_sum(np.array([3, 1, 3]), np.ones((3, 2), np.float32))
    kernels.unique_inverse(np.array([3, 1, 3]), 2)
    for mod in (kernels, dedup):  # plain functions become numba dispatchers...
        for name in mod._JITTED:
            assert hasattr(getattr(mod, name), "signatures"), f"{name} is not a numba dispatcher"
    for entry in (dedup._nb_segment_sum, dedup._nb_unique_inverse):  # ...and the entries ran
        assert entry.signatures, f"{entry} was not called"


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("dist", ["zipf", "uniform", "few"])
@pytest.mark.parametrize("n,dim", [(1, 3), (7, 1), (4096, 16), (6656, 64)])
def test_segment_sum_numba_equals_add_at_bitwise(dtype, dist, n, dim):
    rng = np.random.default_rng(n + dim)
    keys = {"zipf": _zipf_keys(rng, n),
            "uniform": rng.integers(0, 10 * n, size=n),
            "few": rng.integers(0, 3, size=n)}[dist]
    values = rng.standard_normal((n, dim)).astype(dtype)
    uniq, sums = kernels.segment_sum(keys, values)
    assert uniq.dtype == np.int64 and sums.dtype == dtype and sums.shape == (uniq.size, dim)
    np.testing.assert_array_equal(uniq, np.unique(keys))
    # oracle: np.add.at in the same dtype, strictly in input order, into the deduplicated rows
    ref = np.zeros_like(sums)
    np.add.at(ref, np.searchsorted(uniq, keys), values)
    np.testing.assert_array_equal(_bits(sums), _bits(ref))
    # the NumPy twin: same keys, same sums up to rounding (reduceat is pairwise on long runs)
    uniq0, sums0 = kernels.segment_sum_numpy(keys, values)
    np.testing.assert_array_equal(uniq, uniq0)
    tol = 1e-4 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(sums, sums0, rtol=tol, atol=tol * np.sqrt(n))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_segment_sum_numba_equals_numpy_twin_bitwise_on_integers(dtype):
    rng = np.random.default_rng(4)
    keys = _zipf_keys(rng, 5000, a=1.05)
    values = rng.integers(-8, 9, size=(5000, 24)).astype(dtype)  # every order sums exactly
    uniq, sums = kernels.segment_sum(keys, values)
    uniq0, sums0 = kernels.segment_sum_numpy(keys, values)
    np.testing.assert_array_equal(uniq, uniq0)
    np.testing.assert_array_equal(_bits(sums), _bits(sums0))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_segment_sum_edge_cases(dtype):
    empty_u, empty_s = kernels.segment_sum(np.zeros(0, np.int64), np.zeros((0, 5), dtype))
    assert empty_u.shape == (0,) and empty_s.shape == (0, 5) and empty_s.dtype == dtype
    # all duplicates: one key, rows summed in input order
    values = np.random.default_rng(5).standard_normal((1000, 4)).astype(dtype)
    uniq, sums = kernels.segment_sum(np.full(1000, 42, np.int64), values)
    want = values[0].copy()
    for row in values[1:]:
        want = want + row
    assert uniq.tolist() == [42]
    np.testing.assert_array_equal(_bits(sums[0]), _bits(want))
    # a single row is returned as is
    uniq, sums = kernels.segment_sum(np.array([7]), values[:1])
    assert uniq.tolist() == [7] and np.array_equal(_bits(sums), _bits(values[:1]))
    # keys near 2**62 and across the whole int64 range (radix on key - min, as uint64)
    big = np.array([2**62 + 5, 2**62, 2**62 + 5, 2**62 - 1, 0, 2**62], np.int64)
    huge = np.array([2**63 - 1, -2**63, 5, -1, 2**63 - 1, -2**63, 0], np.int64)
    for keys in (big, huge):
        vals = np.arange(keys.size * 3, dtype=dtype).reshape(-1, 3)
        uniq, sums = kernels.segment_sum(keys, vals)
        uniq0, sums0 = kernels.segment_sum_numpy(keys, vals)
        np.testing.assert_array_equal(uniq, uniq0)
        np.testing.assert_array_equal(sums, sums0)


def test_segment_sum_other_shapes_and_layouts():
    rng = np.random.default_rng(6)
    keys = rng.integers(0, 20, size=300)
    for values in (rng.standard_normal(300),                       # (B,)
                   rng.standard_normal((300, 2, 3)),               # (B, F, D)
                   rng.standard_normal((300, 8))[:, ::2],          # strided rows
                   rng.standard_normal((300, 0))):                 # D = 0
        uniq, sums = kernels.segment_sum(keys, values)
        ref = kernels.scatter_add_ref(np.searchsorted(uniq, keys), values, uniq.size)
        assert sums.shape == ref.shape
        np.testing.assert_array_equal(sums, ref)
    # dtypes the numba kernel does not take go to the NumPy twin
    ints = rng.integers(-3, 4, size=(300, 2))
    np.testing.assert_array_equal(kernels.segment_sum(keys, ints)[1],
                                  kernels.segment_sum_numpy(keys, ints)[1])


def test_radix_argsort_is_stable_over_full_int64_range():
    rng = np.random.default_rng(7)
    kernels.numba_active()
    for keys in (rng.integers(-2**63, 2**63 - 1, size=3000, dtype=np.int64, endpoint=True),
                 rng.integers(0, 50, size=3000), np.full(10, 3), np.array([2**62, 1, 2**62, 0])):
        keys = keys.astype(np.int64)
        np.testing.assert_array_equal(dedup._nb_radix_argsort(keys),
                                      np.argsort(keys, kind="stable"))


@pytest.mark.parametrize("bitmap_span", [0, 128, 4096])
@pytest.mark.parametrize("m", [1, 2, 3, 7, 16])
def test_unique_inverse_equals_numpy_twin(monkeypatch, m, bitmap_span):
    """Both numba paths (hash map + radix sort; the bitmap of the sort keys, which
    ``_BITMAP_SPAN`` bits per key allow: never, the default, more often)."""
    monkeypatch.setattr(dedup, "_BITMAP_SPAN", bitmap_span)
    rng = np.random.default_rng(m)
    for keys in (np.zeros(0, np.int64), np.array([5]), rng.integers(0, 50, size=(40, 3)),
                 _zipf_keys(rng, 6656), 2**62 - rng.integers(0, 10**6, size=2000),
                 # negative keys, and both sides of 2^50 (float-reciprocal vs exact division)
                 rng.integers(-2**50, 2**50, size=3000), np.arange(-5 * m, 5 * m).repeat(2),
                 np.array([2**50 - 1, 2**50, -2**50, 1 - 2**50, 0, -1, 2**61, -2**61]),
                 # spans around a bitmap word, keys at both ends of the span
                 np.array([-70, 63, 64, -7, 63, -70]), rng.integers(0, 64 * m + 1, 200),
                 np.array([2**63 - 1] * 3 + [2**63 - 65 * m]),
                 # the whole int64 range (m = 1 only: the sort key of m > 1 needs room)
                 np.array([2**63 - 1, -2**63, 0] if m == 1 else [0])):
        got = kernels.unique_inverse(keys, m)
        want = kernels.unique_inverse_numpy(keys, m)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype == np.int64
            np.testing.assert_array_equal(g, w)
        if keys.size:  # the caller's (min, max): the same result
            extent = kernels.min_max(keys)
            assert extent == (keys.min(), keys.max())
            for g, w in zip(kernels.unique_inverse(keys, m, extent), want):
                np.testing.assert_array_equal(g, w)
        uniq, inverse, bounds = got
        assert inverse.shape == (keys.size,) and (uniq[inverse] == keys.ravel()).all()
        assert bounds.shape == (m + 1,) and bounds[0] == 0 and bounds[-1] == uniq.size
        for r in range(m):
            grp = uniq[bounds[r]:bounds[r + 1]]
            assert (grp % m == r).all() and (grp[1:] > grp[:-1]).all()




@pytest.mark.parametrize("numba_on", [True, False])
@pytest.mark.parametrize("rows,S", [(1, 1), (10, 1), (10, 3), (1000, 4), (5, 8), (3, 16),
                                    (1_000_000, 7), (2**33, 3), (2**62, 5)])
def test_group_by_owner_equals_old_contract(monkeypatch, numba_on, rows, S):
    if not numba_on:
        monkeypatch.setattr(kernels, "_NUMBA", False)  # the NumPy twin path
    rng = np.random.default_rng(rows % 1000 + S)
    for shape in ((0,), (1,), (300,), (64, 26)):
        ids = rng.integers(0, rows, size=shape, dtype=np.int64)
        if ids.size > 2:
            ids.ravel()[1] = ids.ravel()[0]  # a duplicate for sure
        got = partition.group_by_owner(ids, rows, S)
        want = partition.group_by_owner_ref(ids, rows, S)
        for g, w, what in zip(got, want, ("unique", "inverse", "bounds")):
            assert g.dtype == np.int64 and g.shape == w.shape, what
            np.testing.assert_array_equal(g, w, err_msg=what)
    ids = _zipf_keys(rng, 6656, rows=min(rows, 10**6))
    for g, w in zip(partition.group_by_owner(ids, rows, S), partition.group_by_owner_ref(ids, rows, S)):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_scatter_add_bitwise_equals_add_at_and_segment_sum(dtype):
    """The numba scatter-add adds in input order: the same bits as np.add.at and as
    segment_sum of the same rows (the store's push with a prepared plan relies on it)."""
    assert kernels.numba_active()
    rng = np.random.default_rng(7)
    index = np.minimum(rng.zipf(1.2, size=3000) - 1, 199)
    values = rng.standard_normal((3000, 9)).astype(dtype)
    got = kernels.scatter_add(index, values, 200)
    np.testing.assert_array_equal(got, kernels.scatter_add_ref(index, values, 200))
    uniq, sums = kernels.segment_sum(index, values)
    np.testing.assert_array_equal(got[uniq], sums)


def test_scatter_add_refuses_an_index_out_of_range():
    with pytest.raises(IndexError):
        kernels.scatter_add(np.array([0, 3]), np.ones((2, 2)), 3)
    with pytest.raises(IndexError):
        kernels.scatter_add(np.array([0, -1]), np.ones((2, 2)), 3)


# -- the prefetching gather and the prefetch hint --------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [1, kernels._AHEAD, kernels._AHEAD + 1, 5000])
def test_prefetching_gather_equals_take(monkeypatch, dtype, n):
    monkeypatch.setattr(kernels, "_FAR_TABLE", 0)  # the numba path for any table
    rng = np.random.default_rng(n)
    rows = rng.standard_normal((7000, 17)).astype(dtype)
    index = rng.integers(-7000, 7000, size=(n, 3))
    assert kernels.numba_active()
    assert np.array_equal(kernels.gather(rows, index), np.take(rows, index, axis=0))
    with pytest.raises(IndexError, match="7000 rows"):
        kernels.gather(rows, np.array([0, 7000]))


@pytest.mark.parametrize("far", [False, True], ids=["take", "numba"])
def test_gather_into_a_given_array_strided_or_not(monkeypatch, far):
    """``out=`` (a GPU worker's pull into its pinned buffer): the same rows, written in
    place (a padded row buffer's first columns too), nothing past them."""
    if far:
        monkeypatch.setattr(kernels, "_FAR_TABLE", 0)
    rng = np.random.default_rng(3)
    rows = rng.standard_normal((500, 17)).astype(np.float32)
    index = rng.integers(0, 500, 300)
    pad = np.full((300, 20), 7, np.float32)
    for out in (np.empty((300, 17), np.float32), pad[:, :17]):
        assert kernels.gather(rows, index, out=out) is out
        assert np.array_equal(out, np.take(rows, index, axis=0))
    assert (pad[:, 17:] == 7).all()


def test_the_prefetch_hint_is_emitted_or_falls_back_to_a_no_op(monkeypatch):
    """A compiled kernel carries the CPU's prefetch instruction; where the intrinsic cannot
    be built, a no-op takes its place and the kernels give the same values."""
    import numba

    from pshybrid import prefetch

    hint = prefetch.build(numba)

    @numba.njit
    def visit(a, rows):
        s = 0.0
        for r in rows:
            hint(a, r)
            s += a[r, 0]
        return s

    a = np.arange(12.0).reshape(4, 3)
    assert visit(a, np.array([3, 1])) == 12.0
    asm = "\n".join(visit.inspect_asm().values())
    assert "prefetch" in asm.lower()
    monkeypatch.setattr(prefetch, "_declare", lambda numba: 1 / 0)
    noop = prefetch.build(numba)
    assert noop is not hint and noop(a, 1) is None


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("parts", [1, 2, 3, 5, kernels._MERGE_PARTS + 1])
def test_merge_sum_equals_segment_sum_bitwise(dtype, parts):
    """Strictly increasing parts (a server's step messages): the merge gives segment_sum's
    keys and, bit for bit, its sums (added in part order); empty parts and one-row parts
    included."""
    rng = np.random.default_rng(parts)
    cases = []
    for p in range(parts):
        n = [0, 1, 50, 400][p % 4]
        keys = np.sort(rng.choice(np.arange(-300, 900), size=n, replace=False)).astype(np.int64)
        cases.append((keys, (rng.standard_normal((n, 7)) * 10.0 ** rng.integers(-3, 4, (n, 1)))
                      .astype(dtype)))
    if all(k.size == 0 for k, _ in cases):
        cases.append((np.array([5], np.int64), np.ones((1, 7), dtype)))
    keys, sums = kernels.merge_sum(cases)
    want_k, want_s = kernels.segment_sum(np.concatenate([k for k, _ in cases]),
                                         np.concatenate([v for _, v in cases]))
    np.testing.assert_array_equal(keys, want_k)
    assert sums.dtype == dtype and sums.tobytes() == want_s.tobytes()
