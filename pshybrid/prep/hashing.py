"""The hashing encoder: id = 0 if missing else ``1 + zlib.crc32(value) % (buckets_f - 1)``,
with the CRC-32 of a block's fields computed in NumPy."""

from __future__ import annotations

import zlib

import numpy as np

from .block import SHORT_BYTES, Block


def _crc_table(bits: int) -> np.ndarray:
    """(2**bits,) int64: CRC-32 (reflected polynomial 0xEDB88320, as zlib) of each ``bits``-bit
    step, so that ``crc = table[(crc ^ x) & (2**bits - 1)] ^ (crc >> bits)`` consumes x."""
    t = np.arange(2 ** bits, dtype=np.int64)
    for _ in range(bits):
        t = np.where(t & 1, (t >> 1) ^ 0xEDB88320, t >> 1)
    return t


_CRC8, _CRC16 = _crc_table(8), _crc_table(16)


def crc32(block: Block, s, L) -> np.ndarray:
    """``zlib.crc32`` of each field of ``block``: same shape as ``s``, uint32. Fields of one
    length at a time (so no masks), two bytes a step."""
    shape, s, L = s.shape, s.ravel(), L.ravel()
    out = np.zeros(s.size, np.uint32)  # crc32(b"") == 0
    lengths = np.flatnonzero(np.bincount(L, minlength=1))
    for n in lengths[lengths > 0].tolist():        # each length present, but 0 (b"")
        i = np.flatnonzero(L == n)
        if n > SHORT_BYTES:
            out[i] = [zlib.crc32(block.data[a:a + n]) for a in s[i].tolist()]
            continue
        crc = np.full(len(i), 0xFFFFFFFF, np.int64)
        for k in range(0, n, 8):
            w, m = block.words[s[i] + (8 + k)], min(8, n - k)
            for j in range(0, m - 1, 2):
                crc = _CRC16[(crc ^ (w >> 8 * j)) & 0xFFFF] ^ (crc >> 16)
            if m % 2:
                crc = _CRC8[(crc ^ (w >> 8 * (m - 1))) & 0xFF] ^ (crc >> 8)
        out[i] = crc ^ 0xFFFFFFFF
    return out.reshape(shape)


class Hashing:
    """id = 0 if missing else 1 + crc32(value) % (buckets_f - 1)."""

    def __init__(self, buckets: list[int]):
        self.cardinalities = list(buckets)
        self.mod = np.array(buckets, np.int64) - 1

    def count(self, rows) -> None:
        """Nothing to learn: the ids depend on the value only."""

    def finish(self) -> None:
        """Nothing to learn."""

    def encode(self, rows) -> np.ndarray:
        """ids of ``Rows``: (n, F_s) int64."""
        crc = crc32(rows.block, rows.s, rows.L).astype(np.int64)
        return np.where(rows.L == 0, 0, 1 + crc % self.mod)
