"""The vocabulary encoder (``--min-count K``): a counting pass, then ids by decreasing count;
or (``--vocabulary FILE``) the kept values another run stored in FILE, in id order
(``/vocabulary/<field>/bytes`` and ``offsets``: value i, id 2 + i, is ``bytes[offsets[i]:
offsets[i + 1]]``)."""

from __future__ import annotations

import hashlib

import numpy as np

from .read import Rows


MERGE_AT = 1 << 20  # block counts pending before a merge, at least (else: as many as counted)


class _IdTable:
    """``(field, uint64 key)`` → int64 id, 1 where absent: open addressing (linear probing,
    load 1/4 to 1/2) in NumPy arrays, filled and read a whole array of keys at a time. A
    slot holds the field in its smallest type, the key and the id (int32 where ids fit;
    0: a free slot, ids being >= 2): 13 B, 26 to 52 B a key."""

    def __init__(self, fields: np.ndarray, keys: np.ndarray, ids: np.ndarray):
        bits = max(2 * len(keys), 8).bit_length()
        self.mask, self.shift = (1 << bits) - 1, np.uint64(64 - bits)
        self.fields = np.zeros(1 << bits, fields.dtype)
        self.keys = np.zeros(1 << bits, np.uint64)
        self.ids = np.zeros(1 << bits, np.int32 if ids.max(initial=0) < 2**31 else np.int64)
        # the keys still to place (todo) beside their next slot (at), as narrow as they fit
        small = np.int32 if max(len(keys), 1 << bits) < 2**31 else np.int64
        todo, at = np.arange(len(keys), dtype=small), self._slot(fields, keys).astype(small)
        while len(todo):
            free = np.flatnonzero(self.ids[at] == 0)
            won, first = np.unique(at[free], return_index=True)   # one key per free slot
            new = todo[free[first]]
            self.fields[won], self.keys[won], self.ids[won] = fields[new], keys[new], ids[new]
            left = np.ones(len(todo), bool)
            left[free[first]] = False
            todo, at = todo[left], (at[left] + 1) & self.mask

    def _slot(self, fields: np.ndarray, keys: np.ndarray) -> np.ndarray:
        mixed = keys ^ (fields.astype(np.uint64) * np.uint64(0xC2B2AE3D27D4EB4F))
        return ((mixed * np.uint64(0x9E3779B97F4A7C15)) >> self.shift).astype(np.int64)

    def lookup(self, fields: np.ndarray, keys: np.ndarray) -> np.ndarray:
        """ids: (n,) int64 of ``fields``, ``keys`` (n,)."""
        out, slot = np.ones(len(keys), np.int64), self._slot(fields, keys)
        todo = np.arange(len(keys))
        while len(todo):
            at = slot[todo]
            used = self.ids[at] != 0
            hit = used & (self.fields[at] == fields[todo]) & (self.keys[at] == keys[todo])
            out[todo[hit]] = self.ids[at[hit]]
            todo = todo[~hit & used]
            slot[todo] = (slot[todo] + 1) & self.mask
        return out


class Vocabulary:
    """id 0 = missing, 1 = rare (count < min_count), 2.. = kept values by decreasing count,
    ties by increasing bytes. Values of up to 8 bytes are counted (by sorting) and looked up
    (``_IdTable``) in NumPy as ``(field, uint64 key)`` (``Block.packed``); longer ones in a
    dict per field."""

    def __init__(self, n_fields: int, min_count: int | None):
        """``min_count`` None: ``load`` gives the ids (no counting)."""
        self.min_count = min_count
        self.fields = np.arange(n_fields, dtype=np.min_scalar_type(max(n_fields - 1, 0)))
        # per field: its short values' sorted keys and their counts (16 B a distinct value),
        # and the blocks' (keys, counts) not merged into them yet
        self.counts = [(np.zeros(0, np.uint64), np.zeros(0, np.int64))] * n_fields
        self.pending = [[] for _ in range(n_fields)]
        self.n_counted = self.n_pending = 0
        self.long = [{} for _ in range(n_fields)]

    def count(self, rows: Rows) -> None:
        """First pass: add the rows' non-empty values to the counts."""
        if self.min_count is None:
            return
        short = (rows.L > 0) & (rows.L <= 8)
        keys = np.sort(np.where(short, rows.block.packed(rows.s, rows.L), 0), axis=0)
        for f, column in enumerate(keys.T):  # (each sorted: its runs are its values)
            key, count = _runs(column, np.ones(len(column), np.int64))
            self.pending[f].append((key[key != 0], count[key != 0]))  # 0: not short
            self.n_pending += int(np.count_nonzero(key))
        if self.n_pending > max(self.n_counted, MERGE_AT):
            self._merge()
        for _, f, v in _long_values(rows):
            self.long[f][v] = self.long[f].get(v, 0) + 1

    def _merge(self) -> None:
        """Fold the pending block counts into ``counts``, a field at a time (the merge's
        temporaries are one field's); a stable sort of sorted runs merges them."""
        for f, parts in enumerate(self.pending):
            if parts:
                key = np.concatenate([self.counts[f][0], *(k for k, _ in parts)])
                count = np.concatenate([self.counts[f][1], *(c for _, c in parts)])
                self.pending[f] = []
                order = np.argsort(key, kind="stable")
                self.counts[f] = _runs(key[order], count[order])
        self.n_counted, self.n_pending = sum(len(k) for k, _ in self.counts), 0

    def finish(self) -> None:
        """Assign the ids: one ``_IdTable`` for the short values, a dict per field for long."""
        if self.min_count is None:
            return
        self._merge()
        self.cardinalities, self.long_ids, self.kept = [], [], []
        table = [(self.fields[:0], np.zeros(0, np.uint64), np.zeros(0, np.int64))]
        for f, long in enumerate(self.long):
            keys, count = self.counts[f]
            values = np.concatenate([keys.view("S8"), np.array(list(long), "S")])  # the bytes
            counts = np.concatenate([count, np.fromiter(long.values(), np.int64)])
            kept = np.flatnonzero(counts >= self.min_count)
            ids = np.ones(len(values), np.int64)
            order = kept[np.lexsort((values[kept], -counts[kept]))]
            ids[order] = 2 + np.arange(len(kept))
            self.kept.append(stored(values[order]))
            short = np.flatnonzero(ids[:len(keys)] > 1)
            table.append((np.full(len(short), f, self.fields.dtype), keys[short], ids[short]))
            self.long_ids.append({v: i for v, i in zip(long, ids[len(keys):].tolist()) if i > 1})
            self.cardinalities.append(2 + len(kept))
        self.table = _IdTable(*(np.concatenate(a) for a in zip(*table)))
        del self.counts, self.pending, self.long

    def load(self, kept: list) -> None:
        """The ids of another run's kept values: per field ``(bytes, offsets, split)``
        (``read_vocabulary``: ``stored``'s form, in id order, and ``split_values`` of it)."""
        self.cardinalities, self.long_ids = [], []
        self.kept = [(data, offsets) for data, offsets, _ in kept]
        table = [(self.fields[:0], np.zeros(0, np.uint64), np.zeros(0, np.int64))]
        for f, (data, offsets, (short, keys, long)) in enumerate(kept):
            table.append((np.full(len(short), f, self.fields.dtype), keys, 2 + short))
            self.long_ids.append({v: 2 + int(i) for i, v in long.items()})
            self.cardinalities.append(2 + len(offsets) - 1)
        self.table = _IdTable(*(np.concatenate(a) for a in zip(*table)))

    def encode(self, rows: Rows) -> np.ndarray:
        """ids: (n, F_s) int64."""
        packed = rows.block.packed(rows.s, rows.L)
        fields = np.tile(self.fields, len(packed))
        out = self.table.lookup(fields, packed.ravel()).reshape(packed.shape)
        for r, f, v in _long_values(rows):
            out[r, f] = self.long_ids[f].get(v, 1)
        out[rows.L == 0] = 0
        return out


def _runs(key: np.ndarray, count: np.ndarray):
    """``(key, count)`` summed over runs of equal keys, in arrays sorted by key."""
    new = np.ones(len(key), bool)
    new[1:] = key[1:] != key[:-1]
    start = np.flatnonzero(new)
    return key[start], np.add.reduceat(count, start) if len(start) else count


def _long_values(rows: Rows) -> list[tuple[int, int, bytes]]:
    """``(row, field, value)`` of the sparse values over 8 bytes."""
    r, f = np.nonzero(rows.L > 8)
    a, n, data = rows.s[r, f].tolist(), rows.L[r, f].tolist(), rows.block.data
    return [(i, j, data[k:k + m]) for i, j, k, m in zip(r.tolist(), f.tolist(), a, n)]



def stored(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Values (an "S" array: NUL-free, zero-padded) as ``(bytes uint8, offsets int64)``:
    value i is ``bytes[offsets[i]:offsets[i + 1]]``."""
    lengths = np.char.str_len(values).astype(np.int64) if len(values) else np.zeros(0, np.int64)
    padded = np.ascontiguousarray(values).view(np.uint8).reshape(len(values), values.itemsize)
    offsets = np.zeros(len(values) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return padded[np.arange(values.itemsize) < lengths[:, None]], offsets


def digest(names: list[str], kept: list[tuple[np.ndarray, np.ndarray]]) -> str:
    """A vocabulary's fingerprint (16 hex digits of SHA-256 over each field's name, offsets
    and bytes): files that share it give the same values the same ids."""
    h = hashlib.sha256()
    for name, (data, offsets) in zip(names, kept):
        h.update(name.encode() + b"\0" + offsets.astype("<i8").tobytes() + data.tobytes())
    return h.hexdigest()[:16]


def split_values(data: np.ndarray, offsets: np.ndarray):
    """Stored values (``stored``) as ``(short, keys, long)``: the indices of those of up to
    8 bytes and their uint64 keys (zero-padded, as ``Block.packed``), and {index: bytes} of
    the longer ones."""
    lengths = np.diff(offsets)
    short, cols = np.flatnonzero(lengths <= 8), np.arange(8)
    inside = cols < lengths[short, None]
    key = np.zeros((len(short), 8), np.uint8)
    key[inside] = data[(offsets[short, None] + cols)[inside]]
    long = {int(i): data[offsets[i]:offsets[i + 1]].tobytes()
            for i in np.flatnonzero(lengths > 8)}
    return short, key.view(np.uint64).ravel(), long


def read_vocabulary(path: str, names: list[str], seps: dict[str, str]) -> list:
    """``--vocabulary FILE``: the kept values of each of the fields ``names`` (this input's
    sparse fields, the last ``len(seps)`` multi-hot with the item separators ``seps``, as
    FILE's must be), in id order, as ``Vocabulary.load`` takes them; an InputError naming
    what is wrong."""
    from ..data import H5Dataset
    from ..errors import InputError

    try:
        d = H5Dataset(path)  # a dataset file (its structure checked), else an InputError
    except InputError as e:  # (naming the option: FILE is no input of this run)
        raise InputError(f"--vocabulary {e}", collective=e.collective) from None
    try:
        theirs = list(d.schema.sparse_names)
        if theirs != list(names):
            raise InputError(f"--vocabulary {path}: its sparse fields {theirs} are not this "
                             f"input's {list(names)}")
        multi = [list(seps), theirs[d.schema.n_single:]]
        if multi[0] != multi[1]:  # items or whole values: other ids for the same bytes
            raise InputError(f"--vocabulary {path}: its multi-hot fields are {multi[1]}, "
                             f"this input's {multi[0]} (--multi-hot as for FILE)")
        for name, sep in seps.items():  # (FILE's items split otherwise: other values)
            g = d.f.get(f"vocabulary/{name}")
            was = g.attrs.get("separator") if g is not None else None
            if was is not None and was != sep:
                raise InputError(f"--vocabulary {path}: its multi-hot field {name}'s items "
                                 f"were split at {was!r}, this input's at {sep!r}")
        return [_stored_field(d, path, name, card)
                for name, card in zip(names, d.schema.cardinalities)]
    finally:
        d.close()


def _stored_field(d, path: str, name: str, card: int):
    """Field ``name``'s kept values in dataset ``d`` (FILE ``path``), checked: a group of
    ``bytes`` uint8 and ``offsets`` int64, ``card - 2`` distinct non-empty values, no NUL.
    -> ``(bytes, offsets, split_values of them)``."""
    import h5py

    from ..errors import InputError

    key = f"vocabulary/{name}"
    g = d.f.get(key)
    if g is None:
        raise InputError(f"--vocabulary {path}: holds no /{key} (prep --min-count "
                         "stores each field's vocabulary in the files it writes)")
    data, offsets = (np.asarray(g[k][()]) if isinstance(g, h5py.Group)
                     and isinstance(g.get(k), h5py.Dataset) else None
                     for k in ("bytes", "offsets"))
    ok = (data is not None and offsets is not None and data.dtype == np.uint8
          and offsets.dtype == np.int64 and offsets.shape == (card - 1,)
          and offsets[0] == 0 and offsets[-1] == data.size
          and not (np.diff(offsets) <= 0).any() and data.all())
    if ok:  # distinct (which id would a value stored twice get?)
        split = _, keys, long = split_values(data, offsets)
        ok = len(np.unique(keys)) == len(keys) and len(set(long.values())) == len(long)
    if not ok:
        raise InputError(f"--vocabulary {path}: /{key} is not a vocabulary of its "
                         f"cardinality {card} (bytes uint8, offsets int64: {card - 2} "
                         "distinct values + 1, increasing from 0 to the bytes; no NUL byte)")
    return data, offsets, split
