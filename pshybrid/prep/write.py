"""Writing OUT (and the validation file): both published together at the end, or neither;
their room checked before a second pass writes (``check_room``)."""

from __future__ import annotations

import os
import stat

import numpy as np

from .. import safeio
from ..data import CHUNK_ROWS, DatasetWriter
from ..errors import ConfigError, InputError
from .options import SplitOptions


PREP_OUTPUT = {safeio.OUTPUT_ATTR: "prep"}   # what --overwrite may replace


class SplitWriter:
    """Rows ``0..n_train-1`` to ``out``, the later ones to ``valid`` (if any; set ``n_train``
    before the first ``append``). ``close`` finishes both, then publishes both; an exception
    inside ``with`` removes both (``DatasetWriter.abort``), so a failure leaves neither."""

    def __init__(self, out: str, valid: str | None, dense_names, sparse_names,
                 multi_hot_names=(), compression: str = "none"):
        self.n_train: int | None = None
        self.rows = [0, 0]
        self.compression = compression
        self.ids = 0  # the ids written, multi-hot items each one
        args = (dense_names, sparse_names, multi_hot_names, compression)
        self.writers = [DatasetWriter(out, *args)]
        if valid is not None:
            try:
                self.writers.append(DatasetWriter(valid, *args))
            except BaseException:
                self.writers[0].abort()
                raise

    def append(self, label, dense, sparse, bags=()) -> None:
        """label (n,), dense (n, F_d), sparse (n, F_s); bags: per multi-hot field
        ``(values (m,), lengths (n,))``."""
        done = sum(self.rows)
        self.ids += sparse.size + sum(len(v) for v, _ in bags)
        k = len(label) if self.n_train is None else min(max(self.n_train - done, 0), len(label))
        ends = [np.concatenate(([0], np.cumsum(n))) for _, n in bags]
        for i, (a, b) in enumerate(((0, k), (k, len(label)))):
            if b > a:
                part = [(v[e[a]:e[b]], n[a:b]) for (v, n), e in zip(bags, ends)]
                self.writers[i].append(label[a:b], dense[a:b], sparse[a:b], part)
                self.rows[i] += b - a

    def vocabulary(self, names: list[str], kept: list, seps: dict) -> None:
        """Store each field's kept values (``(bytes, offsets)``: ``vocabulary.stored``) in
        every file written; ``seps``: {multi-hot field: the separator of its items}."""
        for w in self.writers:
            for name, (data, offsets) in zip(names, kept):
                w.f.create_dataset(f"vocabulary/{name}/bytes", data=data)
                w.f.create_dataset(f"vocabulary/{name}/offsets", data=offsets)
                if name in seps:
                    w.f[f"vocabulary/{name}"].attrs["separator"] = seps[name]

    def check_room(self, rows: int, items: list[int], kept: list) -> None:
        """Refuse, before the second pass writes a row, ``rows`` rows (``n_train`` of them to
        OUT) that its disk or ``ulimit -f`` has no room for (``check_room``): each file's size
        from ``file_bytes``, each multi-hot field's ``items`` (in all) shared in proportion to
        the rows, every file storing the vocabulary ``kept`` ((bytes, offsets) a field).
        Not for a compressed file, whose size is not known before it is written."""
        if self.compression != "none":
            return
        parts = [rows] if self.n_train is None else [self.n_train, rows - self.n_train]
        stored = sum(a.nbytes for field in kept for a in field)
        # (the estimate is 1-4% under the file written: 5% and MARGIN more, so that no run
        # passes here to fail in the second pass)
        sizes = [file_bytes(n, len(w.dense_names), len(w.sparse_names),
                            [m * n // rows for m in items]) + stored
                 for w, n in zip(self.writers, parts)]
        check_room([(option, w.path, n, b + b // 20 + MARGIN) for option, w, n, b
                    in zip(("OUT", "--valid-out"), self.writers, parts, sizes)])

    def close(self, cardinalities, **attrs) -> None:
        for w in self.writers:
            w.finish(cardinalities, **attrs, **PREP_OUTPUT)
        for w in self.writers:
            w.publish()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *_):
        if exc_type is not None:
            for w in self.writers:
                w.abort()


def file_bytes(rows: int, n_dense: int, n_sparse: int, items: list[int]) -> int:
    """The data bytes of an uncompressed dataset file of ``rows`` rows as ``DatasetWriter``
    lays it out: a float32 label, ``n_dense`` float32 and ``n_sparse`` int64 values a row,
    each multi-hot field's ``items`` int64 values and rows + 1 int64 offsets; each dataset
    in whole chunks of CHUNK_ROWS entries (HDF5 allocates an uncompressed chunk whole)."""
    def chunked(n: int, width: int) -> int:
        return -(-n // CHUNK_ROWS) * CHUNK_ROWS * width

    return (chunked(rows, 4 * (1 + n_dense) + 8 * n_sparse)
            + sum(chunked(m, 8) + chunked(rows + 1, 8) for m in items))


MARGIN = 1 << 20  # check_room's bytes beyond a file's estimate (and 5%)


def check_room(files: list[tuple[str, str, int, int]]) -> None:
    """Refuse files ``(option, path, rows, bytes)`` that would not fit where they go: each
    file's bytes against ``ulimit -f``, those of the files on one disk together against its
    free space (``safeio.room_problem``), naming the file(s), the bytes and the room."""
    where = [os.path.dirname(os.path.abspath(path)) for _, path, _, _ in files]
    disks = [os.stat(d).st_dev for d in where]
    for f, d, disk in zip(files, where, disks):
        same = [g for g, other in zip(files, disks) if other == disk]
        for total, biggest, named in ((0, f[3], [f]), (sum(g[3] for g in same), 0, same)):
            if problem := safeio.room_problem(d, total, biggest):  # (ulimit -f, the disk)
                raise InputError(" and ".join(f"{o} {p} ({n:,} rows)" for o, p, n, _ in named)
                                 + f": cannot be written: {problem}; found before the second "
                                 "pass, nothing written (--compression lzf or gzip writes a "
                                 "smaller file)")


def check_out(path: str, option: str, overwrite: bool, inputs=()) -> None:
    """An output file ``path`` (given as ``option``) can be made: its directory exists and
    is writable, and ``safeio.check_output`` allows it (not one of the ``inputs`` ``(option,
    path)``, not inside a checkpoint directory, a new name, or with ``overwrite`` an earlier
    prep output)."""
    d = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(d):
        why = "is not a directory" if os.path.exists(d) else "does not exist"
        raise InputError(f"{option} {path}: directory {d} {why}")
    try:
        if stat.S_ISDIR(os.stat(path).st_mode):
            raise InputError(f"{option} {path}: is a directory")
    except FileNotFoundError:
        pass
    except OSError as exc:                          # a name too long, a link loop
        raise InputError(f"{option} {path}: {exc.strerror or exc}") from None
    if problem := safeio.check_writable_dir(d):  # (the temporary beside it, renamed)
        raise InputError(f"{option} {path}: {problem}")
    problem = safeio.check_output(path, option, inputs,
                                  existing=safeio.replaceable("prep", overwrite))
    if problem:
        raise ConfigError(problem, collective=True)


def valid_path(out: str, o: SplitOptions, inputs=()) -> str | None:
    """The validation file's path, or None without ``--valid-fraction``; checked like OUT
    (and not OUT)."""
    if not o.valid_fraction:
        return None
    valid = o.valid_out or (out[:-3] if out.endswith(".h5") else out) + ".valid.h5"
    if safeio.same_file(valid, out):
        raise ConfigError(f"--valid-out {valid} is the same file as OUT {out}: the validation "
                          "rows need a file of their own", collective=True)
    check_out(valid, "--valid-out", o.overwrite, inputs)
    return valid


def split_sizes(rows: int, o: SplitOptions) -> int | None:
    """Training rows of ``rows`` (None without a split); an InputError if either part would
    be empty."""
    if not o.valid_fraction:
        return None
    n_valid = round(o.valid_fraction * rows)
    if n_valid in (0, rows):
        part = "validation" if n_valid == 0 else "training"
        raise InputError(f"--valid-fraction {o.valid_fraction} of {rows} rows leaves no "
                         f"{part} rows")
    return rows - n_valid
