"""`--json`: stdout carries one JSON document and nothing else, whatever the command, Prefect,
MLflow or the processes it starts print. Captured at the file-descriptor level (a subprocess, or
capfd), so the output of child processes counts too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import fixtures_model
import pytest

from towerbench.cli.console import as_json
from towerbench.cli.main import main

ROOT = Path(__file__).resolve().parents[1]

# Paths relative to the file's folder; the commands run from elsewhere.
PARAMS = """\
data: {data_dir: data}
train: {dataset: digits, epochs: 1, global_batch: 32, reference_batch: 32}
sweep: {towers: [2], lr_scaling: [none], seeds: [0], per_tower_batch: 16}
tracking: {tracking_uri: "sqlite:///mlflow.db"}
report: {report_dir: reports}
"""


@pytest.fixture(scope="module")
def params_file(tmp_path_factory) -> Path:
    project = tmp_path_factory.mktemp("project")
    return fixtures_model.write_digits_project(project, PARAMS, train=128, test=64)


@pytest.mark.slow
def test_train_json_is_the_whole_of_stdout(params_file: Path, tmp_path: Path, capfd, monkeypatch):
    monkeypatch.chdir(tmp_path)
    status = main(["train", "--params", str(params_file), "--towers", "2", "--json"])
    captured = capfd.readouterr()
    assert status == 0, captured.err[-3000:]
    document = json.loads(captured.out)
    assert document["config"]["towers"] == 2 and document["config"]["epochs"] == 1
    assert "configuration: " in captured.err and "epoch   1.00" in captured.err


@pytest.mark.slow
def test_gradcheck_json_is_the_whole_of_stdout(params_file: Path, capfd) -> None:
    status = main(["gradcheck", "--params", str(params_file), "--towers", "2", "--json"])
    captured = capfd.readouterr()
    assert status == 0, captured.err[-3000:]
    document = json.loads(captured.out)
    assert (document["towers"], document["global_batch"]) == (2, 32)  # the batch from the file
    assert "sum_vs_mean" in captured.err


def test_json_document_is_strict() -> None:
    assert as_json({"loss": float("nan"), "curve": [1.0, float("inf")]}) == (
        '{"loss": null, "curve": [1.0, null]}'
    )


CONSOLE = "towerbench.cli.console"


@pytest.mark.slow
def test_tensorflow_start_up_lines_appear_at_most_once() -> None:
    completed = subprocess.run(
        [
            sys.executable,
            "-c",
            "from towerbench.core.native_logs import import_tensorflow; import_tensorflow()",
        ],
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert completed.stderr.count("Could not find cuda drivers") <= 1, completed.stderr
    assert completed.stderr.count("before absl::InitializeLog") <= 1, completed.stderr


def test_json_on_failure_is_one_error_document(tmp_path: Path, capfd) -> None:
    """A refused command still gives a script something to parse: `{"error": ..., "status": ...}`
    on stdout, the same line on stderr."""
    status = main(["train", "--params", str(tmp_path / "missing.yaml"), "--json"])
    captured = capfd.readouterr()
    document = json.loads(captured.out)
    assert status == 2 and set(document) == {"error", "status"} and document["status"] == 2
    assert "missing.yaml" in document["error"]
    assert captured.err.strip() == f"towerbench train: error: {document['error']}"
