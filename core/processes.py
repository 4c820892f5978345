"""Stopping the processes towerbench starts: ask them to stop, wait, then kill what is left; and
in a started process, ending with the process that started it."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing import forkserver
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


def watch_parent(parent: int, on_gone: Callable[[], None]) -> None:
    """In a started process: call `on_gone` once `parent` (noted as it started; it may be gone
    by now) is no longer its parent. A training process or the probe watches the fork server
    (tasks/training/fork_server.py), which ends with the command that started it, so they end
    with that command too."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        on_gone()

    threading.Thread(target=watch, daemon=True, name="watch-parent").start()


def forked_from_server() -> None:
    """First thing in a process multiprocessing's fork server forked: a session of its own (a
    terminal's Ctrl-C reaches only the caller, which stops it), and the server left to end with
    its caller.
    multiprocessing hands each forked process the write end of the caller's "alive" pipe (so it
    could start processes itself); the server ends when that pipe closes, so a forked process
    that kept it would keep the server, and with it itself (`watch_parent`), alive."""
    os.setsid()
    alive = forkserver._forkserver._forkserver_alive_fd  # type: ignore[attr-defined]
    if alive is not None:
        os.close(alive)
        forkserver._forkserver._forkserver_alive_fd = None  # type: ignore[attr-defined]
