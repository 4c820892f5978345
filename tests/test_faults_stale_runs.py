"""Runs a dead attempt left RUNNING (issue 40): the next sweep closes them KILLED, naming the
run that replaced them, and a sweep that starts anew rather than resuming the interrupted one
says why in one line (here: its model file was edited)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient
from test_flows_sweep import TINY_TRAINING, write_tiny_digits
from test_tracking_user_model import NET

pytestmark = pytest.mark.slow  # trains

ROOT = Path(__file__).resolve().parents[1]

# An attempt of the project's sweep that died with its parent run and first configuration's run
# RUNNING: opened as the sweep opens them, in a process that then ends without closing them.
DEAD_ATTEMPT = """
import sys
from pathlib import Path
from towerbench.config.grid import expand, run_name
from towerbench.config.load import load
from towerbench.config.tracking_uri import resolve_tracking
from towerbench.flows.sweep import Pending, open_config_run, open_sweep, plan_sweep

params = load(Path("params.yaml"))
configs = expand(params.train, params.sweep)
data_dir = Path(params.data.data_dir).resolve()
plan = plan_sweep(configs, params.train, params.sweep, data_dir, None, "sweep")
tracking = resolve_tracking(params.tracking)
run = open_sweep(tracking, plan, params.train, params.sweep, "sweep", False)
request = open_config_run(plan, run, Pending(0, run_name(configs[0], []), configs[0], None))
print(run.parent_run_id, request.run_id)
"""


def _project(folder: Path) -> Path:
    write_tiny_digits(folder / "data")
    (folder / "nets").mkdir()
    (folder / "nets" / "tiny.py").write_text(NET)
    train = {**TINY_TRAINING, "epochs": 1, "model": "nets/tiny.py:build"}
    params = {
        "data": {"data_dir": "data"},
        "train": train,
        "sweep": {"towers": [1], "seeds": [0], "lr_scaling": ["none"]},
        "tracking": {"tracking_uri": "sqlite:///mlflow.db"},
        "report": {"report_dir": "reports"},
    }
    (folder / "params.yaml").write_text(yaml.safe_dump(params))
    return folder


def test_a_sweep_after_a_model_edit_says_so_and_closes_the_dead_attempts_runs(tmp_path):
    project = _project(tmp_path)
    environment = dict(os.environ, PYTHONPATH=str(ROOT))
    dead = subprocess.run(
        [sys.executable, "-c", DEAD_ATTEMPT],
        cwd=project, env=environment, capture_output=True, text=True, check=True, timeout=300,
    )  # fmt: skip
    old_parent, old_child = dead.stdout.split()
    (project / "nets" / "tiny.py").write_text(NET.replace("Conv2D(4", "Conv2D(8"))

    sweep = subprocess.run(
        [sys.executable, "-m", "towerbench.cli.main", "sweep", "--params", "params.yaml"],
        cwd=project, env=environment, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    said = [line for line in sweep.stderr.splitlines() if "not resuming" in line]
    assert len(said) == 1, sweep.stderr[-3000:]
    net = project / "nets" / "tiny.py"
    assert f"not resuming interrupted sweep {old_parent}: model file {net}:build changed" in said[0]

    client = MlflowClient(f"sqlite:///{project / 'mlflow.db'}")
    experiments = [experiment.experiment_id for experiment in client.search_experiments()]
    runs = {run.info.run_id: run for run in client.search_runs(experiments)}
    assert [run.info.status for run in runs.values()].count("RUNNING") == 0
    new_parent = sweep.stdout.split("MLflow parent run: ")[1].split()[0]
    for old in (old_parent, old_child):
        assert runs[old].info.status == "KILLED"
        assert runs[old].data.tags["towerbench.replaced_by"] == new_parent
    assert runs[new_parent].info.status == "FINISHED"
