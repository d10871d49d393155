"""A worker's batches: which rows it reads at each step (``BatchPlan``), read or made into
reused buffers with the field offsets fused in (``worker_batches``), a step or two ahead on
a data thread where the rank has a spare core (``prefetch``)."""

from __future__ import annotations

import bisect

import numpy as np

from .data import SHUFFLE_BLOCK, H5Dataset
from .errors import ConfigError, InputError
from .files import H5Files, open_dataset
from .rawrows import h5_handles, raw_rows
from .rowcheck import check_bag_rows, check_rows
from .synthetic import SyntheticCTR


def global_batch(cfg, n_workers: int) -> int:
    """``G = W*b``: the samples one step trains on over all ``n_workers`` workers, each
    reading ``cfg.batch_size`` of them (the batch one process would need for the same step)."""
    return n_workers * cfg.batch_size


class BatchPlan:
    """Which rows each worker reads at each step.

    Epoch ``e`` visits the rows in a virtual order: with ``shuffle``, the blocks of
    ``SHUFFLE_BLOCK`` rows (the last one partial when the rows are not a multiple of it)
    permuted by ``numpy.random.default_rng([seed, e])``, reads contiguous within a block;
    else the file order. Global batch ``t`` of an epoch is virtual rows ``[t*G, (t+1)*G)``,
    ``G = W*b``; worker ``w`` reads ``[t*G + w*b, t*G + (w+1)*b)``. An epoch has
    ``n_rows // G`` steps: the last partial global batch is dropped (with ``shuffle``, other
    rows each epoch, the partial block included). Nothing depends on ``W`` or ``b`` except
    through ``G``, so one process with batch ``G`` reads the same rows.
    """

    def __init__(self, n_rows: int | None, global_batch: int, shuffle: bool, seed: int):
        self.n, self.G, self.shuffle, self.seed = n_rows, global_batch, shuffle, seed
        self.steps_per_epoch = None if n_rows is None else n_rows // global_batch
        self._perm = (None, None, 0)

    def _order(self, epoch: int):
        """(the epoch's block permutation, the position in it of the last block)."""
        if self._perm[0] != epoch:
            nb = -(-self.n // SHUFFLE_BLOCK)
            perm = np.random.default_rng([self.seed, epoch]).permutation(nb)
            self._perm = (epoch, perm, int(np.flatnonzero(perm == nb - 1)[0]) if nb else 0)
        return self._perm[1:]

    def _run(self, epoch: int, v: int) -> tuple[int, int]:
        """(the file row of virtual row ``v``, rows contiguous in the file from there)."""
        perm, p = self._order(epoch)
        B, last = SHUFFLE_BLOCK, len(perm) - 1
        L = self.n - last * B                      # the last block's rows (B unless partial)
        if p * B <= v < p * B + L:                 # inside the last block
            return last * B + v - p * B, p * B + L - v
        u = v if v < p * B else v - L + B          # as if every block before were full
        blk, within = divmod(u, B)
        return int(perm[blk]) * B + within, B - within

    def ranges(self, step: int, offset: int, count: int) -> list[tuple[int, int]]:
        """Physical row ranges of virtual rows ``[t*G + offset, +count)`` of step ``step``."""
        if self.n is None:  # endless stream
            a = step * self.G + offset
            return [(a, a + count)]
        epoch, t = divmod(step, self.steps_per_epoch)
        a = t * self.G + offset
        if not self.shuffle:
            return [(a, a + count)]
        out = []
        while count:
            s, run = self._run(epoch, a)
            n = min(count, run)
            if out and out[-1][1] == s:
                out[-1] = (out[-1][0], s + n)
            else:
                out.append((s, s + n))
            a, count = a + n, count - n
        return out


def read_ranges(dataset, ranges):
    """Concatenate ``dataset.rows`` over physical ranges: (label, dense, sparse), each
    part's shapes checked (a dataset of the Python API may return fewer rows or fields)."""
    parts = [_shaped(dataset, a, b, dataset.rows(a, b)) for a, b in ranges]
    if len(parts) == 1:
        return parts[0]
    return tuple(np.concatenate(p) for p in zip(*parts))


def _shaped(dataset, a: int, b: int, got):
    """``got``, what ``dataset.rows(a, b)`` returned, as arrays, if it is (label (n,),
    dense (n, F_d), sparse (n, F_s)) with n = b - a, of numbers, numbers and integer ids
    (made int64); else ``InputError`` naming the dataset and the rows."""
    sch = dataset.schema
    want = ((b - a,), (b - a, sch.n_dense), (b - a, sch.n_single))
    try:
        shapes = tuple(np.shape(x) for x in got) if isinstance(got, (tuple, list)) else None
    except ValueError:  # (ragged lists)
        shapes = None
    if shapes != want:
        raise InputError(f"{_name(dataset)}: rows({a}, {b}) returned arrays of shapes "
                         f"{shapes}, not (label, dense, sparse) of shapes {want}")
    label, dense, sparse = (np.asarray(x) for x in got)  # (lists: as arrays)
    if label.dtype.kind not in "biuf" or dense.dtype.kind not in "biuf" or \
            sparse.dtype.kind not in "iu":  # (float ids were "outside" ranges they were in)
        raise InputError(f"{_name(dataset)}: rows({a}, {b}) returned arrays of dtypes "
                         f"({label.dtype}, {dense.dtype}, {sparse.dtype}), not (label, dense, "
                         "sparse) of numbers, numbers and integer ids (int64)")
    return label, dense, sparse.astype(np.int64, copy=False)


def training_data(cfg, dataset, opened: list):
    """The data a run trains on, as ``train`` and ``--mode auto``'s probe open it:
    ``dataset`` (the Python API's, checked: ``python_dataset``), else ``--data``'s files
    (appended to ``opened``, to close), else the synthetic stream of ``--seed``."""
    if dataset is not None:
        return python_dataset(dataset, cfg.data)
    if cfg.data:
        opened.append(open_dataset(cfg.data))
        return opened[-1]
    return SyntheticCTR(seed=cfg.seed)


def python_dataset(dataset, data: str | None):
    """``dataset``, ``train``'s ``dataset=`` argument, if it has what reading needs
    (``docs/data.md``: a ``Schema``, ``rows``, ``n_rows`` absent or a count, ``bags``
    with multi-hot fields) and no other ``--data`` was given beside it (that file would be
    recorded as read); else a ConfigError naming what is missing."""
    from .schema import Schema

    name, n = _name(dataset), getattr(dataset, "n_rows", None)
    problem = (f"cfg.data {data!r} and dataset= both given: give one" if data and
               getattr(dataset, "path", None) != data else  # (not that file, opened)
               "its schema is not a pshybrid.schema.Schema" if not isinstance(
                   getattr(dataset, "schema", None), Schema) else
               "it has no rows(start, stop) method" if not callable(
                   getattr(dataset, "rows", None)) else
               f"its n_rows {n!r} is not a count of rows" if n is not None and (
                   not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 0) else
               "its schema has multi-hot fields and it has no bags(start, stop) method"
               if dataset.schema.multi_hot and not callable(getattr(dataset, "bags", None))
               else None)
    if problem:
        raise ConfigError(f"{name}: {problem} (a dataset for train: docs/data.md)",
                          collective=True)
    return dataset


def _name(dataset) -> str:
    """How errors name a dataset: its path, else its class."""
    return getattr(dataset, "path", None) or f"dataset {type(dataset).__name__}"


def checked(dataset, ranges, label, dense, ids, lo=0):
    """The batch of ``ranges``, ``ids`` (n, F_s) with ``lo`` added, if its labels are 0 or
    1, its dense values finite and each field's ids in ``[0, cardinality)``; else
    ``InputError`` naming the dataset, the field and the dataset row (``rowcheck.check_rows``,
    vectorised, once per batch). Files were checked when opened; other datasets are here."""
    check_rows(_name(dataset), dataset.schema, label, dense, ids, _row_of(ranges), lo)
    return label, dense, ids


def _row_of(ranges):
    """The dataset row of position ``i`` of a batch read from ``ranges``: ``row_of(i)``."""
    starts = np.cumsum([0] + [b - a for a, b in ranges])

    def row_of(i):
        k = int(np.searchsorted(starts, i, side="right")) - 1
        return ranges[k][0] + i - int(starts[k])
    return row_of


def _is_file(dataset) -> bool:
    return isinstance(dataset, (H5Dataset, H5Files))


def read_ids(dataset, ranges, offsets):
    """Rows in ``ranges`` with fused-table ids (``offsets`` (F,) of each field): ``(label,
    dense, ids (n, F))``; with multi-hot fields ``(label, dense, ids, lengths)``: ``ids`` flat
    (n * F1 + M,), the ``F1`` single-hot ids row by row, then multi-hot field 0's ids of
    every row (row 0's first), field 1's, ...; ``lengths`` (n, K) int64 the ids of each row
    and multi-hot field (>= 1)."""
    label, dense, sparse = read_ranges(dataset, ranges)
    if not _is_file(dataset):  # (files: checked when opened)
        checked(dataset, ranges, label, dense, sparse)
    single = np.add(sparse, offsets[:sparse.shape[1]], dtype=np.int64)
    if not getattr(dataset.schema, "multi_hot", 0):
        return label, dense, single
    return (label, dense, *_bagged(dataset, ranges, single, offsets))


def _bagged(dataset, ranges, single, offsets):
    """``(ids, lengths)`` of ``read_ids``: ``single`` (n, F1) fused single-hot ids, then the
    multi-hot fields' ids of the rows in ``ranges``."""
    parts = [dataset.bags(a, b) for a, b in ranges]
    bags = [tuple(np.concatenate(x) for x in zip(*field)) for field in zip(*parts)]
    if not _is_file(dataset):
        check_bag_rows(_name(dataset), dataset.schema, bags, _row_of(ranges))
    f1 = single.shape[1]
    ids = np.concatenate([single.ravel()] + [np.add(v, offsets[f1 + k], dtype=np.int64)
                                             for k, (v, _) in enumerate(bags)])
    return ids, np.stack([n for _, n in bags], axis=1)


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
    ``SyntheticCTR`` (and anything with its ``fill``, unless it overrides ``rows``: see
    ``fills``) generates only these rows, straight into the output with the offsets fused
    in. Every batch but a file's (checked when opened) or ``SyntheticCTR.fill``'s is
    checked (``checked``: shapes, labels, dense values, each field's id range).
    ``H5Dataset``: an uncompressed file's rows are read straight into each step's buffers
    (``rawrows``, one ``preadv`` per dataset and range); a compressed file's ranges of many
    steps are read at once (``WINDOW_ROWS``, one h5py call per dataset and span of nearby
    ranges) and each step copied out; the offsets are added on the way.

    A dataset with multi-hot fields (``schema.multi_hot``) yields ``(label, dense, ids,
    lengths)`` as ``read_ids`` makes them (flat ids; new arrays every step).

    Buffer contract (fast paths): batches live in a ring of ``depth + 3`` buffers, so the
    batch yielded i-th is overwritten when batch ``i + depth + 3`` is made. Consumed through
    ``prefetch(produce, n, depth)`` with the same ``depth`` (which makes at most ``depth + 1``
    batches beyond the one the consumer last received), a batch stays intact while its
    step runs and through the next one. Copy it to keep it longer.
    """
    offsets = np.zeros(dataset.schema.n_sparse, np.int64) if layout is None else \
        np.asarray(layout.offsets, np.int64)
    steps = range(start_step, start_step + max(n_steps, 0))
    if getattr(dataset.schema, "multi_hot", 0) and _is_file(dataset):
        # the single-hot part through the windowed reads, the multi-hot ids per step
        f1 = dataset.schema.n_single
        for step, (label, dense, ids) in zip(steps, _h5_batches(
                dataset, plan, steps, offset, count, offsets[:f1], depth)):
            yield (label, dense, *_bagged(dataset, plan.ranges(step, offset, count), ids,
                                          offsets))
    elif getattr(dataset.schema, "multi_hot", 0):
        for step in steps:
            yield read_ids(dataset, plan.ranges(step, offset, count), offsets)
    elif _is_file(dataset):
        yield from _h5_batches(dataset, plan, steps, offset, count, offsets, depth)
    elif fills(dataset):
        yield from _generated_batches(dataset, plan, steps, offset, count, offsets, depth)
    else:
        for step in steps:
            ranges = plan.ranges(step, offset, count)
            label, dense, sparse = checked(dataset, ranges, *read_ranges(dataset, ranges))
            yield label, dense, np.add(sparse, offsets, dtype=np.int64)


def fills(dataset) -> bool:
    """Whether ``dataset.fill`` makes its batches: its class has one, and the ``rows`` it
    would bypass is not overridden below the class that defines ``fill`` (a ``SyntheticCTR``
    subclass with its own ``rows`` is read through that ``rows``)."""
    mro = type(dataset).__mro__
    at = [next((i for i, c in enumerate(mro) if name in vars(c)), len(mro))
          for name in ("fill", "rows")]
    return at[0] < len(mro) and at[1] >= at[0] and "rows" not in getattr(dataset, "__dict__", {})


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
    from .synthetic import SyntheticCTR

    sch = dataset.schema
    ring = _Ring(depth + 3, count, sch.n_dense, sch.n_sparse)
    fused = bool(np.array_equal(offsets, field_offsets(sch.cardinalities)))
    # the library's own generator makes valid rows by construction (tests/test_synthetic.py):
    # unchecked (a check would cost CPU every batch for nothing); another fill is checked
    # like any dataset
    own = type(dataset).fill is SyntheticCTR.fill
    for i, step in enumerate(steps):
        label, dense, ids = ring.get(i)
        k = 0
        for a, b in plan.ranges(step, offset, count):
            dataset.fill(a, label[k:k + b - a], dense[k:k + b - a], ids[k:k + b - a], fused)
            k += b - a
        if not fused:
            ids += offsets
        yield (label, dense, ids) if own else \
            checked(dataset, plan.ranges(step, offset, count), label, dense, ids, offsets)


def _read_span(part, handles, bufs, span, base: int = 0) -> None:
    """One read per dataset of rows ``span[0]:span[1]`` of file ``part`` (an ``H5Dataset``
    whose first row is row ``base`` of the dataset), straight into ``bufs`` at row
    ``span[2]``; a failed read or a file changed since it was opened raises ``InputError``
    naming it (``H5Dataset.check_unchanged``)."""
    from h5py import h5s

    def read():
        for (dsid, fspace, mspaces), buf in zip(handles, bufs):
            dest = buf[span[2]:span[2] + span[1] - span[0]]
            if dest.size:  # (a file without dense or sparse columns: nothing)
                fspace.select_hyperslab((span[0] - base,) + (0,) * (buf.ndim - 1), dest.shape)
                mspace = mspaces.get(dest.shape)
                if mspace is None:
                    mspace = mspaces[dest.shape] = h5s.create_simple(dest.shape)
                dsid.read(mspace, fspace, dest)
    part._read(read)
    span[3] = True


def _h5_batches(ds, plan, steps, offset, count, offsets, depth):
    sch = ds.schema
    ring = _Ring(depth + 3, count, sch.n_dense, len(offsets))
    # Several files (H5Files): ranges split at the files' bounds, spans within one file.
    bounds = getattr(ds, "bounds", [0, ds.n_rows])
    parts = getattr(ds, "parts", [ds])
    handles = [h5_handles(d) for d in parts]
    raws = [raw_rows(d, h) for d, h in zip(parts, handles)]
    if all(raws):
        yield from _raw_batches(plan, steps, offset, count, offsets, ring, bounds, parts, raws)
        return
    bufs = [np.empty((0,) + d.shape[1:], d.dtype) for d, _, _ in handles[0]]
    per_window = max(1, WINDOW_ROWS // max(count, 1))
    w = 0
    while w < len(steps):
        # A window: the next steps of one epoch (epochs may repeat rows: never mixed).
        first = steps[w]
        n = min(per_window, len(steps) - w)
        if plan.steps_per_epoch:
            n = min(n, plan.steps_per_epoch - first % plan.steps_per_epoch)
        ranges = [_at_bounds(plan.ranges(first + j, offset, count), bounds) for j in range(n)]
        # Spans: the window's ranges sorted, nearby ones merged. where[(a, b)] = (its span,
        # its buffer row). A span is read when a step first needs it, so no step waits
        # for more than its own spans.
        spans, where, total = [], {}, 0
        for a, b in sorted(r for rs in ranges for r in rs):
            f = bisect.bisect_right(bounds, a) - 1
            if spans and spans[-1][4] == f and a - spans[-1][1] <= MERGE_GAP and \
                    b - spans[-1][0] <= SPAN_ROWS:
                total += a - spans[-1][1]
                spans[-1][1] = b
            else:
                spans.append([a, b, total, False, f])  # start, stop, buffer row, read, file
            where[(a, b)] = (spans[-1], total)
            total += b - a
        if bufs[0].shape[0] < total:
            bufs = [np.empty((total,) + d.shape[1:], d.dtype) for d, _, _ in handles[0]]
        lb, db, sb = bufs
        for j, rs in enumerate(ranges):
            label, dense, ids = ring.get(w + j)
            k = 0
            for a, b in rs:
                span, p = where[(a, b)]
                if not span[3]:
                    _read_span(parts[span[4]], handles[span[4]], bufs, span,
                               bounds[span[4]])
                m = b - a
                label[k:k + m] = lb[p:p + m]
                dense[k:k + m] = db[p:p + m]
                np.add(sb[p:p + m], offsets, out=ids[k:k + m])
                k += m
            yield label, dense, ids
        w += n


def _raw_batches(plan, steps, offset, count, offsets, ring, bounds, parts, raws):
    """Uncompressed files (``rawrows``): each step's ranges read straight into its ring
    slot, one ``preadv`` per dataset and range (and chunk it crosses), the offsets added
    in place; every read checked as HDF5's are (``H5Dataset._read``)."""
    for i, step in enumerate(steps):
        bufs, k, pieces = ring.get(i), 0, {}  # pieces: file -> [(its row, batch row, rows)]
        for a, b in _at_bounds(plan.ranges(step, offset, count), bounds):
            f = bisect.bisect_right(bounds, a) - 1
            pieces.setdefault(f, []).append((a - bounds[f], k, b - a))
            k += b - a
        for f, got in pieces.items():  # one check of the file for all its reads
            parts[f]._read(lambda: _read_pieces(raws[f], bufs, got, offsets))
        yield bufs


def _read_pieces(raws, bufs, pieces, offsets) -> None:
    for a, k, n in pieces:
        for r, buf in zip(raws, bufs):
            r.read(a, buf[k:k + n])
        ids = bufs[2][k:k + n]
        np.add(ids, offsets, out=ids)  # (while its rows are in cache)


def _at_bounds(ranges, bounds):
    """``ranges`` split where a file of the dataset ends (``bounds``: the first rows)."""
    if len(bounds) <= 2:
        return ranges
    out = []
    for a, b in ranges:
        for cut in bounds[bisect.bisect_right(bounds, a):bisect.bisect_left(bounds, b)]:
            out.append((a, cut))
            a = cut
        out.append((a, b))
    return out


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


class Upcoming:
    """The loop's next batch ``(label, dense, ids, bags, Batch)``: ``make()`` reads it and
    prepares its ``Batch`` (dedup, owners, datatypes) unless that is done; ``take()`` hands
    it over, made now if nothing made it earlier. ``Mode.update`` calls ``make`` while
    the servers apply a step, so input and planning overlap that wait on any rank."""

    def __init__(self, batches, mode):
        self.batches, self.mode, self.item = batches, mode, None

    def make(self) -> None:
        if self.item is not None:
            return
        with self.mode.timers.time("data"):  # (its planning too, as on the data thread)
            label, dense, ids, bags, batch = next(self.batches)
            if batch is None:  # not made ahead on the data thread
                batch = self.mode.prepare(ids)
        self.item = (label, dense, ids, bags, batch)

    def take(self):
        self.make()
        item, self.item = self.item, None
        return item

    def drop(self) -> None:
        """The loop ends early: free a batch made for a step that will not run."""
        if self.item is not None:
            self.item[-1].release()
            self.item = None
