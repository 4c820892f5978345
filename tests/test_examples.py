"""The Python examples as a user runs them: each script from its own folder, the notebook in a
real Jupyter kernel; each ends with a verdict per configuration and a report."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _verdict_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("Verdict for towers=2")]


@pytest.mark.slow
@pytest.mark.parametrize("script", ["tabular.py", "sequences.py"])
def test_example_script_sweeps_and_prints_its_verdict(tmp_path, script):
    shutil.copy(EXAMPLES / script, tmp_path / script)
    done = subprocess.run(
        [sys.executable, script], cwd=tmp_path, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("completed") == 4, done.stdout
    (verdict,) = _verdict_lines(done.stdout)
    assert "pp" in verdict or "diverged" in verdict
    report = done.stdout.strip().splitlines()[-1].removeprefix("Report: ")
    assert Path(report).is_file()
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_the_notebook_runs_in_a_jupyter_kernel(tmp_path):
    notebook = nbformat.read(EXAMPLES / "notebook.ipynb", as_version=4)
    NotebookClient(
        notebook, timeout=900, kernel_name="python3", resources={"metadata": {"path": tmp_path}}
    ).execute()
    table, verdicts = notebook.cells[3].outputs, notebook.cells[4].outputs
    (result,) = [output for output in table if output.output_type == "execute_result"]
    shown = result["data"]["text/plain"]
    assert shown.count("completed") == 4, shown
    printed = "".join(output.get("text", "") for output in verdicts)
    assert len(_verdict_lines(printed)) == 1 and "Report:" in printed
    outputs = [output for cell in notebook.cells for output in cell.get("outputs", [])]
    assert not [output for output in outputs if output.output_type == "error"]
    streams = "".join(output.get("text", "") for output in outputs)
    assert "cuda" not in streams.lower()  # no TensorFlow C++ logging in the cells' output
    # The sweep's cell: a widget bar per configuration, a line as each ends, its results; no
    # Prefect or MLflow log line, no text-bar fragment, no un-awaited coroutine.
    bars = [
        output
        for output in table
        if "application/vnd.jupyter.widget-view+json" in output.get("data", {})
    ]
    said = "".join(output.get("text", "") for output in table)
    assert len(bars) == 4 and said.count(" completed: test accuracy ") == 4, said
    for noise in ("| INFO", " INFO mlflow", "\r", "RuntimeWarning"):
        assert noise not in streams, streams
