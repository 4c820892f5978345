"""What towerbench starts it stops through handles of its own, except multiprocessing's fork
server and resource tracker, which Python 3.12 offers no public stop for: the one wrapper of
their private `_stop()` still stops them, or these tests say which call a Python release
changed."""

from __future__ import annotations

import psutil
import pytest

from towerbench.serve.temporary_server import start_owned_temporary_server
from towerbench.tasks.training.fork_server import (
    start_fork_server,
    stop_fork_server,
    stop_multiprocessing_servers,
)

pytestmark = pytest.mark.slow  # starts the fork server (TensorFlow's imports) and Prefect's server

WRAPPER = "tasks/training/fork_server.py:stop_multiprocessing_servers"
MULTIPROCESSING = {
    "fork server": ("multiprocessing.forkserver", "multiprocessing.forkserver._forkserver._stop()"),
    "resource tracker": (
        "multiprocessing.resource_tracker",
        "multiprocessing.resource_tracker._resource_tracker._stop()",
    ),
}


def _children(marker: str) -> list[psutil.Process]:
    """This process's children whose command line names `marker`."""
    return [child for child in psutil.Process().children() if marker in " ".join(child.cmdline())]


def _multiprocessing_servers() -> dict[str, psutil.Process]:
    found = {name: _children(module) for name, (module, _) in MULTIPROCESSING.items()}
    assert all(len(processes) == 1 for processes in found.values()), found
    return {name: processes[0] for name, processes in found.items()}


def _stopped_by_the_wrapper() -> None:
    try:
        stop_multiprocessing_servers()
    except AttributeError as error:
        pytest.fail(f"Python's multiprocessing changed a private name ({error}); fix {WRAPPER}")


def test_the_wrapper_stops_the_fork_server_and_its_resource_tracker_and_they_start_again() -> None:
    try:
        for _ in range(2):  # a later training process starts them again
            start_fork_server()
            running = _multiprocessing_servers()
            _stopped_by_the_wrapper()
            for name, process in running.items():
                call = MULTIPROCESSING[name][1]
                assert not process.is_running(), f"{call} left the {name} running; fix {WRAPPER}"
        _stopped_by_the_wrapper()  # nothing running: a no-op
    finally:
        stop_fork_server()


def test_the_temporary_server_started_here_is_returned_and_its_stop_ends_it() -> None:
    server = start_owned_temporary_server(120)
    assert server is not None
    try:
        [uvicorn] = _children("uvicorn")
        assert start_owned_temporary_server(120) is None  # running: the first caller's to stop
    finally:
        server.stop()
    assert not uvicorn.is_running()
    assert _children("uvicorn") == []


def test_no_temporary_server_when_prefects_settings_name_an_api() -> None:
    """Prefect's settings, as its clients read them (the environment when Prefect was imported,
    or the profile), decide: not the environment of now."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:9/api"}):
        assert start_owned_temporary_server(120) is None
    assert _children("uvicorn") == []
