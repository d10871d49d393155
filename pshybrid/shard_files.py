"""A checkpoint's shard files read and checked (``docs/checkpoints.md``): each file's keys,
kinds and shapes (``shard_layout``), its ids (in the table's range, each of a reader's rows
exactly once, every one present: ``_Rows``, with no sort where they come as training writes
them) and its values (finite, their checksums), read a chunk of rows at a time
(``read_shards``: resume, ``--init-from``, ``eval`` / ``predict``, a whole-table
``export``)."""

from __future__ import annotations

import os

import h5py
import numpy as np

from . import partition
from .checkpoint_files import DAMAGE, bad_key, open_h5
from .checksums import CRC_ATTR, Sums
from .errors import InputError

CHUNK_ROWS = 1 << 18


class _Rows:
    """Checks the ids of the shards one reader reads: each in [0, rows), each of this
    reader's rows (``r % n == me``: every row where n = 1) in exactly one place, and, at the
    end, every one of them present (a bitset over its rows: rows/n/8 bytes)."""

    def __init__(self, rows: int, n: int = 1, me: int = 0):
        self.rows, self.n, self.me, self.count = rows, n, me, 0
        self.want = partition.shard_rows(rows, n, me)
        self.bits = np.zeros((self.want + 7) // 8, np.uint8)
        self.ordered = True  # every id so far the next of this reader's rows (bits not set)

    def add(self, fpath: str, ids: np.ndarray, first: int) -> None:
        c = self.count  # (the rows as training writes them: in range, each once, no sort)
        if self.ordered and c + ids.size <= self.want and np.array_equal(
                ids, self.me + self.n * np.arange(c, c + ids.size)):
            self.count += ids.size
            return
        if self.ordered:  # the rows so far, as bits
            self.ordered = False
            self.bits[:c // 8] = 255
            self.bits[c // 8:(c + 7) // 8] = (1 << (c % 8)) - 1
        bad = (ids < 0) | (ids >= self.rows)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise bad_key(fpath, f"/ids[{first + i}]", f"= {ids[i]} is outside the table's rows "
                          f"[0, {self.rows})")
        local = ids
        if self.n > 1:  # (the whole table's rows: nothing to map)
            other = ids % self.n != self.me
            if other.any():
                i = int(np.flatnonzero(other)[0])
                raise bad_key(fpath, f"/ids[{first + i}]", f"= {ids[i]} is a row of shard "
                              f"{ids[i] % self.n} of {self.n} (rows r % {self.n}), not of this "
                              "one")
            local = ids // self.n
        s = np.sort(local)
        dup = s[1:] == s[:-1]
        byte, mask = local >> 3, np.left_shift(np.uint8(1), (local & 7).astype(np.uint8))
        seen = (self.bits[byte] & mask) != 0
        if dup.any() or seen.any():
            v = int(s[1:][dup][0]) if dup.any() else int(local[seen][0])
            raise bad_key(fpath, "/ids", f"holds row {v * self.n + self.me} more than once (in "
                          "this or an earlier shard)")
        np.bitwise_or.at(self.bits, byte, mask)
        self.count += ids.size

    def check_complete(self, where: str) -> None:
        if self.count != self.want:
            mine = f" (r % {self.n} == {self.me})" if self.n > 1 else ""
            raise InputError(f"{where}: the shards hold {self.count:,} of the table's "
                             f"{self.want:,} rows{mine}")


def damaged(fpath: str, e: Exception) -> InputError:
    """A shard h5py could not read (``DAMAGE``), as the error says it."""
    return InputError(f"{fpath}: corrupt or truncated shard ({e})")


def check_finite(fpath: str, key: str, v: np.ndarray, where) -> None:
    """Raise naming the first row of ``v`` (rows x width) with a NaN or infinity:
    ``where(i)`` -> (its row in the file, its id) for its index ``i`` in ``v``."""
    finite = np.isfinite(v)
    if not finite.all():
        row, ident = where(int(np.argmax(~finite.reshape(len(v), -1).all(1))))
        raise bad_key(fpath, f"/{key}", f"row {row} (id {ident}) has a non-finite value")


def shard_layout(fpath: str, f, width: int, slots: tuple[str, ...]) -> int:
    """Check a shard's keys, kinds and shapes; return its row count."""
    want = {"ids", "w", *slots}
    have = set(f.keys())
    if have != want:
        raise bad_key(fpath, "keys", f"are {sorted(have)}, expected {sorted(want)}")
    for k in sorted(want):
        if not isinstance(f[k], h5py.Dataset):
            raise bad_key(fpath, f"/{k}", "is not a dataset")
    ids = f["ids"]
    if ids.ndim != 1 or ids.dtype.kind not in "iu":
        raise bad_key(fpath, "/ids", f"must be 1-D integers, found {ids.ndim}-D {ids.dtype}")
    n = ids.shape[0]
    for k in ("w", *slots):
        d = f[k]
        if d.shape != (n, width) or d.dtype.kind != "f":
            raise bad_key(fpath, f"/{k}", f"has shape {d.shape} {d.dtype}, expected ({n}, "
                          f"{width}) floats (one row per id, width --embedding-dim + linear)")
    return n


def read_shards(step_dir: str, meta: dict, width: int, slots: tuple[str, ...], owns, take,
                weights_only: bool = False, verify=lambda i: True, part=None):
    """Read every shard of ``step_dir`` in chunks, checking it; ``take(ids, {slot: rows})``
    gets the rows ``owns(ids)`` selects, after their values were checked finite (with
    ``weights_only``, ``{"w": rows}``: the slots' layout is checked, their values not read
    unless for the checksum). ``verify(i)``: whether this reader checks the checksums of
    shard ``i`` (every dataset read whole; ``load`` spreads the shards over its readers).
    ``part=(me, n)``: this reader is server ``me`` of ``n`` (it owns the rows ``r % n ==
    me``); where ``n`` servers wrote the checkpoint, it reads and verifies shard ``me``
    alone, which must hold exactly those rows (the other servers check the others)."""
    total, checks = int(sum(meta["schema"]["cardinalities"])), []
    shards = list(enumerate(meta["shards"]))
    rows, where = _Rows(total), step_dir
    if part is not None and len(shards) == part[1]:   # the writer's partition
        rows, shards = _Rows(total, part[1], part[0]), [shards[part[0]]]
        where, verify = os.path.join(step_dir, shards[0][1]), (lambda i: True)
    for i, name in shards:
        fpath = os.path.join(step_dir, name)
        sums = Sums(fpath, meta.get("checksums") == CRC_ATTR and verify(i))
        with open_h5(fpath) as f:
            try:
                n = shard_layout(fpath, f, width, slots)
                for a in range(0, n, CHUNK_ROWS):
                    raw = f["ids"][a:a + CHUNK_ROWS]
                    sums.add("ids", raw)
                    ids = raw.astype(np.int64)
                    rows.add(fpath, ids, a)
                    sel = np.flatnonzero(owns(ids))
                    vals = {}
                    for k in ("w", *slots):
                        keep = sel.size and (k == "w" or not weights_only)
                        if not (keep or sums.want):
                            continue
                        v = f[k][a:a + CHUNK_ROWS]
                        sums.add(k, v)
                        if keep:
                            vals[k] = v[sel] if sel.size < ids.size else v
                            check_finite(fpath, k, vals[k],
                                         lambda i: (a + int(sel[i]), ids[sel[i]]))
                    if sel.size:
                        take(ids[sel] if sel.size < ids.size else ids, vals)
                sums.read(f)
            except DAMAGE as e:
                raise damaged(fpath, e) from None
        checks.append(sums)
    rows.check_complete(where)
    for sums in checks:  # after the checks that name what is wrong, the checksums
        sums.check()
