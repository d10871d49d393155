"""Dataset files (fixed format): HDF5 with

    /label  (N,)      float32 in {0, 1}
    /dense  (N, F_d)  float32
    /sparse (N, F_s)  int64, field f's ids in [0, cardinalities[f])
    /multi_hot/<name>/values (M,) int64, offsets (N + 1,) int64: multi-hot field <name>,
           row r's ids values[offsets[r]:offsets[r + 1]] (at least one), offsets[0] = 0
    attrs: format_version (int, 1), cardinalities (F_s + K,) int64,
           field_names (F_d + F_s + K,) str: the dense names, the single-hot names, then
           the K multi-hot names; optional: multi_hot (K,) str (the multi-hot names),
           planted_auc (float, synthetic files), source (str), transform (str)

``DatasetWriter`` streams rows into such a file atomically (a fresh temporary file, then
rename); the reader and the validation live beside it.
"""

from __future__ import annotations

import errno
import io
import os
import secrets
import stat

import h5py
import numpy as np

from . import safeio
from .errors import InputError
from .rawrows import scan_rows
from .rowcheck import check_bag_rows, check_bags, check_rows, file_change
from .schema import Schema, file_provenance, names_problem

FORMAT_VERSION = 1
CHUNK_ROWS = 16384
_CREATE = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(
    os, "O_CLOEXEC", 0)


def _create_temp(path: str) -> tuple[str, int]:
    """A new file ``.<name>.<random>.tmp`` beside ``path``: ``(its path, fd)``. O_EXCL (and
    O_NOFOLLOW): never an existing file or a planted symbolic link; umask applies."""
    d, name = os.path.split(os.path.abspath(path))
    for _ in range(16):
        tmp = os.path.join(d, f"{safeio.temp_prefix(name)}{secrets.token_hex(6)}.tmp")
        try:
            return tmp, os.open(tmp, _CREATE, 0o666)
        except FileExistsError:
            continue
    raise FileExistsError(f"{d}: no free temporary name")


class _Sink(io.RawIOBase):
    """The temporary file as HDF5 sees it (h5py's fileobj driver): it never fails. The
    first OSError (a full disk, EIO) is kept in ``error`` and every later write is dropped,
    so HDF5's own state stays sane and the file can always be closed (libhdf5 may crash
    closing a file whose writes failed); the writer checks ``error`` and reports it."""

    def __init__(self, fd: int):
        self.file = os.fdopen(fd, "r+b", buffering=0)
        self.error: OSError | None = None

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = 0) -> int:
        return self.file.seek(pos, whence)

    def tell(self) -> int:
        return self.file.tell()

    def readinto(self, b) -> int:
        try:
            return self.file.readinto(b)
        except OSError as exc:
            self.error = self.error or exc
            return 0

    def write(self, b) -> int:
        view = memoryview(b).cast("B")
        n, done = view.nbytes, 0
        try:
            while self.error is None and done < n:
                k = self.file.write(view[done:])
                if not k:
                    raise OSError(errno.EIO, "a write made no progress")
                done += k
        except OSError as exc:
            self.error = exc
        if done < n:
            self.file.seek(n - done, io.SEEK_CUR)   # dropped, as if written
        return n

    def truncate(self, size=None) -> int:
        if self.error is None:
            try:
                return self.file.truncate(size)
            except OSError as exc:
                self.error = exc
        return self.tell() if size is None else size

    def flush(self) -> None:
        """Writes are unbuffered."""

    def close(self) -> None:
        if not self.closed:
            self.file.close()
        super().close()


_STOP: list[int] = []  # the signal that told this process to stop writing, if one did


def stop_writing(sig: int | None) -> None:
    """Record that signal ``sig`` told this process to stop (None: forget it). A signal
    handler calls it before it raises: its exception can be swallowed -- raised inside a
    weakref callback, a ``__del__`` or an h5py file-object callback it is printed at most
    and dropped -- so every ``DatasetWriter`` checks the record between appends and before
    it publishes, and a stopped run never publishes its file."""
    _STOP[:] = [] if sig is None else [sig]


def _check_stop() -> None:
    if _STOP:
        raise SystemExit(128 + _STOP[0])


class DatasetWriter:
    """Append rows, then ``close()`` to publish ``path`` atomically; ``abort()`` (or an
    exception inside ``with``) removes the temporary file and leaves ``path`` untouched.
    After ``stop_writing(sig)``, ``append`` and ``publish`` raise ``SystemExit(128 + sig)``.

    ``DatasetWriter(path, dense_names, sparse_names)``; ``append(label (n,), dense (n, F_d),
    sparse (n, F_s))``; ``close(cardinalities, **attrs)`` = ``finish(cardinalities,
    **attrs)`` (the complete file under its temporary name) + ``publish()`` (the rename).
    A file that cannot be created or written (no such directory, no permission, a full
    disk) raises ``InputError`` naming ``path``.
    """

    def __init__(self, path: str, dense_names, sparse_names, multi_hot_names=(),
                 compression: str = "none"):
        self.path = os.fspath(path)
        self.dense_names, self.sparse_names = list(dense_names), list(sparse_names)
        self.multi_hot_names = list(multi_hot_names)
        problem = names_problem(self.dense_names, self.sparse_names + self.multi_hot_names)
        if problem:
            raise InputError(f"{self.path}: {problem}")
        # Compressed: chunks of one shuffle block (1024 rows), so a shuffled read
        # decompresses only the rows it needs; uncompressed: 16,384 rows.
        filters = {"lzf": {"compression": "lzf"}, "gzip": {"compression": "gzip"},
                   "none": {}}[compression]
        rows = SHUFFLE_BLOCK if filters else CHUNK_ROWS
        self.was = safeio.approved(self.path)  # (what publish may replace: prep checked it)
        try:
            self.tmp, fd = _create_temp(self.path)
        except OSError as exc:
            raise self._error(exc) from None
        self.sink = _Sink(fd)
        try:
            self.f = h5py.File(self.sink, "w")
            nd, ns = len(self.dense_names), len(self.sparse_names)
            self.label = self.f.create_dataset("label", (0,), np.float32, maxshape=(None,),
                                               chunks=(rows,), **filters)
            self.dense = self.f.create_dataset("dense", (0, nd), np.float32,
                                               maxshape=(None, nd),
                                               chunks=(rows, nd) if nd else None,
                                               **(filters if nd else {}))
            self.sparse = self.f.create_dataset("sparse", (0, ns), np.int64,
                                                maxshape=(None, ns),
                                                chunks=(rows, ns) if ns else None,
                                                **(filters if ns else {}))
            # multi-hot field k: /multi_hot/<name>/values (M,), offsets (N + 1,)
            self.bags = [(self.f.create_dataset(f"multi_hot/{n}/values", (0,), np.int64,
                                                maxshape=(None,), chunks=(rows,),
                                                **filters),
                          self.f.create_dataset(f"multi_hot/{n}/offsets", (1,), np.int64,
                                                maxshape=(None,), chunks=(rows,),
                                                **filters))
                         for n in self.multi_hot_names]
            self._check()
        except BaseException as exc:
            self.abort()
            raise self._failed(exc) from None
        self.rows = 0

    def _error(self, exc: OSError):
        return InputError(f"{self.path}: cannot write: {exc.strerror or exc}")

    def _check(self) -> None:
        """Raise the sink's first write error, if any."""
        if self.sink.error is not None:
            raise self._error(self.sink.error)

    def _failed(self, exc: BaseException) -> BaseException:
        """What to raise for ``exc``, caught while writing: the write error behind it if
        there was one (HDF5 then fails in its own words: a bad read, a broken header)."""
        return self._error(self.sink.error) if self.sink.error is not None else exc

    def append(self, label, dense, sparse, bags=()) -> None:
        """label (n,), dense (n, F_d), sparse (n, F_s); ``bags``: per multi-hot field
        ``(values (m,) int64, lengths (n,) int64)``, each length >= 1."""
        _check_stop()
        n = len(label)
        if n == 0:
            return
        a, b = self.rows, self.rows + n
        try:
            for ds, arr in ((self.label, label), (self.dense, dense), (self.sparse, sparse)):
                ds.resize(b, axis=0)
                ds[a:b] = arr
            for (vs, os_), (values, lengths) in zip(self.bags, bags):
                m = int(os_[-1])
                vs.resize(m + len(values), axis=0)
                vs[m:] = values
                os_.resize(b + 1, axis=0)
                os_[a + 1:] = m + np.cumsum(lengths)
        except Exception as exc:
            raise self._failed(exc) from None
        self._check()
        self.rows = b

    def finish(self, cardinalities, **attrs) -> None:
        """Write the attributes and close the file under its temporary name."""
        try:
            self.f.attrs["format_version"] = FORMAT_VERSION
            self.f.attrs["cardinalities"] = np.asarray(cardinalities, np.int64)
            self.f.attrs["field_names"] = np.array(
                self.dense_names + self.sparse_names + self.multi_hot_names,
                dtype=h5py.string_dtype())
            if self.multi_hot_names:
                self.f.attrs["multi_hot"] = np.array(self.multi_hot_names,
                                                     dtype=h5py.string_dtype())
            for k, v in attrs.items():
                self.f.attrs[k] = v
            self.f.close()
        except Exception as exc:
            raise self._failed(exc) from None
        self._check()
        try:
            os.fsync(self.sink.file.fileno())   # a full disk may only tell here (NFS, quotas)
            self.sink.close()
        except OSError as exc:
            raise self._error(exc) from None

    def publish(self) -> None:
        """Rename the finished temporary file to ``path`` (atomic)."""
        _check_stop()
        try:
            safeio.publish_as(self.tmp, self.path, self.was)
        except OSError as exc:
            raise self._error(exc) from None

    def close(self, cardinalities, **attrs) -> None:
        self.finish(cardinalities, **attrs)
        self.publish()

    def abort(self) -> None:
        """Close and remove the temporary file (idempotent; never raises for I/O)."""
        try:
            f = getattr(self, "f", None)
            if f is not None and f.id.valid:
                f.close()
        except Exception:
            pass  # the sink never fails: an HDF5 complaint about a dropped write
        finally:
            self.sink.close()
            if os.path.lexists(self.tmp):
                os.remove(self.tmp)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *_):
        if exc_type is not None:
            self.abort()


# -- reading ---------------------------------------------------------------------------------
SHUFFLE_BLOCK = 1024  # rows; the unit of the block shuffle (independent of W and b)
EVAL_BATCH = 4096  # rows an evaluation reads and scores at a time
_SCAN_ROWS = 65536


def _attr_ints(attrs, key):
    """An integer attribute as an int64 array, None if it is not integers."""
    try:
        a = np.asarray(attrs[key])
    except (OSError, TypeError, ValueError):
        return None
    if a.dtype.kind not in "iu" or (a.dtype.kind == "u" and a.size and a.max() >= 2**63):
        return None
    return a.astype(np.int64)


class H5Dataset:
    """Read-only view of a dataset file; the same ``schema``/``rows`` interface as the
    synthetic stream. Opening checks the structure (keys, dtypes, ranks, row counts,
    attributes) and raises ``InputError`` naming the file and the key."""

    def __init__(self, path: str):
        self.path = os.fspath(path)
        try:
            st = os.stat(self.path)
        except OSError as e:
            why = "no such dataset file" if isinstance(e, FileNotFoundError) else \
                f"cannot read: {e.strerror or e}"
            raise InputError(f"{self.path}: {why}") from None
        if not stat.S_ISREG(st.st_mode):  # h5py would block forever on a FIFO
            raise InputError(f"{self.path}: cannot read a dataset: " + (
                "a directory" if stat.S_ISDIR(st.st_mode) else
                "not a regular file (a FIFO, device or socket)"))
        try:
            self.f = safeio.h5_file(self.path)
        except OSError as e:
            if e.errno == errno.EMFILE:  # (the file is fine)
                import resource

                limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
                raise InputError(f"{self.path}: cannot open: too many open files (ulimit -n "
                                 f"{limit}): every dataset file stays open while the run "
                                 "reads it; raise ulimit -n, or merge the files") from None
            raise InputError(f"{self.path}: not a readable HDF5 file ({e}); a dataset is "
                             "made by pshybrid prep (CSV, Criteo TSV, Parquet)") from None
        try:
            self.stamp = safeio.file_stamp(os.fstat(self.f.id.get_vfd_handle()))
            self._check()
            self.linked = self._linked()
        except BaseException:
            self.f.close()  # a refused file is not left open
            raise

    def check_unchanged(self, error: Exception | None = None) -> None:
        """``InputError`` naming the file if it changed since it was opened (its size, or
        another file at its path), or for ``error`` (a failed read). Cheap: fstat + stat."""
        try:
            now = safeio.file_stamp(os.fstat(self.f.id.get_vfd_handle()))
        except (OSError, ValueError) as e:  # (a closed file)
            now, error = self.stamp, error or e
        try:
            here = safeio.file_stamp(os.stat(self.path))[:2]
        except OSError:  # (removed)
            here = None
        how = file_change(self.stamp, now, here, self.path)
        if how is not None:
            raise InputError(f"{self.path}: the dataset changed while it was read ({how})")
        for path, (key, stamp) in self.linked.items():
            try:
                now = safeio.file_stamp(os.stat(path))
            except OSError:
                now = None
            how = file_change(stamp, now, now and now[:2], path)
            if how is not None:
                raise InputError(f"{path} (/{key} of {self.path}): the dataset changed while "
                                 f"it was read ({how})")
        if error is not None:
            raise InputError(f"{self.path}: cannot read ({error})") from None

    def _linked(self) -> dict:
        """{path: (key, stamp)} of the other files that keys are read from (external links),
        watched as the file itself is."""
        keys = ["label", "dense", "sparse"] + [f"multi_hot/{m}/{k}" for m in self._names(
            "multi_hot") for k in ("values", "offsets")]
        out = {}
        for key in keys:
            other = self.f[key].file
            if other.id.fileno != self.f.id.fileno and other.filename not in out:
                handle = other.id.get_vfd_handle()
                out[other.filename] = (key, safeio.file_stamp(os.fstat(handle)))
        return out

    def _read(self, read):
        """``read()`` (h5py reads), checked: a failed read or a changed file raises
        ``InputError`` naming the file (HDF5 reads past a truncated file's end as zeros)."""
        try:
            out = read()
        except (OSError, ValueError, RuntimeError, KeyError) as e:  # (KeyError: a link's file)
            self.check_unchanged(e)
        self.check_unchanged()
        return out

    def _check(self) -> None:
        """The structure, keys, dtypes, row counts and attributes; sets n_rows and schema."""
        want = {"label": (1, np.float32), "dense": (2, np.float32), "sparse": (2, np.int64)}
        for key, (ndim, dtype) in want.items():
            if key not in self.f:
                raise InputError(f"{self.path}: missing dataset /{key}")
            ds = self.f.get(key)
            if not isinstance(ds, h5py.Dataset):
                raise InputError(f"{self.path}: /{key} is " + (
                    f"a {type(ds).__name__.lower()}, not a dataset" if ds is not None else
                    f"a broken link ({self.f.get(key, getlink=True)})"))
            if ds.ndim != ndim or ds.dtype != dtype:
                name = np.dtype(dtype).name
                order = not ds.dtype.isnative and ds.dtype.newbyteorder("=") == dtype
                raise InputError(f"{self.path}: /{key} must be {ndim}-D {name}, found "
                                 f"{ds.ndim}-D {ds.dtype}" + (
                                     f" ({'another byte order: ' if order else ''}store it "
                                     f"as {name}, e.g. h5py's data=ds[()].astype('{name}'))"
                                     if ds.ndim == ndim and ds.dtype != dtype else ""))
        n = {k: self.f[k].shape[0] for k in want}
        if len(set(n.values())) != 1:
            raise InputError(f"{self.path}: row counts disagree: {n}")
        for attr in ("format_version", "cardinalities", "field_names"):
            if attr not in self.f.attrs:
                raise InputError(f"{self.path}: missing attribute {attr!r}")
        version = _attr_ints(self.f.attrs, "format_version")
        if version is None or version.size != 1 or int(version.ravel()[0]) != FORMAT_VERSION:
            raw = self.f.attrs["format_version"]
            shown = (int(version.ravel()[0]) if version is not None and version.size == 1
                     else raw.tolist() if hasattr(raw, "tolist") else raw)
            raise InputError(f"{self.path}: attribute format_version {shown!r} is not "
                             f"the integer {FORMAT_VERSION}")
        cards_arr = _attr_ints(self.f.attrs, "cardinalities")
        if cards_arr is None or cards_arr.ndim != 1:
            raise InputError(f"{self.path}: attribute cardinalities must be a 1-D array of "
                             "integers")
        cards = tuple(int(c) for c in cards_arr)
        if sum(cards) >= 2**63:
            raise InputError(f"{self.path}: attribute cardinalities sums to {sum(cards)}, "
                             "beyond the int64 ids of the fused table")
        fd, fs = self.f["dense"].shape[1], self.f["sparse"].shape[1]
        names, multi = (self._names(k) for k in ("field_names", "multi_hot"))
        k = len(multi)
        if len(cards) != fs + k or len(names) != fd + fs + k or min(cards, default=1) < 1:
            raise InputError(f"{self.path}: attributes cardinalities ({len(cards)}) and "
                             f"field_names ({len(names)}) do not match /dense ({fd} columns), "
                             f"/sparse ({fs} columns) and {k} multi-hot fields, or a "
                             f"cardinality is < 1{self._unnamed_bags(multi)}")
        self.n_rows = n["label"]
        if multi != names[len(names) - k:]:
            raise InputError(f"{self.path}: attribute multi_hot {multi} is not the last "
                             "field_names")
        if problem := names_problem(names[:fd], names[fd:]):
            raise InputError(f"{self.path}: attribute field_names: {problem}")
        self.bag_sets = [check_bags(self.f, self.path, m, self.n_rows) for m in multi]
        self.schema = Schema(fd, cards, tuple(names[:fd]), tuple(names[fd:]), k,
                             **file_provenance(self.f.attrs, self.path, multi))

    def _unnamed_bags(self, multi: list[str]) -> str:
        """A count mismatch's hint: the /multi_hot groups, where attribute multi_hot differs."""
        g = self.f.get("multi_hot")
        bags = sorted(g) if isinstance(g, h5py.Group) else []
        return (f" (the file's /multi_hot groups are {bags}, attribute multi_hot names "
                f"{multi})" if bags != sorted(multi) else "")

    def _names(self, key: str) -> list[str]:
        """A string-list attribute (absent: empty)."""
        if key not in self.f.attrs:
            return []
        try:
            raw = np.atleast_1d(self.f.attrs[key])
            return [n.decode() if isinstance(n, bytes) else str(n) for n in raw]
        except (OSError, TypeError, ValueError, UnicodeDecodeError) as e:
            raise InputError(f"{self.path}: attribute {key} is not a list of "
                             f"strings ({e})") from None

    def bags(self, start: int, stop: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """Rows ``[start, stop)`` of each multi-hot field: ``(values (m,) int64, lengths (n,)
        int64)``, the ids of row ``start`` first."""
        def read():
            out = []
            for values, offsets in self.bag_sets:
                o = offsets[start:stop + 1]
                out.append((values[o[0]:o[-1]], np.diff(o)))
            return out
        return self._read(read)

    @property
    def n_ids(self) -> int:
        """The ids of every row: one a single-valued field, a multi-hot field's values."""
        return self.n_rows * self.schema.n_single + sum(len(v) for v, _ in self.bag_sets)

    @property
    def compression(self) -> str | None:
        """The filter of the file's /sparse ids (``lzf``, ``gzip``, ...), None if none."""
        return self.f["sparse"].compression

    def rows(self, start: int, stop: int):
        """Rows ``[start, stop)``: label (n,) float32, dense (n, F_d) float32, sparse (n, F_s)
        int64."""
        return self._read(lambda: (self.f["label"][start:stop], self.f["dense"][start:stop],
                                   self.f["sparse"][start:stop]))

    def validate(self, start: int, stop: int) -> None:
        """Scan rows ``[start, stop)`` in chunks; raise ``InputError`` naming the file, the
        key and the first bad row: labels outside {0, 1}, NaN/inf dense values, sparse ids
        < 0 or >= the field's cardinality, multi-hot rows without an id."""
        for a, label, dense, sparse in scan_rows(self, start, stop, _SCAN_ROWS):  # InputError
            check_rows(self.path, self.schema, label, dense, sparse, lambda r: a + r)
            check_bag_rows(self.path, self.schema, self.bags(a, min(stop, a + _SCAN_ROWS)),
                           lambda r: a + r)

    def close(self) -> None:
        self.f.close()
