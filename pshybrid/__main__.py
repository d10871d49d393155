"""``python -m pshybrid <command>``: every entry point runs abort-on-error (launch.run)."""

import sys

from .threads import apply_thread_limits

apply_thread_limits()  # before NumPy loads its BLAS: one pool of the right size per rank

from .cli import main as _cli_main  # noqa: E402
from .launch import run  # noqa: E402


def main(argv=None) -> int:
    return run(_cli_main, argv)


if __name__ == "__main__":
    sys.exit(main())
