"""The Python examples as a user runs them: each script from its own folder, the notebook in a
real Jupyter kernel; each ends with a verdict per configuration and a report.

The scripts and the notebook run untraced by `make test`'s coverage: they are no part of the
package, whose code they call is measured by tests/test_python_api.py, and a tracer made each
~20% slower (tabular.py alone: 68 s traced, 56 s not)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from fixtures_servers import COVERAGE_VARIABLES, untraced
from fixtures_user import QUIET_BREACHES, user_environment
from nbclient import NotebookClient

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _verdict_lines(text: str) -> list[str]:
    """The k-tower configuration's verdict (its seeds together)."""
    return [line for line in text.splitlines() if re.match(r"towers=[2-9] [^:]*warmup=\S+: ", line)]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("script", "metric", "units"),
    [
        ("tabular.py", "accuracy", " pp"),
        ("sequences.py", "accuracy", " pp"),
        ("regression.py", "MAE", ""),  # lower is better, in the targets' units
        ("multilabel.py", "binary accuracy", " pp"),
        ("retrieval.py", "recall@10", " pp"),  # in-batch negatives, 1 against 4 towers
    ],
)
def test_example_script_sweeps_and_prints_its_verdict(tmp_path, script, metric, units):
    shutil.copy(EXAMPLES / script, tmp_path / script)
    env = untraced(user_environment())
    done = subprocess.run(
        [sys.executable, script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count(f" completed: test {metric} ") == 4, done.stdout  # as each ends
    (verdict,) = _verdict_lines(done.stdout)
    assert re.search(rf"Δ [−+][\d.e-]+{units}, 95% CI \[", verdict) or "diverged" in verdict
    report = Path(done.stdout.strip().splitlines()[-1].removeprefix("Report: "))
    assert f"| test {metric} |" in report.read_text()
    if script == "retrieval.py":  # 4 local towers scored 32 of the batch's 128 candidates each
        assert "cross_tower gather scores all 128" in verdict
        assert "32 candidates, ln 32 = 3.47" in report.read_text()
    if metric == "MAE":  # a regression's output and report never say accuracy
        assert "accuracy" not in (done.stdout + report.read_text()).lower()
    assert not QUIET_BREACHES.search(done.stderr), done.stderr  # a warning may stay


@pytest.mark.slow
def test_the_notebook_runs_in_a_jupyter_kernel(tmp_path, monkeypatch):
    for name in COVERAGE_VARIABLES:  # the kernel starts with this environment, untraced
        monkeypatch.delenv(name, raising=False)
    notebook = nbformat.read(EXAMPLES / "notebook.ipynb", as_version=4)
    NotebookClient(
        notebook, timeout=900, kernel_name="python3", resources={"metadata": {"path": tmp_path}}
    ).execute()
    table = notebook.cells[3].outputs
    (result,) = [output for output in table if output.output_type == "execute_result"]
    shown = result["data"]["text/plain"]
    assert shown.count("completed") == 4, shown
    outputs = [output for cell in notebook.cells for output in cell.get("outputs", [])]
    assert not [output for output in outputs if output.output_type == "error"]
    streams = "".join(output.get("text", "") for output in outputs)
    assert "cuda" not in streams.lower()  # no TensorFlow C++ logging in the cells' output
    # The sweep's cell: a widget bar per run, a line as each ends, its results and verdicts, all
    # on stdout; no Prefect or MLflow log line, no text-bar fragment, no un-awaited coroutine.
    widget = "application/vnd.jupyter.widget-view+json"
    bars = [output for output in table if widget in output.get("data", {})]
    said = [output for output in table if output.output_type == "stream"]
    assert {output.name for output in said} == {"stdout"}, said
    text = "".join(output.text for output in said)
    assert len(bars) == 4 and text.count(" completed: test accuracy ") == 4, text
    assert len(_verdict_lines(text)) == 1, text
    assert text.splitlines()[-1].startswith("Report: "), text
    for noise in ("| INFO", " INFO mlflow", "\r", "RuntimeWarning"):
        assert noise not in streams, streams


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_own_fit_takes_the_recipe_home_and_reaches_what_the_trainer_reached(tmp_path):
    """examples/own_fit.py's `main` as a user calls it: advise, the verification sweep in the
    trainer, and the recipe through the user's own fit on 4 replicas, each side over 2 seeds
    (the script's 3 are docs/findings.md's). Its own fits under a tracer took over 10 minutes
    of the suite's 35."""
    shutil.copy(EXAMPLES / "own_fit.py", tmp_path / "own_fit.py")
    done = subprocess.run(
        [sys.executable, "-c", "import own_fit; own_fit.main(seeds=[0, 1])"],
        cwd=tmp_path,
        env=untraced(user_environment()),
        capture_output=True,
        text=True,
        timeout=850,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(list((tmp_path / "reports").glob("advise-*.yaml"))) == 1
    means = {
        match[1]: float(match[2])
        for match in re.finditer(r"^(.+?):\s+test accuracy (\d\.\d+) \(95% CI ", done.stdout, re.M)
    }
    trainer, own = (
        means["4 towers, the recipe, towerbench's trainer"],
        means["4 replicas, the recipe, your own fit"],
    )
    assert trainer > 0.9 and abs(own - trainer) < 0.02, done.stdout  # chance is 0.1
    assert not QUIET_BREACHES.search(done.stderr), done.stderr
