"""Who else in this process follows the configurations' progress: the Python face's bars and
lines (api/progress.py). The training task tells each listener a configuration's epochs done,
then the line that says how it ended."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Protocol


class Listener(Protocol):
    def epoch(self, name: str, done: float, planned: float) -> None: ...

    def finished(self, line: str) -> None: ...


_listeners: list[Listener] = []


@contextlib.contextmanager
def listening(listener: Listener) -> Iterator[None]:
    """`listener` is told every configuration's progress while the block runs."""
    _listeners.append(listener)
    try:
        yield
    finally:
        _listeners.remove(listener)


def tell(name: str, done: float, planned: float) -> None:
    for listener in list(_listeners):
        listener.epoch(name, done, planned)


def tell_finished(line: str) -> None:
    for listener in list(_listeners):
        listener.finished(line)
