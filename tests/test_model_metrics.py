"""train.metric (issue 61 item 2): each metric against values computed by hand, the
evaluation of a regression and a multi-label run by their own metric (MAE, binary accuracy) from
`towerbench train`, and a regression sweep and advise judged, reported and summed up in MAE."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from towerbench.cli.main import main
from towerbench.ingest.arrays import save_arrays
from towerbench.model.metric_values import auc, binary_accuracy, mae, rmse

LABELS = np.array([[1.0, 0.0], [0.0, 1.0]], np.float32)
OUTPUTS = np.array([[0.9, 0.4], [0.1, 0.4]], np.float32)


def test_each_metric_matches_its_definition_by_hand():
    # logit > 0 against label > 0.5: (1, 0)->(T, T): right, wrong; (0, 1)->(T, T): wrong, right
    assert binary_accuracy(LABELS, OUTPUTS) == pytest.approx(2 / 4)
    # positives score 0.9, 0.4; negatives 0.4, 0.1: 0.9 beats both, 0.4 beats 0.1, ties 0.4
    assert auc(LABELS, OUTPUTS) == pytest.approx((2 + 1 + 0.5) / 4)
    errors = [0.1, 0.4, 0.1, 0.6]
    assert mae(LABELS, OUTPUTS) == pytest.approx(sum(errors) / 4)
    assert rmse(LABELS, OUTPUTS) == pytest.approx((sum(e * e for e in errors) / 4) ** 0.5)
    assert np.isnan(auc(np.ones((2, 1)), OUTPUTS[:, :1]))  # one side only: undefined


MODEL = """
import keras

def build(input_shape, width):
    inputs = keras.Input(shape=input_shape)
    x = keras.layers.Dense(16, activation="tanh")(inputs)
    return keras.Model(inputs, keras.layers.Dense(width)(x))
"""


def _task_arrays(kind: str):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((300, 6)).astype(np.float32)
    if kind == "regression":  # two targets, linear in the features
        y = x @ rng.standard_normal((6, 2)).astype(np.float32)
    else:  # three tags, each on when its feature is positive
        y = (x[:, :3] > 0).astype(np.int64)
    return (x[:240], y[:240]), (x[240:], y[240:])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "loss", "metric", "label", "judged"),
    [
        ("regression", "mse", "auto", "MAE", "mae"),
        ("regression", "huber", "rmse", "RMSE", "rmse"),
        ("tags", "binary_crossentropy", "auto", "binary accuracy", "binary_accuracy"),
    ],
)
def test_train_reports_a_task_by_its_own_metric(
    tmp_path, capfd, monkeypatch, kind, loss, metric, label, judged
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "net.py").write_text(textwrap.dedent(MODEL))
    save_arrays(*_task_arrays(kind), tmp_path / "data", "task")
    assert main(["fetch", "arrays", "--url", "data/arrays/task.npz", "--name", "task"]) == 0
    assert main(["preprocess", "task"]) == 0
    capfd.readouterr()
    command = ["train", "--dataset", "task", "--model", "net.py:build", "--loss", loss]
    command += ["--metric", metric, "--towers", "2", "--global-batch", "32", "--epochs", "5"]
    command += ["--base-lr", "0.5", "--json"]
    status = main(command)
    captured = capfd.readouterr()
    assert status == 0, captured.err[-3000:]
    result = json.loads(captured.out.strip().splitlines()[-1])
    assert result["metric"] == judged and "test_accuracy" not in result
    assert np.isfinite(result["test_metric"]) and result["test_examples"] == 60
    assert f"completed: test {label} {result['test_metric']:.4f}" in captured.out + captured.err
    if judged in ("mae", "rmse"):  # learnt something: below predicting 0 for every target
        (_, _), (_, y_test) = _task_arrays(kind)
        zero = np.mean(np.abs(y_test)) if judged == "mae" else np.sqrt(np.mean(y_test**2))
        assert result["test_metric"] < zero
    else:
        assert result["test_metric"] > 0.8  # all-zero logits score about 0.5


OWN_SQUARED_ERROR = """
import keras


def squared(y_true, y_pred):
    return keras.ops.mean(keras.ops.square(y_pred - y_true), axis=-1)
"""


def _towerbench(argv: list[str], folder: Path) -> subprocess.CompletedProcess:
    """A command that orchestrates with Prefect, run as a user runs it: in a process of its
    own, whose temporary Prefect server ends with it."""
    done = subprocess.run(
        [sys.executable, "-m", "towerbench.cli.main", *argv],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _regression_project(folder, monkeypatch) -> None:
    """The regression arrays preprocessed as dataset `task`, and net.py, in `folder` (the cwd)."""
    monkeypatch.chdir(folder)
    (folder / "net.py").write_text(textwrap.dedent(MODEL))
    save_arrays(*_task_arrays("regression"), folder / "data", "task")
    assert main(["fetch", "arrays", "--url", "data/arrays/task.npz", "--name", "task"]) == 0
    assert main(["preprocess", "task"]) == 0


@pytest.mark.slow
def test_a_regression_sweep_is_judged_in_mae_and_its_report_never_says_accuracy(
    tmp_path, monkeypatch
):
    _regression_project(tmp_path, monkeypatch)
    (tmp_path / "own.py").write_text(OWN_SQUARED_ERROR)  # on label rows, as mse
    done = _towerbench(
        ["sweep", "--dataset", "task", "--model", "net.py:build", "--loss", "own.py:squared"]
        + ["--metric", "mae"]
        + ["--towers", "1,2", "--seeds", "0,1", "--epochs", "3", "--global-batch", "32"]
        + ["--base-lr", "0.5", "--json"],
        tmp_path,
    )
    result = json.loads(done.stdout)
    assert {config["metric"] for config in result["configs"]} == {"mae"}
    assert all(config["test_accuracy"] is None for config in result["configs"])
    (_, _), (_, y_test) = _task_arrays("regression")
    assert all(config["test_metric"] < np.mean(np.abs(y_test)) for config in result["configs"])
    two_towers = next(text for group, text in result["verdicts"].items() if "towers=2" in group)
    # Held against +margin (an error is worse above it), 1% of 1 tower's MAE by default.
    assert re.search(r"Δ [−+][\d.e+-]+, 95% CI \[[−+][\d.e+-]+, [−+][\d.e+-]+\]", two_towers)
    assert re.search(r"(straddles|lies below|lies above) \+0\.\d+", two_towers), two_towers
    # 2 towers at the same global batch are the 1-tower run's batch: the same MAE per seed.
    by_seed = {}
    for config in result["configs"]:
        by_seed.setdefault(config["seed"], []).append(config["test_metric"])
    assert all(abs(one - two) < 1e-4 for one, two in by_seed.values()), by_seed
    report = (tmp_path / result["report"]).read_text()
    assert "accuracy" not in report.lower()
    assert "## MAE" in report and "| test MAE |" in report
    # The 2-tower runs' gradcheck took your loss on the dataset's label rows, and agreed.
    client = MlflowClient()  # the store the sweep used (MLFLOW_TRACKING_URI)
    for config in result["configs"]:
        if config["towers"] == 2:
            path = client.download_artifacts(config["run_id"], "gradcheck.json", str(tmp_path))
            check = json.loads(Path(path).read_text())
            assert check["loss"].endswith("/own.py:squared") and check["passed"], check


@pytest.mark.slow
def test_advise_verifies_a_regression_recipe_in_mae(tmp_path, monkeypatch):
    _regression_project(tmp_path, monkeypatch)
    (tmp_path / "params.yaml").write_text(
        "train: {dataset: task, model: net.py:build, loss: mse, epochs: 3, global_batch: 32, "
        "base_lr: 0.1}\n"
    )
    command = ["advise", "--params", "params.yaml", "--towers", "2", "--seeds", "2"]
    done = _towerbench([*command, "--probe-steps", "40", "--json"], tmp_path)
    verification = json.loads(done.stdout)["verification"]
    assert verification["metric"] == "mae" and verification["difference_pp"] is None
    assert verification["ci_low"] <= verification["difference"] <= verification["ci_high"]
    assert "the 1-tower MAE: Δ " in verification["verdict"] or verification["verdict"].startswith(
        "inconclusive: Δ "
    )
    assert "accuracy" not in verification["verdict"]
    assert "accuracy" not in (tmp_path / verification["report"]).read_text().lower()
