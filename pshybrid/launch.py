"""Abort-on-error launch.

``run(main, argv)`` runs a command so that the MPI job can never hang on an error:

- a ``PshybridError`` raised on every rank at the same point (``collective``) prints one
  line per rank, ``pshybrid: error: <message>``, and every rank exits with status 2;
- Ctrl-C (KeyboardInterrupt) outside a training loop prints one line and exits with 130
  (a training loop stops at a step boundary instead: ``preempt``);
- any other exception (or a ``PshybridError`` on some ranks only) prints the rank and
  the error (with traceback for unexpected ones) and calls ``MPI.COMM_WORLD.Abort``,
  which ends every rank of the job within seconds with a non-zero status.
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
from types import SimpleNamespace

from . import procenv
from .errors import PshybridError, pipe_closed, say

# Set by the MPI launchers (Hydra/MPICH, Open MPI, PMIx/Slurm) in every rank they start.
_LAUNCHER_VARS = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS")
_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS")
_SERIAL = SimpleNamespace(rank=0, size=1)


def launched() -> bool:
    """Whether an MPI launcher started this process (it may have started others)."""
    return any(v in os.environ for v in _LAUNCHER_VARS)


def launched_alone() -> bool:
    """Whether the launcher says this process is its job's only rank: the first of Hydra's,
    Open MPI's and srun's size variables that is set (PMIx alone sets none: not known to
    be alone). Only the first: an ``mpiexec`` inside a Slurm step inherits the step's."""
    size = next((os.environ[v] for v in _SIZE_VARS if v in os.environ), "")
    return size.strip() == "1"


def _world():
    """COMM_WORLD; a one-rank stand-in in a process that has not loaded MPI and was not
    started by an MPI launcher (a serial command such as ``prep``): MPI_Init would tell
    nothing more there, and can itself fail (it creates files: not on a full disk); and in
    one that cannot load it (``unloadable``: each rank then ends alone)."""
    if "mpi4py.MPI" not in sys.modules and not launched():
        return _SERIAL
    try:
        from mpi4py import MPI
    except Exception:  # noqa: BLE001 - (said once, by ``run``: no second traceback here)
        return _SERIAL
    return MPI.COMM_WORLD


def _abort(code: int) -> None:
    if _world() is _SERIAL:  # (no MPI to end the others with: this rank ends)
        raise SystemExit(code)
    from .transport import abort

    abort(_world(), code)  # Wire: MPI_Abort kills every rank of the job; nobody waits.


def unloadable(exc: BaseException) -> str | None:
    """One line for a library this Python cannot load (the MPI library ``mpi4py`` is told
    to use, a package missing from the environment), else None: a job script's environment,
    not an error of the run."""
    if isinstance(exc, RuntimeError) and str(exc).startswith("cannot load MPI library"):
        said = "; ".join(str(exc).splitlines()[1:]) or str(exc)
        lib = os.environ.get("MPI4PY_LIBMPI")
        return (f"cannot load the MPI library ({said}{f'; MPI4PY_LIBMPI={lib}' if lib else ''})"
                ": check MPI4PY_LIBMPI, the modules loaded and the virtual environment "
                "(docs/clusters.md)")
    if isinstance(exc, ModuleNotFoundError) and exc.name in ("mpi4py", "numpy", "h5py",
                                                             "numba"):  # (not a name in one)
        return (f"{exc} in {sys.executable}: activate the virtual environment pshybrid was "
                "installed in (a job script: PSHYBRID_VENV; docs/clusters.md)")
    return None


def excepthook(exc_type, exc, tb) -> None:
    """sys.excepthook that aborts the whole job (for uncaught exceptions anywhere)."""
    world = _world()
    sys.stderr.write(f"pshybrid: rank {world.rank}/{world.size}: uncaught exception:\n")
    traceback.print_exception(exc_type, exc, tb)
    _abort(1)


def run(main, argv=None) -> int:
    """Run ``main(argv)`` under the error policy above, its standard output ``Guarded``
    (a failed write: status 1 at the end, not 0); return its exit status."""
    procenv.reopen_closed()
    procenv.mark_start()
    guard = procenv.guard_stdout()
    try:
        status = _run(main, argv)
    except SystemExit as exc:  # (--help, --version: their output lost is status 1 too)
        if exc.code in (0, None) and guard is not None and guard.error is not None:
            raise SystemExit(1) from None
        raise
    finally:
        failed = procenv.unguard(guard)
    return 1 if failed is not None and status == 0 else status


def _flushed(main, argv) -> int:
    """``main(argv)``, then standard output flushed, also before a ``SystemExit(0)``
    (``--help``): a failed write is the guard's to tell, not the interpreter's exit's."""
    try:
        status = main(argv) or 0
    except SystemExit as exc:
        if exc.code in (0, None):
            sys.stdout.flush()
        raise
    sys.stdout.flush()
    return status


def _run(main, argv) -> int:
    sys.excepthook = excepthook
    try:
        return _flushed(main, argv)
    except PshybridError as exc:
        return _report("pshybrid: error", f": {exc}", 2, exc.collective)
    except SystemExit as exc:  # (a command ended by a signal: stopping)
        if isinstance(exc.code, int) and exc.code - 128 in set(signal.Signals):
            _report(f"pshybrid: stopped by {signal.Signals(exc.code - 128).name}",
                    f": nothing published (exit status {exc.code})", exc.code)
        raise
    except BrokenPipeError:  # (abort_on_error's line where one was around it)
        return _report("pshybrid: stopped", f": {pipe_closed()}", 128 + signal.SIGPIPE)
    except MemoryError as exc:  # (abort_on_error's line where one was around it)
        from .transport import out_of_memory

        return _report("pshybrid: error", f": {out_of_memory(exc)}", 2)
    except KeyboardInterrupt:  # Ctrl-C outside a training loop (which stops at a step)
        return _report("pshybrid: interrupted by SIGINT", "", 130)
    except BaseException as exc:
        if said := unloadable(exc):  # (MPI loaded here: the others may wait, so abort them)
            return _report("pshybrid: error", f": {said}", 2, "mpi4py.MPI" not in sys.modules)
        if isinstance(exc, FileNotFoundError) and procenv.cwd_gone():  # (a relative path)
            return _report("pshybrid: error", f": {exc.strerror}: the working directory was "
                           "removed: give absolute paths, or start in a directory that stays",
                           2)
        excepthook(*sys.exc_info())
    return 1


def _report(head: str, tail: str, code: int, every_rank: bool = False) -> int:
    """Print ``head`` (this rank, of several) ``tail``; return ``code`` where this process
    alone ends the job (one rank, or ``every_rank`` stopping at the same point), else end
    every rank: the others may wait in a collective."""
    world = _world()
    where = f" (rank {world.rank}/{world.size})" if world.size > 1 else ""
    say(sys.stderr, f"{head}{where}{tail}\n")
    if not every_rank and world.size > 1:
        _abort(code)
    return code
