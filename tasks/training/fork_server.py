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
import pickle
import subprocess
import sys
import tempfile
import traceback
import types
from collections.abc import Callable, Iterator
from multiprocessing import forkserver, reduction, resource_tracker, util
from typing import IO, Any

from towerbench.config.sections import TrainConfig
from towerbench.core.processes import forked_from_server, stop, watch_parent
from towerbench.core.reaper import end_process_reapers, remove_when_this_process_ends

PRELOAD = [
    "towerbench.tasks.training.imports",
    "towerbench.tasks.training.worker",
    "towerbench.tasks.training.fork_server_exit",
]
_context = multiprocessing.get_context("forkserver")
STOP_GRACE_SECONDS = 2  # for a forked call to end when asked, before it is killed
_REMOVED: set[str] = set()  # multiprocessing's folders a watchdog removes at this process's end


def start_fork_server() -> None:
    """Start the server (it imports in the background); a no-op when it is running."""
    _context.set_forkserver_preload(PRELOAD)
    forkserver.ensure_running()
    # The folder of the server's socket (pymp-*): multiprocessing removes it at a normal exit.
    folder = util.get_temp_dir()
    if folder not in _REMOVED:
        remove_when_this_process_ends(folder)
        _REMOVED.add(folder)


def stop_multiprocessing_servers() -> None:
    """Stop and reap multiprocessing's fork server and resource tracker (a no-op for one not
    running); the next `ensure_running` starts them again. Python 3.12's multiprocessing has no
    public stop for either: this is towerbench's one call of their private `_stop()`
    (tests/test_private_apis.py fails when a Python release changes it)."""
    forkserver._forkserver._stop()  # type: ignore[attr-defined]
    resource_tracker._resource_tracker._stop()  # type: ignore[attr-defined]


def stop_fork_server() -> None:
    """Stop the server, its resource tracker and the watchdog of its socket's folder (which
    multiprocessing removes at this process's exit): a notebook's call leaves nothing running.
    The next training process starts them again."""
    stop_multiprocessing_servers()
    end_process_reapers(keep=_REMOVED)
    _REMOVED.clear()


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


class ForkedProcess:
    """A process forked from the server to run `target(*args, stdout, stderr)`: its stdout (a
    pipe) as `stdout`, its stderr kept in `log`, and `subprocess.Popen`'s poll, wait, terminate
    and kill."""

    def __init__(self, target: Callable[..., None], args: tuple, name: str, binary: bool = False):
        start_fork_server()
        self.log: IO[str] = tempfile.TemporaryFile("w+")
        read_end, write_end = os.pipe()
        self.process = _context.Process(
            target=target,
            args=(*args, _PassedFd(write_end), _PassedFd(self.log.fileno())),
            name=name,
        )
        try:
            with main_module_hidden():
                self.process.start()
        except BaseException:
            os.close(read_end)
            self.log.close()
            raise
        finally:
            os.close(write_end)  # the child holds its own: its end is this side's end of file
        self.stdout: IO = os.fdopen(read_end, "rb" if binary else "r")
        self.pid = self.process.pid

    def poll(self) -> int | None:
        return self.process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self.process.join(timeout)
        if self.process.exitcode is None:
            raise subprocess.TimeoutExpired("towerbench forked process", timeout or 0)
        return self.process.exitcode

    def terminate(self) -> None:
        self.process.terminate()

    def kill(self) -> None:
        self.process.kill()

    def close(self) -> None:
        self.stdout.close()
        self.log.close()


class TrainingProcess(ForkedProcess):
    """A forked `tasks.training.worker` run of one request: its stdout (the worker's events) as
    lines, its stderr kept in `log`."""

    def __init__(self, request_json: str, environment: dict[str, str]):
        from towerbench.tasks.training.worker import forked_main

        super().__init__(forked_main, (request_json, environment), "towerbench-training")


def forked_call(function: Callable[..., Any], args: tuple, result: int, stderr: int) -> None:
    """In a forked process: `function(*args)`'s value, or the exception it raised, pickled to
    the `result` descriptor; it ends at once when the server is gone (the caller died)."""
    forked_from_server()
    watch_parent(os.getppid(), lambda: os._exit(143))
    sys.stdout.flush()
    sys.stderr.flush()
    for standard in (1, 2):  # what it prints is its log
        os.dup2(stderr, standard)
    os.close(stderr)
    try:
        outcome: tuple[str, Any] = ("value", function(*args))
    except Exception as error:  # noqa: BLE001 - raised again on the caller's side
        traceback.print_exc()
        outcome = ("error", error)
    try:
        data = pickle.dumps(outcome)
    except Exception as error:  # noqa: BLE001 - an exception that cannot be pickled
        data = pickle.dumps(("error", RuntimeError(f"{type(error).__name__}: {error}")))
    with os.fdopen(result, "wb") as channel:
        channel.write(data)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip TensorFlow's teardown


def call_forked(name: str, function: Callable[..., Any], *args: Any) -> Any:
    """`function(*args)` in a process forked from the server (TensorFlow already imported),
    named `name`; its exception is raised here. The process is stopped if this one is
    interrupted, and ends on its own if this one dies; `ChildProcessError` (how it ended and its
    last line) if it died without an answer."""
    process = ForkedProcess(forked_call, (function, args), name, binary=True)
    with contextlib.closing(process):
        try:
            data = process.stdout.read()
            status = process.wait()
        except BaseException:  # Ctrl-C, SIGTERM: the process ends with us
            stop([process], STOP_GRACE_SECONDS)
            raise
        if not data:
            process.log.seek(0)
            lines = [line.strip() for line in process.log.read().splitlines() if line.strip()]
            ended = f"exit status {status}" if status >= 0 else f"killed by signal {-status}"
            raise ChildProcessError(ended + (f"; its last line: {lines[-1]}" if lines else ""))
    kind, value = pickle.loads(data)
    if kind == "error":
        raise value
    return value
