"""The fetch task retries a download that gave up (a real HTTP server answering 503) and never a
settings error (real Prefect test harness, real DVC project)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from uuid import UUID

import pytest
import yaml
from fixtures_servers import untraced_prefect_harness
from prefect import flow
from prefect.client.orchestration import get_client

from towerbench.config.sections import FetchConfig, PreprocessConfig
from towerbench.core.errors import TowerbenchError
from towerbench.tasks.data.dvc_stages import data_stages
from towerbench.tasks.data.fetch import RETRY_DELAYS_SECONDS, fetch_task

pytestmark = pytest.mark.slow  # trains, or starts servers or processes

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def prefect_harness():
    with untraced_prefect_harness():
        yield


SHARDS = PreprocessConfig(shards=1)  # as in every project below
FAST = fetch_task.with_options(retries=1, retry_delay_seconds=0)


def write_project(folder: Path, fetch: dict) -> Path:
    """A DVC project (no git) whose params.yaml has the given `fetch:` section."""
    folder.mkdir()
    shutil.copy(ROOT / "dvc.yaml", folder / "dvc.yaml")
    params = {"fetch": fetch, "preprocess": {"shards": 1}, "data": {"data_dir": "data"}}
    (folder / "params.yaml").write_text(yaml.safe_dump(params))
    subprocess.run([sys.executable, "-m", "dvc", "init", "--no-scm", "-q"], cwd=folder, check=True)
    return folder


def fetch_attempts(project: Path, config: FetchConfig, task=FAST) -> tuple[str, int]:
    """Run the fetch task in a flow (by default with one retry and no delay: each attempt of the
    stage takes seconds): its final message and how often it ran."""

    @flow
    def fetch_only() -> UUID:
        state = task(project, config, SHARDS, project / "data", return_state=True)
        return state.state_details.task_run_id

    with get_client(sync_client=True) as client:
        task_run = client.read_task_run(fetch_only())
    assert task_run.state.is_failed()
    return task_run.state.message, task_run.run_count


def test_settings_mismatch_names_each_field_that_differs(tmp_path) -> None:
    """Other settings under params.yaml's dataset name would overwrite its data."""
    project = write_project(tmp_path / "project", {"source": "digits", "name": "digits"})
    asked = FetchConfig(source="cifar10", name="digits", retries=5)
    with pytest.raises(TowerbenchError) as raised:
        data_stages(project, asked, SHARDS, project / "data")
    message = str(raised.value)
    assert message.startswith(
        f"{project / 'params.yaml'}: fetch.retries: 5 in the form, 3 in params.yaml; "
        "fetch.source: 'cifar10' in the form, 'digits' in params.yaml ("
    )
    assert "\n" not in message and "FetchConfig" not in message


def test_a_settings_error_fails_at_once_without_retries(prefect_harness, tmp_path) -> None:
    project = write_project(tmp_path / "project", {"source": "digits", "name": "digits"})
    started = time.monotonic()
    message, runs = fetch_attempts(project, FetchConfig(source="cifar10", name="digits"))
    assert runs == 1
    assert time.monotonic() - started < RETRY_DELAYS_SECONDS[0]
    assert "fetch.source: 'cifar10' in the form, 'digits' in params.yaml" in message


class _Unavailable(BaseHTTPRequestHandler):
    requests = 0

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        type(self).requests += 1
        self.send_error(503)

    def log_message(self, *args) -> None:  # keep pytest's output clean
        pass


def test_a_download_that_gave_up_is_retried(prefect_harness, tmp_path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Unavailable)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/cifar-10-binary.tar.gz"
        fetch = {"source": "cifar10", "name": "cifar10", "url": url, "retries": 0}
        project = write_project(tmp_path / "project", fetch)
        message, runs = fetch_attempts(project, FetchConfig(**fetch))
    finally:
        server.shutdown()
    assert runs == 2 and _Unavailable.requests == 2  # the first attempt and the retry
    assert "download failed after 1 attempt(s) (HTTP 503)" in message


class _NotFound(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self.send_error(404)

    def log_message(self, *args) -> None:
        pass


def _paths_in(message: str) -> list[Path]:
    return [Path(word.rstrip(":;,.)")) for word in message.split() if word.startswith("/")]


def _fails_once_soon(tmp_path: Path, url: str) -> str:
    """The real fetch task (its own retries and delays) on `url`: failed in one run, within a
    minute, naming only paths that exist and no partial file; its message."""
    fetch = {"source": "cifar10", "name": "cifar10", "url": url}
    project = write_project(tmp_path / "project", fetch)
    started = time.monotonic()
    message, runs = fetch_attempts(project, FetchConfig(**fetch), task=fetch_task)
    assert runs == 1, message  # not retried
    # No hang either: 3 s of flow, but up to 34 s with Prefect's start under the full suite's load.
    assert time.monotonic() - started < 60
    assert ".part" not in message and "../" not in message
    assert _paths_in(message) and all(path.exists() for path in _paths_in(message)), message
    assert not (project / "data" / "raw").exists()  # no empty folder left behind
    return message


def test_a_url_answering_404_fails_once_at_once(prefect_harness, tmp_path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/missing.tar.gz"
        message = _fails_once_soon(tmp_path, url)
    finally:
        server.shutdown()
    assert f"{url}: HTTP 404 Not Found; nothing downloaded" in message


def test_an_unresolvable_host_fails_once_at_once(prefect_harness, tmp_path) -> None:
    """A DNS failure (here a reserved name that never resolves; offline, every name) is not
    worth Prefect's waits of 10 and 60 s."""
    message = _fails_once_soon(tmp_path, "http://nonexistent.invalid/cifar-10-binary.tar.gz")
    assert "host 'nonexistent.invalid' not found" in message
