"""Dataset files (fixed format): HDF5 with

    /label  (N,)      float32 in {0, 1}
    /dense  (N, F_d)  float32
    /sparse (N, F_s)  int64, field f's ids in [0, cardinalities[f])
    attrs: format_version (int, 1), cardinalities (F_s,) int64,
           field_names (F_d + F_s,) str: the dense names, then the sparse names;
           optional: planted_auc (float, synthetic files), source (str), transform (str)

``DatasetWriter`` streams rows into such a file atomically (a fresh temporary file, then
rename); the reader and the validation live beside it.
"""

from __future__ import annotations

import errno
import io
import os
import secrets

import h5py
import numpy as np

FORMAT_VERSION = 1
CHUNK_ROWS = 16384
_CREATE = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(
    os, "O_CLOEXEC", 0)


def _create_temp(path: str) -> tuple[str, int]:
    """A new file ``.<name>.<random>.tmp`` beside ``path``: ``(its path, fd)``. O_EXCL (and
    O_NOFOLLOW): never an existing file or a planted symbolic link; umask applies."""
    d, name = os.path.split(os.path.abspath(path))
    for _ in range(16):
        tmp = os.path.join(d, f".{name[:200]}.{secrets.token_hex(6)}.tmp")
        try:
            return tmp, os.open(tmp, _CREATE, 0o666)
        except FileExistsError:
            continue
    raise FileExistsError(f"{d}: no free temporary name")


class _Sink(io.RawIOBase):
    """The temporary file as HDF5 sees it (h5py's fileobj driver): it never fails. The
    first OSError (a full disk, EIO) is kept in ``error`` and every later write is dropped,
    so HDF5's own state stays sane and the file can always be closed (libhdf5 may crash
    closing a file whose writes failed); the writer checks ``error`` and reports it."""

    def __init__(self, fd: int):
        self.file = os.fdopen(fd, "r+b", buffering=0)
        self.error: OSError | None = None

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = 0) -> int:
        return self.file.seek(pos, whence)

    def tell(self) -> int:
        return self.file.tell()

    def readinto(self, b) -> int:
        try:
            return self.file.readinto(b)
        except OSError as exc:
            self.error = self.error or exc
            return 0

    def write(self, b) -> int:
        view = memoryview(b).cast("B")
        n, done = view.nbytes, 0
        try:
            while self.error is None and done < n:
                k = self.file.write(view[done:])
                if not k:
                    raise OSError(errno.EIO, "a write made no progress")
                done += k
        except OSError as exc:
            self.error = exc
        if done < n:
            self.file.seek(n - done, io.SEEK_CUR)   # dropped, as if written
        return n

    def truncate(self, size=None) -> int:
        if self.error is None:
            try:
                return self.file.truncate(size)
            except OSError as exc:
                self.error = exc
        return self.tell() if size is None else size

    def flush(self) -> None:
        """Writes are unbuffered."""

    def close(self) -> None:
        if not self.closed:
            self.file.close()
        super().close()


class DatasetWriter:
    """Append rows, then ``close()`` to publish ``path`` atomically; ``abort()`` (or an
    exception inside ``with``) removes the temporary file and leaves ``path`` untouched.

    ``DatasetWriter(path, dense_names, sparse_names)``; ``append(label (n,), dense (n, F_d),
    sparse (n, F_s))``; ``close(cardinalities, **attrs)`` = ``finish(cardinalities,
    **attrs)`` (the complete file under its temporary name) + ``publish()`` (the rename).
    A file that cannot be created or written (no such directory, no permission, a full
    disk) raises ``InputError`` naming ``path``.
    """

    def __init__(self, path: str, dense_names, sparse_names):
        self.path = os.fspath(path)
        self.dense_names, self.sparse_names = list(dense_names), list(sparse_names)
        try:
            self.tmp, fd = _create_temp(self.path)
        except OSError as exc:
            raise self._error(exc) from None
        self.sink = _Sink(fd)
        try:
            self.f = h5py.File(self.sink, "w")
            nd, ns = len(self.dense_names), len(self.sparse_names)
            self.label = self.f.create_dataset("label", (0,), np.float32, maxshape=(None,),
                                               chunks=(CHUNK_ROWS,))
            self.dense = self.f.create_dataset("dense", (0, nd), np.float32,
                                               maxshape=(None, nd),
                                               chunks=(CHUNK_ROWS, nd) if nd else None)
            self.sparse = self.f.create_dataset("sparse", (0, ns), np.int64,
                                                maxshape=(None, ns),
                                                chunks=(CHUNK_ROWS, ns) if ns else None)
            self._check()
        except BaseException as exc:
            self.abort()
            raise self._failed(exc) from None
        self.rows = 0

    def _error(self, exc: OSError):
        from .errors import InputError

        return InputError(f"{self.path}: cannot write: {exc.strerror or exc}")

    def _check(self) -> None:
        """Raise the sink's first write error, if any."""
        if self.sink.error is not None:
            raise self._error(self.sink.error)

    def _failed(self, exc: BaseException) -> BaseException:
        """What to raise for ``exc``, caught while writing: the write error behind it if
        there was one (HDF5 then fails in its own words: a bad read, a broken header)."""
        return self._error(self.sink.error) if self.sink.error is not None else exc

    def append(self, label, dense, sparse) -> None:
        n = len(label)
        if n == 0:
            return
        a, b = self.rows, self.rows + n
        try:
            for ds, arr in ((self.label, label), (self.dense, dense), (self.sparse, sparse)):
                ds.resize(b, axis=0)
                ds[a:b] = arr
        except Exception as exc:
            raise self._failed(exc) from None
        self._check()
        self.rows = b

    def finish(self, cardinalities, **attrs) -> None:
        """Write the attributes and close the file under its temporary name."""
        try:
            self.f.attrs["format_version"] = FORMAT_VERSION
            self.f.attrs["cardinalities"] = np.asarray(cardinalities, np.int64)
            self.f.attrs["field_names"] = np.array(self.dense_names + self.sparse_names,
                                                   dtype=h5py.string_dtype())
            for k, v in attrs.items():
                self.f.attrs[k] = v
            self.f.close()
        except Exception as exc:
            raise self._failed(exc) from None
        self._check()
        try:
            os.fsync(self.sink.file.fileno())   # a full disk may only tell here (NFS, quotas)
            self.sink.close()
        except OSError as exc:
            raise self._error(exc) from None

    def publish(self) -> None:
        """Rename the finished temporary file to ``path`` (atomic)."""
        try:
            os.replace(self.tmp, self.path)
        except OSError as exc:
            raise self._error(exc) from None

    def close(self, cardinalities, **attrs) -> None:
        self.finish(cardinalities, **attrs)
        self.publish()

    def abort(self) -> None:
        """Close and remove the temporary file (idempotent; never raises for I/O)."""
        try:
            f = getattr(self, "f", None)
            if f is not None and f.id.valid:
                f.close()
        except Exception:
            pass  # the sink never fails: an HDF5 complaint about a dropped write
        finally:
            self.sink.close()
            if os.path.lexists(self.tmp):
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


# -- a worker's batches ----------------------------------------------------------------------
WINDOW_ROWS = 8192    # HDF5: rows of this worker's upcoming steps planned together
MERGE_GAP = 1024      # HDF5: ranges closer than this are read as one span (gap rows too)
SPAN_ROWS = 2048      # HDF5: the longest span read in one call (unless one range is longer)


def worker_batches(dataset, plan: BatchPlan, start_step: int, n_steps: int, offset: int,
                   count: int, layout=None, depth: int = 0):
    """Yield ``(label, dense, ids)`` for steps ``start_step .. start_step + n_steps - 1``:
    virtual rows ``[t*G + offset, +count)`` of each step ``t`` (``plan.ranges``), with ``ids``
    (count, F) int64 the fused-table rows ``layout.offsets[f] + id`` (per-field ids when
    ``layout`` is None).

    ``dataset``: ``schema``, ``rows(start, stop)`` -> (label (n,), dense (n, F_d), sparse
    (n, F_s)); optional ``n_rows`` (absent: an endless stream) and ``validate(start, stop)``.
    Such a dataset takes the generic path: one ``rows`` call per physical range, label and
    dense as it returns them, new arrays every step. Fast paths, label and dense float32:
    ``SyntheticCTR`` (and anything with its ``fill``) generates only these rows, straight
    into the output with the offsets fused in; ``H5Dataset`` reads this worker's ranges of
    many steps at once (``WINDOW_ROWS``, one h5py call per dataset and span of nearby
    ranges) and copies each step out, adding the offsets on the way.

    Buffer contract (fast paths): batches live in a ring of ``depth + 3`` buffers, so the
    batch yielded i-th is overwritten when batch ``i + depth + 3`` is made. Consumed through
    ``prefetch(produce, n, depth)`` with the same ``depth`` (which makes at most ``depth + 1``
    batches beyond the one the consumer last received), a batch stays intact while its
    step runs and through the next one. Copy it to keep it longer.
    """
    offsets = np.zeros(dataset.schema.n_sparse, np.int64) if layout is None else \
        np.asarray(layout.offsets, np.int64)
    steps = range(start_step, start_step + max(n_steps, 0))
    if hasattr(dataset, "fill"):
        yield from _generated_batches(dataset, plan, steps, offset, count, offsets, depth)
    elif isinstance(dataset, H5Dataset):
        yield from _h5_batches(dataset, plan, steps, offset, count, offsets, depth)
    else:
        for step in steps:
            label, dense, sparse = read_ranges(dataset, plan.ranges(step, offset, count))
            yield label, dense, np.add(sparse, offsets, dtype=np.int64)


class _Ring:
    """``slots`` output buffers of one batch each: ``get(i)`` -> views of slot ``i % slots``
    (new view objects every time, so identity checks never mistake one batch for another)."""

    def __init__(self, slots: int, count: int, n_dense: int, n_sparse: int):
        self.label = np.empty((slots, count), np.float32)
        self.dense = np.empty((slots, count, n_dense), np.float32)
        self.ids = np.empty((slots, count, n_sparse), np.int64)
        self.slots = slots

    def get(self, i: int):
        s = i % self.slots
        return self.label[s], self.dense[s], self.ids[s]


def _generated_batches(dataset, plan, steps, offset, count, offsets, depth):
    from .schema import field_offsets

    sch = dataset.schema
    ring = _Ring(depth + 3, count, sch.n_dense, sch.n_sparse)
    fused = bool(np.array_equal(offsets, field_offsets(sch.cardinalities)))
    for i, step in enumerate(steps):
        label, dense, ids = ring.get(i)
        k = 0
        for a, b in plan.ranges(step, offset, count):
            dataset.fill(a, label[k:k + b - a], dense[k:k + b - a], ids[k:k + b - a], fused)
            k += b - a
        if not fused:
            ids += offsets
        yield label, dense, ids


def _h5_batches(ds, plan, steps, offset, count, offsets, depth):
    from h5py import h5d, h5p, h5s

    sch = ds.schema
    ring = _Ring(depth + 3, count, sch.n_dense, sch.n_sparse)
    handles = []
    for key in ("label", "dense", "sparse"):
        dapl = h5p.create(h5p.DATASET_ACCESS)
        if ds.f[key].id.get_create_plist().get_nfilters() == 0:  # (that handle is closed again)
            # Uncompressed: no chunk cache, so a read copies just its rows. With the default
            # 1 MiB cache, each new 16k-row chunk of /dense was read whole (~0.5 ms a call).
            # HDF5 shares one cache among a dataset's open handles: opened first, this sets it.
            dapl.set_chunk_cache(0, 0, 1.0)
        dsid = h5d.open(ds.f.id, key.encode(), dapl)
        handles.append((dsid, dsid.get_space(), {}))  # file space, memory spaces by shape
    bufs = [np.empty((0,) + d.shape[1:], d.dtype) for d, _, _ in handles]
    per_window = max(1, WINDOW_ROWS // max(count, 1))
    w = 0
    while w < len(steps):
        # A window: the next steps of one epoch (epochs may repeat rows: never mixed).
        first = steps[w]
        n = min(per_window, len(steps) - w)
        if plan.steps_per_epoch:
            n = min(n, plan.steps_per_epoch - first % plan.steps_per_epoch)
        ranges = [plan.ranges(first + j, offset, count) for j in range(n)]
        # Spans: the window's ranges sorted, nearby ones merged. where[(a, b)] = (its span,
        # its buffer row). A span is read when a step first needs it, so no step waits
        # for more than its own spans.
        spans, where, total = [], {}, 0
        for a, b in sorted(r for rs in ranges for r in rs):
            if spans and a - spans[-1][1] <= MERGE_GAP and b - spans[-1][0] <= SPAN_ROWS:
                total += a - spans[-1][1]
                spans[-1][1] = b
            else:
                spans.append([a, b, total, False])  # start, stop, buffer row, read yet
            where[(a, b)] = (spans[-1], total)
            total += b - a
        if bufs[0].shape[0] < total:
            bufs = [np.empty((total,) + d.shape[1:], d.dtype) for d, _, _ in handles]
        lb, db, sb = bufs
        for j, rs in enumerate(ranges):
            label, dense, ids = ring.get(w + j)
            k = 0
            for a, b in rs:
                span, p = where[(a, b)]
                if not span[3]:  # one read per dataset, straight into the buffers
                    for (dsid, fspace, mspaces), buf in zip(handles, bufs):
                        dest = buf[span[2]:span[2] + span[1] - span[0]]
                        if dest.size:  # (a file without dense or sparse columns: nothing)
                            fspace.select_hyperslab((span[0],) + (0,) * (buf.ndim - 1),
                                                    dest.shape)
                            mspace = mspaces.get(dest.shape)
                            if mspace is None:
                                mspace = mspaces[dest.shape] = h5s.create_simple(dest.shape)
                            dsid.read(mspace, fspace, dest)
                    span[3] = True
                m = b - a
                label[k:k + m] = lb[p:p + m]
                dense[k:k + m] = db[p:p + m]
                np.add(sb[p:p + m], offsets, out=ids[k:k + m])
                k += m
            yield label, dense, ids
        w += n


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
