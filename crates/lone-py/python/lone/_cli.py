"""The ``lone`` command installed with the wheel: the same program as the ``lone`` binary."""

import signal
import sys

from . import _lone


def main() -> None:
    # Ctrl-C ends the command as it ends the binary (the commands that handle it install
    # their own handler).
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    sys.exit(_lone.cli(["lone", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
