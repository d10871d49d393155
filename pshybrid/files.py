"""A dataset of several files (``--data a.h5,b.h5`` or a directory): their rows read as one
table, the files' rows one after the other in the order given (a directory: its ``*.h5``
files sorted by name). Every file must have the same fields and cardinalities."""

from __future__ import annotations

import os

import h5py
import numpy as np

from .data import H5Dataset
from .errors import InputError
from .safeio import same_file


def dataset_paths(spec: str) -> list[str]:
    """The files of ``--data`` text: a comma list of files and directories."""
    paths = []
    for part in spec.split(","):
        if not part:
            raise InputError(f"{spec!r}: an empty file name in the list")
        if os.path.isdir(part):
            found = sorted(n for n in os.listdir(part) if n.endswith(".h5")
                           and os.path.isfile(os.path.join(part, n)))
            if not found:
                raise InputError(f"{part}: a directory without *.h5 files")
            paths += [os.path.join(part, n) for n in found]
        else:
            paths.append(part)
    return paths


def taken_in(out: str, spec: str) -> str | None:
    """The directory of ``--data`` text ``spec`` whose ``*.h5`` would take in the output
    ``out`` (it would be read as a part of the dataset the next time), or None."""
    where = os.path.realpath(os.path.dirname(os.path.abspath(out)))
    return next((part for part in spec.split(",") if out.endswith(".h5")
                 and os.path.isdir(part) and os.path.realpath(part) == where), None)


def scan_key(d) -> tuple[int, int, int] | None:
    """(inode, size, modification time in ns) of dataset file ``d`` as opened: what a
    checkpoint records of a file its run scanned, which a resume on it unchanged scans no
    more. None where a key it reads lies in another file (an external link, external
    storage, a virtual dataset: changed unseen) or for a Python dataset: always scanned."""
    if not hasattr(d, "stamp") or d.linked:
        return None
    outside = []
    d.f.visititems(lambda name, o: outside.append(name) if isinstance(o, h5py.Dataset) and (
        o.external or o.is_virtual) else None)
    return None if outside else tuple(d.stamp[1:4])


def scan_keys(d) -> list[tuple[int, int, int]]:
    """``scan_key`` of each file of dataset ``d`` that has one."""
    return [k for p in getattr(d, "parts", [d]) if (k := scan_key(p)) is not None]


def validate_unscanned(d, start: int, stop: int, skip=frozenset()) -> None:
    """``validate`` rows ``[start, stop)`` of dataset ``d``, but not those of a file whose
    ``scan_key`` is in ``skip`` (a resumed run's checkpoint's: scanned, unchanged since)."""
    for p, a, b in d._pieces(start, stop) if hasattr(d, "parts") else [(d, start, stop)]:
        key = scan_key(p)
        if key is None or key not in skip:
            p.validate(a, b)


def not_trained_on(eval_spec: str, data_spec: str) -> None:
    """An InputError if a file of --eval-data comes into --data through a directory (its
    ``*.h5`` take in the ``OUT.valid.h5`` that ``prep --valid-fraction`` writes beside OUT);
    a file or directory named in both lists is the user's choice (a training set's AUC)."""
    named = {os.path.realpath(part) for part in eval_spec.split(",")}
    listed = [p for part in data_spec.split(",")
              if os.path.isdir(part) and os.path.realpath(part) not in named
              for p in dataset_paths(part)]
    for e in dataset_paths(eval_spec):
        for t in listed:
            if same_file(e, t):
                raise InputError(f"--eval-data {e} is also a training file (--data "
                                 f"{data_spec} takes in {t}): the evaluation would score rows "
                                 "the model trained on. Move it out of that directory, or "
                                 "list --data's files")


UNLABELED = "unlabeled"  # a file's attribute: 1 = its /label holds no labels (zeros)


def open_dataset(spec: str, labels: bool = True):
    """``H5Dataset`` of one file, ``H5Files`` of several. ``labels``: refuse a file marked
    unlabeled (``prep --unlabeled``), as training and evaluation must."""
    paths = dataset_paths(spec)
    data = H5Dataset(paths[0]) if len(paths) == 1 else H5Files(paths)
    try:
        for d in getattr(data, "parts", [data]):
            if is_unlabeled(d) and labels:
                refuse_unlabeled(d, "predict scores such a file")
    except BaseException:
        data.close()
        raise
    return data


def refuse_unlabeled(d: H5Dataset, instead: str) -> None:
    """An InputError naming file ``d``, marked unlabeled, for a pass that needs its labels;
    ``instead``: what reads such a file."""
    raise InputError(f"{d.path}: its rows have no labels (attribute {UNLABELED} = 1, as prep "
                     f"--unlabeled writes): training and evaluation need them; {instead}")


def is_unlabeled(d: H5Dataset) -> bool:
    """Whether file ``d`` is marked unlabeled (its attribute ``UNLABELED``: 0 or 1)."""
    value = np.asarray(d.f.attrs.get(UNLABELED, 0))
    if value.ndim or value.dtype.kind not in "biu" or int(value) not in (0, 1):
        raise InputError(f"{d.path}: attribute {UNLABELED} is {value.tolist()!r}, not 0 or 1")
    return bool(value)


class H5Files:
    """Files read as their concatenation: row ``r`` is row ``r - bounds[i]`` of file ``i``
    for ``bounds[i] <= r < bounds[i + 1]``. The same interface as ``H5Dataset`` (``schema``,
    ``n_rows``, ``rows``, ``bags``, ``validate``, ``close``); errors name the file and its
    own row."""

    def __init__(self, paths: list[str]):
        self.parts: list[H5Dataset] = []
        try:
            for p in paths:
                self.parts.append(H5Dataset(p))
                first, d = self.parts[0], self.parts[-1]
                why = first.schema.difference(d.schema, first.path, d.path)
                if why is not None:
                    raise InputError(f"{d.path}: its fields differ from {first.path}'s: "
                                     f"{why}")
        except BaseException:
            self.close()
            raise
        self.path = ",".join(paths)
        self.schema = self.parts[0].schema
        self.bounds = np.cumsum([0] + [d.n_rows for d in self.parts]).tolist()
        self.n_rows = self.bounds[-1]

    def _pieces(self, start: int, stop: int):
        """``(file, first, stop)`` of rows ``[start, stop)``, in order, file rows."""
        for d, a, b in zip(self.parts, self.bounds[:-1], self.bounds[1:]):
            if a < stop and start < b:
                yield d, max(start, a) - a, min(stop, b) - a

    def rows(self, start: int, stop: int):
        """Rows ``[start, stop)``: label (n,) float32, dense (n, F_d), sparse (n, F_s)."""
        parts = [d.rows(a, b) for d, a, b in self._pieces(start, stop)]
        if len(parts) == 1:
            return parts[0]
        return tuple(np.concatenate(p) for p in zip(*parts))

    def bags(self, start: int, stop: int):
        """Rows ``[start, stop)`` of each multi-hot field: (values, lengths)."""
        parts = [d.bags(a, b) for d, a, b in self._pieces(start, stop)]
        return [tuple(np.concatenate(x) for x in zip(*field)) for field in zip(*parts)]

    @property
    def n_ids(self) -> int:
        return sum(d.n_ids for d in self.parts)

    @property
    def compression(self) -> str | None:
        """The first compressed file's filter, None if none is."""
        return next((d.compression for d in self.parts if d.compression), None)

    def validate(self, start: int, stop: int) -> None:
        for d, a, b in self._pieces(start, stop):
            d.validate(a, b)

    def close(self) -> None:
        for d in self.parts:
            d.close()
