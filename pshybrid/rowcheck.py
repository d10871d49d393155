"""Value checks of a dataset's rows as read: labels in {0, 1}, finite dense values, ids in
their field's range, multi-hot rows with at least one id; an ``InputError`` names the
dataset, the key (the field) and the first bad row. ``data.H5Dataset.validate`` scans a
file's rows with them when it is opened; ``batches.checked`` checks a custom dataset's
every batch. Also the structure of a multi-hot field's keys (``check_bags``), and how a
file changed while it was read (``file_change``)."""

from __future__ import annotations

import sys

import h5py
import numpy as np

from .errors import InputError
from .schema import Schema


def check_rows(where: str, schema: Schema, label, dense, sparse, row_of, lo=0) -> None:
    """Rows as read: raise ``InputError`` naming ``where``, the key, the field and the first
    bad row (``row_of(i)``: the dataset row of position ``i``) for a label outside {0, 1},
    a NaN or infinite dense value, a single-hot id outside ``[0, cardinality)``. ``lo``:
    (F_s,) the fused-table offsets already added to ``sparse``. Vectorised: a pass over each
    key (the dense values' float64 sum: finite iff they all are); the rows only if one fails."""
    cards = np.asarray(schema.cardinalities[:schema.n_single], np.int64)
    # id - lo as unsigned: >= cards also for id < lo (no wrap: lo + cards < 2**63)
    out = (np.subtract(sparse, lo) if np.any(lo) else sparse).view(np.uint64) >= cards
    with np.errstate(invalid="ignore"):  # (inf - inf: the NaN that says so, no warning)
        finite = np.isfinite(dense.sum(dtype=np.float64))
    if finite and not out.any() and \
            np.count_nonzero(label == 0) + np.count_nonzero(label == 1) == label.size:
        return
    checks = (("label", (label != 0) & (label != 1), "a label outside {0, 1}"),
              ("dense", ~np.isfinite(dense).all(axis=1), "a NaN or infinite value"),
              ("sparse", out.any(axis=1), "an id outside [0, cardinality)"))
    for key, bad, what in checks:
        if bad.any():
            r = int(np.flatnonzero(bad)[0])
            detail = f": {label[r]}" if key == "label" else ""
            if key == "sparse":
                f = int(np.flatnonzero(out[r])[0])
                detail = (f": field {schema.sparse_names[f]} id "
                          f"{int(sparse[r, f]) - int(np.broadcast_to(lo, cards.shape)[f])}, "
                          f"cardinality {cards[f]}")
            raise InputError(f"{where}: /{key} row {row_of(r)} has {what}{detail}")


def check_bag_rows(where: str, schema: Schema, bags, row_of) -> None:
    """Multi-hot rows as read (``bags``: per multi-hot field ``(values (m,), lengths (n,))``):
    integers, at least one id each, ids in ``[0, cardinality)``, else ``InputError`` naming
    ``where``, the field and the dataset row (``row_of(i)`` of position ``i``)."""
    for k, (values, lengths) in enumerate(bags):
        name, card = (x[schema.n_single + k] for x in (schema.sparse_names, schema.cardinalities))
        at = f"{where}: /multi_hot/{name}"
        kinds = (np.asarray(values).dtype.kind, np.asarray(lengths).dtype.kind)
        if not set(kinds) <= set("iu"):  # (float ids were cast in, or failed the cast)
            raise InputError(f"{at}: values and lengths of dtypes {np.asarray(values).dtype}, "
                             f"{np.asarray(lengths).dtype}: integer ids and counts")
        if np.shape(values) != (int(np.sum(lengths)),) or np.ndim(lengths) != 1:
            raise InputError(f"{at}: values of shape {np.shape(values)} for lengths summing "
                             f"to {int(np.sum(lengths))}")
        if (lengths < 1).any():
            i = int(np.flatnonzero(lengths < 1)[0])
            why = ("has no id (every row needs one)" if lengths[i] == 0 else
                   f"has {int(lengths[i])} ids: the offsets decrease there (they must rise)")
            raise InputError(f"{at}/offsets row {row_of(i)} {why}")
        bad = (values < 0) | (values >= card)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            r = row_of(int(np.searchsorted(np.cumsum(lengths), i, side="right")))
            raise InputError(f"{at}/values row {r} has an id outside [0, cardinality): "
                             f"{values[i]}, cardinality {card}")


def check_bags(f, path: str, name: str, n_rows: int):
    """``(values, offsets)`` datasets of multi-hot field ``name``: 1-D int64, offsets of
    ``n_rows + 1`` entries from 0 to len(values)."""
    got = []
    for key in ("values", "offsets"):
        ds = f.get(f"multi_hot/{name}/{key}")
        if not isinstance(ds, h5py.Dataset) or ds.ndim != 1 or ds.dtype != np.int64:
            found = "missing" if ds is None else f"found {ds.__class__.__name__.lower()}" + (
                f" of {ds.ndim}-D {ds.dtype}" if isinstance(ds, h5py.Dataset) else "")
            raise InputError(f"{path}: /multi_hot/{name}/{key} must be a 1-D int64 dataset "
                             f"({found})")
        got.append(ds)
    values, offsets = got
    if offsets.shape[0] != n_rows + 1 or offsets[0] != 0 or offsets[-1] != values.shape[0]:
        raise InputError(f"{path}: /multi_hot/{name}/offsets must hold {n_rows + 1} entries "
                         f"from 0 to {values.shape[0]} (the length of values)")
    return values, offsets


_TOUCHED: set = set()  # (device, inode) of the files whose new modification time was told


def file_change(was: tuple, now: tuple | None, here: tuple | None, name: str) -> str | None:
    """How file ``name`` stamped ``was`` changed: ``now`` its open file's stamp, ``here`` the
    (device, inode) at its path (None: removed); None if it did not. A new modification
    time alone is one warning per file and process: ``touch`` (which keeps scratch files
    from a purge) changes nothing read, and a run stopped for it lost its work since its
    checkpoint."""
    if here is not None and here == was[:2] and now[2] == was[2]:
        if now[3] != was[3] and was[:2] not in _TOUCHED:
            _TOUCHED.add(was[:2])
            sys.stderr.write(f"pshybrid: warning: {name}: its modification time changed while "
                             "it was read (the same file and size: touch?); training goes on "
                             "reading it as it is now\n")
        return None
    return ("removed" if here is None else "replaced by another file"
            if here != was[:2] else f"now {now[2]} bytes, was {was[2]}")
