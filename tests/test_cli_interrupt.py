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


@pytest.mark.parametrize("delay", [0.2, 0.5, 1.0])
@pytest.mark.slow
def test_ctrl_c_while_starting_is_one_line(delay, tmp_path) -> None:
    command = [str(TOWERBENCH), "fetch", "digits", "--data-dir", str(tmp_path / "data")]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(delay)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr  # fetching digits takes seconds longer than this
    assert "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1, stderr
