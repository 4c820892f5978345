"""Training processes, one of them started ahead of its configuration.

A training process spends its first seconds importing TensorFlow and MLflow (about 5 s on 2
cores). The sweep starts the first configuration's process as it begins and, while one
configuration trains, the next one's: it imports, then waits for its request on stdin. The next
`take_process` with the same environment gets it ready; one nobody takes is stopped by
`discard_ahead` or when this process exits (and would exit by itself at the end of its stdin if
this process were killed).
"""

from __future__ import annotations

import atexit
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import IO

WORKER_COMMAND = [sys.executable, "-m", "tasks.train_worker"]


@dataclass
class TrainingProcess:
    """A `tasks.train_worker` process in its own session (a terminal's Ctrl-C reaches only the
    sweep, which stops it), its stderr kept in `log`."""

    popen: subprocess.Popen
    log: IO[str]
    environment: dict[str, str]

    @classmethod
    def start(cls, environment: dict[str, str]) -> TrainingProcess:
        log = tempfile.TemporaryFile("w+")
        popen = subprocess.Popen(
            WORKER_COMMAND,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env=environment,
            start_new_session=True,
        )
        return cls(popen, log, environment)

    def discard(self) -> None:
        """Stop it unused (it holds no run yet)."""
        self.popen.kill()
        self.popen.wait()
        self.log.close()


_ahead: TrainingProcess | None = None


def take_process(environment: dict[str, str]) -> TrainingProcess:
    """A training process for the next configuration: the one started ahead when it is alive and
    has this environment, else a new one."""
    global _ahead
    ahead, _ahead = _ahead, None
    if ahead is not None and ahead.popen.poll() is None and ahead.environment == environment:
        return ahead
    if ahead is not None:
        ahead.discard()
    return TrainingProcess.start(environment)


def start_ahead(environment: dict[str, str]) -> None:
    """Start the next configuration's process now, unless one is waiting already."""
    global _ahead
    if _ahead is None:
        _ahead = TrainingProcess.start(environment)


@atexit.register
def discard_ahead() -> None:
    """Stop the process started ahead, if nobody took it."""
    global _ahead
    ahead, _ahead = _ahead, None
    if ahead is not None:
        ahead.discard()
