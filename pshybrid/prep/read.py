"""Reading IN: whole-line blocks (plain or gzip), each parsed into the good rows of a table."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

import numpy as np

from ..errors import InputError
from .block import Block, split_lines
from .inputs import MAX_LINE_BYTES, STDIN, open_input, read_checked, reads, shown_input
from .quoted import outside, split_quoted

BLOCK_BYTES = 2 << 20      # read size: a block holds ~9k Criteo lines
QUOTE = ord('"')
NL = 10


@dataclass
class Table:
    """How to read the inputs: fields per line, the columns used and how their values parse.
    ``paths``: the inputs, read one after the other (``-``: standard input, its copy in
    ``spools`` where one was made); ``quote``: RFC 4180 quoting (lines with a ``"``)."""

    paths: list[str]
    sep: int                     # separator byte
    n_fields: int
    header: bool                 # line 1 is a header
    label: int | None            # column indices (label None: unlabeled lines)
    dense: list[int]
    sparse: list[int]
    dense_names: list[str]
    sparse_names: list[str]
    integers: bool               # label and dense are integers (criteo) or floats (csv)
    log: bool                    # dense transform log1p(max(x, 0))
    threshold: float | None      # label = value >= threshold; None: value must be 0 or 1
    quote: bool = False
    spools: dict = field(default_factory=dict)
    multi_hot: list[int] = field(default_factory=list)   # multi-hot columns
    multi_sep: list[int] = field(default_factory=list)   # and their item separators
    header_line: bytes | None = None  # the first input's header: every input must repeat it
    parquet: bool = False        # a Parquet input is read as text (else refused)
    one_short: str = ""          # what a line one field short may be (criteo: unlabeled)
    one_long: str = ""           # and one a field over (criteo --unlabeled: labeled)

    def transform(self, x: np.ndarray) -> np.ndarray:
        """Dense values as stored, (n, F_d) float32: log1p(max(x, 0)) (in float64), or x."""
        y = np.log1p(np.maximum(x, 0).astype(np.float64)) if self.log else x
        return y.astype(np.float32)


@dataclass
class Rows:
    """The good rows of a block: ``label (n,) float32``, ``dense (n, F_d)`` the values x as
    parsed (int64 or float64, missing 0), and the sparse fields as offsets ``s``, lengths
    ``L`` ``(n, F_s) int64`` into ``block``; the multi-hot fields likewise, ``ms``, ``mL``
    ``(n, K)``."""

    block: Block
    label: np.ndarray
    dense: np.ndarray
    s: np.ndarray
    L: np.ndarray
    ms: np.ndarray
    mL: np.ndarray

    def take(self, rows) -> Rows:
        """The rows ``rows`` (an index, a mask or a slice)."""
        return Rows(self.block, self.label[rows], self.dense[rows], self.s[rows], self.L[rows],
                    self.ms[rows], self.mL[rows])


def parse(t: Table, data: bytes):
    """Parse a block of whole lines: ``ok`` (records,) bool, ``why(i)``: what is wrong with
    bad record i, the good ``Rows``, ``line_of`` (records,): the line of IN, counted from
    the block's first, where each record starts (None: record i is line i), and ``again``:
    None, or the offset of ``data`` up to which it was parsed, the rest to be parsed anew
    (``quoted.split_quoted``: a bad record over several lines costs its first line)."""
    if t.quote and QUOTE in data:
        block, s, L, whole, shape_why, line_of, again = split_quoted(t, data)
        if again is not None:
            return (*parse(t, data[:again])[:4], again)
    else:
        block, s, L, whole, shape_why = split_lines(data, t.sep, t.n_fields)
        line_of = None
    number = block.ints if t.integers else block.floats
    label, label_ok, label_number = _labels(t, s, L, number)
    dense_cols, sparse_cols = _view(t.dense), _view(t.sparse)
    dense, dense_ok = number(s[:, dense_cols], L[:, dense_cols])
    if not t.log:                                       # stored as is: must fit in float32
        dense_ok &= np.abs(dense) <= np.finfo(np.float32).max
    good = label_ok & dense_ok.all(1)
    ok = whole.copy()
    ok[whole] = good

    def why(i: int) -> str:
        if not whole[i]:
            hint = {f"wrong number of fields: {t.n_fields + d}, expected {t.n_fields}": h
                    for d, h in ((-1, t.one_short), (1, t.one_long))}
            return shape_why(i) + hint.get(shape_why(i), "")
        r = np.count_nonzero(whole[:i])

        def text(c: int) -> str:
            return block.data[s[r, c]:s[r, c] + L[r, c]].decode(errors="replace")

        if not label_ok[r]:
            need = "0 or 1" if t.threshold is None else "a number"
            fix = ("" if t.integers or t.threshold is not None or not label_number[r] else
                   ": --label-threshold T makes a number 1 if >= T, else 0")  # csv: a rating
            return f"label {text(t.label)!r} is not {need}{fix}"
        j = int(np.flatnonzero(~dense_ok[r])[0])
        need = ("an integer of at most 18 digits" if t.integers else "a finite number"
                if t.log else "a float32")
        return f"{t.dense_names[j]} value {text(t.dense[j])!r} is not {need}"

    multi = _view(t.multi_hot)
    rows = Rows(block, label.astype(np.float32), dense, s[:, sparse_cols], L[:, sparse_cols],
                s[:, multi], L[:, multi])
    return ok, why, rows if good.all() else rows.take(good), line_of, None


def _labels(t: Table, s: np.ndarray, L: np.ndarray, number):
    """``(label, ok, a number)`` of each record (``--unlabeled``: 0, all good)."""
    if t.label is None:
        good = np.ones(len(s), bool)
        return np.zeros(len(s)), good, good
    label, label_ok = number(s[:, t.label], L[:, t.label])
    label_ok &= L[:, t.label] > 0
    label_number = label_ok.copy()  # a number, if maybe not 0 or 1
    if t.threshold is None:
        label_ok &= (label == 0) | (label == 1)
    else:
        label = label >= t.threshold
    return label, label_ok, label_number


def _view(cols: list[int]):
    """Column indices as a slice where they are consecutive (NumPy takes a view), else as is."""
    run = cols and cols == list(range(cols[0], cols[0] + len(cols)))
    return slice(cols[0], cols[0] + len(cols)) if run else cols


@dataclass
class Tally:
    """Counts of one pass; ``bad_line`` raises unless bad lines are skipped. ``path``: the
    input being read (as messages name it)."""

    path: str
    skip: bool
    rows: int = 0
    bad: int = 0

    def bad_line(self, line: int, why: str, count: int = 1) -> None:
        if not self.skip:
            raise InputError(f"{self.path}:{line}: {why} (--skip-bad-lines skips such lines)")
        self.bad += count


def _cut(buf: bytes, quote: int | None) -> int:
    """Where the whole lines of ``buf`` end: after its last LF (with ``quote``, the
    separator of quoted CSV: the last LF outside double quotes); 0 if none."""
    cut = buf.rfind(b"\n") + 1
    if quote is None or not cut or b'"' not in buf:
        return cut
    a = np.frombuffer(buf, np.uint8)
    nl = np.flatnonzero(a == NL)
    ends = nl[outside(a, quote, nl)]
    return int(ends[-1]) + 1 if len(ends) else 0


def blocks(path: str, tally: Tally, spools: dict | None = None, quote: int | None = None,
           parquet: bool = False):
    """Yield ``(first, data)``: whole lines of IN, each ending in LF, ``first`` the 1-based
    number of the first line; lines over MAX_LINE_BYTES go to ``tally.bad_line``. With
    ``quote`` (the separator of quoted CSV), a block never ends inside double quotes (a
    quoted value may hold LFs); a
    double quote still open MAX_LINE_BYTES later makes its line bad, and the lines after it
    are read again as lines of their own (one stray quote costs one line). ``parquet``: as
    ``inputs.open_input``."""
    line, rem, skipping, again = 1, b"", False, False
    with open_input(path, spools, parquet) as f, reads(path, spools, f, BLOCK_BYTES) as read:
        while True:
            chunk = b"" if again else read()
            end, again = not chunk and not again, False
            # (at the end, a last line without its LF gets one)
            buf = rem + (chunk or b"\n" * (end and rem[-1:] not in (b"", b"\n")))
            if skipping:                                 # the rest of a too long line
                k = buf.find(b"\n") + 1
                buf, skipping, line = (buf[k:], False, line + 1) if k else (b"", True, line)
            cut = len(buf) if end else _cut(buf, quote)
            k = buf.find(b"\n", 0, cut) + 1   # the first line, begun in an earlier read
            if k > MAX_LINE_BYTES + 1:        # (a later one lies within this read: shorter)
                tally.bad_line(line, f"line longer than {MAX_LINE_BYTES} bytes")
                buf, cut, line = buf[k:], cut - k, line + 1
            if cut:
                data = buf[:cut]
                yield line, data.replace(b"\r\n", b"\n") if b"\r" in data else data
                line += data.count(b"\n")
            rem = buf[cut:]
            if len(rem) > MAX_LINE_BYTES:
                k = rem.find(b"\n") + 1
                if quote is not None and 0 < k <= MAX_LINE_BYTES + 1:  # a quote left open
                    tally.bad_line(line, f"a double quote not closed within {MAX_LINE_BYTES} "
                                   "bytes")
                    rem, line, again = rem[k:], line + 1, True
                else:
                    tally.bad_line(line, f"line longer than {MAX_LINE_BYTES} bytes")
                    rem, skipping = b"", True
            if end:
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
    """Yield the good rows of the inputs, one after the other (``Rows``), block by block, at
    most ``max_rows`` in all."""
    progress = Progress(title)
    for path in t.paths:
        tally.path = shown_input(path)
        for first, data in blocks(path, tally, t.spools, t.sep if t.quote else None,
                                  t.parquet):
            if t.header and first == 1:
                _check_header(t, data[:data.index(b"\n") + 1], tally.path)
                data, first = data[data.index(b"\n") + 1:], 2
            while data:  # (the rest of a block a bad record over several lines cut short)
                rows, again = _block(t, first, data, max_rows, tally)
                if rows is not None:
                    yield rows
                    progress.update(tally.rows)
                if max_rows is not None and tally.rows >= max_rows:
                    progress.update(tally.rows, end=True)
                    return
                first, data = ((first + data.count(b"\n", 0, again), data[again:])
                               if again is not None else (first, b""))
    progress.update(tally.rows, end=True)


def _block(t: Table, first: int, data: bytes, max_rows: int | None, tally: Tally):
    """Parse one block (or its part up to ``again``: ``parse``); count its bad lines (or
    raise); return its good rows (at most what ``max_rows`` leaves; None if it has none)
    and ``again``."""
    ok, why, rows, line_of, again = parse(t, data)
    good = np.flatnonzero(ok)
    if max_rows is not None and len(good) >= max_rows - tally.rows:
        good = good[:max_rows - tally.rows]
        ok = ok[:good[-1] + 1] if len(good) else ok[:0]
    bad = np.flatnonzero(~ok)
    if len(bad):
        i = int(bad[0])
        tally.bad_line(first + (i if line_of is None else int(line_of[i])), why(i), len(bad))
    tally.rows += len(good)
    return rows.take(slice(len(good))) if len(good) else None, again


def check_inputs(t: Table) -> None:
    """Open every input but standard input as ``blocks`` will and, with a header, compare
    its first line with the first input's as ``scan`` will: a later input that is missing,
    not a regular file, unreadable, a Parquet file to ``prep criteo``, a gzip whose start
    does not decompress, or of another header fails in the reader's words before the first
    pass reads a row, not when the scan reaches it (hours into a large dataset). Standard
    input can be read once: it is checked as it is read. A first line the reader would call
    too long is left to it."""
    for path in t.paths:
        if path == STDIN:
            continue
        name = shown_input(path)
        with open_input(path, t.spools, t.parquet) as f:
            line = read_checked(name, f.readline, MAX_LINE_BYTES + 1) if t.header else b""
        if line.endswith(b"\n") or 0 < len(line) <= MAX_LINE_BYTES:   # (b"": no rows)
            _check_header(t, line, name)


def _check_header(t: Table, line: bytes, name: str) -> None:
    """Every input's header is the first input's."""
    want = None if t.header_line is None else t.header_line.rstrip(b"\r\n")
    if want is not None and line.rstrip(b"\r\n") != want:
        shown = want.decode(errors="replace")
        raise InputError(f"{name}:1: the header differs from the first input's ({shown!r})")
