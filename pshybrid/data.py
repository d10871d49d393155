"""Dataset files (fixed format, ``docs/data.md``): HDF5 with

    /label  (N,)      float32 in {0, 1}
    /dense  (N, F_d)  float32
    /sparse (N, F_s)  int64, field f's ids in [0, cardinalities[f])
    attrs: format_version (int, 1), cardinalities (F_s,) int64,
           field_names (F_d + F_s,) str: the dense names, then the sparse names;
           optional: planted_auc (float, synthetic files), source (str), transform (str)

``DatasetWriter`` streams rows into such a file atomically (a fresh unique temporary
name beside it, then rename); the reader and the validation live beside it.
"""

from __future__ import annotations

import os

import h5py
import numpy as np

FORMAT_VERSION = 1
CHUNK_ROWS = 16384


class DatasetWriter:
    """Append rows, then ``close()`` to publish ``path`` atomically; ``abort()`` (or an
    exception inside ``with``) removes the temporary file and leaves ``path`` untouched.

    ``DatasetWriter(path, dense_names, sparse_names)``; ``append(label (n,), dense (n, F_d),
    sparse (n, F_s))``; ``close(cardinalities, **attrs)``.
    """

    def __init__(self, path: str, dense_names, sparse_names):
        from .safeio import new_temp_file

        self.path = os.fspath(path)
        self.dense_names, self.sparse_names = list(dense_names), list(sparse_names)
        self.tmp = new_temp_file(self.path)  # a fresh unique name: never a planted link
        try:
            self.f = h5py.File(self.tmp, "w")
        except BaseException:
            os.remove(self.tmp)
            raise
        fd, fs = len(self.dense_names), len(self.sparse_names)
        self.label = self.f.create_dataset("label", (0,), np.float32, maxshape=(None,),
                                           chunks=(CHUNK_ROWS,))
        self.dense = self.f.create_dataset("dense", (0, fd), np.float32, maxshape=(None, fd),
                                           chunks=(CHUNK_ROWS, max(fd, 1)) if fd else None)
        self.sparse = self.f.create_dataset("sparse", (0, fs), np.int64, maxshape=(None, fs),
                                            chunks=(CHUNK_ROWS, max(fs, 1)) if fs else None)
        self.rows = 0

    def append(self, label, dense, sparse) -> None:
        n = len(label)
        if n == 0:
            return
        a, b = self.rows, self.rows + n
        for ds, arr in ((self.label, label), (self.dense, dense), (self.sparse, sparse)):
            ds.resize(b, axis=0)
            ds[a:b] = arr
        self.rows = b

    def close(self, cardinalities, **attrs) -> None:
        self.f.attrs["format_version"] = FORMAT_VERSION
        self.f.attrs["cardinalities"] = np.asarray(cardinalities, np.int64)
        self.f.attrs["field_names"] = np.array(self.dense_names + self.sparse_names, dtype=h5py.string_dtype())
        for k, v in attrs.items():
            self.f.attrs[k] = v
        self.f.close()
        from .safeio import publish_file

        publish_file(self.tmp, self.path)  # atomic publish; a link at path is replaced

    def abort(self) -> None:
        try:
            self.f.close()
        finally:
            if os.path.exists(self.tmp):
                os.remove(self.tmp)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *_):
        if exc_type is not None:
            self.abort()


# -- reading ---------------------------------------------------------------------------------
SHUFFLE_BLOCK = 1024  # rows; the unit of the block shuffle (independent of W and b)
EVAL_BATCH = 4096  # rows an evaluation reads and scores at a time
_SCAN_ROWS = 65536


def _attr_ints(attrs, key):
    """An integer attribute as an int64 array, None if it is not integers."""
    try:
        a = np.asarray(attrs[key])
    except (OSError, TypeError, ValueError):
        return None
    if a.dtype.kind not in "iu" or (a.dtype.kind == "u" and a.size and a.max() >= 2**63):
        return None
    return a.astype(np.int64)


class H5Dataset:
    """Read-only view of a dataset file; the same ``schema``/``rows`` interface as the
    synthetic stream. Opening checks the structure (keys, dtypes, ranks, row counts,
    attributes) and raises ``InputError`` naming the file and the key."""

    def __init__(self, path: str):
        from .errors import InputError
        from .schema import Schema

        self.path = os.fspath(path)
        if not os.path.exists(self.path):
            raise InputError(f"{self.path}: no such dataset file")
        try:
            self.f = h5py.File(self.path, "r")
        except OSError as e:
            raise InputError(f"{self.path}: not a readable HDF5 file ({e})") from None
        want = {"label": (1, np.float32), "dense": (2, np.float32), "sparse": (2, np.int64)}
        for key, (ndim, dtype) in want.items():
            if key not in self.f:
                raise InputError(f"{self.path}: missing dataset /{key}")
            ds = self.f.get(key)
            if not isinstance(ds, h5py.Dataset):
                raise InputError(f"{self.path}: /{key} is a {type(ds).__name__.lower()}, "
                                 f"not a dataset")
            if ds.ndim != ndim or ds.dtype != dtype:
                raise InputError(f"{self.path}: /{key} must be {ndim}-D {np.dtype(dtype).name}, "
                                 f"found {ds.ndim}-D {ds.dtype}")
        n = {k: self.f[k].shape[0] for k in want}
        if len(set(n.values())) != 1:
            raise InputError(f"{self.path}: row counts disagree: {n}")
        for attr in ("format_version", "cardinalities", "field_names"):
            if attr not in self.f.attrs:
                raise InputError(f"{self.path}: missing attribute {attr!r}")
        version = _attr_ints(self.f.attrs, "format_version")
        if version is None or version.size != 1 or int(version.ravel()[0]) != FORMAT_VERSION:
            raise InputError(f"{self.path}: attribute format_version "
                             f"{self.f.attrs['format_version']!r} is not {FORMAT_VERSION}")
        cards_arr = _attr_ints(self.f.attrs, "cardinalities")
        if cards_arr is None or cards_arr.ndim != 1:
            raise InputError(f"{self.path}: attribute cardinalities must be a 1-D array of "
                             "integers")
        cards = tuple(int(c) for c in cards_arr)
        if sum(cards) >= 2**63:
            raise InputError(f"{self.path}: attribute cardinalities sums to {sum(cards)}, "
                             "beyond the int64 ids of the fused table")
        fd, fs = self.f["dense"].shape[1], self.f["sparse"].shape[1]
        try:
            raw = np.atleast_1d(self.f.attrs["field_names"])
            names = [n.decode() if isinstance(n, bytes) else str(n) for n in raw]
        except (OSError, TypeError, ValueError, UnicodeDecodeError) as e:
            raise InputError(f"{self.path}: attribute field_names is not a list of "
                             f"strings ({e})") from None
        if len(cards) != fs or len(names) != fd + fs or min(cards, default=1) < 1:
            raise InputError(f"{self.path}: attributes cardinalities ({len(cards)}) and "
                             f"field_names ({len(names)}) do not match /dense ({fd} columns) "
                             f"and /sparse ({fs} columns), or a cardinality is < 1")
        self.n_rows = n["label"]
        self.schema = Schema(fd, cards, tuple(names[:fd]), tuple(names[fd:]))

    def rows(self, start: int, stop: int):
        """Rows ``[start, stop)``: label (n,) float32, dense (n, F_d) float32, sparse (n, F_s) int64."""
        return (self.f["label"][start:stop], self.f["dense"][start:stop],
                self.f["sparse"][start:stop])

    def validate(self, start: int, stop: int) -> None:
        """Scan rows ``[start, stop)`` in chunks; raise ``InputError`` naming the file, the
        key and the first bad row: labels outside {0, 1}, NaN/inf dense values, sparse ids
        < 0 or >= the field's cardinality."""
        from .errors import InputError

        cards = np.asarray(self.schema.cardinalities, np.int64)
        for a in range(start, stop, _SCAN_ROWS):
            try:
                label, dense, sparse = self.rows(a, min(stop, a + _SCAN_ROWS))
            except (OSError, ValueError) as e:
                raise InputError(f"{self.path}: rows {a}..{min(stop, a + _SCAN_ROWS)} are "
                                 f"unreadable ({e})") from None
            checks = (("label", (label != 0) & (label != 1), "a label outside {0, 1}"),
                      ("dense", ~np.isfinite(dense).all(axis=1), "a NaN or infinite value"),
                      ("sparse", ((sparse < 0) | (sparse >= cards)).any(axis=1),
                       "an id outside [0, cardinality)"))
            for key, bad, what in checks:
                if bad.any():
                    r = int(np.flatnonzero(bad)[0])
                    detail = ""
                    if key == "sparse":
                        f = int(np.flatnonzero((sparse[r] < 0) | (sparse[r] >= cards))[0])
                        detail = (f": field {self.schema.sparse_names[f]} id {sparse[r, f]}, "
                                  f"cardinality {cards[f]}")
                    elif key == "label":
                        detail = f": {label[r]}"
                    raise InputError(f"{self.path}: /{key} row {a + r} has {what}{detail}")

    def close(self) -> None:
        self.f.close()


class BatchPlan:
    """Which rows each worker reads at each step.

    Epoch ``e`` visits the rows in a virtual order: with ``shuffle``, blocks of
    ``SHUFFLE_BLOCK`` rows permuted by ``numpy.random.default_rng([seed, e])`` (reads stay
    contiguous within a block; the last partial block keeps its place at the end), else
    the file order. Global batch ``t`` of an epoch is virtual rows ``[t*G, (t+1)*G)``,
    ``G = W*b``; worker ``w`` reads ``[t*G + w*b, t*G + (w+1)*b)``. An epoch has
    ``n_rows // G`` steps: the last partial global batch is dropped. Nothing depends on
    ``W`` or ``b`` except through ``G``, so one process with batch ``G`` reads the same rows.
    """

    def __init__(self, n_rows: int | None, global_batch: int, shuffle: bool, seed: int):
        self.n, self.G, self.shuffle, self.seed = n_rows, global_batch, shuffle, seed
        self.steps_per_epoch = None if n_rows is None else n_rows // global_batch
        self._perm = (None, None)

    def _order(self, epoch: int):
        if self._perm[0] != epoch:
            nb = self.n // SHUFFLE_BLOCK
            self._perm = (epoch, np.random.default_rng([self.seed, epoch]).permutation(nb))
        return self._perm[1]

    def ranges(self, step: int, offset: int, count: int) -> list[tuple[int, int]]:
        """Physical row ranges of virtual rows ``[t*G + offset, +count)`` of step ``step``."""
        if self.n is None:  # endless stream
            a = step * self.G + offset
            return [(a, a + count)]
        epoch, t = divmod(step, self.steps_per_epoch)
        a = t * self.G + offset
        if not self.shuffle:
            return [(a, a + count)]
        perm, out = self._order(epoch), []
        full = len(perm) * SHUFFLE_BLOCK
        while count:
            if a >= full:  # the tail after the last full block is not shuffled
                out.append((a, a + count))
                break
            blk, within = divmod(a, SHUFFLE_BLOCK)
            n = min(count, SHUFFLE_BLOCK - within)
            s = int(perm[blk]) * SHUFFLE_BLOCK + within
            if out and out[-1][1] == s:
                out[-1] = (out[-1][0], s + n)
            else:
                out.append((s, s + n))
            a, count = a + n, count - n
        return out


def read_ranges(dataset, ranges):
    """Concatenate ``dataset.rows`` over physical ranges: (label, dense, sparse)."""
    parts = [dataset.rows(a, b) for a, b in ranges]
    if len(parts) == 1:
        return parts[0]
    return tuple(np.concatenate(p) for p in zip(*parts))


def prefetch(produce, n: int, depth: int = 2):
    """Yield ``produce(i)`` for i in range(n), computed ``depth`` items ahead on a
    background thread (h5py reads and the synthetic generator release the GIL in part);
    ``depth`` 0: on the caller's thread, when asked."""
    if depth <= 0:
        yield from (produce(i) for i in range(n))
        return
    import queue
    import threading

    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def run():
        try:
            for i in range(n):
                if stop.is_set():
                    return
                q.put((True, produce(i)))
        except BaseException as e:  # re-raised on the consumer's side
            q.put((False, e))

    th = threading.Thread(target=run, daemon=True, name="pshybrid-prefetch")
    th.start()
    try:
        for _ in range(n):
            ok, item = q.get()
            if not ok:
                raise item
            yield item
    finally:
        stop.set()
        while th.is_alive():  # unblock a producer waiting on a full queue
            try:
                q.get_nowait()
            except queue.Empty:
                th.join(0.01)
