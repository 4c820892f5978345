"""Who else in this process follows the configurations' progress: the Python face's progress
bars (api/progress.py). The training task tells each listener a configuration's epochs done."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

Listener = Callable[[str, float, float], None]  # (configuration, epochs done, epochs planned)
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
        listener(name, done, planned)
