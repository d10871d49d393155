"""Checksums of a checkpoint's arrays: ``zlib.crc32`` of each array's bytes in C order,
stored as the attribute ``crc32`` beside every dataset when it is written and compared
when it is read (``checkpoint``, ``checkpoint_files``). One pass over the bytes; rows read
in chunks give the checksum of the whole array."""

from __future__ import annotations

import zlib

import numpy as np

from .errors import InputError

CRC_ATTR = "crc32"  # on every dataset of a checkpoint: zlib.crc32 of its bytes (C order)


def crc32(a: np.ndarray, running: int = 0) -> int:
    """zlib.crc32 of ``a``'s bytes in C order, continuing ``running`` (rows read in chunks
    give the checksum of the whole array)."""
    return zlib.crc32(np.ascontiguousarray(a).reshape(-1).view(np.uint8), running)


class Sums:
    """Checks datasets of one file against their ``CRC_ATTR`` (``want``: whether the
    checkpoint has checksums; one without, written before them, is not checked)."""

    def __init__(self, fpath: str, want: bool):
        self.fpath, self.want, self.got, self.stored = fpath, want, {}, {}

    def add(self, key: str, a: np.ndarray) -> None:
        if self.want:
            self.got[key] = crc32(a, self.got.get(key, 0))

    def read(self, f) -> None:
        """Take the stored checksums of what was added from the open file ``f``."""
        self.stored = {k: f[k].attrs.get(CRC_ATTR) for k in self.got}

    def check(self) -> None:
        for key, got in self.got.items():
            stored = self.stored[key]
            if stored is None:
                raise InputError(f"{self.fpath}: /{key} has no checksum (attribute crc32), "
                                 "though meta.json says the checkpoint has them")
            if int(stored) != got:
                raise InputError(f"{self.fpath}: /{key} fails its checksum: crc32 {got:#010x}, "
                                 f"stored {int(stored):#010x} (changed after it was written)")
