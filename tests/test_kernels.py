"""CPU kernels against their xp reference twins (the oracle)."""

import numpy as np
import pytest

from pshybrid import kernels


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
