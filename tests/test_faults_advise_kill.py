"""`towerbench advise` killed during its probe (issue 40): every process it started ends with it
(the probe's, the fork server, multiprocessing's resource tracker, Prefect's temporary server),
nothing is left in the temporary folder, and the next run closes the run it left RUNNING. Killed
again during its verification (issue 64), the same command reuses that run's finished probe and
its recipe file, and resumes the verification."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import fixtures_model
import psutil
import pytest
from mlflow.tracking import MlflowClient
from test_advise import PARAMS

pytestmark = pytest.mark.slow  # starts the command, which trains

ROOT = Path(__file__).resolve().parents[1]
# The forked processes look for their server once a second; Prefect's server, sent SIGTERM by the
# kernel as its parent dies (PR_SET_PDEATHSIG), shuts its services down first: over 5 s once in a
# full 2-worker suite (2026-12-04), within 5 s alone.
ENDED_WITHIN_SECONDS = 15


def _advise(project: Path, temporary: Path) -> tuple[list[str], dict[str, str]]:
    """`towerbench advise` of the project, short, with TMPDIR `temporary`: (argv, environment)."""
    command = [sys.executable, "-m", "towerbench.cli.main", "advise", "--towers", "2"]
    command += ["--params", "params.yaml", "--seeds", "1", "--probe-steps", "40", "--json"]
    return command, dict(os.environ, PYTHONPATH=str(ROOT), TMPDIR=str(temporary))


def _forked(process: psutil.Process) -> bool:
    """Whether `process` runs the fork server's code: the server, or a process forked from it
    (not what its preload runs, such as GitPython's `git version`)."""
    try:
        return "multiprocessing.forkserver" in " ".join(process.cmdline())
    except psutil.Error:  # ended meanwhile (a zombie until reaped)
        return False


def _probe_started(command: psutil.Process) -> bool:
    """A process forked from the command's fork server: the probe."""
    for server in filter(_forked, command.children()):
        try:
            if any(_forked(child) for child in server.children()):
                return True
        except psutil.Error:
            continue
    return False


def _ended(process: psutil.Process) -> bool:
    """Exited: gone, or a zombie until whoever inherited it reaps it."""
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _recipe_written(project: Path) -> Callable[[psutil.Process], bool]:
    """Whether advise has written its recipe file (its probe finished; its verification next)."""
    return lambda command: any((project / "reports").glob("advise-*.yaml"))


def _kill_once(
    project: Path, temporary: Path, ready: Callable[[psutil.Process], bool]
) -> list[psutil.Process]:
    """SIGKILL the command once `ready(it)`; what it had started."""
    argv, environment = _advise(project, temporary)
    log = project / "advise.log"
    with open(log, "w") as stderr:
        command = subprocess.Popen(
            argv, cwd=project, env=environment, stdout=subprocess.DEVNULL, stderr=stderr
        )
    try:
        deadline = time.monotonic() + 300
        while not ready(psutil.Process(command.pid)):
            running = command.poll() is None and time.monotonic() < deadline
            assert running, f"not ready to be killed: {log.read_text()[-3000:]}"
            time.sleep(0.1)
        started = psutil.Process(command.pid).children(recursive=True)
        command.send_signal(signal.SIGKILL)
    finally:
        command.kill()
        command.wait()
    return started


def test_advise_killed_during_its_probe_leaves_nothing_and_its_run_is_closed_next_time(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    fixtures_model.write_digits_project(project, PARAMS, train=480, test=120)
    # Short: the fork server's socket lives in it (AF_UNIX paths hold 107 bytes).
    temporary = Path(tempfile.mkdtemp(prefix="tb-", dir="/tmp"))
    request.addfinalizer(lambda: shutil.rmtree(temporary, ignore_errors=True))

    started = _kill_once(project, temporary, _probe_started)
    assert len(started) >= 4  # watchdog, resource tracker, fork server, probe, Prefect's server
    deadline = time.monotonic() + ENDED_WITHIN_SECONDS
    while not all(_ended(process) for process in started) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [process.cmdline()[:4] for process in started if not _ended(process)]
    assert not left, f"outlived the killed command: {left}"
    assert list(temporary.iterdir()) == []  # no pymp-* folder, nothing else
    client = MlflowClient(f"sqlite:///{project / 'mlflow.db'}")
    experiments = [experiment.experiment_id for experiment in client.search_experiments()]
    [killed] = client.search_runs(experiments, "tags.`towerbench.kind` = 'advise'")
    assert killed.info.status == "RUNNING"  # its process could not close it

    # Again, killed once its probe finished and its recipe file is written: during its
    # verification sweep.
    _kill_once(project, temporary, _recipe_written(project))
    advise_runs = client.search_runs(experiments, "tags.`towerbench.kind` = 'advise'")
    [probed] = [run for run in advise_runs if run.info.run_id != killed.info.run_id]
    kept_probe = json.loads(
        Path(client.download_artifacts(probed.info.run_id, "probe.json", str(tmp_path))).read_text()
    )

    argv, environment = _advise(project, temporary)
    rerun = subprocess.run(
        argv, cwd=project, env=environment, capture_output=True, text=True, timeout=600
    )
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"resuming advise run {probed.info.run_id}: its probe" in rerun.stderr
    advice = json.loads(rerun.stdout)
    assert advice["advise_run_id"] == probed.info.run_id
    assert advice["probe"] == kept_probe  # not probed again: its timings would differ
    assert advice["verification"]["outcome"]  # verified
    recipe_files = sorted(path.name for path in (project / "reports").glob("advise-*.yaml"))
    assert recipe_files == [f"advise-{probed.info.run_id[:8]}.yaml"]
    runs = {run.info.run_id: run for run in client.search_runs(experiments)}
    assert [run.info.status for run in runs.values()].count("RUNNING") == 0
    closed = runs[killed.info.run_id]
    assert closed.info.status == "KILLED"
    assert closed.data.tags["towerbench.replaced_by"] == probed.info.run_id
    assert runs[probed.info.run_id].info.status == "FINISHED"
    assert "towerbench.replaced_by" not in runs[probed.info.run_id].data.tags
    deadline = time.monotonic() + ENDED_WITHIN_SECONDS  # its watchdog empties it as it exits
    while list(temporary.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert list(temporary.iterdir()) == []
