"""Training processes forked from a server that has imported TensorFlow and MLflow once.

A new Python process spends 5-10 s (2 cores) importing TensorFlow and MLflow before it can
train. Each configuration still trains in a process of its own (TensorFlow fixes its device
layout once per process, and a crash or an out-of-memory kill must take only that run), but the
process is forked from multiprocessing's fork server, which loaded tasks/training/imports.py
once: it starts ready in a few hundredths of a second. The sweep and pipeline commands start the
server before Prefect's start-up, which its imports overlap (a sweep called otherwise starts it
as it begins). It serves every later sweep of this process and ends with this process however
that ends; a forked process whose server is gone stops itself (tasks/training/worker.py).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import subprocess
import sys
import tempfile
import types
from collections.abc import Iterator
from multiprocessing import forkserver, reduction
from typing import IO

from towerbench.config.sections import TrainConfig

PRELOAD = [
    "towerbench.tasks.training.imports",
    "towerbench.tasks.training.worker",
    "towerbench.tasks.training.fork_server_exit",
]
_context = multiprocessing.get_context("forkserver")


def start_fork_server() -> None:
    """Start the server (it imports in the background); a no-op when it is running."""
    _context.set_forkserver_preload(PRELOAD)
    forkserver.ensure_running()


def start_fork_server_for(configs: list[TrainConfig], pool: str | None) -> None:
    """Start the server if this machine trains some of `configs` in single processes (not on a
    work `pool`; a multi-worker configuration starts processes of its own)."""
    if pool is None and any(config.workers == 1 for config in configs):
        start_fork_server()


@contextlib.contextmanager
def main_module_hidden() -> Iterator[None]:
    """multiprocessing runs this process's main module again in the forked process (as
    `__mp_main__`) unless it has neither a module name nor a file. The training process needs
    nothing from it, and a script that calls the sweep without an `if __name__ == "__main__"`
    guard would start its sweep again there."""
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


class _PassedFd:
    """A file descriptor handed to the forked process: pickled while it starts, it arrives
    there as a descriptor of its own."""

    def __init__(self, fd: int):
        self.fd = fd

    def __reduce__(self):
        return _received_fd, (reduction.DupFd(self.fd),)


def _received_fd(duplicate) -> int:
    return duplicate.detach()


class TrainingProcess:
    """A forked `tasks.training.worker` run of one request: its stdout (the worker's events) as
    lines, its stderr kept in `log`, and `subprocess.Popen`'s poll, wait, terminate and kill."""

    def __init__(self, request_json: str, environment: dict[str, str]):
        from towerbench.tasks.training.worker import forked_main

        start_fork_server()
        self.log: IO[str] = tempfile.TemporaryFile("w+")
        read_end, write_end = os.pipe()
        self.process = _context.Process(
            target=forked_main,
            args=(request_json, environment, _PassedFd(write_end), _PassedFd(self.log.fileno())),
            name="towerbench-training",
        )
        try:
            with main_module_hidden():
                self.process.start()
        except BaseException:
            os.close(read_end)
            self.log.close()
            raise
        finally:
            os.close(write_end)  # the worker holds its own: its end is this side's end of file
        self.stdout: IO[str] = os.fdopen(read_end)
        self.pid = self.process.pid

    def poll(self) -> int | None:
        return self.process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self.process.join(timeout)
        if self.process.exitcode is None:
            raise subprocess.TimeoutExpired("towerbench.tasks.training.worker", timeout or 0)
        return self.process.exitcode

    def terminate(self) -> None:
        self.process.terminate()

    def kill(self) -> None:
        self.process.kill()

    def close(self) -> None:
        self.stdout.close()
        self.log.close()
