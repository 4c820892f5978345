"""Sweeps that survive: killed (SIGKILL) or interrupted (Ctrl-C) in the middle, the same command
resumes: finished configurations are reused, the interrupted one continues, nothing is left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from mlflow.tracking import MlflowClient
from test_flows_sweep import TINY_TRAINING, write_tiny_digits

pytestmark = pytest.mark.slow  # trains, or starts servers or processes

ROOT = Path(__file__).resolve().parents[1]
CONFIGURATIONS = 2  # 2 towers x seeds 0, 1
EPOCHS = 4  # each stop comes right after an epoch's line, with epochs still to go


def _sweep_command(root: Path) -> list[str]:
    training = [
        f"--{key.replace('_', '-')}={'none' if value is None else value}"
        for key, value in {**TINY_TRAINING, "epochs": EPOCHS}.items()
    ]
    return [
        sys.executable,
        "-m",
        "towerbench.cli.main",
        "sweep",
        "--towers=2",
        "--seeds=0,1",
        "--lr-scaling=linear",
        "--warmup-epochs=0",
        "--per-tower-batch=32",
        *training,
        f"--data-dir={root / 'data'}",
        f"--tracking-uri=sqlite:///{root / 'mlflow.db'}",
        f"--report-dir={root / 'reports'}",
    ]


def _children(client: MlflowClient) -> list:
    experiments = client.search_experiments()
    if not experiments:
        return []
    return client.search_runs(
        [e.experiment_id for e in experiments],
        filter_string="tags.`towerbench.kind` = 'config'",
        order_by=["attributes.start_time ASC"],
    )


def _start_and_stop_during(root: Path, configuration: int, stop) -> tuple[list, int | None]:
    """Start the sweep, stop it with `stop(process)` once configuration number `configuration`
    (seed configuration - 1) has logged an epoch; returns the earlier finished run ids and the
    exit status. Its stderr is read as it comes (a full pipe would stall the sweep)."""
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    process = subprocess.Popen(
        _sweep_command(root), cwd=ROOT, start_new_session=True, stderr=subprocess.PIPE, text=True
    )
    lines: list[str] = []
    training = threading.Event()

    def read_stderr() -> None:
        for line in process.stderr:
            lines.append(line)
            if f"seed={configuration - 1} epoch " in line:
                training.set()

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    while not training.wait(0.2):
        assert process.poll() is None, "".join(lines)[-3000:]
    assert process.poll() is None, "".join(lines)[-3000:]
    finished = [run.info.run_id for run in _children(client)[: configuration - 1]]
    descendants = psutil.Process(process.pid).children(recursive=True)
    assert len(descendants) >= 2  # the temporary Prefect server and a training process
    stopped_at = time.monotonic()
    stop(process)
    try:
        status = process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        status = None
    elapsed = time.monotonic() - stopped_at
    _, alive = psutil.wait_procs(descendants, timeout=15)
    assert not alive, f"still running after the sweep ended: {[p.cmdline() for p in alive]}"
    reader.join(timeout=10)
    return finished, (status, elapsed, "".join(lines))


def _resume_and_check(root: Path, finished: list[str]) -> None:
    result = subprocess.run(
        _sweep_command(root), cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    experiment_ids = [e.experiment_id for e in client.search_experiments()]
    parents = client.search_runs(experiment_ids, "tags.`towerbench.kind` = 'sweep'")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    children = _children(client)
    assert len(children) == CONFIGURATIONS
    assert {run.data.tags["towerbench.status"] for run in children} == {"completed"}
    assert {run.info.status for run in children} == {"FINISHED"}
    assert [run.info.run_id for run in children[: len(finished)]] == finished  # reused
    report = root / "reports" / parents[0].info.run_id / "report.md"
    assert report.is_file() and report.read_text().count("seed=") >= CONFIGURATIONS
    assert "resuming sweep" in result.stderr + result.stdout
    assert not list((root / "data" / "checkpoints").glob("*/checkpoint"))  # cleaned up


@pytest.fixture
def project(tmp_path: Path) -> Path:
    write_tiny_digits(tmp_path / "data")
    return tmp_path


def test_ctrl_c_then_a_kill_and_the_same_command_finishes_the_sweep_once(project):
    """One sweep stopped twice: Ctrl-C in its second configuration, then SIGKILL in the same
    configuration resumed from its checkpoint; the third attempt finishes it under the same
    parent, with the first configuration's run reused each time."""
    client = MlflowClient(f"sqlite:///{project / 'mlflow.db'}")
    first_done, (status, elapsed, stderr) = _start_and_stop_during(
        project, 2, lambda p: os.killpg(p.pid, signal.SIGINT)
    )
    # Within 1 s on an idle machine; the interpreter's teardown alone took 6-8 s before the
    # command skipped it (cli/main.py).
    assert status == 130 and elapsed < 5, stderr[-2000:]
    last = stderr.strip().splitlines()[-1]
    assert last == "towerbench sweep: interrupted; run the same command again to resume"
    every_run = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert {run.info.status for run in every_run} <= {"FINISHED", "KILLED"}

    done, (status, _, _) = _start_and_stop_during(project, 2, lambda p: p.kill())
    assert status == -signal.SIGKILL and done == first_done and len(done) == 1
    interrupted = _children(client)[1]
    assert interrupted.info.status == "KILLED"  # marked by its worker, not left RUNNING
    assert "resume" in interrupted.data.tags["towerbench.error"]
    _resume_and_check(project, done)
