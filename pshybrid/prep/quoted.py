"""Quoted CSV (RFC 4180), for the blocks that hold a double quote: records end at the LFs
outside double quotes; a record without a quote splits at the separator as any line; one
with a quote is read by Python's ``csv`` module (``delimiter`` the separator, ``"`` quotes,
``""`` inside quotes is one ``"``, ``strict``): it must give exactly one record of the
expected number of fields. The values are then laid end to end in a new ``Block``, so the
typed parsers and the encoders read them as they read unquoted fields."""

from __future__ import annotations

import csv

import numpy as np

from .block import Block

NL, QUOTE = 10, ord('"')


def _records(data: bytes) -> tuple[np.ndarray, np.ndarray]:
    """Start and end (the LF's offset) of each record: the LFs outside double quotes (and
    the block's last byte, an LF)."""
    a = np.frombuffer(data, np.uint8)
    nl = np.flatnonzero(a == NL)
    ends = nl[np.cumsum(a == QUOTE)[nl] % 2 == 0]
    if not len(ends) or ends[-1] != len(data) - 1:   # the last quote never closed (at EOF)
        ends = np.append(ends, len(data) - 1)
    return np.concatenate(([0], ends[:-1] + 1)).astype(np.int64), ends


def _fields(record: bytes, sep: int) -> tuple[list[bytes] | None, str]:
    """The values of one record (None if it is bad) and why it is bad."""
    if b"\0" in record:
        return None, "a NUL byte (not a text file?)"
    if b'"' not in record:
        return record.split(bytes([sep])), ""
    lines = record.decode("latin-1").split("\n")
    lines = [x + "\n" for x in lines[:-1]] + lines[-1:]
    try:
        got = list(csv.reader(lines, delimiter=chr(sep), quotechar='"', doublequote=True,
                              strict=True))
    except csv.Error as exc:
        return None, f"bad quoting: {exc}"
    if len(got) != 1:
        return None, "unbalanced double quotes, or a CR outside them"
    return [v.encode("latin-1") for v in got[0]], ""


def split_quoted(t, data: bytes):
    """Records of a block with quotes: ``(block, s, L, whole, shape_why, line_of)`` as
    ``read._split`` gives for lines, over a new block of the values; ``line_of`` (records,)
    the line, counted from the block's first, where each record starts."""
    starts, ends = _records(data)
    values, whole, why = [], np.zeros(len(starts), bool), {}
    for i, (a, b) in enumerate(zip(starts.tolist(), ends.tolist())):
        got, problem = _fields(data[a:b], t.sep)
        if got is not None and len(got) != t.n_fields:
            got, problem = None, f"wrong number of fields: {len(got)}, expected {t.n_fields}"
        if got is None:
            why[i] = problem
        else:
            whole[i] = True
            values.extend(got)
    lengths = np.array([len(v) for v in values], np.int64)
    s = (np.cumsum(lengths) - lengths).reshape(-1, t.n_fields)
    block = Block(b"".join(values))
    lines = np.frombuffer(data, np.uint8) == NL
    line_of = np.concatenate(([0], np.cumsum(lines)))[starts]
    return block, s, lengths.reshape(-1, t.n_fields), whole, why.__getitem__, line_of
