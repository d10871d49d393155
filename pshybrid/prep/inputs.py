"""The inputs of ``prep``: files or ``-`` (standard input), plain text or gzip told by their
first two bytes, which are read, looked at and handed back (no seek: a pipe loses nothing).
Standard input is read once; where it must be read again (a counting pass, a csv header) it
is first copied into an unnamed temporary file (``spool``)."""

from __future__ import annotations

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

STDIN = "-"
PARQUET_MAGIC = b"PAR1"
BOM = b"\xef\xbb\xbf"     # UTF-8's byte order mark, dropped where an input starts with it
PARQUET_BATCH = 65536      # rows converted at a time
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


class _ParquetText(io.RawIOBase):
    """A Parquet file (optional: pyarrow) as the CSV text pyarrow writes for it: a header
    of the column names, then the rows, comma-separated, a value quoted only where it must
    be (RFC 4180), null = empty."""

    def __init__(self, f, name: str):
        try:
            import pyarrow.csv as pcsv
            import pyarrow.parquet as pq
        except ImportError:
            raise InputError(f"{name}: a Parquet file; reading it needs pyarrow (pip install "
                             "'pshybrid[parquet]')") from None
        self.pcsv, self.name = pcsv, name
        try:
            self.batches = pq.ParquetFile(f).iter_batches(batch_size=PARQUET_BATCH)
        except Exception as exc:  # noqa: BLE001 - pyarrow's errors name no common base
            raise InputError(f"{name}: not a readable Parquet file ({exc})") from None
        self.buf, self.header = b"", True

    def readable(self) -> bool:
        return True

    def _next(self) -> bytes:
        try:
            batch = next(self.batches)
        except StopIteration:
            return b""
        except Exception as exc:  # noqa: BLE001
            raise InputError(f"{self.name}: cannot read: {exc}") from None
        out = io.BytesIO()
        for style in ("none", "needed"):     # unquoted where no value needs quotes
            try:
                opts = self.pcsv.WriteOptions(include_header=self.header, quoting_style=style)
                self.pcsv.write_csv(batch, out, opts)
                break
            except Exception as exc:  # noqa: BLE001 - ArrowInvalid (a value needs quotes)
                out, why = io.BytesIO(), exc
        else:
            raise InputError(f"{self.name}: cannot convert to text: {why}")
        self.header = False
        return out.getvalue()

    def readinto(self, b) -> int:
        while not self.buf:
            self.buf = self._next()
            if not self.buf:
                return 0
        n = min(len(b), len(self.buf))
        b[:n], self.buf = self.buf[:n], self.buf[n:]
        return n


@contextlib.contextmanager
def open_input(path: str, spools: dict | None = None):
    """IN opened for binary reading (``readline``, ``read``), gunzipped if it starts with the
    gzip magic bytes. IN is a regular file, or ``-`` (standard input, or its copy in
    ``spools``); a FIFO or device by name is refused (it could not be read twice)."""
    name = shown_input(path)
    spool = (spools or {}).get(path)
    own = True
    if spool is not None:
        f, own = spool, False
        f.seek(0)
    elif path == STDIN:
        f, own = sys.stdin.buffer, False
    else:
        f = _open_regular(path)
    try:
        head = read_checked(name, f.read, 4)
        if head == PARQUET_MAGIC:
            f.seek(0)
            raw = io.BufferedReader(_ParquetText(f, name), 1 << 20)
        else:  # a UTF-8 byte order mark is no part of the first value
            raw = io.BufferedReader(_Prefixed(head[3:] if head[:3] == BOM else head, f),
                                    1 << 20)
        if head[:2] == b"\x1f\x8b":
            with gzip.GzipFile(fileobj=raw, mode="rb") as g:
                first = read_checked(name, g.read, 3)
                yield g if first == BOM else io.BufferedReader(_Prefixed(first, g), 1 << 20)
        else:
            yield raw
    finally:
        if own:
            f.close()


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
    with open_input(path, spools) as f:
        return read_checked(shown_input(path), f.readline, MAX_LINE_BYTES + 1)


@contextlib.contextmanager
def spooled(inputs: list[str], needed: bool):
    """``{"-": unnamed temporary file holding standard input}`` when ``needed`` and ``-`` is
    an input (else ``{}``); the file disappears when it is closed, on any exit."""
    if not needed or STDIN not in inputs:
        yield {}
        return
    with tempfile.TemporaryFile() as f:
        try:
            shutil.copyfileobj(sys.stdin.buffer, f, 1 << 20)
        except OSError as exc:
            raise InputError(f"<stdin>: cannot copy to a temporary file: "
                             f"{exc.strerror or exc}") from None
        yield {STDIN: f}
