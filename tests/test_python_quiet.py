"""A script or a notebook that imports towerbench hears from towerbench, not from the libraries
under it: TensorFlow's C++ start-up lines stay off stderr unless the user set their level."""

from __future__ import annotations

import os
import subprocess
import sys

IMPORTS = "import towerbench, keras, tensorflow as tf\nprint(int(tf.constant(1) + 1))\n"


def _stderr_of(script: str, **environment: str) -> str:
    env = {key: value for key, value in os.environ.items() if key != "TF_CPP_MIN_LOG_LEVEL"}
    done = subprocess.run(
        [sys.executable, "-c", script],
        env={**env, **environment},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0 and done.stdout == "2\n", done.stderr[-2000:]
    return done.stderr


def test_keras_imported_after_towerbench_prints_no_tensorflow_log_line() -> None:
    assert _stderr_of(IMPORTS) == ""
    # The user's own level wins: TensorFlow's start-up lines are theirs to see.
    assert "absl::InitializeLog" in _stderr_of(IMPORTS, TF_CPP_MIN_LOG_LEVEL="0")
