"""``python -m pshybrid <command>``: every entry point runs abort-on-error (launch.run)."""

import sys

from .procenv import reopen_closed

reopen_closed()  # (before any file is opened: MPI's, the data's)

from .threads import apply_thread_limits  # noqa: E402

apply_thread_limits()  # before NumPy loads its BLAS: one pool of the right size per rank

from .launch import run, unloadable  # noqa: E402  (the standard library only)


def main(argv=None) -> int:
    try:
        from . import cli
    except ImportError as exc:  # (a Python without pshybrid's packages: one line, not a trace)
        if (said := unloadable(exc)) is None:
            raise
        sys.stderr.write(f"pshybrid: error: {said}\n")
        return 2
    cli.EXITS_AFTER = True  # (train keeps its signal catcher to the exit)
    try:
        return run(cli.main, argv)
    finally:
        _finish_quietly()


def _finish_quietly() -> None:
    """After train, its catcher still installed: ``preempt.finish_quietly``."""
    preempt = sys.modules.get("pshybrid.preempt")  # (importing it would start MPI)
    if preempt is not None and preempt.CAUGHT.installed:
        preempt.finish_quietly()


if __name__ == "__main__":
    sys.exit(main())
