"""``python -m pshybrid prep criteo IN OUT`` · ``prep csv IN OUT``: text table → dataset file.

One process, no MPI. IN is plain text or gzip (told by its first two bytes). It is streamed
in blocks of whole lines of about ``BLOCK_BYTES``, each parsed with NumPy at once, so memory
stays bounded whatever the input size (a ``--min-count`` vocabulary grows with the number of
distinct values). Rows are written with ``DatasetWriter``: published atomically at the end,
removed on any error, so a failed run leaves no OUT, valid or temporary file and an existing
OUT unchanged.

Lines. ``criteo``: 40 tab-separated fields: label, I1..I13 (integers), C1..C26 (categorical,
hexadecimal in Criteo's files, taken as raw strings). ``csv``: ``--sep``-separated, no quoting;
every line has as many fields as the first (the header with ``--header``). Lines end in LF or
CRLF; the last may lack one. An empty field is missing. A bad line stops the run with an
``InputError`` naming IN and the 1-based line number, or with ``--skip-bad-lines`` is skipped
and counted: a wrong number of fields, a bad label, a bad dense value, a line over
``MAX_LINE_BYTES``.

Transform, the same for both commands:

- label: criteo ``0`` or ``1``; csv a number (Python ``float`` syntax, finite) that is 0 or
  1, or with ``--label-threshold T`` any number: 1 if value >= T else 0. Stored float32.
- dense: criteo a decimal integer ``-?[0-9]{1,18}``; csv a finite number (Python ``float``
  syntax); missing → x = 0. Stored ``float32(log1p(max(x, 0)))`` computed in float64
  (csv ``--dense-transform none``: ``float32(x)``, |x| at most float32's largest).
- sparse, field f, value v = the field's raw bytes as in IN (no trimming, no NUL bytes):
  hashing (default): id = 0 if v is missing, else ``1 + zlib.crc32(v) % (buckets_f - 1)``;
  cardinality_f = buckets_f (``--buckets N``: the same N for every field, or one per field).
  vocabulary (``--min-count K``): a first pass counts each field's values; values seen >= K
  times get ids 2, 3, ... by decreasing count, ties by increasing bytes; id 0 = missing,
  id 1 = every other value; cardinality_f = 2 + the number of kept values.
- rows: the good lines in file order, at most ``--max-rows``. With ``--valid-fraction F`` the
  last ``round(F * rows)`` (Python round, half to even) go to ``--valid-out``, the rest to
  OUT; both files get the same field names and cardinalities. The row count comes from a
  first pass that parses IN (the vocabulary's counting pass, or one of its own when hashing),
  then a second pass writes.
"""

from __future__ import annotations

import gzip
import math
import os
import sys
import time
import zlib
from dataclasses import dataclass

import numpy as np

from .config import ArgumentParser, add_arguments, option, resolve
from .data import DatasetWriter
from .errors import ConfigError, InputError

BLOCK_BYTES = 2 << 20      # read size: a block holds ~9k Criteo lines
MAX_LINE_BYTES = 8 << 20   # a longer line is a bad line
SHORT_BYTES = 64           # values up to this long are handled in NumPy, longer ones in Python
DEFAULT_BUCKETS = 1_000_000
CRITEO_DENSE = [f"I{i}" for i in range(1, 14)]
CRITEO_SPARSE = [f"C{i}" for i in range(1, 27)]
NL = 10


def _crc_table(bits: int) -> np.ndarray:
    """(2**bits,) int64: CRC-32 (reflected polynomial 0xEDB88320, as zlib) of each ``bits``-bit
    step, so that ``crc = table[(crc ^ x) & (2**bits - 1)] ^ (crc >> bits)`` consumes x."""
    t = np.arange(2 ** bits, dtype=np.int64)
    for _ in range(bits):
        t = np.where(t & 1, (t >> 1) ^ 0xEDB88320, t >> 1)
    return t


_CRC8, _CRC16 = _crc_table(8), _crc_table(16)
_ASCII0 = 0x3030303030303030                                  # b"00000000"
_LOW = np.array([(1 << 8 * m) - 1 for m in range(9)], np.uint64)  # the low m bytes


# -- fields of a block of lines -------------------------------------------------------------

class _Block:
    """Whole lines of IN: ``data`` bytes, ``buf`` uint8 (``data`` with 8 zero bytes on each
    side) and ``words`` int64, ``words[o + 8]`` the 8 bytes at offset ``o >= -8`` of ``data``
    (little-endian: the first byte lowest). A field is an offset ``s`` and a length ``L``."""

    def __init__(self, data: bytes):
        self.data = data
        self.buf = np.frombuffer(bytes(8) + data + bytes(8), np.uint8)
        self.words = np.ndarray((len(data) + 9,), "<i8", self.buf, strides=(1,))

    def crc32(self, s, L) -> np.ndarray:
        """``zlib.crc32`` of each field: same shape as ``s``, uint32. Fields of one length at a
        time (so no masks), two bytes a step."""
        shape, s, L = s.shape, s.ravel(), L.ravel()
        out = np.zeros(s.size, np.uint32)  # crc32(b"") == 0
        lengths = np.flatnonzero(np.bincount(L, minlength=1))
        for n in lengths[lengths > 0].tolist():        # each length present, but 0 (b"")
            i = np.flatnonzero(L == n)
            if n > SHORT_BYTES:
                out[i] = [zlib.crc32(self.data[a:a + n]) for a in s[i].tolist()]
                continue
            crc = np.full(len(i), 0xFFFFFFFF, np.int64)
            for k in range(0, n, 8):
                w, m = self.words[s[i] + (8 + k)], min(8, n - k)
                for j in range(0, m - 1, 2):
                    crc = _CRC16[(crc ^ (w >> 8 * j)) & 0xFFFF] ^ (crc >> 16)
                if m % 2:
                    crc = _CRC8[(crc ^ (w >> 8 * (m - 1))) & 0xFF] ^ (crc >> 8)
            out[i] = crc ^ 0xFFFFFFFF
        return out.reshape(shape)

    def texts(self, s, L) -> np.ndarray:
        """The fields as byte strings: same shape as ``s``, ``S<w>`` (object if any is over
        SHORT_BYTES)."""
        w = int(L.max(initial=0))
        if w > SHORT_BYTES:
            return np.array([self.data[a:a + n] for a, n in
                             zip(s.ravel().tolist(), L.ravel().tolist())],
                            dtype=object).reshape(s.shape)
        j = np.arange(max(w, 1))
        m = self.buf[np.minimum(s[..., None] + (j + 8), len(self.buf) - 1)]
        m[j >= L[..., None]] = 0
        return m.view(f"S{max(w, 1)}")[..., 0]

    def ints(self, s, L) -> tuple[np.ndarray, np.ndarray]:
        """Decimal integers ``-?[0-9]{1,18}``: ``(value int64, ok bool)``, shapes of ``s``;
        empty → 0. Eight digits at a time from the right (SWAR: each window's word made
        b"00000000" below the first digit, checked, and converted with three multiplies)."""
        neg = (L > 0) & ((self.words[s + 8] & 0xFF) == ord("-"))
        a, e = s + neg, s + L                                   # the digits: data[a:e]
        ok = ((e > a) | (L == 0)) & (e - a <= 18)
        v = np.zeros(s.shape, np.int64)
        for k in range(-(-min(int((e - a).max(initial=0)), 18) // 8)):
            o = e - 8 * (k + 1)                                   # the window's word offset
            low = _LOW[np.clip(a - o, 0, 8)]                      # its bytes before the digits
            w = self.words[np.maximum(o, -8) + 8].view(np.uint64)
            w = (w & ~low) | (low & np.uint64(_ASCII0))
            ok &= ((w & np.uint64(0xF0F0F0F0F0F0F0F0))
                   | (((w + np.uint64(0x0606060606060606)) & np.uint64(0xF0F0F0F0F0F0F0F0))
                      >> np.uint64(4))) == np.uint64(0x3333333333333333)
            w = w - np.uint64(_ASCII0)
            w = w * np.uint64(10) + (w >> np.uint64(8))
            w = ((w & np.uint64(0x000000FF000000FF)) * np.uint64(0x000F424000000064)
                 + ((w >> np.uint64(16)) & np.uint64(0x000000FF000000FF))
                 * np.uint64(0x0000271000000001)) >> np.uint64(32)
            v += w.astype(np.int64) * 10 ** (8 * k)
        return np.where(neg, -v, v), ok

    def packed(self, s, L) -> np.ndarray:
        """Fields of up to 8 bytes as uint64 keys (their bytes, little-endian, zero-padded;
        garbage for longer ones): same shape as ``s``; ``keys.view("S8")`` gives the bytes."""
        return self.words[s + 8].view(np.uint64) & _LOW[np.minimum(L, 8)]

    def floats(self, s, L) -> tuple[np.ndarray, np.ndarray]:
        """Finite numbers in Python ``float`` syntax: ``(value float64, ok bool)``; empty → 0."""
        text = np.where(L == 0, b"0", self.texts(s, L))
        try:
            v = text.astype(np.float64)
        except ValueError:
            v = np.array([_float(t) for t in text.ravel().tolist()], np.float64).reshape(s.shape)
        ok = np.isfinite(v)
        return np.where(ok, v, 0.0), ok


def _float(t: bytes) -> float:
    try:
        return float(t)
    except ValueError:
        return math.nan


# -- tables ---------------------------------------------------------------------------------

@dataclass
class _Table:
    """How to read IN: fields per line, the columns used and how their values parse."""

    path: str
    sep: int                     # separator byte
    n_fields: int
    header: bool                 # line 1 is a header
    label: int                   # column indices
    dense: list[int]
    sparse: list[int]
    dense_names: list[str]
    sparse_names: list[str]
    integers: bool               # label and dense are integers (criteo) or floats (csv)
    log: bool                    # dense transform log1p(max(x, 0))
    threshold: float | None      # label = value >= threshold; None: value must be 0 or 1

    def transform(self, x: np.ndarray) -> np.ndarray:
        """Dense values as stored, (n, F_d) float32: log1p(max(x, 0)) (in float64), or x."""
        y = np.log1p(np.maximum(x, 0).astype(np.float64)) if self.log else x
        return y.astype(np.float32)


@dataclass
class _Rows:
    """The good rows of a block: ``label (n,) float32``, ``dense (n, F_d)`` the values x as
    parsed (int64 or float64, missing 0), and the sparse fields as offsets ``s``, lengths
    ``L`` ``(n, F_s) int64`` into ``block``."""

    block: _Block
    label: np.ndarray
    dense: np.ndarray
    s: np.ndarray
    L: np.ndarray

    def take(self, rows) -> _Rows:
        """The rows ``rows`` (an index, a mask or a slice)."""
        return _Rows(self.block, self.label[rows], self.dense[rows], self.s[rows], self.L[rows])


def _parse(t: _Table, data: bytes):
    """Parse a block of whole lines: ``ok`` (lines,) bool, ``why(i)``: what is wrong with bad
    line i, and the good ``_Rows``."""
    block = _Block(data)
    buf = block.buf[8:8 + len(data)]
    ends = np.flatnonzero((buf == t.sep) | (buf == NL))
    starts = np.concatenate(([0], ends[:-1] + 1))
    eol = np.flatnonzero(buf[ends] == NL)
    fields = np.diff(eol, prepend=-1)
    whole = fields == t.n_fields
    if whole.all():
        s, L = starts.reshape(-1, t.n_fields), (ends - starts).reshape(-1, t.n_fields)
    else:
        idx = eol[whole][:, None] + np.arange(1 - t.n_fields, 1)
        s, L = starts[idx], ends[idx] - starts[idx]
    number = block.ints if t.integers else block.floats
    label, label_ok = number(s[:, t.label], L[:, t.label])
    label_ok &= L[:, t.label] > 0
    if t.threshold is None:
        label_ok &= (label == 0) | (label == 1)
    else:
        label = label >= t.threshold
    dense_cols, sparse_cols = _view(t.dense), _view(t.sparse)
    dense, dense_ok = number(s[:, dense_cols], L[:, dense_cols])
    if not t.log:                                       # stored as is: must fit in float32
        dense_ok &= np.abs(dense) <= np.finfo(np.float32).max
    good = label_ok & dense_ok.all(1)
    ok = whole.copy()
    ok[whole] = good

    def why(i: int) -> str:
        if not whole[i]:
            return f"wrong number of fields: {fields[i]}, expected {t.n_fields}"
        r = np.count_nonzero(whole[:i])

        def text(c: int) -> str:
            return data[s[r, c]:s[r, c] + L[r, c]].decode(errors="replace")

        if not label_ok[r]:
            need = "0 or 1" if t.threshold is None else "a number"
            return f"label {text(t.label)!r} is not {need}"
        j = int(np.flatnonzero(~dense_ok[r])[0])
        need = "an integer" if t.integers else "a finite number" if t.log else "a float32"
        return f"{t.dense_names[j]} value {text(t.dense[j])!r} is not {need}"

    rows = _Rows(block, label.astype(np.float32), dense, s[:, sparse_cols], L[:, sparse_cols])
    return ok, why, rows if good.all() else rows.take(good)


def _view(cols: list[int]):
    """Column indices as a slice where they are consecutive (NumPy takes a view), else as is."""
    run = cols and cols == list(range(cols[0], cols[0] + len(cols)))
    return slice(cols[0], cols[0] + len(cols)) if run else cols


def _open(path: str):
    """IN opened for binary reading, gunzipped if it starts with the gzip magic bytes."""
    try:
        with open(path, "rb") as f:
            gz = f.read(2) == b"\x1f\x8b"
        return gzip.open(path, "rb") if gz else open(path, "rb")
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None


@dataclass
class _Tally:
    """Counts of one pass; ``bad_line`` raises unless bad lines are skipped."""

    path: str
    skip: bool
    rows: int = 0
    bad: int = 0

    def bad_line(self, line: int, why: str, count: int = 1) -> None:
        if not self.skip:
            raise InputError(f"{self.path}:{line}: {why} (--skip-bad-lines skips such lines)")
        self.bad += count


def _blocks(path: str, tally: _Tally):
    """Yield ``(first, data)``: whole lines of IN, each ending in LF, ``first`` the 1-based
    number of the first line; lines over MAX_LINE_BYTES go to ``tally.bad_line``."""
    line, rem, skipping = 1, b"", False
    with _open(path) as f:
        while True:
            try:
                chunk = f.read(BLOCK_BYTES)
            except (OSError, EOFError, zlib.error) as exc:
                raise InputError(f"{path}: cannot read: {exc}") from None
            buf = rem + (chunk or b"\n" * bool(rem))   # at the end, close an unfinished line
            if skipping:                                 # the rest of a too long line
                k = buf.find(b"\n") + 1
                buf, skipping, line = (buf[k:], False, line + 1) if k else (b"", True, line)
            cut = buf.rfind(b"\n") + 1
            if cut:
                data = buf[:cut]
                yield line, data.replace(b"\r\n", b"\n") if b"\r" in data else data
                line += data.count(b"\n")
            rem = buf[cut:]
            if len(rem) > MAX_LINE_BYTES:
                tally.bad_line(line, f"line longer than {MAX_LINE_BYTES} bytes")
                rem, skipping = b"", True
            if not chunk:
                return


class _Progress:
    """Rows/s on stderr: a ``\\r`` line on a TTY, else a line every 5 s; and one at the end."""

    def __init__(self, title: str):
        self.title, self.tty = title, sys.stderr.isatty()
        self.t0 = self.last = time.perf_counter()

    def update(self, rows: int, end: bool = False) -> None:
        now = time.perf_counter()
        if not end and now - self.last < (0.25 if self.tty else 5.0):
            return
        self.last, dt = now, now - self.t0
        msg = f"{self.title}: {rows:,} rows, {dt:.1f} s, {rows / max(dt, 1e-9):,.0f} rows/s"
        if self.tty:
            msg = "\r" + msg + "\x1b[K" + ("\n" if end else "")
        sys.stderr.write(msg if self.tty else msg + "\n")
        sys.stderr.flush()


def _scan(t: _Table, max_rows: int | None, tally: _Tally, title: str):
    """Yield the good rows of IN (``_Rows``) block by block, at most ``max_rows`` in all."""
    progress = _Progress(title)
    for first, data in _blocks(t.path, tally):
        if t.header and first == 1:
            data, first = data[data.index(b"\n") + 1:], 2
            if not data:
                continue
        ok, why, rows = _parse(t, data)
        good = np.flatnonzero(ok)
        stop = max_rows is not None and len(good) >= max_rows - tally.rows
        if stop:
            good = good[:max_rows - tally.rows]
            ok = ok[:good[-1] + 1]
        bad = np.flatnonzero(~ok)
        if len(bad):
            tally.bad_line(first + int(bad[0]), why(int(bad[0])), len(bad))
        yield rows.take(slice(len(good)))
        tally.rows += len(good)
        progress.update(tally.rows)
        if stop:
            break
    progress.update(tally.rows, end=True)


# -- categorical encoders -------------------------------------------------------------------

class _Hashing:
    """id = 0 if missing else 1 + crc32(value) % (buckets_f - 1)."""

    def __init__(self, buckets: list[int]):
        self.cardinalities = list(buckets)
        self.mod = np.array(buckets, np.int64) - 1

    def count(self, rows: _Rows) -> None:
        """Nothing to learn: the ids depend on the value only."""

    def finish(self) -> None:
        """Nothing to learn."""

    def encode(self, rows: _Rows) -> np.ndarray:
        """ids: (n, F_s) int64."""
        crc = rows.block.crc32(rows.s, rows.L).astype(np.int64)
        return np.where(rows.L == 0, 0, 1 + crc % self.mod)


class _IdTable:
    """``(field, uint64 key)`` → int64 id, 1 where absent: open addressing (linear probing,
    load <= 1/4) in NumPy arrays, filled and read a whole array of keys at a time."""

    def __init__(self, fields: np.ndarray, keys: np.ndarray, ids: np.ndarray):
        bits = max(4 * len(keys), 8).bit_length()
        self.mask, self.shift = (1 << bits) - 1, np.uint64(64 - bits)
        self.fields = np.full(1 << bits, -1, np.int32)               # -1: a free slot
        self.keys, self.ids = np.zeros(1 << bits, np.uint64), np.ones(1 << bits, np.int64)
        slot, todo = self._slot(fields, keys), np.arange(len(keys))
        while len(todo):
            free = todo[self.fields[slot[todo]] < 0]
            won, first = np.unique(slot[free], return_index=True)   # one key per free slot
            new = free[first]
            self.fields[won], self.keys[won], self.ids[won] = fields[new], keys[new], ids[new]
            todo = np.setdiff1d(todo, new, assume_unique=True)
            slot[todo] = (slot[todo] + 1) & self.mask

    def _slot(self, fields: np.ndarray, keys: np.ndarray) -> np.ndarray:
        mixed = keys ^ (fields.astype(np.uint64) * np.uint64(0xC2B2AE3D27D4EB4F))
        return ((mixed * np.uint64(0x9E3779B97F4A7C15)) >> self.shift).astype(np.int64)

    def lookup(self, fields: np.ndarray, keys: np.ndarray) -> np.ndarray:
        """ids: (n,) int64 of ``fields``, ``keys`` (n,)."""
        out, slot = np.ones(len(keys), np.int64), self._slot(fields, keys)
        todo = np.arange(len(keys))
        while len(todo):
            at = slot[todo]
            f = self.fields[at]
            hit = (f == fields[todo]) & (self.keys[at] == keys[todo])
            out[todo[hit]] = self.ids[at[hit]]
            todo = todo[~hit & (f >= 0)]
            slot[todo] = (slot[todo] + 1) & self.mask
        return out


class _Vocabulary:
    """id 0 = missing, 1 = rare (count < min_count), 2.. = kept values by decreasing count,
    ties by increasing bytes. Values of up to 8 bytes are counted (by sorting) and looked up
    (``_IdTable``) in NumPy as ``(field, uint64 key)`` (``_Block.packed``); longer ones in a
    dict per field."""

    def __init__(self, n_fields: int, min_count: int):
        self.min_count = min_count
        self.fields = np.arange(n_fields, dtype=np.min_scalar_type(max(n_fields - 1, 0)))
        self.counts = (self.fields[:0], np.zeros(0, np.uint64), np.zeros(0, np.int64))
        self.pending = []                   # per block: (field, key, count) to merge
        self.long = [{} for _ in range(n_fields)]

    def count(self, rows: _Rows) -> None:
        """First pass: add the rows' non-empty values to the counts."""
        short = (rows.L > 0) & (rows.L <= 8)
        keys = np.sort(np.where(short, rows.block.packed(rows.s, rows.L), 0), axis=0)
        fields = np.repeat(self.fields, len(keys))
        field, key, count = _runs(fields, keys.T.ravel(), np.ones(keys.size, np.int64))
        self.pending.append((field[key != 0], key[key != 0], count[key != 0]))  # 0: not short
        if sum(len(k) for _, k, _ in self.pending) > max(len(self.counts[1]), 1 << 20):
            self._merge()
        for _, f, v in _long_values(rows):
            self.long[f][v] = self.long[f].get(v, 0) + 1

    def _merge(self) -> None:
        """Fold the pending block counts into ``counts``: (field, key, count) sorted."""
        field, key, count = (np.concatenate(a) for a in zip(self.counts, *self.pending))
        order = np.argsort(key)
        order = order[np.argsort(field[order], kind="stable")]   # a radix sort: small ints
        self.counts, self.pending = _runs(field[order], key[order], count[order]), []

    def finish(self) -> None:
        """Assign the ids: one ``_IdTable`` for the short values, a dict per field for long."""
        self._merge()
        field, key, count = self.counts
        self.cardinalities, self.long_ids = [], []
        table = [(self.fields[:0], np.zeros(0, np.uint64), np.zeros(0, np.int64))]
        for f, long in enumerate(self.long):
            lo, hi = np.searchsorted(field, [f, f + 1])
            keys = key[lo:hi]
            values = np.concatenate([keys.view("S8"), np.array(list(long), "S")])  # the bytes
            counts = np.concatenate([count[lo:hi], np.fromiter(long.values(), np.int64)])
            kept = np.flatnonzero(counts >= self.min_count)
            ids = np.ones(len(values), np.int64)
            ids[kept[np.lexsort((values[kept], -counts[kept]))]] = 2 + np.arange(len(kept))
            short = np.flatnonzero(ids[:len(keys)] > 1)
            table.append((np.full(len(short), f, self.fields.dtype), keys[short], ids[short]))
            self.long_ids.append({v: i for v, i in zip(long, ids[len(keys):].tolist()) if i > 1})
            self.cardinalities.append(2 + len(kept))
        self.table = _IdTable(*(np.concatenate(a) for a in zip(*table)))
        del self.counts, self.pending, self.long

    def encode(self, rows: _Rows) -> np.ndarray:
        """ids: (n, F_s) int64."""
        packed = rows.block.packed(rows.s, rows.L)
        fields = np.tile(self.fields, len(packed))
        out = self.table.lookup(fields, packed.ravel()).reshape(packed.shape)
        for r, f, v in _long_values(rows):
            out[r, f] = self.long_ids[f].get(v, 1)
        out[rows.L == 0] = 0
        return out


def _runs(field: np.ndarray, key: np.ndarray, count: np.ndarray):
    """``(field, key, count)`` summed over runs of equal (field, key), in arrays sorted so."""
    new = np.ones(len(key), bool)
    new[1:] = (key[1:] != key[:-1]) | (field[1:] != field[:-1])
    start = np.flatnonzero(new)
    return field[start], key[start], np.add.reduceat(count, start) if len(start) else count


def _long_values(rows: _Rows) -> list[tuple[int, int, bytes]]:
    """``(row, field, value)`` of the sparse values over 8 bytes."""
    r, f = np.nonzero(rows.L > 8)
    a, n, data = rows.s[r, f].tolist(), rows.L[r, f].tolist(), rows.block.data
    return [(i, j, data[k:k + m]) for i, j, k, m in zip(r.tolist(), f.tolist(), a, n)]


# -- output ---------------------------------------------------------------------------------

def _writer(path: str, dense_names, sparse_names) -> DatasetWriter:
    try:
        return DatasetWriter(path, dense_names, sparse_names)
    except OSError as exc:
        raise InputError(f"{path}: cannot write: {exc}") from None


class _SplitWriter:
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


def _check_out(path: str, option: str) -> None:
    d = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(d):
        raise InputError(f"{option} {path}: directory {d} does not exist")
    if os.path.isdir(path):
        raise InputError(f"{option} {path}: is a directory")


def _valid_path(out: str, o: SplitOptions) -> str | None:
    """The validation file's path, or None without ``--valid-fraction``."""
    if not o.valid_fraction:
        return None
    valid = o.valid_out or (out[:-3] if out.endswith(".h5") else out) + ".valid.h5"
    if os.path.abspath(valid) == os.path.abspath(out):
        raise ConfigError(f"--valid-out {valid}: the same file as OUT", collective=True)
    _check_out(valid, "--valid-out")
    return valid


def _prep(command: str, t: _Table, out: str, o: TableOptions) -> int:
    """Convert IN to ``out`` (and the validation file); print the summary; exit code 0."""
    t0 = time.perf_counter()
    encoder = _encoder(o, len(t.sparse))
    _check_out(out, "OUT")
    valid = _valid_path(out, o)
    rows = None
    if valid is not None or o.min_count is not None:
        tally = _Tally(t.path, o.skip_bad_lines)
        for r in _scan(t, o.max_rows, tally, f"prep {command}: pass 1/2 (count)"):
            encoder.count(r)
        rows = _rows_read(tally)
        encoder.finish()
    n_train = None if valid is None else rows - round(o.valid_fraction * rows)
    tally = _Tally(t.path, o.skip_bad_lines)
    title = f"prep {command}: {'write' if rows is None else 'pass 2/2 (write)'}"
    with _SplitWriter(out, valid, n_train, t.dense_names, t.sparse_names) as w:
        for r in _scan(t, o.max_rows, tally, title):
            w.append(r.label, t.transform(r.dense), encoder.encode(r))
        if _rows_read(tally) != rows and rows is not None:
            raise InputError(f"{t.path}: changed while being read ({rows} rows, then "
                             f"{tally.rows})")
        w.close(encoder.cardinalities, source=t.path, transform=_transform(t, o))
    dt = time.perf_counter() - t0
    cards = " ".join(f"{n}={c}" for n, c in zip(t.sparse_names, encoder.cardinalities))
    split = f", {w.rows[1]:,} valid rows -> {valid}" if valid is not None else ""
    print(f"prep {command}: {w.rows[0]:,} rows -> {out}{split}; {tally.bad:,} bad lines "
          f"skipped; cardinalities {cards or '(none)'}; {dt:.2f} s, "
          f"{tally.rows / max(dt, 1e-9):,.0f} rows/s", flush=True)
    return 0


def _rows_read(tally: _Tally) -> int:
    """The rows of a finished pass; an InputError if there were none."""
    if tally.rows == 0:
        skipped = f" ({tally.bad} bad lines skipped)" if tally.bad else ""
        raise InputError(f"{tally.path}: no data rows{skipped}")
    return tally.rows


def _encoder(o: TableOptions, n_fields: int):
    """``_Hashing`` (default) or ``_Vocabulary`` (``--min-count``) for ``n_fields`` fields."""
    if o.min_count is not None:
        return _Vocabulary(n_fields, o.min_count)
    buckets = list(o.buckets or [DEFAULT_BUCKETS])
    if len(buckets) == 1:
        buckets = buckets * n_fields
    elif len(buckets) != n_fields:
        raise ConfigError(f"--buckets: {len(buckets)} values for {n_fields} sparse fields "
                          "(give one, or one per field)", collective=True)
    return _Hashing(buckets)


def _transform(t: _Table, o: TableOptions) -> str:
    """The one-line ``transform`` attribute."""
    dense = "log1p(max(x, 0))" if t.log else "x"
    sparse = (f"vocabulary min_count={o.min_count} (0 missing, 1 rare, 2.. by count)"
              if o.min_count is not None else "1 + crc32(value) % (buckets - 1), 0 missing")
    label = "" if t.threshold is None else f"label = value >= {t.threshold}; "
    return f"{label}dense {dense} (missing 0); sparse {sparse}"


# -- options and commands -------------------------------------------------------------------

def _check(ok, problem: str):
    """A config ``check``: None where ``ok(value)``, else ``problem``."""
    return lambda v: None if ok(v) else problem


@dataclass
class SplitOptions:
    """Options of every ``prep`` command: which rows, and the validation split."""

    max_rows: int | None = option(None, "stop after this many data rows; none: all",
                                  check=_check(lambda v: v > 0, "must be > 0"))
    valid_fraction: float = option(0.0, "the last round(F * rows) rows go to --valid-out",
                                   check=_check(lambda v: 0 <= v < 1, "must be in [0, 1)"))
    valid_out: str | None = option(None, "validation file; none: OUT with .h5 -> .valid.h5")

    def validate(self) -> None:
        """Cross-field rules."""
        if self.valid_out is not None and not self.valid_fraction:
            raise ConfigError("--valid-out needs --valid-fraction > 0", collective=True)


@dataclass
class TableOptions(SplitOptions):
    """Options of the text-table commands (``prep criteo``, base of ``prep csv``)."""

    buckets: tuple[int, ...] | None = option(
        None, f"hashing: ids per field, one for all or one per field; none: {DEFAULT_BUCKETS}",
        check=_check(lambda v: v and min(v) >= 2, "must be integers >= 2"))
    min_count: int | None = option(None, "a vocabulary instead of hashing: values seen >= K "
                                   "times get their own id; none: hashing",
                                   check=_check(lambda v: v > 0, "must be > 0"))
    skip_bad_lines: bool = option(False, "skip and count bad lines instead of failing")

    def validate(self) -> None:
        """Cross-field rules."""
        super().validate()
        if self.buckets is not None and self.min_count is not None:
            raise ConfigError("--buckets and --min-count exclude each other (hashing or a "
                              "vocabulary)", collective=True)


@dataclass
class CsvOptions(TableOptions):
    """Options of ``prep csv``."""

    label: str | None = option(None, "label column, a header name or 0-based index; required")
    dense: str | None = option(None, "dense columns, comma list of names or indices")
    sparse: str | None = option(None, "categorical columns, comma list of names or indices")
    label_threshold: float | None = option(None, "label = 1 if value >= T else 0; none: the "
                                           "label must be 0 or 1",
                                           check=_check(math.isfinite, "must be finite"))
    sep: str = option(",", "field separator, one ASCII character (\\t or tab: a tab)",
                      check=_check(lambda v: _separator(v) is not None,
                                   "must be one ASCII character (or \\t)"))
    header: bool = option(True, "the first line names the columns")
    dense_transform: str = option("log", "log: log1p(max(x, 0)); none: x",
                                  choices=("log", "none"))

    def validate(self) -> None:
        """Cross-field rules."""
        super().validate()
        if self.label is None:
            raise ConfigError("--label is required (a column name or index)", collective=True)
        if self.dense is None and self.sparse is None:
            raise ConfigError("give the feature columns: --dense and/or --sparse",
                              collective=True)


def _separator(text: str) -> str | None:
    """The separator character of ``--sep`` text, None if not a valid one."""
    sep = {"\\t": "\t", "tab": "\t"}.get(text, text)
    return sep if len(sep) == 1 and sep.isascii() and sep not in "\r\n" else None


@dataclass
class SyntheticOptions(SplitOptions):
    """Options of ``prep synthetic``."""

    rows: int = option(1_000_000, "rows to generate (train + validation)",
                       check=_check(lambda v: v > 0, "must be > 0"))
    seed: int = option(0, "generator seed", check=_check(lambda v: v >= 0, "must be >= 0"))
    max_cardinality: int = option(100_000, "cap of each field's cardinality (Criteo Kaggle's, "
                                  "capped)", check=_check(lambda v: v >= 1, "must be >= 1"))
    zipf: float = option(1.1, "Zipf exponent of the ids", check=_check(lambda v: v > 1,
                                                                      "must be > 1"))


def cmd_synthetic(args) -> int:
    import time

    from .synthetic import CRITEO_LIKE, write_synthetic

    o = resolve(SyntheticOptions, args)
    _check_out(args.out, "OUT")
    valid = _valid_path(args.out, o)
    rows = min(o.rows, o.max_rows or o.rows)
    t0 = time.perf_counter()
    done = write_synthetic(args.out, rows, o.valid_fraction, valid, seed=o.seed, zipf=o.zipf,
                           cardinalities=tuple(min(c, o.max_cardinality) for c in CRITEO_LIKE))
    dt = time.perf_counter() - t0
    parts = "; ".join(f"{n} rows -> {path} (planted AUC {a:.4f})" for path, (n, a) in done.items())
    print(f"prep synthetic: {parts}; {dt:.2f} s, {rows / dt:,.0f} rows/s")
    return 0


def cmd_criteo(args) -> int:
    o = resolve(TableOptions, args)
    t = _Table(args.input, sep=ord("\t"), n_fields=40, header=False, label=0,
               dense=list(range(1, 14)), sparse=list(range(14, 40)), dense_names=CRITEO_DENSE,
               sparse_names=CRITEO_SPARSE, integers=True, log=True, threshold=None)
    return _prep("criteo", t, args.out, o)


def cmd_csv(args) -> int:
    o = resolve(CsvOptions, args)
    sep = _separator(o.sep)
    with _open(args.input) as f:
        first = f.readline(MAX_LINE_BYTES + 1)
    if not first.strip(b"\r\n"):
        raise InputError(f"{args.input}: no data rows (empty first line)")
    cells = first.rstrip(b"\n").rstrip(b"\r").decode("utf-8-sig", "replace").split(sep)
    names = cells if o.header else [f"c{i}" for i in range(len(cells))]
    label, dense, sparse = (_columns(text, option, names, o.header, args.input) for
                            text, option in ((o.label, "--label"), (o.dense, "--dense"),
                                             (o.sparse, "--sparse")))
    if len(label) != 1:
        raise ConfigError(f"--label {o.label}: give one column", collective=True)
    used = label + dense + sparse
    if len(set(used)) < len(used):
        twice = next(names[c] for c in used if used.count(c) > 1)
        raise ConfigError(f"column {twice!r} is used twice in --label/--dense/--sparse",
                          collective=True)
    t = _Table(args.input, sep=ord(sep), n_fields=len(names), header=o.header, label=label[0],
               dense=dense, sparse=sparse, dense_names=[names[c] for c in dense],
               sparse_names=[names[c] for c in sparse], integers=False,
               log=o.dense_transform == "log", threshold=o.label_threshold)
    return _prep("csv", t, args.out, o)


def _columns(text: str | None, option: str, names: list[str], header: bool, path: str):
    """Column indices of a comma list of header names or 0-based indices."""
    out = []
    for c in (text.split(",") if text else []):
        if header and c in names:
            out.append(names.index(c))
        elif c.isdigit() and int(c) < len(names):
            out.append(int(c))
        else:
            known = f"columns: {', '.join(names)}" if header else f"{len(names)} columns"
            raise ConfigError(f"{option}: no column {c!r} in {path} ({known})", collective=True)
    return out


def _command(formats, name: str, options, func, help: str, description: str) -> None:
    """Add ``prep <name> IN OUT`` with the options of dataclass ``options`` (and --config)."""
    p = formats.add_parser(name, help=help, description=description + " Every option can "
                           "also come from a TOML file (--config FILE; the command line wins).")
    p.add_argument("input", metavar="IN", help="input table, plain text or gzip")
    p.add_argument("out", metavar="OUT", help="dataset file to write (HDF5)")
    add_arguments(p, options)
    p.set_defaults(func=func)


def add_prep_commands(sub) -> None:
    """Register ``prep`` and its subcommands on the CLI's subparsers ``sub``."""
    prep = sub.add_parser("prep", help="build a dataset file (criteo, csv, synthetic)",
                          description="Build a dataset file (HDF5, DESIGN §8).")
    formats = prep.add_subparsers(dest="format", metavar="<format>",
                                  parser_class=ArgumentParser)
    formats.required = True
    _command(formats, "criteo", TableOptions, cmd_criteo, "Criteo TSV: label, I1..I13, C1..C26",
             "Criteo TSV (label, 13 integer and 26 categorical fields, tab-separated) -> "
             "dataset file.")
    _command(formats, "csv", CsvOptions, cmd_csv, "any delimited table: label, dense and "
             "sparse columns", "Delimited table -> dataset file; columns by header name or "
             "0-based index.")
    p = formats.add_parser("synthetic", help="the built-in synthetic CTR stream as a file, "
                           "with the planted model's AUC", description="Synthetic Criteo-like "
                           "dataset (pshybrid/synthetic.py) -> dataset file; each file stores "
                           "the planted model's own AUC on its rows as attribute planted_auc "
                           "(the quality ceiling). Every option can also come from a TOML "
                           "file (--config FILE; the command line wins).")
    p.add_argument("out", metavar="OUT", help="dataset file to write (HDF5)")
    add_arguments(p, SyntheticOptions)
    p.set_defaults(func=cmd_synthetic)
