"""Multi-hot fields (``prep csv --multi-hot COL[:SEP]``): a value is a list of items split at
SEP; each item is encoded as a categorical value of its own field (hashing or vocabulary,
as the single-hot fields); empty items are dropped, and a value without a non-empty item is
one missing item (id 0), so every row has at least one id in every field."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError
from .block import Block
from .options import separator


@dataclass
class Items:
    """The items of one multi-hot column in a block: ``s``, ``L`` (m, 1) offsets and lengths
    in ``block`` (as ``Rows`` holds fields, so the encoders take them), ``lengths`` (n,)
    items per row."""

    block: Block
    s: np.ndarray
    L: np.ndarray
    lengths: np.ndarray


def items(block: Block, s: np.ndarray, L: np.ndarray, sep: int) -> Items:
    """Split the values at ``s``, ``L`` (n,) of ``block`` into their items."""
    n = len(s)
    buf = block.buf[8:8 + len(block.data)]
    p = np.append(np.flatnonzero(buf == sep), len(buf) + 1)    # SEP positions, a sentinel
    lo, hi = np.searchsorted(p, s), np.searchsorted(p, s + L)
    k = hi - lo + 1                                             # items per value, empty too
    first = np.cumsum(k) - k
    row = np.repeat(np.arange(n), k)
    j = np.arange(int(k.sum())) - first[row]                    # item index in its value
    at = lo[row] + j
    start = np.where(j == 0, s[row], p[np.maximum(at - 1, 0)] + 1)
    end = np.where(j == k[row] - 1, (s + L)[row], p[np.minimum(at, len(p) - 1)])
    keep = end > start
    lone = np.bincount(row[keep], minlength=n) == 0             # no non-empty item: missing
    keep[first[lone]] = True
    start, end = start[keep], end[keep]
    return Items(block, start[:, None], (end - start)[:, None],
                 np.bincount(row[keep], minlength=n).astype(np.int64))


def parse_multi_hot(text: str | None, names: list[str], header: bool, path: str, columns):
    """``--multi-hot`` text ``COL[:SEP],...`` -> (column indices, separator bytes). SEP: one
    ASCII character (default ``|``; ``comma`` for a comma, ``\\t`` or ``tab`` for a tab, ``:``
    as ``COL::``)."""
    cols, seps = [], []
    for part in (text.split(",") if text else []):
        col, _, sep = (part[:-2], ":", ":") if part.endswith("::") else \
            part.rpartition(":") if ":" in part else (part, "", "|")  # COL:: -> SEP ':'
        ch = "," if sep == "comma" else separator(sep)
        if ch is None:
            raise ConfigError(f"--multi-hot {part}: the separator must be one ASCII character "
                              "(comma, \\t or tab also work)", collective=True)
        cols.extend(columns(col, "--multi-hot", names, header, path))
        seps.append(ord(ch))
    return cols, seps
