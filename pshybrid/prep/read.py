"""Reading IN: whole-line blocks (plain or gzip), each parsed into the good rows of a table."""

from __future__ import annotations

import contextlib
import gzip
import os
import stat
import sys
import time
import zlib
from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from .block import Block

BLOCK_BYTES = 2 << 20      # read size: a block holds ~9k Criteo lines
MAX_LINE_BYTES = 8 << 20   # a longer line is a bad line
NL = 10


@dataclass
class Table:
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
class Rows:
    """The good rows of a block: ``label (n,) float32``, ``dense (n, F_d)`` the values x as
    parsed (int64 or float64, missing 0), and the sparse fields as offsets ``s``, lengths
    ``L`` ``(n, F_s) int64`` into ``block``."""

    block: Block
    label: np.ndarray
    dense: np.ndarray
    s: np.ndarray
    L: np.ndarray

    def take(self, rows) -> Rows:
        """The rows ``rows`` (an index, a mask or a slice)."""
        return Rows(self.block, self.label[rows], self.dense[rows], self.s[rows], self.L[rows])


def parse(t: Table, data: bytes):
    """Parse a block of whole lines: ``ok`` (lines,) bool, ``why(i)``: what is wrong with bad
    line i, and the good ``Rows``."""
    block = Block(data)
    buf = block.buf[8:8 + len(data)]
    ends = np.flatnonzero((buf == t.sep) | (buf == NL))
    starts = np.concatenate(([0], ends[:-1] + 1))
    eol = np.flatnonzero(buf[ends] == NL)
    fields = np.diff(eol, prepend=-1)
    whole = fields == t.n_fields
    nul = np.zeros(len(eol), bool)
    if b"\0" in data:                                   # such a line is bad
        nul[np.searchsorted(ends[eol], np.flatnonzero(buf == 0))] = True
        whole &= ~nul
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
        if nul[i]:
            return "a NUL byte (not a text file?)"
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

    rows = Rows(block, label.astype(np.float32), dense, s[:, sparse_cols], L[:, sparse_cols])
    return ok, why, rows if good.all() else rows.take(good)


def _view(cols: list[int]):
    """Column indices as a slice where they are consecutive (NumPy takes a view), else as is."""
    run = cols and cols == list(range(cols[0], cols[0] + len(cols)))
    return slice(cols[0], cols[0] + len(cols)) if run else cols


@contextlib.contextmanager
def open_input(path: str):
    """IN opened for binary reading, gunzipped if it starts with the gzip magic bytes. IN
    must be a regular file (it is read twice; a FIFO is not even opened for long)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        what = "is a directory" if stat.S_ISDIR(mode) else "not a regular file"
        raise InputError(f"{path}: cannot read: {what}")
    f = os.fdopen(fd, "rb")
    try:
        gz = _read(path, f.read, 2) == b"\x1f\x8b"
        f.seek(0)
        with gzip.GzipFile(fileobj=f, mode="rb") if gz else contextlib.nullcontext(f) as g:
            yield g
    finally:
        f.close()


def _read(path: str, read, n: int) -> bytes:
    """``read(n)``, its failures (an I/O error, a corrupt or truncated gzip stream) as an
    InputError naming IN."""
    try:
        return read(n)
    except (OSError, EOFError, zlib.error) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise InputError(f"{path}: cannot read: {why or type(exc).__name__}") from None


def first_line(path: str) -> bytes:
    """IN's first line (at most MAX_LINE_BYTES + 1 bytes), with its line end."""
    with open_input(path) as f:
        return _read(path, f.readline, MAX_LINE_BYTES + 1)


@dataclass
class Tally:
    """Counts of one pass; ``bad_line`` raises unless bad lines are skipped."""

    path: str
    skip: bool
    rows: int = 0
    bad: int = 0

    def bad_line(self, line: int, why: str, count: int = 1) -> None:
        if not self.skip:
            raise InputError(f"{self.path}:{line}: {why} (--skip-bad-lines skips such lines)")
        self.bad += count


def blocks(path: str, tally: Tally):
    """Yield ``(first, data)``: whole lines of IN, each ending in LF, ``first`` the 1-based
    number of the first line; lines over MAX_LINE_BYTES go to ``tally.bad_line``."""
    line, rem, skipping = 1, b"", False
    with open_input(path) as f:
        while True:
            chunk = _read(path, f.read, BLOCK_BYTES)
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


class Progress:
    """Rows/s on stderr: a ``\\r`` line on a TTY (from 0.25 s on), else a line every 5 s; and
    one at the end if any was shown (a short run's only output is the summary, or the error)."""

    def __init__(self, title: str):
        self.title, self.tty, self.shown = title, sys.stderr.isatty(), False
        self.t0 = self.last = time.perf_counter()

    def update(self, rows: int, end: bool = False) -> None:
        now = time.perf_counter()
        due = self.shown if end else now - self.last >= (0.25 if self.tty else 5.0)
        if not due:
            return
        self.shown = True
        self.last, dt = now, now - self.t0
        msg = f"{self.title}: {rows:,} rows, {dt:.1f} s, {rows / max(dt, 1e-9):,.0f} rows/s"
        if self.tty:
            msg = "\r" + msg + "\x1b[K" + ("\n" if end else "")
        sys.stderr.write(msg if self.tty else msg + "\n")
        sys.stderr.flush()


def scan(t: Table, max_rows: int | None, tally: Tally, title: str):
    """Yield the good rows of IN (``Rows``) block by block, at most ``max_rows`` in all."""
    progress = Progress(title)
    for first, data in blocks(t.path, tally):
        if t.header and first == 1:
            data, first = data[data.index(b"\n") + 1:], 2
            if not data:
                continue
        ok, why, rows = parse(t, data)
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

