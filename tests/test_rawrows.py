"""Direct reads of uncompressed HDF5 datasets (``pshybrid.rawrows``). Oracles: the rows
written, and HDF5's own windowed reads of the same plan (``raw_rows`` switched off)."""

import os

import h5py
import numpy as np
import pytest

import pshybrid.batches as batches
import pshybrid.data as data
from pshybrid.batches import BatchPlan, worker_batches
from pshybrid.data import H5Dataset
from pshybrid.errors import InputError
from pshybrid.files import H5Files
from pshybrid.rawrows import RawRows, h5_handles, raw_rows, scan_rows

CARDS = (3, 5, 7)


def arrays(n, seed=0):
    rng = np.random.default_rng(seed)
    return dict(label=(rng.random(n) < 0.4).astype(np.float32),
                dense=rng.random((n, 2)).astype(np.float32),
                sparse=np.stack([rng.integers(0, c, n) for c in CARDS], axis=1))


def write(path, n, layout="chunks", seed=0, monkeypatch=None):
    """A dataset file of ``n`` rows, as ``layout``: ``chunks`` (the writer's, 300-row
    chunks), ``lzf`` (the writer's, compressed), ``contiguous``, ``userblock`` (contiguous
    after a 512-byte user block), ``holes`` (chunked, the second chunk never written:
    HDF5 reads its fill value, zeros). Returns the rows HDF5 holds."""
    a = arrays(n, seed)
    if layout in ("chunks", "lzf"):
        monkeypatch.setattr(data, "CHUNK_ROWS", 300)
        w = data.DatasetWriter(path, ["I0", "I1"], ["C0", "C1", "C2"],
                               compression="lzf" if layout == "lzf" else "none")
        w.append(a["label"], a["dense"], a["sparse"])
        w.close(CARDS)
        return a
    with h5py.File(path, "w", userblock_size=512 if layout == "userblock" else 0) as f:
        for key, v in a.items():
            if layout == "holes":
                d = f.create_dataset(key, v.shape, v.dtype, chunks=(256,) + v.shape[1:])
                d[:256], d[512:] = v[:256], v[512:]
                v[256:512] = 0
            else:
                f.create_dataset(key, data=v)
        f.attrs["format_version"] = data.FORMAT_VERSION
        f.attrs["cardinalities"] = np.asarray(CARDS, np.int64)
        f.attrs["field_names"] = np.array(["I0", "I1", "C0", "C1", "C2"],
                                          dtype=h5py.string_dtype())
    return a


def batches_of(ds, plan, W, b, direct: bool, monkeypatch):
    """Every worker's batches over 3 epochs from a start near an epoch's end, copied."""
    monkeypatch.setattr(batches, "raw_rows", raw_rows if direct else (lambda *a: None))
    offsets = type("L", (), {"offsets": np.array([0, 3, 8])})()
    start = plan.steps_per_epoch - 2
    return [[tuple(x.copy() for x in got) for got in worker_batches(
        ds, plan, start, 3 * plan.steps_per_epoch, w * b, b, offsets)] for w in range(W)]


@pytest.mark.parametrize("layout", ["chunks", "contiguous", "userblock", "holes"])
@pytest.mark.parametrize("shuffle", [False, True])
def test_direct_reads_give_hdf5s_rows(tmp_path, monkeypatch, layout, shuffle):
    """Batches that cross chunks, a partial last chunk, an unallocated chunk: the rows
    written, the same as HDF5's windowed reads, for every worker and step."""
    p = tmp_path / "d.h5"
    a = write(p, 3 * 1024 + 700, layout, monkeypatch=monkeypatch)
    ds = H5Dataset(p)
    assert raw_rows(ds, h5_handles(ds)) is not None
    for W, b in ((1, 512), (2, 300)):
        plan = BatchPlan(ds.n_rows, W * b, shuffle, seed=3)
        got = batches_of(ds, plan, W, b, True, monkeypatch)
        ref = batches_of(ds, plan, W, b, False, monkeypatch)
        for w in range(W):
            for i, (g, r) in enumerate(zip(got[w], ref[w])):
                rows = np.concatenate([np.arange(s, e) for s, e in plan.ranges(
                    plan.steps_per_epoch - 2 + i, w * b, b)])
                want = (a["label"][rows], a["dense"][rows], a["sparse"][rows] + [0, 3, 8])
                for x, y, z in zip(g, r, want):
                    assert x.dtype == z.dtype
                    np.testing.assert_array_equal(x, z)
                    np.testing.assert_array_equal(y, z)
    ds.close()


def test_several_files_are_read_directly_across_their_bounds(tmp_path, monkeypatch):
    paths = [tmp_path / f"d{i}.h5" for i in range(3)]
    parts = [write(p, n, "chunks", seed=i, monkeypatch=monkeypatch)
             for i, p in enumerate(paths, 1) for n in [(700, 1100, 450)[i - 1]]]
    whole = {k: np.concatenate([x[k] for x in parts]) for k in parts[0]}
    ds = H5Files([str(p) for p in paths])
    plan = BatchPlan(ds.n_rows, 2 * 250, True, seed=1)
    assert_last_batches(batches_of(ds, plan, 2, 250, True, monkeypatch), plan, 250, whole)
    ds.close()


def assert_last_batches(got, plan, count, want) -> None:
    """``got`` (``batches_of``: each of 2 workers' last 2 steps) == the rows of ``want``
    (label, dense, sparse arrays) the plan gives them, the fused offsets added."""
    for w in range(2):
        for i, g in enumerate(got[w]):
            rows = np.concatenate([np.arange(s, e) for s, e in plan.ranges(
                plan.steps_per_epoch - 2 + i, w * count, count)])
            np.testing.assert_array_equal(g[0], want["label"][rows])
            np.testing.assert_array_equal(g[1], want["dense"][rows])
            np.testing.assert_array_equal(g[2], want["sparse"][rows] + [0, 3, 8])


def test_compressed_files_keep_hdf5s_reads(tmp_path, monkeypatch):
    p = tmp_path / "d.h5"
    write(p, 1000, "lzf", monkeypatch=monkeypatch)
    ds = H5Dataset(p)
    assert raw_rows(ds, h5_handles(ds)) is None
    ds.close()


def test_chunks_that_cut_rows_take_the_windowed_reads(tmp_path, monkeypatch):
    """h5py's chunks=True (and any resizable dataset) chunks /sparse as (k, 1): every row
    is in several chunks. Read directly, each range was one HDF5 read per chunk row with
    no chunk cache (docs/benchmarks.md, Chunk layouts); such a file takes the windowed
    reads with a chunk cache, and gives its rows."""
    p = tmp_path / "d.h5"
    a = arrays(3000)
    with h5py.File(p, "w") as f:
        for key, v in a.items():
            f.create_dataset(key, data=v, chunks=(512,) + (1,) * (v.ndim - 1))
        f.attrs.update(format_version=data.FORMAT_VERSION, cardinalities=np.array(CARDS),
                       field_names=["I0", "I1", "C0", "C1", "C2"])
    ds = H5Dataset(p)
    handles = h5_handles(ds)
    assert raw_rows(ds, handles) is None
    assert handles[2][0].get_access_plist().get_chunk_cache()[1] > 0
    plan = BatchPlan(ds.n_rows, 2 * 300, True, seed=3)
    assert_last_batches(batches_of(ds, plan, 2, 300, True, monkeypatch), plan, 300, a)
    ds.close()


def test_a_layout_that_does_not_check_out_keeps_hdf5s_reads(tmp_path, monkeypatch):
    """Chunk offsets read wrong (a row off): the first and last rows differ from HDF5's, so
    the file is read by HDF5, and its batches are still its rows."""
    p = tmp_path / "d.h5"
    a = write(p, 1000, "chunks", monkeypatch=monkeypatch)
    start = RawRows._start
    monkeypatch.setattr(RawRows, "_start", lambda self, c: start(self, c) + self.row)
    ds = H5Dataset(p)
    assert raw_rows(ds, h5_handles(ds)) is None
    plan = BatchPlan(ds.n_rows, 200, False, seed=0)
    got = batches_of(ds, plan, 1, 200, True, monkeypatch)[0]
    np.testing.assert_array_equal(got[2][2], a["sparse"][:200] + [0, 3, 8])  # (epoch 2)
    ds.close()


def test_a_read_past_a_truncated_end_names_the_file(tmp_path, monkeypatch):
    """The file cut before the next batch's rows: the direct read comes back short, and
    the error names the file and its new size (HDF5 would have read zeros)."""
    p = tmp_path / "d.h5"
    write(p, 5000, "chunks", monkeypatch=monkeypatch)
    ds = H5Dataset(p)
    raws = raw_rows(ds, h5_handles(ds))
    cut = raws[2]._start(10)  # the sparse rows from chunk 10 (row 3000) on are gone
    plan = BatchPlan(ds.n_rows, 1000, False, seed=0)
    it = worker_batches(ds, plan, 0, 5, 0, 1000)
    for _ in range(3):
        next(it)
    with open(p, "r+b") as fh:
        fh.truncate(cut)
    with pytest.raises(InputError) as e:
        next(it)
    assert str(e.value).startswith(f"{p}: the dataset changed while it was read (now "), e.value
    ds.close()
    assert os.path.getsize(p) == cut


def elsewhere(path, tmp_path, how):
    """A contiguous file whose bytes at HDF5's offsets are not its rows, as ``how``:
    ``external link`` (/label links to another file's; the deleted /label's bytes stay where
    HDF5 says the linked one's are), ``own type`` (/sparse stored 48 bits wide at bit 8),
    ``external storage`` (/dense in a raw file beside). Rows 0 and N-1 read the same either
    way. Returns h5py's rows."""
    write(path, 2000, "contiguous")
    with h5py.File(path, "r+") as f:
        if how == "external link":
            label = f["label"][()]
            label[1:-1] = 1 - label[1:-1]
            with h5py.File(tmp_path / "other.h5", "w") as g:
                g["label"] = label
            del f["label"]
            f["label"] = h5py.ExternalLink(str(tmp_path / "other.h5"), "/label")
        elif how == "own type":
            ids = f["sparse"][()]
            ids[[0, -1]] = 0  # zero bytes in both types
            del f["sparse"]
            t = h5py.h5t.STD_I64LE.copy()
            t.set_precision(48)
            t.set_offset(8)
            d = h5py.h5d.create(f.id, b"sparse", t, h5py.h5s.create_simple(ids.shape))
            d.write(h5py.h5s.ALL, h5py.h5s.ALL, ids)
        else:
            dense = f["dense"][()]
            del f["dense"]
            f.create_dataset("dense", data=dense, external=[(str(tmp_path / "raw.bin"), 0,
                                                             h5py.h5f.UNLIMITED)])
        return {k: f[k][()] for k in ("label", "dense", "sparse")}


@pytest.mark.parametrize("how", ["external link", "own type", "external storage"])
def test_rows_kept_elsewhere_or_in_a_type_of_their_own_keep_hdf5s_reads(tmp_path, monkeypatch,
                                                                        how):
    """The direct reads would read other bytes (the stale ones, or the stored type's):
    such a file is read by HDF5, and its batches and opening scan are h5py's rows."""
    p = tmp_path / "d.h5"
    want = elsewhere(p, tmp_path, how)
    ds = H5Dataset(p)
    assert raw_rows(ds, h5_handles(ds)) is None
    plan = BatchPlan(ds.n_rows, 600, True, seed=2)
    for i, got in enumerate(batches_of(ds, plan, 1, 600, True, monkeypatch)[0]):
        rows = np.concatenate([np.arange(s, e) for s, e in plan.ranges(
            plan.steps_per_epoch - 2 + i, 0, 600)])
        for g, k in zip(got, ("label", "dense", "sparse")):
            np.testing.assert_array_equal(g, want[k][rows] + ([0, 3, 8] if k == "sparse" else 0))
    for a, *got in scan_rows(ds, 0, ds.n_rows, 700):
        for g, k in zip(got, ("label", "dense", "sparse")):
            np.testing.assert_array_equal(g, want[k][a:a + 700])
    ds.close()


def test_a_linked_file_changed_while_read_names_it(tmp_path, monkeypatch):
    """The file an external link reads from is watched as the file itself: truncated, the
    next read names it (HDF5 would read zeros past its end)."""
    p = tmp_path / "d.h5"
    elsewhere(p, tmp_path, "external link")
    ds = H5Dataset(p)
    ds.rows(0, 500)
    os.truncate(tmp_path / "other.h5", 3000)
    with pytest.raises(InputError) as e:
        ds.rows(500, 1000)
    assert str(e.value).startswith(f"{tmp_path / 'other.h5'} (/label of {p}): the dataset "
                                   "changed while it was read (now 3000 bytes"), e.value
    ds.close()


@pytest.mark.parametrize("layout", ["chunks", "lzf"])
def test_the_opening_scan_reads_the_rows_and_names_a_bad_one(tmp_path, monkeypatch, layout):
    """``scan_rows`` (direct reads into reused buffers, or HDF5's for a compressed file)
    gives each chunk's rows as ``rows`` does, the last one partial; ``validate`` over it
    names a bad id in that last chunk by its row."""
    p = tmp_path / "d.h5"
    write(p, 3000 + 700, layout, monkeypatch=monkeypatch)
    ds = H5Dataset(p)
    seen = []
    for a, *got in scan_rows(ds, 100, ds.n_rows, 1000):
        seen.append(a)
        for g, want in zip(got, ds.rows(a, min(ds.n_rows, a + 1000))):
            np.testing.assert_array_equal(g, want)
    assert seen == [100, 1100, 2100, 3100]
    ds.close()
    with h5py.File(p, "r+") as f:
        f["sparse"][3650, 2] = 7  # field C2's cardinality is 7
    ds = H5Dataset(p)
    monkeypatch.setattr(data, "_SCAN_ROWS", 1000)
    with pytest.raises(InputError) as e:
        ds.validate(0, ds.n_rows)
    assert str(e.value) == f"{p}: /sparse row 3650 has an id outside [0, cardinality): " \
                           "field C2 id 7, cardinality 7", e.value
    ds.close()


def test_a_dataset_says_whether_it_is_compressed(tmp_path, monkeypatch):
    """(What the plan's note on compressed training data reads, report.banner.)"""
    paths = {k: tmp_path / f"{k}.h5" for k in ("chunks", "lzf", "contiguous")}
    for k, p in paths.items():
        write(p, 500, k, monkeypatch=monkeypatch)
    got = {k: H5Dataset(p) for k, p in paths.items()}
    assert {k: d.compression for k, d in got.items()} == \
        {"chunks": None, "lzf": "lzf", "contiguous": None}
    for d in got.values():
        d.close()
    for names, want in ((("chunks", "contiguous"), None), (("chunks", "lzf"), "lzf")):
        files = H5Files([str(paths[k]) for k in names])
        assert files.compression == want
        files.close()
