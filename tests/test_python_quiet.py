"""A script or a notebook that imports towerbench hears from towerbench, not from the libraries
under it: TensorFlow's C++ start-up lines stay off stderr unless the user set their level."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from subprocess import CompletedProcess

import pytest
from fixtures_user import QUIET_BREACHES, user_environment

IMPORTS = "import towerbench, keras, tensorflow as tf\nprint(int(tf.constant(1) + 1))\n"


def _python(*argv: str, cwd: Path | None = None, **environment: str) -> CompletedProcess[str]:
    """Python run as a user runs it: TensorFlow's log level theirs to set (unset unless given)."""
    return subprocess.run(
        [sys.executable, *argv],
        cwd=cwd,
        env=user_environment(**environment),
        capture_output=True,
        text=True,
        timeout=600,
    )


def _stderr_of(script: str, **environment: str) -> str:
    done = _python("-c", script, **environment)
    assert done.returncode == 0 and done.stdout == "2\n", done.stderr[-2000:]
    return done.stderr


def test_keras_imported_after_towerbench_prints_no_tensorflow_log_line() -> None:
    assert _stderr_of(IMPORTS) == ""
    # The user's own level wins: TensorFlow's start-up lines are theirs to see.
    assert "absl::InitializeLog" in _stderr_of(IMPORTS, TF_CPP_MIN_LOG_LEVEL="0")


SWEEP = """
import towerbench
import numpy as np
import keras

def build(input_shape, num_classes):
    inputs = keras.Input(input_shape)
    return keras.Model(inputs, keras.layers.Dense(num_classes)(inputs))

rng = np.random.default_rng(0)
labels = rng.integers(0, 3, size=200)
features = (labels[:, None] + rng.normal(size=(200, 6))).astype(np.float32)
data = ((features[:160], labels[:160]), (features[160:], labels[160:]))
towerbench.sweep(model=build, data=data, name="blobs", towers=[1, 2], seeds=[0], epochs=2,
                 global_batch=32, tracking_uri="sqlite:///mlflow.db")
"""


@pytest.mark.slow
def test_a_script_sweep_says_a_line_per_configuration_then_its_results_on_stdout(tmp_path) -> None:
    (tmp_path / "script.py").write_text(SWEEP)
    done = _python("script.py", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()  # as Keras' model.fit says its progress
    ended = [line for line in lines if " completed: test accuracy " in line]
    assert len(ended) == 2 and lines[-1].startswith("Report: "), done.stdout
    assert len(lines) <= 8, done.stdout  # 2 ends, 2 results, 2 verdicts, the parent, the report
    assert not QUIET_BREACHES.search(done.stderr), done.stderr  # a warning may stay
    assert "RuntimeWarning" not in done.stderr, done.stderr  # no un-awaited coroutine
    assert "\r" not in done.stdout + done.stderr  # piped: no bar, nor a fragment of one
