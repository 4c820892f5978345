"""Two sweeps started at once on a new SQLite store both complete (issue 10).

MLflow creates a new store's tables on first use; two processes doing so at the same moment
used to crash one of them. The race is in that first use, so each process here does what a
sweep does first (`ensure_experiment`, then its parent run) rather than a whole training.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from mlflow.tracking import MlflowClient

pytestmark = pytest.mark.slow  # trains, or starts servers or processes

# Import everything first, say "ready", then wait for "go": both start on the store together.
FIRST_SWEEP_STEPS = """
import sys, time
from pathlib import Path
from towerbench.config.params import TrackingConfig
from towerbench.config.tracking_uri import resolve_tracking
from towerbench.tasks.tracking import ensure_experiment, start_sweep_run

uri, ready, go = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
tracking = resolve_tracking(TrackingConfig(tracking_uri=uri))
ready.touch()
while not go.exists():
    time.sleep(0.002)
experiment_id = ensure_experiment(tracking, "towerbench-digits-tutorial")
start_sweep_run(tracking, experiment_id, ready.name, "sweep", {}, [], key=ready.name)
"""


def test_two_first_sweeps_on_one_new_sqlite_store_both_succeed(tmp_path):
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    go = tmp_path / "go"
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", FIRST_SWEEP_STEPS, uri, str(tmp_path / name), str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for name in ("first", "second")
    ]
    deadline = time.monotonic() + 120
    while not all((tmp_path / name).exists() for name in ("first", "second")):
        assert time.monotonic() < deadline and all(p.poll() is None for p in processes)
        time.sleep(0.05)
    go.touch()
    outputs = [process.communicate(timeout=120)[0] for process in processes]
    assert [process.returncode for process in processes] == [0, 0], outputs[-1][-3000:]
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("towerbench-digits-tutorial")
    runs = client.search_runs([experiment.experiment_id])
    assert sorted(run.info.run_name for run in runs) == ["first", "second"]
