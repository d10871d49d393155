"""Public exceptions: each carries an actionable message.

The launcher (`pshybrid.launch`) prints these as one line per rank and exits with
status 2, without a traceback; any other exception aborts the whole MPI job.
"""

import os
import sys


class PshybridError(Exception):
    """Base class of errors a user can fix (bad option, bad file, bad id).

    ``collective=True`` means every rank raises this error at the same point (a check
    whose verdict was shared, or one computed identically everywhere from the options),
    so the job can exit cleanly; otherwise the launcher aborts the whole job.
    """

    def __init__(self, message: str, *, collective: bool = False):
        super().__init__(message)
        self.collective = collective


class ConfigError(PshybridError):
    """A command-line option or config key is invalid (names the key)."""


class InputError(PshybridError):
    """Data passed to the library is invalid (names the table/file and the offending value)."""


def pipe_closed() -> str:
    """One line for a write to a closed pipe (``BrokenPipeError``: ``train ... | head`` once
    head has its lines), after pointing standard output at /dev/null so that exiting, which
    flushes it, raises no second error."""
    to_null(sys.stdout)
    return "an output pipe was closed (its reader ended, as | head does once it has its lines)"


def say(stream, line: str) -> None:
    """Write ``line`` to ``stream`` (standard error), unless it cannot take it (its reader
    ended: ``2>&1 | head``; a full disk; no stream): then the stream goes to /dev/null, and
    the exit status alone tells."""
    if stream is None:
        return
    try:
        stream.write(line)
        stream.flush()
    except OSError:
        to_null(stream)


def to_null(stream) -> None:
    """Point ``stream``'s descriptor at /dev/null (a stream with none: nothing)."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError, AttributeError):  # (none: a capture, a notebook, no stream)
        return
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, fd)
    os.close(null)
