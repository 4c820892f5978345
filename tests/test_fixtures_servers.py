"""The test servers outlive no test: the private PostgreSQL stops even when the test's process is
killed outright."""

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


def _accepts(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def test_postgres_stops_when_its_test_process_is_killed() -> None:
    command = [sys.executable, "-c", HOLD_POSTGRES, str(Path(__file__).parent)]
    holder = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    port = urlsplit(holder.stdout.readline()).port
    assert port is not None and _accepts(port)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    wait_until(lambda: not _accepts(port), 30, "PostgreSQL to stop")
