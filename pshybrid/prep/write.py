"""Writing OUT (and the validation file): both published together at the end, or neither."""

from __future__ import annotations

import os
import stat

import numpy as np

from .. import safeio
from ..data import DatasetWriter
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
