"""Writing OUT (and the validation file): both published together at the end, or neither."""

from __future__ import annotations

import os

from ..data import DatasetWriter
from ..errors import ConfigError, InputError
from .options import SplitOptions


def _writer(path: str, dense_names, sparse_names) -> DatasetWriter:
    try:
        return DatasetWriter(path, dense_names, sparse_names)
    except OSError as exc:
        raise InputError(f"{path}: cannot write: {exc}") from None


class SplitWriter:
    """Rows ``0..n_train-1`` to ``out``, the later ones to ``valid`` (if any). ``close``
    publishes both; an exception inside ``with`` removes both (DatasetWriter.abort)."""

    def __init__(self, out: str, valid: str | None, n_train: int | None, dense_names,
                 sparse_names):
        self.n_train, self.rows = n_train, [0, 0]
        self.writers = [_writer(out, dense_names, sparse_names)]
        if valid is not None:
            try:
                self.writers.append(_writer(valid, dense_names, sparse_names))
            except BaseException:
                self.writers[0].abort()
                raise

    def append(self, label, dense, sparse) -> None:
        """label (n,), dense (n, F_d), sparse (n, F_s)."""
        done = sum(self.rows)
        k = len(label) if self.n_train is None else min(max(self.n_train - done, 0), len(label))
        for i, (a, b) in enumerate(((0, k), (k, len(label)))):
            if b > a:
                self.writers[i].append(label[a:b], dense[a:b], sparse[a:b])
                self.rows[i] += b - a

    def close(self, cardinalities, **attrs) -> None:
        for w in self.writers:
            w.close(cardinalities, **attrs)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *_):
        if exc_type is not None:
            for w in self.writers:
                w.abort()


def check_out(path: str, option: str) -> None:
    d = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(d):
        raise InputError(f"{option} {path}: directory {d} does not exist")
    if os.path.isdir(path):
        raise InputError(f"{option} {path}: is a directory")


def valid_path(out: str, o: SplitOptions) -> str | None:
    """The validation file's path, or None without ``--valid-fraction``."""
    if not o.valid_fraction:
        return None
    valid = o.valid_out or (out[:-3] if out.endswith(".h5") else out) + ".valid.h5"
    if os.path.abspath(valid) == os.path.abspath(out):
        raise ConfigError(f"--valid-out {valid}: the same file as OUT", collective=True)
    check_out(valid, "--valid-out")
    return valid

