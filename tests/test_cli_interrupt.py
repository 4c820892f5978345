"""Ctrl-C while `towerbench` starts (issue 29): one line and status 130, never a traceback,
whenever it lands: in the imports, or once the command has taken over."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

TOWERBENCH = Path(sys.executable).with_name("towerbench")  # the console script users run


def _interpreter_start_seconds() -> float:
    """How long this machine takes, now, to start Python and exit: the longer of two tries."""
    times = []
    for _ in range(2):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        times.append(time.perf_counter() - started)
    return max(times)


@pytest.mark.parametrize("delay", [0.2, 0.5, 1.0])
@pytest.mark.slow
def test_ctrl_c_while_starting_is_one_line(delay, tmp_path) -> None:
    # `delay` after the interpreter's own start (its site import, coverage's hook in the
    # tests): a SIGINT before that kills CPython before any program's code runs.
    interpreter = _interpreter_start_seconds()
    command = [str(TOWERBENCH), "fetch", "digits", "--data-dir", str(tmp_path / "data")]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(interpreter + delay)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr  # fetching digits takes seconds longer than this
    assert "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1, stderr
