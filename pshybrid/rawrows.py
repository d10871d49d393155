"""Rows of an uncompressed HDF5 dataset read with ``os.preadv`` from the file's own
descriptor, straight into the caller's buffer, at the byte offsets HDF5 gives for the
dataset's chunks (or its contiguous storage): the bytes an HDF5 read of those rows
returns, without HDF5's per-call work (the chunk's lookup, the selection's iteration) and
without a copy through an intermediate buffer. A compressed or filtered dataset, another
file driver, data kept in another file, a stored type of its own or a layout that does not
check out keeps HDF5's reads (``raw_rows`` gives None); a chunk HDF5 has not allocated is
read through HDF5 (its fill value). Also the handles HDF5's own direct reads use
(``h5_handles``)."""

from __future__ import annotations

import os

import numpy as np

KEYS = ("label", "dense", "sparse")


def h5_handles(ds) -> list:
    """(dataset id, file space, memory spaces by shape) of /label, /dense, /sparse of an
    opened ``H5Dataset``, for HDF5's reads straight into the caller's buffers (a compressed
    file's windows, ``batches._read_span``; the chunks ``RawRows`` leaves to HDF5)."""
    from h5py import h5d, h5p

    handles = []
    for key in KEYS:
        dapl = h5p.create(h5p.DATASET_ACCESS)
        d = ds.f[key]
        nfilters, chunks, dtype = d.id.get_create_plist().get_nfilters(), d.chunks, d.dtype
        whole = not cuts_rows(chunks, d.shape)
        # HDF5 shares one cache among a dataset's open handles, set by the first: this one
        # is closed before ours opens (held open, its default cache made every read copy
        # its whole chunks).
        del d
        if nfilters == 0 and whole:
            # Uncompressed: no chunk cache, so a read copies just its rows. With the default
            # 1 MiB cache, each new 16k-row chunk of /dense was read whole for a few rows.
            dapl.set_chunk_cache(0, 0, 1.0)
        elif chunks:
            # Compressed, or chunks that cut rows (h5py's chunks=True): a chunk is read
            # whole (without a cache, once per column range); keep 4 (a window's spans
            # reuse them).
            dapl.set_chunk_cache(521, 4 * int(np.prod(chunks)) * dtype.itemsize, 1.0)
        dsid = h5d.open(ds.f.id, key.encode(), dapl)
        handles.append((dsid, dsid.get_space(), {}))
    return handles


class RawRows:
    """One dataset's rows by direct reads: ``read(a, out)`` fills ``out`` (C-contiguous,
    the dataset's dtype and row shape) with rows ``[a, a + len(out))``."""

    def __init__(self, fd: int, dsid, shape, dtype):
        from h5py import h5d

        self.fd, self.dsid, self.shape, self.dtype = fd, dsid, tuple(shape), np.dtype(dtype)
        self.row = int(self.dtype.itemsize * np.prod(shape[1:], dtype=np.int64))
        plist = dsid.get_create_plist()
        if plist.get_layout() == h5d.CHUNKED:
            self.chunk, self.starts = int(plist.get_chunk()[0]), {}
        else:  # contiguous: one "chunk" of every row (None: no storage allocated)
            self.chunk, self.starts = max(1, self.shape[0]), {0: dsid.get_offset()}

    def _start(self, c: int):
        """Byte offset of chunk ``c`` in the file; None where HDF5 must read it (not
        allocated, or stored at another size than its rows')."""
        if c not in self.starts:
            first = (c * self.chunk,) + (0,) * (len(self.shape) - 1)  # its first element
            info = self.dsid.get_chunk_info_by_coord(first)
            ok = info.byte_offset is not None and info.size == self.chunk * self.row
            self.starts[c] = info.byte_offset if ok else None
        return self.starts[c]

    def read(self, a: int, out: np.ndarray) -> None:
        n = out.shape[0]
        if n == 0 or out.size == 0:
            return
        assert out.flags.c_contiguous, "a direct read fills contiguous rows"
        view = memoryview(out.reshape(-1)).cast("B")
        k = 0
        while k < n:
            c, w = divmod(a + k, self.chunk)
            m = min(n - k, self.chunk - w)
            start = self._start(c)
            if start is None:
                self._hdf5(a + k, out[k:k + m])
            else:
                _pread_all(self.fd, view[k * self.row:(k + m) * self.row], start + w * self.row)
            k += m

    def _hdf5(self, a: int, out: np.ndarray) -> None:
        from h5py import h5s

        space = self.dsid.get_space()
        space.select_hyperslab((a,) + (0,) * (out.ndim - 1), out.shape)
        self.dsid.read(h5s.create_simple(out.shape), space, out)


def _pread_all(fd: int, buf: memoryview, offset: int) -> None:
    """Fill ``buf`` from byte ``offset`` of ``fd``; ``OSError`` if the file ends first."""
    done = 0
    while done < len(buf):
        got = os.preadv(fd, [buf[done:]], offset + done)
        if got == 0:
            raise OSError(f"the file ends at byte {offset + done}, inside the rows read")
        done += got


def scan_rows(ds, start: int, stop: int, n: int):
    """``(a, label, dense, sparse)``: rows ``[a, a + n)`` (the last ones up to ``stop``) of
    an opened ``H5Dataset``, for ``a`` from ``start`` in steps of ``n``; read directly into
    the same buffers every time where ``raw_rows`` can (so use them before the next), else
    by ``ds.rows``; every read checked (``ds._read``: a failed read or a changed file
    raises ``InputError`` naming it)."""
    raws = raw_rows(ds) if stop > start else None
    if raws is None:
        for a in range(start, stop, n):
            yield (a, *ds.rows(a, min(stop, a + n)))
        return
    bufs = [np.empty((min(n, stop - start),) + r.shape[1:], r.dtype) for r in raws]
    for a in range(start, stop, n):
        got = [b[:min(stop, a + n) - a] for b in bufs]
        ds._read(lambda: [r.read(a, g) for r, g in zip(raws, got)])
        yield (a, *got)


def raw_rows(part, handles=None) -> list[RawRows] | None:
    """[label, dense, sparse] ``RawRows`` of an opened ``H5Dataset`` (``handles``: its
    ``h5_handles``, whose dataset ids read the unallocated chunks; made if None), or None
    if any of them must be read by HDF5 (``_hdf5_only``), or has a first or last row that
    differs from HDF5's read of it."""
    try:
        fd = part.f.id.get_vfd_handle()
        if not isinstance(fd, int):
            return None
        handles, out = handles or h5_handles(part), []
        for dsid, _, _ in handles:
            if _hdf5_only(dsid, part.f.id):
                return None
            raw = RawRows(fd, dsid, dsid.shape, dsid.dtype)
            for r in {0, dsid.shape[0] - 1} if dsid.shape[0] else ():
                mine = np.empty((1,) + dsid.shape[1:], dsid.dtype)
                hdf5 = np.empty_like(mine)
                raw.read(r, mine)
                raw._hdf5(r, hdf5)  # the same row as HDF5 reads it
                if mine.tobytes() != hdf5.tobytes():
                    return None
            out.append(raw)
        return out
    except (AttributeError, OSError, RuntimeError, TypeError, ValueError):
        return None  # an h5py without chunk queries, a driver without a descriptor


def cuts_rows(chunks, shape) -> bool:
    """Whether chunks of shape ``chunks`` (None: not chunked) hold parts of rows, each row
    of a dataset of ``shape`` in several (h5py's ``chunks=True``, a resizable default)."""
    return bool(chunks) and tuple(chunks[1:]) != tuple(shape[1:])


def _hdf5_only(dsid, fid) -> bool:
    """True where the bytes at the offsets HDF5 gives are not the rows as read: a filter;
    data in another file (an external link, external storage, a virtual dataset) or not in
    chunks or one block (compact); chunks that cut rows (each row in several chunks); a
    stored type other than the native one of its NumPy dtype (another byte order, a
    precision or bit offset of its own)."""
    from h5py import h5d, h5i, h5t

    plist = dsid.get_create_plist()
    chunks = plist.get_chunk() if plist.get_layout() == h5d.CHUNKED else None
    return bool(plist.get_nfilters() or plist.get_external_count()
                or cuts_rows(chunks, dsid.shape)
                or plist.get_layout() not in (h5d.CHUNKED, h5d.CONTIGUOUS)
                or h5i.get_file_id(dsid).fileno != fid.fileno
                or not dsid.dtype.isnative
                or not dsid.get_type().equal(h5t.py_create(dsid.dtype)))
