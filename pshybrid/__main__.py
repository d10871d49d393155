"""``python -m pshybrid <command>``: every entry point runs abort-on-error (launch.run)."""

import sys

from .cli import main as _cli_main
from .launch import run


def main(argv=None) -> int:
    return run(_cli_main, argv)


if __name__ == "__main__":
    sys.exit(main())
