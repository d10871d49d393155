"""The inputs of ``prep``: files or ``-`` (standard input), plain text or gzip told by their
first two bytes, which are read, looked at and handed back (no seek: a pipe loses nothing).
Standard input is read once; where it must be read again (a counting pass) it is first
copied into an unnamed temporary file (``spooled``); for a csv header alone, the bytes read
for it are kept and read again (``_Replay``)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import gzip
import io
import os
import shutil
import stat
import sys
import tempfile
import zlib

from ..errors import InputError
from . import parquet

STDIN = "-"
BOM = b"\xef\xbb\xbf"     # UTF-8's byte order mark, dropped where an input starts with it
MAX_LINE_BYTES = 8 << 20   # a longer line is a bad line


def as_inputs(paths: list[str]) -> list[str]:
    """The inputs, a name of standard input that is not a regular file (``/dev/stdin`` on a
    pipe) taken as ``-`` (its bytes can be read once only); standard input given more than
    once is refused (the second would read nothing)."""
    try:
        st0 = os.fstat(0)
    except OSError:
        st0 = None
    out = []
    for p in paths:
        try:
            st = os.stat(p) if st0 is not None and p != STDIN else None
            same = st is not None and (st.st_dev, st.st_ino) == (st0.st_dev, st0.st_ino) \
                and not stat.S_ISREG(st.st_mode)
        except OSError:
            same = False
        out.append(STDIN if same else p)
    if out.count(STDIN) > 1:
        twice = [p for p, q in zip(paths, out) if q == STDIN]
        raise InputError(f"IN: standard input is given {len(twice)} times ({' '.join(twice)}): "
                         "it can be read once; give it once")
    return out


def shown_input(path: str) -> str:
    """How messages name an input: ``<stdin>`` for ``-``."""
    return "<stdin>" if path == STDIN else path


class _Prefixed(io.RawIOBase):
    """A stream whose first bytes ``head`` were already read from ``f``: ``head``, then the
    rest of ``f``."""

    def __init__(self, head: bytes, f):
        self.head, self.f = head, f

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        if self.head:
            n = min(len(b), len(self.head))
            b[:n], self.head = self.head[:n], self.head[n:]
            return n
        data = self.f.read(len(b))
        b[:len(data)] = data
        return len(data)


@contextlib.contextmanager
def raw_input(path: str, spools: dict | None):
    """IN's bytes from their start: the regular file, standard input, or its copy in
    ``spools``."""
    spool = (spools or {}).get(path)
    if spool is not None:
        spool.seek(0)
        yield spool
    elif path == STDIN:
        yield sys.stdin.buffer
    else:
        with _open_regular(path) as f:
            yield f


@contextlib.contextmanager
def open_input(path: str, spools: dict | None = None, parquet_text: bool = False):
    """IN opened for binary reading (``readline``, ``read``), gunzipped if it starts with the
    gzip magic bytes, or as text if it is a Parquet file and ``parquet_text``
    (``parquet.ParquetText``; else refused). IN is a regular file, or ``-`` (standard input,
    or its copy in ``spools``); a FIFO or device by name is refused (it could not be read
    twice)."""
    name = shown_input(path)
    with raw_input(path, spools) as f:
        head = read_checked(name, f.read, 4)
        if head == parquet.MAGIC:
            if not parquet_text:
                raise InputError(f"{name}: a Parquet file: prep criteo reads Criteo's "
                                 "tab-separated text (prep csv reads Parquet)")
            f.seek(0)
            raw = io.BufferedReader(parquet.ParquetText(f, name), 1 << 20)
        else:  # a UTF-8 byte order mark is no part of the first value
            raw = io.BufferedReader(_Prefixed(head[3:] if head[:3] == BOM else head, f),
                                    1 << 20)
        if head[:2] == b"\x1f\x8b":
            with gzip.GzipFile(fileobj=raw, mode="rb") as g:
                first = read_checked(name, g.read, 3)
                yield g if first == BOM else io.BufferedReader(_Prefixed(first, g), 1 << 20)
        else:
            yield raw


@contextlib.contextmanager
def reads(path: str, spools: dict | None, f, n: int):
    """A function giving ``f.read(n)`` call after call, failures as ``read_checked``'s. For a
    file (not live standard input) each read runs on a thread of its own one call ahead, so
    a gzip decompresses (zlib lets go of the GIL), a Parquet file converts and a disk reads
    while the caller parses the bytes before. A pipe's read may wait without end: standard
    input is read in the caller's thread, so nothing waits on it at an exit."""
    name = shown_input(path)
    if path == STDIN and path not in (spools or {}):
        yield lambda: read_checked(name, f.read, n)
        return
    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="prep-read")
    pending = pool.submit(read_checked, name, f.read, n)

    def take() -> bytes:
        nonlocal pending
        chunk = pending.result()  # (the read's InputError, raised here)
        pending = pool.submit(read_checked, name, f.read, n) if chunk else None
        return chunk

    try:
        yield take
    finally:
        if pending is not None:  # (the file closes after: its read ends first)
            with contextlib.suppress(Exception):
                pending.result()
        pool.shutdown()


def is_parquet(path: str, spools: dict | None) -> bool:
    """Whether IN is a Parquet file (standard input only through its copy in ``spools``)."""
    if path == STDIN and path not in (spools or {}):
        return False
    with raw_input(path, spools) as f:
        return read_checked(shown_input(path), f.read, 4) == parquet.MAGIC


def _open_regular(path: str):
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        what = "is a directory" if stat.S_ISDIR(mode) else \
            "not a regular file (give - to read standard input)"
        raise InputError(f"{path}: cannot read: {what}")
    return os.fdopen(fd, "rb")


def read_checked(name: str, read, n: int) -> bytes:
    """``read(n)``, its failures (an I/O error, a corrupt or truncated gzip stream) as an
    InputError naming IN."""
    try:
        return read(n)
    except (OSError, EOFError, zlib.error) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise InputError(f"{name}: cannot read: {why or type(exc).__name__}") from None


def first_line(path: str, spools: dict | None = None) -> bytes:
    """IN's first line (at most MAX_LINE_BYTES + 1 bytes), with its line end."""
    with open_input(path, spools, parquet_text=True) as f:
        return read_checked(shown_input(path), f.readline, MAX_LINE_BYTES + 1)


class _Replay:
    """Standard input opened again from its start though read once: the bytes read before
    the last ``seek(0)`` (a header, its first bytes: at most ``KEEP``) are kept and read
    again, then the stream goes on; past ``KEEP`` they are let go (no more rewinds)."""

    KEEP = MAX_LINE_BYTES + (2 << 20)  # (a longest header, and a buffer's read beyond it)

    def __init__(self, f, head: bytes):
        self.f, self.kept, self.pos = f, bytearray(head), 0

    def seek(self, offset: int, whence: int = 0) -> int:
        if offset or whence or self.kept is None:
            raise InputError("<stdin>: read again from its start after more than "
                             f"{self.KEEP:,} bytes (a header that long?)")
        self.pos = 0
        return 0

    def read(self, n: int = -1) -> bytes:
        if self.kept is not None and self.pos < len(self.kept):
            out = bytes(self.kept[self.pos:] if n < 0 else self.kept[self.pos:self.pos + n])
        else:
            out = self.f.read(n)
            if self.kept is not None:
                self.kept += out
                if len(self.kept) > self.KEEP:
                    self.kept = None  # (the rows' pass: nothing is read again)
        self.pos += len(out)
        return out


@contextlib.contextmanager
def spooled(inputs: list[str], needed: bool, header: bool = False):
    """``{"-": standard input, readable from its start again}`` where ``-`` is an input:
    where it is ``needed`` again whole (or is a Parquet file), an unnamed temporary file
    holding it (gone when closed, on any exit); for a ``header`` alone, a ``_Replay``;
    else ``{}``."""
    if STDIN not in inputs or not (needed or header):
        yield {}
        return
    stdin = sys.stdin.buffer
    head = b"" if needed else read_checked(shown_input(STDIN), stdin.read, 4)
    if not needed and head != parquet.MAGIC:
        yield {STDIN: _Replay(stdin, head)}
        return
    with tempfile.TemporaryFile() as f:
        try:
            f.write(head)
            shutil.copyfileobj(stdin, f, 1 << 20)
        except OSError as exc:
            raise InputError(f"<stdin>: cannot copy to a temporary file: "
                             f"{exc.strerror or exc}") from None
        yield {STDIN: f}
