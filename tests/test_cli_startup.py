"""A quick no: help and bad input are answered before TensorFlow, Prefect or MLflow is imported.

Checked by what a fresh interpreter has imported when the command returns, not by the clock
(no timed unit tests): those three imports are what made a bad option take 8-12 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("tensorflow", "prefect", "mlflow")

# Runs the CLI in-process and reports its status and which heavy packages it imported.
PROBE = f"""
import json, sys
from towerbench.cli.main import main
try:
    status = main(sys.argv[2:])
except SystemExit as exit:
    status = exit.code
heavy = [name for name in {HEAVY!r} if name in sys.modules]
with open(sys.argv[1], "w") as report:
    json.dump({{"status": status, "heavy": heavy}}, report)
"""


def probe(tmp_path: Path, *argv: str) -> tuple[dict, subprocess.CompletedProcess]:
    report = tmp_path / "probe.json"
    environment = dict(os.environ, PYTHONPATH=str(ROOT))
    completed = subprocess.run(
        [sys.executable, "-c", PROBE, str(report), *argv],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(report.read_text()), completed


@pytest.mark.parametrize("argv", [["--help"], ["train", "--help"], ["sweep", "--help"]])
@pytest.mark.slow
def test_help_imports_none_of_the_heavy_packages(tmp_path: Path, argv: list[str]) -> None:
    outcome, completed = probe(tmp_path, *argv)
    assert outcome == {"status": 0, "heavy": []}
    assert "usage: towerbench" in completed.stdout
    assert completed.stderr == ""  # no CUDA-stub lines, no warnings


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["train", "--towers", "0"], "towerbench train: error: --towers: "),
        (["gradcheck", "--model", "vgg"], "towerbench gradcheck: error: --model: "),
        (["sweep", "--towers", "1,x", "--json"], "towerbench sweep: error: --towers[1]: "),
        (["train", "--params", "absent.yaml"], "towerbench train: error: absent.yaml: no such"),
        (["advise", "--towers", "1"], "towerbench advise: error: --towers: "),
        (["advise", "--towers", "4", "--seeds", "0"], "towerbench advise: error: --seeds: "),
        (["advise", "--towers", "3", "--params", "bad.yaml"], "towerbench advise: error: bad.yaml"),
        (["advise", "--towers", "2", "--dataset", "absent"], "towerbench advise: error: --dataset"),
        (["pipeline", "--params", "bad.yaml"], "towerbench pipeline: error: bad.yaml: train.epo"),
        (
            ["report", "--sweep", "x", "--params", "bad.yaml"],
            "towerbench report: error: bad.yaml: train.epochs: ",
        ),
    ],
)
@pytest.mark.slow
def test_bad_input_is_one_line_before_the_heavy_imports(
    tmp_path: Path, argv: list[str], message: str
) -> None:
    (tmp_path / "bad.yaml").write_text("train:\n  epochs: -1\n")
    outcome, completed = probe(tmp_path, *argv)
    assert outcome == {"status": 2, "heavy": []}
    assert completed.stderr.startswith(message) and completed.stderr.count("\n") == 1
    said = completed.stderr.strip().split(": error: ", 1)[1]
    # Under --json, stdout is the error document; else nothing.
    expected = json.dumps({"error": said, "status": 2}) + "\n" if "--json" in argv else ""
    assert completed.stdout == expected
