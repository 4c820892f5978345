"""The test servers outlive no test: the private PostgreSQL and `prefect server start` (the pools'
and deployments' tests) stop even when the test's process is killed outright; and a killed
pytest process leaves no sandbox behind (conftest.py)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from fixtures_servers import wait_until

pytestmark = pytest.mark.slow  # starts a server

HOLD_POSTGRES = """
import sys, time
sys.path.insert(0, sys.argv[1])
from fixtures_servers import postgres
with postgres("password") as uri:
    print(uri, flush=True)
    time.sleep(600)
"""

HOLD_PREFECT = """
import os, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from fixtures_servers import prefect_server
with prefect_server(Path(sys.argv[2]), dict(os.environ)) as ready:
    print(ready(), flush=True)
    time.sleep(600)
"""


def _accepts(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def _killed_after_its_first_line(holder: str, *arguments: str, check) -> str:
    """The first line `holder` prints (`check` holds for it), once its process is killed by
    SIGKILL."""
    command = [sys.executable, "-c", holder, str(Path(__file__).parent), *arguments]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    line = process.stdout.readline().strip()
    assert check(line), line
    process.send_signal(signal.SIGKILL)
    process.wait()
    return line


def _killed_while_serving(holder: str, *arguments: str) -> int:
    """The port of the server `holder` serves on, once `holder`'s process is killed by SIGKILL."""
    url = _killed_after_its_first_line(holder, *arguments, check=lambda line: _accepts(_port(line)))
    return _port(url)


def _port(url: str) -> int:
    port = urlsplit(url).port
    assert port is not None, url
    return port


def test_postgres_stops_when_its_test_process_is_killed() -> None:
    port = _killed_while_serving(HOLD_POSTGRES)
    wait_until(lambda: not _accepts(port), 30, "PostgreSQL to stop")


def test_prefect_server_stops_when_its_test_process_is_killed(tmp_path: Path) -> None:
    port = _killed_while_serving(HOLD_PREFECT, str(tmp_path))
    wait_until(lambda: not _accepts(port), 30, "the Prefect server to stop")


HOLD_SANDBOX = """
import sys, time
sys.path.insert(0, sys.argv[1])
import conftest
print(conftest._SANDBOX, flush=True)
time.sleep(600)
"""


def _a_sandbox(line: str) -> bool:
    return Path(line).name.startswith("towerbench-tests-") and (Path(line) / "prefect").is_dir()


def test_a_killed_pytest_process_leaves_no_sandbox() -> None:
    sandbox = Path(_killed_after_its_first_line(HOLD_SANDBOX, check=_a_sandbox))
    wait_until(lambda: not sandbox.exists(), 30, f"{sandbox} to be removed")
