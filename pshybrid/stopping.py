"""Commands other than ``train`` (``prep``, ``export``, ``eval``, ``predict``, ``plot``)
ended by a signal: SIGTERM, SIGHUP and SIGUSR1 (a job's time limit or preemption, a closed
terminal) raise ``SystemExit(128 + signal)`` and SIGINT ``KeyboardInterrupt`` where the
command is, so that its ``with`` blocks remove their temporary files and nothing is
published; ``launch.run`` then prints the line and exits with that status (under MPI it
ends every rank). ``train`` stops at a step boundary instead (``preempt``). Neither
catches a signal the process was started with ignored (``catch``)."""

from __future__ import annotations

import functools
import signal
import threading

STOPS = (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGINT)


def ended_by_signals(func, record=None):
    """``func(args)`` stopped by ``STOPS`` as above. Each signal is also remembered (and
    passed to ``record(sig)``; ``record(None)`` at the end): an exception raised inside a
    weakref callback, a ``__del__`` or h5py's file callbacks is printed at most and
    dropped, so a command that still returns is ended then, by the same exception."""
    @functools.wraps(func)
    def run(args) -> int:
        if threading.current_thread() is not threading.main_thread():
            return func(args)
        got: list[int] = []

        def stop(sig, _frame):
            got.append(sig)
            if record is not None:
                record(sig)
            _raise(sig)

        old = catch(STOPS, stop)
        try:
            status = func(args)
        finally:
            restore(old)
            if record is not None:
                record(None)
        if got:  # (its exception was swallowed on the way)
            _raise(got[0])
        return status
    return run


def catch(signals, handler) -> dict:
    """``handler`` for each of ``signals`` but one the process was started with ignored
    (``nohup``'s SIGHUP, the SIGINT of a shell script's background job: the one who started
    it meant it not to hear that); returns {signal: the handler it replaced}."""
    return {sig: signal.signal(sig, handler) for sig in signals
            if signal.getsignal(sig) != signal.SIG_IGN}


def restore(old: dict) -> None:
    """Give back the handlers ``catch`` replaced."""
    for sig, handler in old.items():
        signal.signal(sig, signal.SIG_DFL if handler is None else handler)


def _raise(sig: int):
    if sig == signal.SIGINT:
        raise KeyboardInterrupt
    raise SystemExit(128 + sig)
