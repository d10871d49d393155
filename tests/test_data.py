"""Dataset files: writer atomicity, reader validation (one clear message naming file, key,
row), the batch plan (order, block shuffle), a worker's batches (worker_batches:
the plan's rows on every path, reused buffers) and the prefetcher."""

import io
import os
from dataclasses import replace

import h5py
import numpy as np
import pytest

from pshybrid.batches import BatchPlan, prefetch, read_ranges, worker_batches
from pshybrid.data import SHUFFLE_BLOCK, DatasetWriter, H5Dataset
from pshybrid.errors import InputError
from pshybrid.schema import Schema


def write(path, n=50, cards=(3, 5), fd=2, **overrides):
    rng = np.random.default_rng(0)
    label = (rng.random(n) < 0.4).astype(np.float32)
    dense = rng.random((n, fd)).astype(np.float32)
    sparse = np.stack([rng.integers(0, c, n) for c in cards], axis=1)
    arrays = dict(label=label, dense=dense, sparse=sparse)
    arrays.update(overrides)
    with DatasetWriter(path, [f"I{i}" for i in range(fd)], [f"C{i}" for i in range(len(cards))]) as w:
        w.append(arrays["label"], arrays["dense"], arrays["sparse"])
        w.close(cards)
    return arrays


def test_round_trip(tmp_path):
    p = tmp_path / "d.h5"
    want = write(p)
    ds = H5Dataset(p)
    assert ds.n_rows == 50 and ds.schema.cardinalities == (3, 5)
    assert ds.schema.dense_names == ("I0", "I1") and ds.schema.sparse_names == ("C0", "C1")
    got = ds.rows(0, 50)
    for g, k in zip(got, ("label", "dense", "sparse")):
        np.testing.assert_array_equal(g, want[k])
    ds.validate(0, 50)
    ds.close()


def test_writer_is_atomic(tmp_path):
    p = tmp_path / "d.h5"
    write(p)
    before = p.read_bytes()
    with pytest.raises(RuntimeError):
        with DatasetWriter(p, ["I0"], ["C0"]) as w:
            w.append(np.zeros(3, np.float32), np.zeros((3, 1), np.float32), np.zeros((3, 1), np.int64))
            raise RuntimeError("boom")
    assert p.read_bytes() == before
    assert os.listdir(tmp_path) == ["d.h5"]  # no temporary file left


def test_writer_never_writes_through_links(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    p = tmp_path / "d.h5"
    for name in ("d.h5", f".d.h5.tmp-{os.getpid()}", ".d.h5.tmp", "d.h5.tmp"):
        os.symlink(victim, tmp_path / name)
    write(p)
    assert victim.read_text() == "precious\n" and not p.is_symlink()
    assert H5Dataset(p).n_rows == 50
    assert sorted(os.listdir(tmp_path)) == sorted(
        ["d.h5", f".d.h5.tmp-{os.getpid()}", ".d.h5.tmp", "d.h5.tmp", "victim.txt"])


def test_planted_symlink_at_the_temporary_name_is_never_followed(tmp_path, monkeypatch):
    """The temporary file is made with O_EXCL | O_NOFOLLOW under a random name: a link planted
    at a name it may take (here the first one tried, made predictable; and the name of the
    old ``.<name>.tmp-<pid>`` scheme) is skipped, its target never written."""
    names = iter(["aaaa", "bbbb"])
    monkeypatch.setattr("secrets.token_hex", lambda n: next(names))
    outside, d = tmp_path / "outside", tmp_path / "d"
    outside.mkdir()
    d.mkdir()
    planted = [".out.h5.aaaa.tmp", f".out.h5.tmp-{os.getpid()}"]
    for name in planted:
        (d / name).symlink_to(outside / name)
    w = DatasetWriter(d / "out.h5", ["I0"], ["C0"])
    w.append(np.zeros(3, np.float32), np.zeros((3, 1), np.float32), np.ones((3, 1), np.int64))
    w.close([2])
    assert os.listdir(outside) == []
    assert sorted(os.listdir(d)) == sorted(planted + ["out.h5"])
    ds = H5Dataset(d / "out.h5")
    assert ds.rows(0, 3)[2].tolist() == [[1]] * 3
    ds.close()


@pytest.mark.parametrize("corrupt,needle", [
    (lambda f: f.__delitem__("dense"), "missing dataset /dense"),
    (lambda f: (f.__delitem__("label"), f.create_dataset("label", data=np.zeros(50))),
     "/label must be 1-D float32, found 1-D float64 (store it as float32, e.g. h5py's "
     "data=ds[()].astype('float32'))"),
    (lambda f: (f.__delitem__("label"), f.create_dataset("label", data=np.zeros(49, np.float32))),
     "row counts disagree"),
    (lambda f: f.attrs.__delitem__("cardinalities"), "missing attribute 'cardinalities'"),
    (lambda f: f.attrs.__setitem__("cardinalities", [3]), "do not match"),
    # every kind of object where a dataset or an integer attribute belongs
    (lambda f: (f.__delitem__("label"), f.create_group("label")), "/label is a group"),
    (lambda f: f.attrs.__setitem__("cardinalities", [3.0, 5.5]),
     "attribute cardinalities must be a 1-D array of integers"),
    (lambda f: f.attrs.__setitem__("cardinalities", "3,5"), "attribute cardinalities"),
    (lambda f: f.attrs.__setitem__("cardinalities", np.array([2**62, 2**62], np.uint64)),
     "beyond the int64 ids"),
    (lambda f: f.attrs.__setitem__("format_version", "one"), "attribute format_version"),
    (lambda f: f.attrs.__setitem__("format_version", "1"),
     "attribute format_version '1' is not the integer 1"),
    (lambda f: (f.__delitem__("label"), f.__setitem__("label", h5py.SoftLink("/gone"))),
     "/label is a broken link"),
    (lambda f: (f.__delitem__("sparse"), f.create_dataset("sparse", data=np.zeros((50, 1), ">i8"))),
     "/sparse must be 2-D int64, found 2-D >i8 (another byte order: store it as int64"),
])
def test_structure_errors_name_file_and_key(tmp_path, corrupt, needle):
    p = tmp_path / "d.h5"
    write(p)
    with h5py.File(p, "a") as f:
        corrupt(f)
    with pytest.raises(InputError) as e:
        H5Dataset(p)
    assert str(p) in str(e.value) and needle in str(e.value)


def test_a_wrong_rank_is_not_called_a_byte_order(tmp_path):
    """A (N, 1) label or a 1-D /sparse of one field: the rank is wrong, not the byte order."""
    p = tmp_path / "d.h5"
    write(p)
    with h5py.File(p, "a") as f:
        del f["label"]
        f.create_dataset("label", data=np.zeros((50, 1), np.float32))
    with pytest.raises(InputError) as e:
        H5Dataset(p)
    assert str(e.value) == f"{p}: /label must be 1-D float32, found 2-D float32"


@pytest.mark.parametrize("field,value,needle", [
    ("label", 2.0, "/label row 7 has a label outside {0, 1}: 2.0"),
    ("dense", np.nan, "/dense row 7 has a NaN or infinite value"),
    ("dense", np.inf, "/dense row 7 has a NaN or infinite value"),
    ("sparse", 5, "/sparse row 7 has an id outside [0, cardinality): field C1 id 5, cardinality 5"),
    ("sparse", -1, "/sparse row 7 has an id outside [0, cardinality): field C1 id -1"),
])
def test_value_errors_name_row(tmp_path, field, value, needle):
    arrays = write(tmp_path / "ok.h5")
    arr = arrays[field].copy()
    if field == "sparse":
        arr[7, 1] = value
    elif field == "dense":
        arr[7, 0] = value
    else:
        arr[7] = value
    p = tmp_path / "bad.h5"
    write(p, **{field: arr})
    ds = H5Dataset(p)
    ds.validate(0, 7)  # the bad row is outside this share
    with pytest.raises(InputError) as e:
        ds.validate(5, 50)
    assert str(p) in str(e.value) and needle in str(e.value)


def test_missing_and_non_hdf5(tmp_path):
    with pytest.raises(InputError, match="no such dataset file"):
        H5Dataset(tmp_path / "nope.h5")
    (tmp_path / "x.h5").write_text("not hdf5")
    with pytest.raises(InputError, match="not a readable HDF5 file"):
        H5Dataset(tmp_path / "x.h5")


def _opens_within(path, seconds=30):
    """The InputError message ``H5Dataset(path)`` raises, in a subprocess with a timeout: a
    hang (h5py opening a FIFO waits for a writer forever, holding the GIL) fails the test
    instead of blocking it."""
    import subprocess
    import sys

    code = ("import sys\nfrom pshybrid.data import H5Dataset\nfrom pshybrid.errors import "
            "InputError\ntry:\n    H5Dataset(sys.argv[1]).close()\nexcept InputError as e:\n"
            "    print(e)")
    try:
        p = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                           text=True, timeout=seconds, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"H5Dataset({path}) blocked for {seconds} s") from None
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


def test_non_regular_files_are_refused_before_hdf5_opens_them(tmp_path):
    """Oracle: a FIFO, a device and a directory are not dataset files; each is refused at
    once, naming the path (a FIFO used to block h5py forever)."""
    os.mkfifo(tmp_path / "fifo.h5")
    assert _opens_within(tmp_path / "fifo.h5") == (
        f"{tmp_path / 'fifo.h5'}: cannot read a dataset: not a regular file (a FIFO, device "
        "or socket)")
    assert "not a regular file" in _opens_within("/dev/null")
    assert _opens_within(tmp_path).endswith("cannot read a dataset: a directory")


def _truncate(path, fraction):
    with open(path, "r+b") as fh:
        fh.truncate(int(os.path.getsize(path) * fraction))


@pytest.mark.parametrize("direct", [True, False])
@pytest.mark.parametrize("change", ["truncate", "touch", "replace"])
def test_a_file_changed_while_it_is_read_stops_the_reads(tmp_path, monkeypatch, capsys, change,
                                                         direct):
    """Oracle: the file's rows before the change, then InputError naming the file at the
    next read: a truncated file read as zeros (HDF5 fills past the end) trained silently.
    A file only touched reads on, with one warning (it stopped every run reading it).
    ``direct``: read by ``rawrows``, else by HDF5 (a compressed file's path)."""
    import pshybrid.batches as batches

    if not direct:
        monkeypatch.setattr(batches, "raw_rows", lambda *a: None)
    monkeypatch.setattr(batches, "WINDOW_ROWS", 256)  # HDF5: one read per window of 2 steps
    p = tmp_path / "d.h5"
    arrays = write(p, n=4000)
    ds = H5Dataset(p)
    plan = BatchPlan(ds.n_rows, 128, False, seed=0)
    it = batches.worker_batches(ds, plan, 0, 20, 0, 128)
    label, _, ids = next(it)
    np.testing.assert_array_equal(ids, arrays["sparse"][:128])
    if change == "truncate":
        _truncate(p, 0.25)
    elif change == "touch":
        os.utime(p, ns=(0, os.stat(p).st_mtime_ns + 10**9))
    else:
        write(tmp_path / "other.h5", n=4000)
        os.replace(tmp_path / "other.h5", p)
    if change == "touch":  # a new mtime alone (touch, against a scratch purge): one warning
        for step in range(1, 4):
            np.testing.assert_array_equal(next(it)[2], arrays["sparse"][step * 128:][:128])
        np.testing.assert_array_equal(ds.rows(0, 10)[2], arrays["sparse"][:10])
        err = capsys.readouterr().err
        assert err.count("its modification time changed") == 1 and str(p) in err, err
        return ds.close()
    why = {"truncate": "(now", "replace": "(replaced by another"}
    for read in (lambda: [next(it) for _ in range(3)], lambda: ds.rows(0, 10)):
        with pytest.raises(InputError) as e:
            read()
        assert str(e.value).startswith(f"{p}: the dataset changed while it was read "
                                       f"{why[change]}"), e.value
    ds.close()


def covered(plan, step, W, b):
    rows = []
    for w in range(W):
        for a, c in plan.ranges(step, w * b, b):
            rows.extend(range(a, c))
    return rows


@pytest.mark.parametrize("shuffle", [False, True])
def test_plan_epoch_is_a_permutation_and_independent_of_w(shuffle):
    n, G = 10 * SHUFFLE_BLOCK + 300, 768
    plan = BatchPlan(n, G, shuffle, seed=4)
    assert plan.steps_per_epoch == n // G  # the last partial global batch is dropped
    epoch = [r for t in range(plan.steps_per_epoch) for r in covered(plan, t, 3, 256)]
    assert len(epoch) == len(set(epoch)) == plan.steps_per_epoch * G
    assert max(epoch) < n
    if shuffle:
        assert epoch != sorted(epoch)
        nxt = [r for r in covered(plan, plan.steps_per_epoch, 3, 256)]
        assert nxt != epoch[:G]  # epoch 1 is ordered differently from epoch 0
    else:
        assert epoch == list(range(plan.steps_per_epoch * G))
    one = BatchPlan(n, G, shuffle, seed=4)  # one process reading the global batch
    for t in (0, 3, plan.steps_per_epoch + 2):
        assert covered(plan, t, 3, 256) == covered(one, t, 1, G)


def test_plan_drops_other_rows_each_epoch_and_shuffles_the_partial_block():
    """The rows an epoch drops (its last partial global batch) are other rows in other
    epochs, the last partial block's among them: over a few epochs every row trains. (The
    partial block stayed last and the same rows were dropped in every epoch: half of a
    2047-row file never trained with a global batch of 1536.)"""
    n, G = 2047, 1536
    plan = BatchPlan(n, G, True, seed=0)
    epochs = [set(covered(plan, e, 1, G)) for e in range(8)]   # one step an epoch
    assert all(len(r) == G for r in epochs) and len({frozenset(r) for r in epochs}) == 2
    assert set().union(*epochs) == set(range(n))
    n = 5 * SHUFFLE_BLOCK + 300                                  # the partial block: not last
    plan = BatchPlan(n, 256, True, seed=3)
    firsts = {covered(plan, e * plan.steps_per_epoch, 1, 256)[0] for e in range(12)}
    assert 5 * SHUFFLE_BLOCK in firsts                           # it led an epoch


def test_plan_endless_stream():
    plan = BatchPlan(None, 12, True, 0)
    assert plan.ranges(5, 4, 4) == [(64, 68)]


def test_read_ranges_and_prefetch_order(tmp_path):
    p = tmp_path / "d.h5"
    want = write(p, n=40)
    ds = H5Dataset(p)
    lab, _, sp = read_ranges(ds, [(30, 35), (2, 4)])
    np.testing.assert_array_equal(sp, np.concatenate([want["sparse"][30:35], want["sparse"][2:4]]))
    got = list(prefetch(lambda i: ds.rows(i, i + 1)[0], 40))
    np.testing.assert_array_equal(np.concatenate(got), want["label"])


def test_prefetch_propagates_errors():
    def produce(i):
        if i == 3:
            raise ValueError("bad block 3")
        return i

    it = prefetch(produce, 10)
    assert [next(it) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(ValueError, match="bad block 3"):
        next(it)


@pytest.mark.parametrize("depth", [0, 1, 3])
def test_prefetch_depths_same_items_and_errors(depth):
    """depth 0 runs produce on the caller's thread (ranks without a spare core)."""
    assert list(prefetch(lambda i: i * i, 7, depth)) == [i * i for i in range(7)]
    it = prefetch(lambda i: 1 // (i - 2), 5, depth)
    assert next(it) == -1 and next(it) == -1
    with pytest.raises(ZeroDivisionError):
        next(it)


class RowsOnly:
    """A user dataset: only the documented minimum (schema, rows, n_rows)."""

    def __init__(self, inner):
        self.inner, self.schema = inner, inner.schema
        if hasattr(inner, "n_rows"):
            self.n_rows = inner.n_rows

    def rows(self, start, stop):
        return self.inner.rows(start, stop)


class Offsets:
    def __init__(self, offsets):
        self.offsets = np.asarray(offsets, np.int64)


def expected(data, plan, step, offset, count, offsets):
    label, dense, sparse = read_ranges(data, plan.ranges(step, offset, count))
    return label, dense, sparse + offsets


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("window,gap,span", [(8192, 1024, 2048), (250, 0, 100), (700, 50, 700),
                                             (4000, 2000, 16384)])
def test_worker_batches_from_a_file_are_the_plans_rows(tmp_path, monkeypatch, shuffle, window,
                                                       gap, span):
    """HDF5's windowed reads (windows of many steps, nearby ranges read as one span; the
    path of compressed files, here forced on an uncompressed one) give each worker exactly
    its rows of every step, across epochs, from any start step."""
    import pshybrid.batches as batches

    monkeypatch.setattr(batches, "raw_rows", lambda *a: None)
    monkeypatch.setattr(batches, "WINDOW_ROWS", window)
    monkeypatch.setattr(batches, "MERGE_GAP", gap)
    monkeypatch.setattr(batches, "SPAN_ROWS", span)
    p = tmp_path / "d.h5"
    write(p, n=5 * SHUFFLE_BLOCK + 300, cards=(3, 5, 7))
    ds = H5Dataset(p)
    offsets = np.array([0, 3, 8])
    for W, b in ((1, 256), (3, 100), (2, 700)):
        plan = BatchPlan(ds.n_rows, W * b, shuffle, seed=2)
        start = plan.steps_per_epoch - 2
        for w in range(W):
            got = list(batches.worker_batches(ds, plan, start, 3 * plan.steps_per_epoch, w * b,
                                              b, Offsets(offsets), depth=10**6))  # keep all
            assert len(got) == 3 * plan.steps_per_epoch
            for i, batch in enumerate(got):
                for g, e in zip(batch, expected(ds, plan, start + i, w * b, b, offsets)):
                    assert g.dtype == e.dtype
                    np.testing.assert_array_equal(g, e)
    ds.close()


def test_uncompressed_files_are_read_without_a_chunk_cache(tmp_path):
    """The direct-read handles of an uncompressed file have no chunk cache, so a read copies
    just its rows. HDF5 shares one cache among a dataset's open handles, set by the first
    one: an h5py Dataset still open when they were opened gave them its default cache, and
    every span read then read its whole 16,384-row chunks (13x the bytes at 4096-row
    batches, bench/host_bench.py)."""
    from pshybrid.rawrows import h5_handles

    p = tmp_path / "d.h5"
    write(p)
    ds = H5Dataset(p)
    for dsid, _, _ in h5_handles(ds):
        assert dsid.get_access_plist().get_chunk_cache()[:2] == (0, 0)
    ds.close()


def test_worker_batches_generic_and_synthetic_paths(tmp_path):
    from pshybrid.schema import FusedTable
    from pshybrid.synthetic import SyntheticCTR

    p = tmp_path / "d.h5"
    write(p, n=3000)
    h5 = H5Dataset(p)
    syn = SyntheticCTR(seed=1, n_dense=2, cardinalities=(4, 9000, 30))
    for data in (RowsOnly(h5), syn, RowsOnly(syn)):
        layout = FusedTable(data.schema, 4, 1, "float64")
        for offsets, lay in ((layout.offsets, layout), (np.zeros(data.schema.n_sparse), None),
                             (np.array([5, 0, 1])[:data.schema.n_sparse], None)):
            lay = lay if lay is not None or not offsets.any() else Offsets(offsets)
            plan = BatchPlan(getattr(data, "n_rows", None), 96, True, seed=0)
            got = list(worker_batches(data, plan, 1, 12, 32, 32, lay, depth=100))
            for i, batch in enumerate(got):
                for g, e in zip(batch, expected(data, plan, 1 + i, 32, 32, offsets)):
                    np.testing.assert_array_equal(g, e)
                assert batch[2].dtype == np.int64
    assert list(worker_batches(syn, BatchPlan(None, 8, False, 0), 0, 0, 0, 8)) == []
    h5.close()


@pytest.mark.parametrize("depth", [0, 1, 2, 4])
@pytest.mark.parametrize("source", ["synthetic", "hdf5"])
def test_reused_buffers_hold_through_the_next_step(tmp_path, depth, source):
    """Through prefetch(depth), the fast paths' ring of depth + 3 buffers never overwrites
    a batch while its step runs or during the next one, even with the producer as far
    ahead as the queue lets it (a slow consumer); each batch is a new array object."""
    import time

    from pshybrid.synthetic import SyntheticCTR

    if source == "hdf5":
        write(tmp_path / "d.h5", n=4000)
        data = H5Dataset(tmp_path / "d.h5")
    else:
        data = SyntheticCTR(seed=3, n_dense=2, cardinalities=(3, 5))
    plan = BatchPlan(getattr(data, "n_rows", None), 64, True, seed=0)
    rows = worker_batches(data, plan, 0, 30, 0, 64, None, depth)
    held = []  # (batch, its copy) of the last two steps
    for batch in prefetch(lambda i: next(rows), 30, depth):
        assert all(batch[2] is not b[2] for b, _ in held)  # (identity checks see new batches)
        held = held[-1:] + [(batch, tuple(x.copy() for x in batch))]
        time.sleep(0.002)  # the step: the producer fills the queue meanwhile
        for b, c in held:
            for x, y in zip(b, c):
                np.testing.assert_array_equal(x, y)


class Custom(RowsOnly):
    """A user dataset whose rows are another's with one value changed: ``edit(label, dense,
    sparse, start)`` after each ``rows`` call (no ``validate``)."""

    def __init__(self, inner, edit):
        super().__init__(inner)
        self.edit = edit

    def rows(self, start, stop):
        label, dense, sparse = (a.copy() for a in self.inner.rows(start, stop))
        return self.edit(label, dense, sparse, start)


def _at(row, fn):
    def edit(label, dense, sparse, start):
        if start <= row < start + len(label):
            fn(label, dense, sparse, row - start)
        return label, dense, sparse
    return edit


@pytest.mark.parametrize("edit,needle", [
    (_at(70, lambda lab, d, s, i: s.__setitem__((i, 1), 9)),
     "/sparse row 70 has an id outside [0, cardinality): field C2 id 9, cardinality 9"),
    (_at(70, lambda lab, d, s, i: s.__setitem__((i, 0), -1)),
     "/sparse row 70 has an id outside [0, cardinality): field C1 id -1, cardinality 4"),
    (_at(70, lambda lab, d, s, i: lab.__setitem__(i, 2.0)),
     "/label row 70 has a label outside {0, 1}: 2.0"),
    (_at(70, lambda lab, d, s, i: d.__setitem__((i, 0), np.nan)),
     "/dense row 70 has a NaN or infinite value"),
    (lambda lab, d, s, a: (lab[:-1], d[:-1], s[:-1]) if a >= 64 else (lab, d, s),
     "returned arrays of shapes ((31,), (31, 2), (31, 3)), not (label, dense, sparse) of "
     "shapes ((32,), (32, 2), (32, 3))"),
    (lambda lab, d, s, a: (lab, d, s[:, :2] if a >= 64 else s), "returned arrays of shapes"),
    (lambda lab, d, s, a: (lab, d, s.astype(np.float64) if a >= 64 else s),  # not "outside"
     "returned arrays of dtypes (float32, float32, float64), not (label, dense, sparse) of "
     "numbers, numbers and integer ids (int64)"),
    (lambda lab, d, s, a: (lab, d.astype(str) if a >= 64 else d, s), "of dtypes (float32, <U"),
    (lambda lab, d, s, a: (lab, d, [list(r) for r in s[:-1]] + [[0]] if a >= 64 else s),
     "returned arrays of shapes None"),  # (ragged lists: np.shape's ValueError)
])
@pytest.mark.parametrize("layout", [False, True])
def test_a_custom_datasets_bad_batch_is_refused(edit, needle, layout):
    """Oracle: the row planted bad (row 70 is in step 1 of worker 0 at b = 32, G = 64) is
    named; the batches before it are the inner dataset's (a dataset without validate
    used to train on an id >= its field's cardinality: the next field's rows)."""
    from pshybrid.schema import FusedTable
    from pshybrid.synthetic import SyntheticCTR

    syn = SyntheticCTR(seed=1, n_dense=2, cardinalities=(4, 9, 30))
    data = Custom(syn, edit)
    lay = FusedTable(data.schema, 4, 1, "float64") if layout else None
    it = worker_batches(data, BatchPlan(None, 64, False, 0), 0, 4, 0, 32, lay)
    first = next(it)
    np.testing.assert_array_equal(first[0], syn.rows(0, 32)[0])
    with pytest.raises(InputError) as e:
        next(it)
    assert str(e.value).startswith("dataset Custom: ") and needle in str(e.value), e.value


@pytest.mark.parametrize("form", [lambda s: s.astype(np.int32), lambda s: s.tolist()])
def test_a_custom_datasets_int32_or_list_ids_are_read_as_int64(form):
    """Oracle: the inner dataset's batches; int32 ids (a view as uint64 in the id check) and
    lists ended the job with a traceback."""
    from pshybrid.synthetic import SyntheticCTR

    syn = SyntheticCTR(seed=1, n_dense=2, cardinalities=(4, 9, 30))
    data = Custom(syn, lambda lab, d, s, a: (lab.tolist(), d, form(s)))
    for step, (lab, d, ids) in enumerate(worker_batches(data, BatchPlan(None, 32, False, 0),
                                                        0, 3, 0, 32)):
        want = syn.rows(32 * step, 32 * (step + 1))
        assert ids.dtype == np.int64
        for got, exp in zip((lab, d, ids), want):
            np.testing.assert_array_equal(got, exp)


def test_a_synthetic_subclass_that_overrides_rows_is_read_through_them():
    """Oracle: its own rows (labels flipped); training used to call the parent's fill and
    bypass them. One that overrides nothing keeps the generator's fast path."""
    from pshybrid.batches import fills
    from pshybrid.synthetic import SyntheticCTR

    class Flipped(SyntheticCTR):
        def rows(self, start, stop):
            label, dense, sparse = super().rows(start, stop)
            return 1 - label, dense, sparse

    class Same(SyntheticCTR):
        pass

    syn, flipped = (c(seed=3, n_dense=2, cardinalities=(4, 9)) for c in (SyntheticCTR, Flipped))
    assert fills(syn) and fills(Same(seed=3)) and not fills(flipped)
    got = list(worker_batches(flipped, BatchPlan(None, 32, False, 0), 0, 3, 0, 32))
    for t, (label, dense, ids) in enumerate(got):
        np.testing.assert_array_equal(label, 1 - syn.rows(32 * t, 32 * t + 32)[0])
        np.testing.assert_array_equal(ids, syn.rows(32 * t, 32 * t + 32)[2])


class BagsOnly(RowsOnly):
    """A user dataset with a multi-hot field: ``rows`` and ``bags`` of a file, ``edit(values,
    lengths, start)`` applied to what ``bags`` returns."""

    def __init__(self, inner, edit):
        super().__init__(inner)
        self.edit = edit

    def bags(self, start, stop):
        return [self.edit(v.copy(), n.copy(), start) for v, n in self.inner.bags(start, stop)]


def _bag_at(row, fn):
    def edit(values, lengths, start):
        if start <= row < start + len(lengths):
            fn(values, lengths, row - start)
        return values, lengths
    return edit


@pytest.mark.parametrize("edit,needle", [
    (_bag_at(70, lambda v, n, i: v.__setitem__(int(n[:i].sum()), 11)),
     "/multi_hot/tags/values row 70 has an id outside [0, cardinality): 11, cardinality 11"),
    (_bag_at(70, lambda v, n, i: n.__setitem__(i, 0)), "values of shape"),
    (_bag_at(70, lambda v, n, i: (n.__setitem__(i + 1, n[i + 1] + n[i]), n.__setitem__(i, 0))),
     "/multi_hot/tags/offsets row 70 has no id (every row needs one)"),  # (row 71 takes its ids)
    (_bag_at(70, lambda v, n, i: (n.__setitem__(i + 1, n[i + 1] + 4), n.__setitem__(i, n[i] - 4))),
     "/offsets row 70 has -"),  # (offsets that decrease: a negative count, not "no id")
    (lambda v, n, start: (v.astype(np.float64) if start <= 70 < start + len(n) else v, n),
     "values and lengths of dtypes float64, int64: integer ids and counts"),  # (a cast error)
])
def test_a_custom_datasets_bad_multi_hot_batch_is_refused(tmp_path, edit, needle):
    """Oracle: the bag planted bad (row 70: step 1 of worker 0) is named; the batch before
    it equals the file's (a custom dataset's multi-hot ids were never checked)."""
    rng = np.random.default_rng(0)
    n, lengths = 256, rng.integers(1, 4, 256)
    with DatasetWriter(tmp_path / "m.h5", ["I0"], ["C0"], ["tags"]) as w:
        w.append(rng.integers(0, 2, n).astype(np.float32), rng.random((n, 1), np.float32),
                 rng.integers(0, 5, (n, 1)), [(rng.integers(0, 11, lengths.sum()), lengths)])
        w.close([5, 11])
    h5 = H5Dataset(tmp_path / "m.h5")
    plan = BatchPlan(n, 64, False, 0)
    it = worker_batches(BagsOnly(h5, edit), plan, 0, 3, 0, 32)
    for g, e in zip(next(it), next(worker_batches(h5, plan, 0, 1, 0, 32))):
        np.testing.assert_array_equal(g, e)
    with pytest.raises(InputError) as e:
        next(it)
    assert str(e.value).startswith("dataset BagsOnly: /multi_hot/tags") and needle in str(
        e.value), e.value
    h5.close()


def test_a_synthetic_subclass_with_its_own_fill_is_checked():
    """Oracle: the label its fill plants at row 40 (step 1 of worker 0 at b = 32) is named;
    the library's own generator is trusted, a subclass's fill is not."""
    from pshybrid.synthetic import SyntheticCTR

    class TwoLabels(SyntheticCTR):
        def fill(self, start, label, dense, ids, fused=False):
            p = super().fill(start, label, dense, ids, fused)
            if start <= 40 < start + len(label):
                label[40 - start] = 2.0
            return p

    it = worker_batches(TwoLabels(seed=3, n_dense=2, cardinalities=(4, 9)),
                        BatchPlan(None, 32, False, 0), 0, 3, 0, 32)
    next(it)
    with pytest.raises(InputError, match=r"^dataset TwoLabels: /label row 40 has a label "
                       r"outside \{0, 1\}: 2.0$"):
        next(it)


@pytest.mark.parametrize("dense,sparse,needle", [
    (["d"], ["a/b"], "'a/b' cannot name a field"),
    (["d"], ["."], "'.' cannot name a field"),
    (["d/x"], ["s"], "'d/x' cannot name a field"),
    (["d"], ["u", "u"], "'u' is given twice"),
    (["d"], [""], "'' cannot name a field"),
])
def test_field_names_a_checkpoint_cannot_hold_are_refused_by_writer_and_reader(tmp_path, dense,
                                                                               sparse, needle):
    """Field names become HDF5 names in checkpoints and exports (/embeddings/<field>): the
    writer refuses them before a file exists, and a file holding them (written another way)
    is refused when it is opened, before any training (not at export or resume)."""
    with pytest.raises(InputError, match=needle):
        DatasetWriter(str(tmp_path / "bad.h5"), dense, sparse)
    assert os.listdir(tmp_path) == []
    path = str(tmp_path / "good.h5")
    w = DatasetWriter(path, ["d"] * len(dense), [f"s{i}" for i in range(len(sparse))])
    w.append(np.zeros(2, np.float32), np.zeros((2, len(dense)), np.float32),
             np.zeros((2, len(sparse)), np.int64))
    w.close([3] * len(sparse))
    with h5py.File(path, "a") as f:
        f.attrs["field_names"] = np.array(dense + sparse, dtype=h5py.string_dtype())
    with pytest.raises(InputError, match="attribute field_names: .*" + needle):
        H5Dataset(path)


def test_too_many_open_files_says_so_not_that_the_file_is_unreadable(tmp_path):
    """(A directory of more files than ``ulimit -n`` named a sound file "not a readable HDF5
    file".)"""
    import resource

    import shutil

    write(tmp_path / "d.h5")
    paths = [tmp_path / f"d{i}.h5" for i in range(64)]  # (HDF5 shares one file's handle)
    for p in paths:
        shutil.copy(tmp_path / "d.h5", p)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    held = []
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
        with pytest.raises(InputError) as e:
            for p in paths:
                held.append(H5Dataset(p))
    finally:
        for d in held:
            d.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert str(e.value) == (f"{p}: cannot open: too many open files (ulimit -n 64): every "
                            "dataset file stays open while the run reads it; raise ulimit -n, "
                            "or merge the files"), e.value


def _without(attr, **set_):
    """A RowsOnly over a small synthetic stream, ``attr`` removed and ``set_`` set."""
    from pshybrid.synthetic import SyntheticCTR

    ds = RowsOnly(SyntheticCTR(seed=1, n_dense=2, cardinalities=(4, 9)))
    for k, v in set_.items():
        object.__setattr__(ds, k, v)
    if attr:
        object.__setattr__(ds, attr, None)
    return ds


@pytest.mark.parametrize("ds,data,needle", [
    (_without(None), "d.h5", "cfg.data 'd.h5' and dataset= both given: give one"),
    (_without("schema"), None, "its schema is not a pshybrid.schema.Schema"),
    (_without("rows"), None, "it has no rows(start, stop) method"),
    (_without(None, n_rows=4096.0), None, "its n_rows 4096.0 is not a count of rows"),
    (_without(None, n_rows=-1), None, "its n_rows -1 is not a count of rows"),
    (_without(None, schema=Schema(1, (4, 9), multi_hot=1)), None,
     "its schema has multi-hot fields and it has no bags(start, stop) method"),
])
def test_a_python_dataset_missing_what_reading_needs_is_one_config_error(ds, data, needle):
    """Each was an AttributeError or TypeError traceback (after the plan, for rows) on every
    rank; cfg.data beside dataset= was recorded as read while the dataset was trained on.
    Oracle: the unmodified dataset trains (the first case's dataset without cfg.data)."""
    from mpi4py import MPI

    from pshybrid.config import TrainConfig
    from pshybrid.errors import ConfigError
    from pshybrid.train import train

    cfg = TrainConfig(mode="allreduce", embedding_dim=2, mlp=(4,), steps=2, batch_size=8,
                      progress="none", data=data)
    with pytest.raises(ConfigError) as e:
        train(cfg, MPI.COMM_SELF, dataset=ds, out=io.StringIO())
    assert str(e.value) == f"dataset RowsOnly: {needle} (a dataset for train: docs/data.md)"
    if data:
        assert train(replace(cfg, data=None), MPI.COMM_SELF, dataset=ds,
                     out=io.StringIO()).summary["steps"] == 2


def test_a_file_given_both_as_cfg_data_and_opened_as_dataset_is_that_file(tmp_path):
    """``auto.resolve`` and tests hand the file ``cfg.data`` names, opened, as the dataset:
    no contradiction to refuse; another file is."""
    from pshybrid.batches import python_dataset
    from pshybrid.errors import ConfigError

    p = str(tmp_path / "d.h5")
    write(p)
    ds = H5Dataset(p)
    assert python_dataset(ds, p) is ds
    with pytest.raises(ConfigError, match="and dataset= both given"):
        python_dataset(ds, str(tmp_path / "other.h5"))
    ds.close()


def test_a_multi_hot_group_the_attribute_does_not_name_is_said(tmp_path):
    """A file with /multi_hot/tags but no ``multi_hot`` attribute got the counts' line
    alone; it now names the groups and the attribute."""
    p = tmp_path / "m.h5"
    with DatasetWriter(p, ["I0"], ["C0"], ["tags"]) as w:
        w.append(np.zeros(4, np.float32), np.zeros((4, 1), np.float32), np.zeros((4, 1), int),
                 [(np.zeros(4, int), np.ones(4, int))])
        w.close([5, 3])
    H5Dataset(p).close()  # (as written: fine)
    with h5py.File(p, "a") as f:
        del f.attrs["multi_hot"]
    with pytest.raises(InputError) as e:
        H5Dataset(p)
    assert str(e.value).endswith("(the file's /multi_hot groups are ['tags'], attribute "
                                 "multi_hot names [])"), e.value
