"""The first line a user reads is the one that matters: TensorFlow's C++ logging (absl, oneDNN,
CUDA probing) stays off stderr unless asked for, so a bad model reference is exactly one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from fixtures_model import write_digits
from fixtures_user import user_environment


def _train_a_missing_function(tmp_path: Path, *extra: str, **environment: str) -> tuple[int, str]:
    write_digits(tmp_path / "data", train=64, test=32)
    (tmp_path / "net.py").write_text("def build(input_shape, num_classes):\n    return None\n")
    completed = subprocess.run(
        [sys.executable, "-m", "towerbench.cli.main", "train", "--model", "net.py:nothere"]
        + ["--dataset", "digits", "--data-dir", "data", "--global-batch", "16", *extra],
        cwd=tmp_path,
        env=user_environment(**environment),
        capture_output=True,
        text=True,
        timeout=300,
    )
    return completed.returncode, completed.stderr


@pytest.mark.slow
def test_a_missing_model_function_is_one_line_on_stderr(tmp_path) -> None:
    status, stderr = _train_a_missing_function(tmp_path)
    assert status == 2
    net = (tmp_path / "net.py").resolve()
    assert stderr.splitlines() == [
        f"towerbench train: error: {net}:nothere: no function 'nothere' in {net} "
        "(its functions: build)"
    ]


@pytest.mark.slow
def test_verbose_shows_tensorflows_own_logging(tmp_path) -> None:
    status, stderr = _train_a_missing_function(tmp_path, "--verbose")
    assert status == 2
    assert "absl::InitializeLog" in stderr, stderr
    assert stderr.splitlines()[-1].endswith("/net.py (its functions: build)")


def test_prefects_server_notices_stay_off_the_commands_stderr_and_its_warnings_do_not() -> None:
    """A command's results are its last lines: "Stopping temporary server on ..." (logged as
    the command exits) is not after them."""
    script = (
        "from towerbench.cli.console import server_notices_hidden; server_notices_hidden()\n"
        "from prefect.logging import get_logger\n"
        "get_logger().info('Stopping temporary server on http://127.0.0.1:1')\n"
        "get_logger().warning('a warning of its own')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "a warning of its own" in done.stderr and "temporary server" not in done.stderr
