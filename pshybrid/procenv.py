"""What a command starts with, as a batch system or a shell may leave it: its standard
streams and its working directory.

- ``reopen_closed``: a descriptor 0, 1 or 2 the process was started without (``>&-``,
  ``2>&-``, ``<&-``) is opened on /dev/null before anything else opens a file: else the next
  file opened takes its number, and a library's output meant for the stream lands in it.
  Python, which had set that ``sys.std*`` to None, gets a stream on it.
- ``Guarded``: standard output whose write fails (a full disk, a file system's error; not
  a reader gone, the ``BrokenPipeError`` that ``launch.run`` answers) says so once on
  standard error, drops the rest and lets the command go on; ``launch.run`` then ends with
  status 1, as a ``--metrics`` file on a full disk does.
- ``work_dir``: the working directory a checkpoint records (relative paths in its options
  are from there); where it was removed under the running job, the one the run started in
  (``mark_start``), so such a removal costs nothing but the relative paths, which
  ``cwd_gone`` names.
"""

from __future__ import annotations

import os
import sys

from .errors import say, to_null

_STREAMS = ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w"))
_START: list = [None]  # [the working directory at the last mark_start(); None: gone]


def mark_start() -> None:
    """Note the working directory (``launch.run`` and ``pshybrid.torch``'s ``init`` call it
    first thing: a run's start)."""
    try:
        _START[0] = os.getcwd()
    except OSError:
        _START[0] = None


def work_dir() -> str | None:
    """The working directory; where it is gone (removed under the run), the one the run
    started in, as ``mark_start`` noted it (None: not noted)."""
    try:
        return os.getcwd()
    except OSError:
        return _START[0]


def cwd_gone() -> bool:
    """Whether the working directory no longer exists (removed under the job)."""
    try:
        os.getcwd()
    except FileNotFoundError:
        return True
    return False


def reopen_closed() -> None:
    """Open /dev/null on each of descriptors 0-2 the process has not got (the lowest free
    number: each in turn), and give Python a stream where it has none: on that descriptor,
    or, where a file took the number before this call, on a /dev/null of its own."""
    for fd, name, mode in _STREAMS:
        try:
            os.fstat(fd)
            ours = False
        except OSError:
            got = os.open(os.devnull, os.O_RDWR)
            ours = got == fd
            if not ours:  # (not the lowest free number: no stream of ours on it)
                os.close(got)
        if getattr(sys, name) is None:
            setattr(sys, name, open(fd, mode, closefd=False) if ours else open(os.devnull, mode))


class Guarded:
    """``stream`` (standard output) whose failed writes are said once and then dropped;
    ``error``: the first failure (None: none)."""

    def __init__(self, stream):
        self.stream, self.error = stream, None

    def write(self, text: str) -> int:
        self._try(self.stream.write, text)
        return len(text)

    def flush(self) -> None:
        self._try(self.stream.flush)

    def _try(self, call, *args) -> None:
        if self.error is None:
            try:
                call(*args)
            except BrokenPipeError:
                raise
            except OSError as exc:
                self._failed(exc)

    def _failed(self, exc: OSError) -> None:
        self.error = exc
        to_null(self.stream)  # (what is still buffered goes nowhere, at the exit too)
        say(sys.stderr, f"pshybrid: warning: cannot write to standard output ({exc.strerror or exc}"
                        "): the rest of its lines are dropped; the command goes on and ends "
                        "with exit status 1\n")

    def __getattr__(self, name):  # (isatty, fileno, encoding, ...: the stream's)
        return getattr(self.stream, name)


def guard_stdout() -> Guarded | None:
    """Put ``Guarded`` around ``sys.stdout`` (None where it already is one, or there is
    none); ``unguard`` takes it off."""
    if sys.stdout is None or isinstance(sys.stdout, Guarded):
        return None
    sys.stdout = Guarded(sys.stdout)
    return sys.stdout


def unguard(guard: Guarded | None) -> OSError | None:
    """Take ``guard`` off ``sys.stdout`` (where it is still there) -> its first failure."""
    if guard is None:
        return None
    if sys.stdout is guard:
        sys.stdout = guard.stream
    return guard.error
