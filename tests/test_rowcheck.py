"""``rowcheck.check_rows`` against a row-by-row reference: the first key (label, dense,
sparse) with a bad row, and its first bad row, or no error for a clean batch, for faults
planted anywhere, with and without the fused table's offsets added to the ids."""

import math

import numpy as np
import pytest

from pshybrid.errors import InputError
from pshybrid.rowcheck import check_rows
from pshybrid.schema import Schema

CARDS = (3, 7, 1000)
I64 = np.iinfo(np.int64)


def reference(label, dense, sparse, lo):
    """(key, row) of the first bad value, keys in the order the check reports them."""
    lo = np.broadcast_to(lo, len(CARDS))
    for key in ("label", "dense", "sparse"):
        for r in range(len(label)):
            if key == "label" and label[r] not in (0.0, 1.0):
                return key, r
            if key == "dense" and not all(math.isfinite(v) for v in dense[r]):
                return key, r
            if key == "sparse" and any(not lo[f] <= int(sparse[r, f]) < lo[f] + CARDS[f]
                                       for f in range(len(CARDS))):
                return key, r
    return None


FAULTS = [("label", 0.5), ("label", np.nan), ("label", -1.0), ("dense", np.inf),
          ("dense", -np.inf), ("dense", np.nan), ("sparse", -1), ("sparse", "card"),
          ("sparse", I64.min), ("sparse", I64.max)]


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("seed", range(6))
def test_check_rows_finds_the_first_bad_row_of_the_first_bad_key(seed, fused):
    rng = np.random.default_rng(seed)
    schema = Schema(2, CARDS)
    lo = np.array([0, 3, 10]) if fused else 0
    for trial in range(30):
        n = int(rng.integers(1, 40))
        label = rng.integers(0, 2, n).astype(np.float32)
        dense = (rng.uniform(-1, 1, (n, 2)) * 3e38).astype(np.float32)  # finite, huge
        sparse = np.stack([rng.integers(0, c, n) for c in CARDS], axis=1) + lo
        for _ in range(int(rng.integers(0, 3))):  # 0-2 faults anywhere
            key, v = FAULTS[int(rng.integers(len(FAULTS)))]
            r = int(rng.integers(n))
            if key == "label":
                label[r] = v
            elif key == "dense":
                dense[r, int(rng.integers(2))] = v
            else:
                f = int(rng.integers(len(CARDS)))
                sparse[r, f] = CARDS[f] + np.broadcast_to(lo, 3)[f] if v == "card" else v
        want = reference(label, dense, sparse, lo)
        if want is None:
            check_rows("d.h5", schema, label, dense, sparse, lambda i: i + 100, lo)
            continue
        with pytest.raises(InputError) as e:
            check_rows("d.h5", schema, label, dense, sparse, lambda i: i + 100, lo)
        assert str(e.value).startswith(f"d.h5: /{want[0]} row {want[1] + 100} has "), \
            (str(e.value), want, trial)
