"""`make run` as a new user reads it: `towerbench pipeline` in a fresh DVC project says each
configuration's result and each verdict once (on stdout, after the runs' progress on stderr) and
ends with its own lines, not a server's (real DVC, Prefect, MLflow and TensorFlow)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from towerbench.tasks.data.dvc_stages import run_dvc

pytestmark = pytest.mark.slow  # fetches, preprocesses, trains and starts Prefect

PROJECT = Path(__file__).resolve().parents[1]


def _project(folder: Path) -> None:
    """A git + DVC project with the real stages and a small sweep of the embedded digits."""
    subprocess.run(["git", "init", "-q", str(folder)], check=True)
    for name in ("dvc.yaml", "data/.gitignore"):
        (folder / name).parent.mkdir(exist_ok=True)
        shutil.copy(PROJECT / name, folder / name)
    params = yaml.safe_load((PROJECT / "params.yaml").read_text())
    params["train"].update(epochs=1)
    params["sweep"].update(towers=[1, 2], lr_scaling=["linear"], warmup_epochs=[0], seeds=[0])
    (folder / "params.yaml").write_text(yaml.safe_dump(params))
    run_dvc(folder, "init", "-q")


def test_the_pipeline_says_each_result_and_verdict_once(tmp_path) -> None:
    _project(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "towerbench.cli.main", "pipeline", "--params", "params.yaml"],
        cwd=tmp_path,
        env={**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = done.stdout.splitlines()
    verdicts = [line for line in results if line.startswith("towers=") and ": " in line]
    assert len(verdicts) >= 2 and results[-1].startswith("Report: "), done.stdout
    both = done.stdout + done.stderr
    assert all(both.count(line) == 1 for line in results), both[-3000:]
    assert "temporary server" not in done.stderr and "Downloading artifacts" not in done.stderr
