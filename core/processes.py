"""Stopping the processes towerbench starts: ask them to stop, wait, then kill what is left."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Sequence
from typing import Protocol

import psutil


class Process(Protocol):
    """What `subprocess.Popen` (and our forked training process) offer to stop one."""

    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def terminate(self) -> None: ...
    def kill(self) -> None: ...


def stop(
    processes: Sequence[Process], grace_seconds: float, ask: Sequence[bool] | None = None
) -> None:
    """SIGTERM each running process (SIGKILL at once where `ask` says False), give them
    `grace_seconds` together to end, then SIGKILL and reap the ones still running."""
    for process, politely in zip(processes, ask or [True] * len(processes), strict=True):
        if process.poll() is None:
            process.terminate() if politely else process.kill()
    deadline = time.monotonic() + grace_seconds
    for process in processes:
        try:
            process.wait(max(deadline - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def stop_tree(process: subprocess.Popen, grace_seconds: float) -> None:
    """`stop` the process, then kill whatever it started and left behind (in sessions of their
    own, say)."""
    try:
        descendants = psutil.Process(process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        descendants = []
    stop([process], grace_seconds)
    _, left_behind = psutil.wait_procs(descendants, timeout=5)
    for orphan in left_behind:
        orphan.kill()
