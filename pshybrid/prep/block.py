"""A block of whole lines of IN and NumPy parsers of its fields (integers, floats, bytes)."""

from __future__ import annotations

import math

import numpy as np

SHORT_BYTES = 64           # values up to this long are handled in NumPy, longer ones in Python
_ASCII0 = 0x3030303030303030                                  # b"00000000"
_LOW = np.array([(1 << 8 * m) - 1 for m in range(9)], np.uint64)  # the low m bytes


class Block:
    """Whole lines of IN: ``data`` bytes, ``buf`` uint8 (``data`` with 8 zero bytes on each
    side) and ``words`` int64, ``words[o + 8]`` the 8 bytes at offset ``o >= -8`` of ``data``
    (little-endian: the first byte lowest). A field is an offset ``s`` and a length ``L``."""

    def __init__(self, data: bytes):
        self.data = data
        self.buf = np.frombuffer(bytes(8) + data + bytes(8), np.uint8)
        self.words = np.ndarray((len(data) + 9,), "<i8", self.buf, strides=(1,))

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


NL = 10


def split_lines(data: bytes, sep: int, n_fields: int):
    """Unquoted lines split at ``sep``: ``(block, s, L, whole, shape_why)``, ``s``/``L``
    (whole lines, n_fields) the fields' offsets and lengths, ``whole`` (lines,) the lines
    with the right number of fields and no NUL byte, ``shape_why(i)`` why line i is not
    whole."""
    block = Block(data)
    buf = block.buf[8:8 + len(data)]
    ends = np.flatnonzero((buf == sep) | (buf == NL))
    starts = np.concatenate(([0], ends[:-1] + 1))
    eol = np.flatnonzero(buf[ends] == NL)
    fields = np.diff(eol, prepend=-1)
    whole = fields == n_fields
    nul = np.zeros(len(eol), bool)
    if b"\0" in data:                                   # such a line is bad
        nul[np.searchsorted(ends[eol], np.flatnonzero(buf == 0))] = True
        whole &= ~nul
    if whole.all():
        s, L = starts.reshape(-1, n_fields), (ends - starts).reshape(-1, n_fields)
    else:
        idx = eol[whole][:, None] + np.arange(1 - n_fields, 1)
        s, L = starts[idx], ends[idx] - starts[idx]

    def shape_why(i: int) -> str:
        if nul[i]:
            return "a NUL byte (not a text file?)"
        if fields[i] == 1 and ends[eol[i]] == starts[eol[i]]:
            return f"an empty line (a record has {n_fields} fields)"
        return f"wrong number of fields: {fields[i]}, expected {n_fields}"

    return block, s, L, whole, shape_why
