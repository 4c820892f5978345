"""The training process started ahead of its configuration: taken ready by the next one with the
same environment, replaced when the environment differs, and gone when nobody needs it."""

from __future__ import annotations

import os

import psutil
import pytest

from tasks.process_ahead import start_ahead, take_process

pytestmark = pytest.mark.slow  # trains, or starts servers or processes


def _training_children() -> list[psutil.Process]:
    return [
        child
        for child in psutil.Process().children()
        if "tasks.train_worker" in " ".join(child.cmdline())
    ]


def test_a_process_started_ahead_is_taken_and_one_not_needed_ends() -> None:
    environment = dict(os.environ)
    start_ahead(environment)
    [ahead] = _training_children()
    taken = take_process(environment)
    assert taken.popen.pid == ahead.pid
    taken.popen.stdin.close()  # no request: it exits quietly once its imports are done
    assert taken.popen.wait(timeout=120) == 0
    taken.log.seek(0)
    assert "Traceback" not in taken.log.read()

    start_ahead(environment)
    [ahead] = _training_children()
    other = take_process({**environment, "MLFLOW_TRACKING_URI": "sqlite:///elsewhere.db"})
    assert other.popen.pid != ahead.pid and not ahead.is_running()  # replaced, not left over
    other.discard()
    assert _training_children() == []
