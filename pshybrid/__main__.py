"""``python -m pshybrid <command>``: every entry point runs abort-on-error (launch.run)."""

import signal
import sys

from .threads import apply_thread_limits

apply_thread_limits()  # before NumPy loads its BLAS: one pool of the right size per rank

from .cli import main as _cli_main  # noqa: E402
from .launch import run  # noqa: E402


def main(argv=None) -> int:
    from . import cli

    cli.EXITS_AFTER = True  # (train keeps its signal catcher to the exit)
    try:
        return run(_cli_main, argv)
    finally:
        _finish_quietly()


def _finish_quietly() -> None:
    """After train (its catcher still installed): MPI finalized now, while a signal is
    still the same request (mpi4py finalizes it at the interpreter's very end, after
    Python has put the signals' default actions back: a SIGTERM then killed the rank and
    left the job's shared memory), then the three signals ignored to the exit."""
    preempt = sys.modules.get("pshybrid.preempt")  # (importing it would start MPI)
    if preempt is None or not preempt.CAUGHT.installed:
        return
    MPI = sys.modules.get("mpi4py.MPI")
    if MPI is not None and MPI.Is_initialized() and not MPI.Is_finalized():
        MPI.Finalize()  # Wire: every rank of the job finalizes (each after its command)
    for sig in preempt.SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


if __name__ == "__main__":
    sys.exit(main())
