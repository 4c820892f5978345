"""`towerbench ui` killed or hung up (issue 29): the servers it started, the workers they
started and its scratch folder end within 5 s of its death: the next `ui` finds its ports free."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

# An owner like `towerbench ui`: a reaper, a server in its own session that starts a worker of
# its own (as `mlflow ui` starts uvicorn), then it prints their pids and waits to be killed.
OWNER = """
import signal, subprocess, sys, tempfile, time
from towerbench.core.reaper import Reaper
signal.signal(signal.SIGHUP, signal.SIG_DFL)  # as `ui` does, even when launched under nohup
reaper = Reaper()
scratch, kept = tempfile.mkdtemp(), tempfile.mkdtemp()
reaper.remove(scratch)
reaper.remove(kept)
reaper.keep(kept)
server = subprocess.Popen(
    [sys.executable, "-c",
     "import subprocess, sys, time; "
     "w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
     "print(w.pid, flush=True); time.sleep(600)"],
    stdout=subprocess.PIPE, text=True, start_new_session=True,
)
reaper.watch(server)
worker = server.stdout.readline().strip()
print(server.pid, worker, scratch, kept, flush=True)
time.sleep(600)
"""


def _gone(pids: list[int]) -> bool:
    def running(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    return not any(running(pid) for pid in pids)


@pytest.mark.parametrize("death", [signal.SIGKILL, signal.SIGHUP])
@pytest.mark.slow
def test_what_the_owner_started_ends_within_5_s_of_its_death(death) -> None:
    owner = subprocess.Popen([sys.executable, "-c", OWNER], stdout=subprocess.PIPE, text=True)
    server, worker, scratch, kept = owner.stdout.readline().split()
    pids = [int(server), int(worker)]
    assert len(pids) == 2 and not _gone(pids)
    os.kill(owner.pid, death)
    owner.wait()
    deadline = time.monotonic() + 5
    while not _gone(pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _gone(pids), "the server or its worker outlived its owner by 5 s"
    while Path(scratch).exists() and time.monotonic() < deadline + 1:
        time.sleep(0.1)
    assert not Path(scratch).exists() and Path(kept).is_dir()
    Path(kept).rmdir()


def test_a_normal_end_leaves_no_watchdog() -> None:
    from towerbench.core.reaper import Reaper

    reaper = Reaper()
    reaper.close()
    assert reaper.process.returncode == 0


# A long-running command (`serve`, `worker`): what it and its children put in temporary folders.
LONG_RUNNING = """
import subprocess, sys, tempfile, time
from towerbench.core.reaper import temporary_files_of_this_process
folder = temporary_files_of_this_process("towerbench-test-")
run = tempfile.TemporaryDirectory(prefix="prefect-workspace-attempt-")  # Prefect's, per flow run
child = [sys.executable, "-c", "import tempfile; print(tempfile.mkdtemp(prefix='pymp-'))"]
made = subprocess.run(child, capture_output=True, text=True, check=True).stdout.strip()
print(folder, run.name, made, flush=True)
time.sleep(600)
"""


@pytest.mark.slow
def test_a_killed_long_running_commands_temporary_folders_go_with_it() -> None:
    owner = subprocess.Popen(
        [sys.executable, "-c", LONG_RUNNING], stdout=subprocess.PIPE, text=True
    )
    folder, *inside = owner.stdout.readline().split()
    assert all(Path(path).is_dir() and Path(path).parent == Path(folder) for path in inside)
    owner.kill()
    owner.wait()
    deadline = time.monotonic() + 5
    while Path(folder).exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(folder).exists()
