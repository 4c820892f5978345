"""The fork server behind every configuration's training process: a forked process reports its
failure like a started one (exit status, its stderr as the log, end of its events), the server
ends when the process that started it dies, however it dies, and the parent's main script is not
run again in the forked process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from towerbench.config.sections import TrainConfig
from towerbench.tasks.training.fork_server import TrainingProcess
from towerbench.tasks.training.worker import WorkerRequest

pytestmark = pytest.mark.slow  # starts processes that import TensorFlow

ROOT = Path(__file__).resolve().parents[1]


def _fork_servers(parent: psutil.Process) -> list[psutil.Process]:
    return [
        child
        for child in parent.children()
        if "multiprocessing.forkserver" in " ".join(child.cmdline())
    ]


def test_a_forked_process_fails_like_a_started_one(tmp_path: Path) -> None:
    request = WorkerRequest(
        config=TrainConfig(dataset="tiny"),
        data_dir=tmp_path,
        tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}",
        run_id="0123456789abcdef0123456789abcdef",  # no such run
        data_version="none",
    )
    process = TrainingProcess(request.model_dump_json(), dict(os.environ))
    [server] = _fork_servers(psutil.Process())
    assert psutil.Process(process.pid).ppid() == server.pid
    try:
        events = process.stdout.read()  # ends when the process does
        assert process.wait(timeout=120) == 1
        process.log.seek(0)
        log = process.log.read()
    finally:
        process.close()
    assert events == ""  # no result event
    assert log.strip().splitlines()[-1].startswith("error: MlflowException:"), log[-2000:]
    assert "0123456789abcdef0123456789abcdef" in log


def test_a_script_without_a_main_guard_runs_once_and_its_server_ends_when_it_is_killed(
    tmp_path: Path,
) -> None:
    """multiprocessing would run the script again in the forked process; it must not."""
    script = tmp_path / "unguarded.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, sys, time
            print("script ran", flush=True)
            from towerbench.tasks.training.fork_server import TrainingProcess
            process = TrainingProcess("not a request", dict(os.environ))
            print("exit", process.wait(timeout=120), flush=True)
            time.sleep(600)
            """
        )
    )
    owner = subprocess.Popen(
        [sys.executable, str(script)],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        lines = [owner.stdout.readline().strip() for _ in range(2)]
        assert lines == ["script ran", "exit 1"]  # the request did not parse
        [server] = _fork_servers(psutil.Process(owner.pid))
        owner.send_signal(signal.SIGKILL)
        owner.wait(timeout=30)
        # At once: without tasks/training/fork_server_exit.py it spent 2 s or more
        # (machine-dependent) tearing down TensorFlow and MLflow after its owner had gone.
        deadline = time.monotonic() + 1
        while not _ended(server) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _ended(server), "the fork server outlived its owner by over a second"
        assert owner.stdout.read() == ""  # nothing ran the script again
    finally:
        owner.kill()
        owner.wait()


def _ended(process: psutil.Process) -> bool:
    """Exited: gone, or a zombie until whoever inherited it reaps it."""
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
