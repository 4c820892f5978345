"""The environment a user runs towerbench in, for tests of what a user sees.

conftest.py sets TF_CPP_MIN_LOG_LEVEL for the suite's own processes; a user's shell usually has
none, and then towerbench's own choice (core/native_logs.py) decides what TensorFlow prints.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path


def user_environment(**settings: str) -> dict[str, str]:
    """This process's environment without TensorFlow's log level, with `settings` on top."""
    kept = {key: value for key, value in os.environ.items() if key != "TF_CPP_MIN_LOG_LEVEL"}
    return {**kept, **settings}


@contextlib.contextmanager
def interruptible_children() -> Iterator[None]:
    """Processes started in the block take SIGINT as from a terminal or a Jupyter kernel, even
    when this test process inherited it ignored (a background job, nohup, a CI runner): an
    ignored signal stays ignored across exec, and Python then raises no KeyboardInterrupt."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def run_script(folder: Path, text: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """`text` as folder/script.py, run by this Python in `folder`; it must exit 0 (its stderr's
    end is the failure's message)."""
    (folder / "script.py").write_text(text)
    done = subprocess.run(
        [sys.executable, "script.py"], cwd=folder, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


# What a user never sees unless they ask (TF_CPP_MIN_LOG_LEVEL, verbose=True): TensorFlow's C++
# lines, Prefect's and MLflow's INFO lines. Warnings stay: they are meant to be seen.
QUIET_BREACHES = re.compile(r"absl::InitializeLog|^[IWEF]\d{4} |\| INFO |INFO mlflow", re.M)
