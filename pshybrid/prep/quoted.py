"""Quoted CSV (RFC 4180), for the blocks that hold a double quote: records end at the LFs
outside double quotes, as Python's ``csv`` module reads them (``outside``: a quote inside
an unquoted value is a character of it); a record without a quote splits at the separator
as any line; one with a quote is read by the ``csv`` module (``delimiter`` the separator,
``"`` quotes, ``""`` inside quotes is one ``"``, ``strict``): it must give exactly one
record of the expected number of fields. The values are then laid end to end in a new
``Block``, so the typed parsers and the encoders read them as they read unquoted fields.
A bad record over several lines (a quote opened and never closed where a record can end)
costs its first line only: the block ends there and the lines after it are read again."""

from __future__ import annotations

import csv

import numpy as np

from .block import Block, split_lines
from .inputs import MAX_LINE_BYTES

NL, QUOTE = 10, ord('"')
# A field may be as long as a line may (csv's own limit, 128 KiB, made long quoted values bad)
csv.field_size_limit(max(csv.field_size_limit(), MAX_LINE_BYTES))


def outside(a: np.ndarray, sep: int, at: np.ndarray) -> np.ndarray:
    """Whether each offset ``at`` (not a quote's) of ``a`` (uint8, from a record's start) lies
    outside double quotes as the ``csv`` module reads them, run of quotes by run: an odd run
    that starts a value (at ``a``'s start, after the separator or an LF) opens a quoted
    value, or inside one closes it (toggles); any other odd run closes a quoted value and
    is a character of an unquoted one (outside after it); an even run changes nothing
    (``""``: one quote inside, an empty value at a start)."""
    q = np.flatnonzero(a == QUOTE)
    if not len(q):
        return np.ones(len(at), bool)
    first = np.concatenate(([True], q[1:] != q[:-1] + 1))
    runs = q[first]
    odd = np.diff(np.append(np.flatnonzero(first), len(q))) % 2 == 1
    before = a[np.maximum(runs - 1, 0)]
    starts = (runs == 0) | (before == sep) | (before == NL)
    toggles = np.cumsum(odd & starts)
    reset = np.maximum.accumulate(np.where(odd & ~starts, np.arange(len(runs)), -1))
    inside = (toggles - np.where(reset >= 0, toggles[np.maximum(reset, 0)], 0)) % 2 == 1
    j = np.searchsorted(runs, at) - 1   # the last run before each offset
    return (j < 0) | ~inside[np.maximum(j, 0)]


def _records(data: bytes, sep: int) -> tuple[np.ndarray, np.ndarray]:
    """Start and end (the LF's offset) of each record: the LFs outside double quotes (and
    the block's last byte, an LF)."""
    a = np.frombuffer(data, np.uint8)
    nl = np.flatnonzero(a == NL)
    ends = nl[outside(a, sep, nl)]
    if not len(ends) or ends[-1] != len(data) - 1:   # the last quote never closed (at EOF)
        ends = np.append(ends, len(data) - 1)
    return np.concatenate(([0], ends[:-1] + 1)).astype(np.int64), ends


def _fields(record: bytes, sep: int) -> tuple[list[bytes] | None, str]:
    """The values of one record (None if it is bad) and why it is bad."""
    if b"\0" in record:
        return None, "a NUL byte (not a text file?)"
    lines = record.decode("latin-1").split("\n")
    lines = [x + "\n" for x in lines[:-1]] + lines[-1:]
    try:
        got = list(csv.reader(lines, delimiter=chr(sep), quotechar='"', doublequote=True,
                              strict=True))
    except csv.Error as exc:
        said = str(exc)
        if said == "unexpected end of data":
            said = "a double quote never closed where a readable record could end"
        elif said.startswith("new-line character seen"):
            said = "a CR outside double quotes (only LF and CRLF end a line)"
        return None, f"bad quoting: {said}"
    if len(got) != 1:
        return None, "unbalanced double quotes, or a CR outside them"
    return [v.encode("latin-1") for v in got[0]], ""


def split_quoted(t, data: bytes):
    """Records of a block with quotes: ``(block, s, L, whole, shape_why, line_of, again)``
    as ``block.split_lines`` gives for lines; ``line_of`` (records,) the line, counted from
    the block's first, where each record starts. The records without a quote keep the NumPy
    path: each record with one becomes a line of empty fields there, and its values (from
    the csv module) are appended to the block, where its fields then point. ``again``: None,
    or where the block must end instead (after the first line of its first bad record over
    several lines; the rest is read again), the other values then None."""
    starts, ends = _records(data, t.sep)
    quotes = np.concatenate(([0], np.cumsum(np.frombuffer(data, np.uint8) == QUOTE)))
    quoted = np.flatnonzero(quotes[ends] > quotes[starts]).tolist()
    blank = bytes([t.sep]) * (t.n_fields - 1) + b"\n"
    pieces, at, values, got = [], 0, [], {}
    for i in quoted:
        a, b = int(starts[i]), int(ends[i])
        pieces += [data[at:a], blank]
        at = b + 1
        got[i] = _fields(data[a:b], t.sep)
        if got[i][0] is not None and len(got[i][0]) != t.n_fields:
            got[i] = None, f"wrong number of fields: {len(got[i][0])}, expected {t.n_fields}"
        if got[i][0] is None and data.find(b"\n", a, b) >= 0:
            return None, None, None, None, None, None, data.find(b"\n", a, b) + 1
        values += got[i][0] or []
    pieces.append(data[at:])
    lines = b"".join(pieces)
    _, s, L, whole, line_why = split_lines(lines, t.sep, t.n_fields)
    lengths = np.array([len(v) for v in values], np.int64)
    row = np.cumsum(whole) - 1                  # each whole line's row of s and L
    ok = [i for i in quoted if got[i][0] is not None]
    s[row[ok]] = (len(lines) + np.cumsum(lengths) - lengths).reshape(-1, t.n_fields)
    L[row[ok]] = lengths.reshape(-1, t.n_fields)
    bad = [i for i in quoted if got[i][0] is None]
    keep = np.ones(len(s), bool)
    keep[row[bad]] = False
    whole[bad] = False
    block = Block(lines + b"".join(values))
    nl = np.concatenate(([0], np.cumsum(np.frombuffer(data, np.uint8) == NL)))

    def why(i: int) -> str:
        return got[i][1] if i in got else line_why(i)

    return block, s[keep], L[keep], whole, why, nl[starts], None
