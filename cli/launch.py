"""The `towerbench` console script: a Ctrl-C while the command starts (its imports take seconds)
ends it with one line instead of a traceback; then the command runs and handles its own."""

from __future__ import annotations

import os
import signal


def _interrupted_while_starting(*_: object) -> None:
    os.write(2, b"towerbench: interrupted while starting\n")  # nothing was started yet
    os._exit(130)


def run() -> None:
    signal.signal(signal.SIGINT, _interrupted_while_starting)
    signal.signal(signal.SIGTERM, _interrupted_while_starting)
    from towerbench.cli.main import run as run_command

    run_command()
