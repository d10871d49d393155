"""A batch system's signal stops a ``pshybrid.torch`` run at a step boundary, on every rank.

``pt.init`` catches SIGTERM and SIGUSR1 on every rank, server or worker (``preempt.CAUGHT``:
the handler only records the signal; SIGINT stays Python's ``KeyboardInterrupt``). Each
``opt.step()`` ends with the workers' agreement (``preempt.Preemption``: an Iallreduce of
one int started at one step and completed at the next; a server that caught the signal
tells every worker), so ``pt.stop_requested()`` becomes True after the same step on every
worker. The script then writes ``pt.checkpoint`` and leaves its loop, and ``pt.shutdown()``
ends every rank with one status (``status``): 75 after a checkpoint of that step or a later
one, else 128 + the signal's number. A script that steps on instead is ended at the end of
its next ``opt.step()``, the same way. A signal after the last step changes nothing.
"""

from __future__ import annotations

import contextlib
import gc
import io
import os
import signal

from pshybrid.errors import ConfigError
from pshybrid.preempt import CAUGHT, Preemption, exit_status, finish_quietly

STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM)


def start(s) -> None:
    """Every rank, at the end of ``pt.init``: catch ``STOP_SIGNALS`` from now on (a catcher
    an earlier session of this process kept, a signal having come after its last step,
    is removed first: that request was for the earlier session)."""
    s.stop = Preemption(s.topo)
    while CAUGHT.installed:
        CAUGHT.uninstall()
    CAUGHT.install(STOP_SIGNALS)


def after_step(s) -> bool:
    """Workers, at the end of each ``opt.step()`` (collective over the workers: completes
    the agreement started at the previous step, starts the next). True when the script
    stepped on after ``pt.stop_requested()`` became True: the caller ends the run."""
    if s.stopped is not None:
        return True
    if s.stop.stop():
        s.stopped = s.step
    return False


def status(s) -> int | None:
    """Every rank, after the last step (collective over the world: ``Preemption.outcome``):
    the exit status of a run a signal stopped (worker 0 prints one line), else None."""
    if s.stop is None:  # (pt.init refused before it began)
        return None
    s.stop.close()
    stopped, sig = s.stop.outcome(s.stopped)
    if not sig:
        return None
    s.stopped = stopped  # (servers learn it here)
    saved = s.saved is not None and s.saved[0] >= stopped
    code = exit_status(sig, saved)
    if s.topo.rank == s.topo.worker_ranks[0]:
        print(notice(sig, stopped, s.step, s.saved if saved else None, code if s.owns
                     else None), flush=True)
    return code


def notice(sig: int, stopped: int, ended: int, saved, code: int | None) -> str:
    """Worker 0's line: the signal, the step the run ended at, the checkpoint or none, and
    the exit status (None: the script's to choose)."""
    status = f" (exit status {code})" if code is not None else ""
    line = f"pshybrid: stopped by {signal.Signals(sig).name} at step {ended}"
    if ended != stopped:
        line += (f" (pt.stop_requested() was True from step {stopped}: check it after each "
                 "opt.step() and write pt.checkpoint there)")
    if saved is None:
        return line + f"; no pt.checkpoint since, so nothing was saved{status}"
    step, root = saved[:2]
    return (line + f": checkpoint {root}/step-{step} written; continue with "
            f"pt.init(resume={root!r}){status}")


def stepped_on(s) -> None:
    """Workers, collectively: the script stepped on after the stop. Where the processes
    are not pshybrid's to end (``returns`` below), one error ends the job instead."""
    if not s.owns:
        raise ConfigError(f"stopped by {signal.Signals(s.stop.agreed).name}: "
                          f"pt.stop_requested() was True from step {s.stopped}; with comm= "
                          "a part of the job or exit_servers=False the script ends the run: "
                          "check it after each opt.step()", collective=True)


def leave(code: int | None, ends: bool = False, at_exit: bool = False,
          returns: bool = False) -> None:
    """Every rank, after ``status``. A stopped run (``code``) ends the process with it,
    MPI finalized first (``finish_quietly``); at the interpreter's exit (no
    ``pt.shutdown()`` in the script) a ``SystemExit`` would not change the status:
    ``os._exit`` does, after every open file is flushed (``_flush_files``). ``returns``:
    the session is not the whole job (``pt.init``'s ``comm=``) or a server rank goes on
    (``exit_servers=False``): nothing is ended, the script decides (``pt.stop_requested()``).
    Otherwise the signals get their handlers back, unless one reached this rank after the
    last step: then the catcher stays (the same request forwarded again changes nothing),
    and a process that ``ends`` here finalizes MPI before the interpreter puts the default
    actions back."""
    if code is not None and not returns:
        finish_quietly()
        if at_exit:
            _flush_files()
            os._exit(code)
        raise SystemExit(code)
    if code is None and CAUGHT.signum is None:
        CAUGHT.uninstall()
    elif ends and not returns:
        finish_quietly()


def _flush_files() -> None:
    """Flush every open file object (the script's unclosed logs: ``os._exit`` drops
    buffers that the interpreter's own exit would have written)."""
    for obj in gc.get_objects():
        if isinstance(obj, io.IOBase):
            with contextlib.suppress(Exception):
                if not obj.closed and obj.writable():
                    obj.flush()
