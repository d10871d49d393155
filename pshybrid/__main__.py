"""``python -m pshybrid <command>``: every entry point runs abort-on-error (launch.run)."""

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
    """After train, its catcher still installed: ``preempt.finish_quietly``."""
    preempt = sys.modules.get("pshybrid.preempt")  # (importing it would start MPI)
    if preempt is not None and preempt.CAUGHT.installed:
        preempt.finish_quietly()


if __name__ == "__main__":
    sys.exit(main())
