"""A command that trains, logs artifacts or runs until stopped, killed outright: the temporary
files it and its children made (MLflow writes each logged dict through a `TemporaryDirectory`,
multiprocessing its `pymp-*` folder) go with it, from one `towerbench-<command>-*` folder that a
watchdog removes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import fixtures_model
import pytest
from test_advise import PARAMS

from towerbench.cli.main import SCRATCH_FOLDER_COMMANDS

pytestmark = pytest.mark.slow  # starts each command

ROOT = Path(__file__).resolve().parents[1]
ARGUMENTS = {
    "sweep": ["--params", "params.yaml"],
    "pipeline": ["--params", "params.yaml"],
    "advise": ["--params", "params.yaml", "--towers", "2"],
    "serve": ["--params", "params.yaml"],
    "worker": ["--pool", "scratch-test", "--project", "."],
}
APPEARS_WITHIN_SECONDS = 60  # the folder is made once the options are parsed
REMOVED_WITHIN_SECONDS = 15  # the watchdog sees its pipe close at once; no group to end here


def _scratch_folder(temporary: Path, command: str, process: subprocess.Popen) -> Path:
    deadline = time.monotonic() + APPEARS_WITHIN_SECONDS
    while time.monotonic() < deadline and process.poll() is None:
        made = list(temporary.glob(f"towerbench-{command}-*"))
        if made:
            return made[0]
        # Killed the moment it appears: a folder made before its watchdog knew of it stayed
        # behind 8 times in 20 this way (worker, 2026-12-07).
        time.sleep(0.001)
    raise AssertionError(f"no towerbench-{command}-* folder in TMPDIR: {os.listdir(temporary)}")


@pytest.mark.parametrize("command", SCRATCH_FOLDER_COMMANDS)
def test_a_killed_commands_temporary_files_go_with_it(
    command: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    assert set(ARGUMENTS) == set(SCRATCH_FOLDER_COMMANDS)
    project = tmp_path / "project"
    project.mkdir()
    fixtures_model.write_digits_project(project, PARAMS, train=480, test=120)
    (project / ".dvc").mkdir()  # what `pipeline` checks before it starts
    shutil.copy(ROOT / "dvc.yaml", project)
    # Short: a fork server's socket would live in it (AF_UNIX paths hold 107 bytes).
    temporary = Path(tempfile.mkdtemp(prefix="tb-", dir="/tmp"))
    request.addfinalizer(lambda: shutil.rmtree(temporary, ignore_errors=True))
    argv = [sys.executable, "-m", "towerbench.cli.main", command, *ARGUMENTS[command]]
    environment = dict(os.environ, PYTHONPATH=str(ROOT), TMPDIR=str(temporary))
    process = subprocess.Popen(
        argv, cwd=project, env=environment, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        folder = _scratch_folder(temporary, command, process)
        # What MLflow's log_dict leaves when the command dies inside it.
        left = Path(tempfile.mkdtemp(dir=folder))
        (left / "probe.json").write_text("{}")
    finally:
        process.kill()
        process.wait()
    deadline = time.monotonic() + REMOVED_WITHIN_SECONDS
    while list(temporary.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert list(temporary.iterdir()) == []
