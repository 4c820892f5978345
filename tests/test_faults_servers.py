"""Servers down before training (issue 10): an unreachable MLflow tracking server or Prefect API
is one line naming its URI, exit 2, within 15 s, before anything is trained; MLflow's own HTTP
retries are bounded so that a server dying mid-sweep is not waited on for minutes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import fixtures_model
import httpx
import psutil
import pytest
from fixtures_data import http_server
from fixtures_servers import free_port, start, stop, wait_until
from mlflow.environment_variables import (
    MLFLOW_HTTP_REQUEST_MAX_RETRIES,
    MLFLOW_HTTP_REQUEST_TIMEOUT,
)

from towerbench.core.errors import TowerbenchError
from towerbench.tasks.preflight import (
    MLFLOW_HTTP_DEFAULTS,
    MLFLOW_PROBE,
    bound_mlflow_http,
    check_servers,
)

pytestmark = pytest.mark.slow  # trains, or starts servers or processes

ROOT = Path(__file__).resolve().parents[1]
LIMIT_SECONDS = 15


def _dead_url() -> str:
    """An address on this machine where nothing listens."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


def _sweep(
    tmp_path: Path, *options: str, inside: tuple[str, ...] = (), **environment: str
) -> tuple[int, list[str], float]:
    """`towerbench sweep` of one tiny digits run, as a user starts it (`inside` a wrapper
    command); (status, stderr, seconds)."""
    fixtures_model.write_digits(tmp_path / "data", train=240, test=80)  # checked before servers
    argv = [
        *inside,
        sys.executable,
        "-m",
        "towerbench.cli.main",
        "sweep",
        "--dataset",
        "digits",
        "--towers",
        "1",
    ]
    argv += ["--seeds", "0", "--epochs", "1", "--data-dir", str(tmp_path / "data"), *options]
    started = time.monotonic()
    result = subprocess.run(
        argv,
        cwd=ROOT,
        env={**os.environ, **environment},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return result.returncode, result.stderr.strip().splitlines(), time.monotonic() - started


def test_dead_tracking_server_stops_the_sweep_in_one_line_within_15s(tmp_path):
    dead = _dead_url()
    status, errors, seconds = _sweep(tmp_path, "--tracking-uri", dead)
    assert status == 2, errors
    assert len(errors) == 1 and errors[0].startswith("towerbench sweep: error: "), errors
    assert dead in errors[0] and "MLflow tracking server does not answer" in errors[0]
    assert seconds < LIMIT_SECONDS
    assert not (tmp_path / "data" / "checkpoints").exists()  # nothing was started


def test_dead_prefect_api_stops_the_sweep_in_one_line_within_15s(tmp_path):
    api = f"{_dead_url()}/api"
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    status, errors, seconds = _sweep(tmp_path, "--tracking-uri", store, PREFECT_API_URL=api)
    assert status == 2, errors
    assert len(errors) == 1 and errors[0].startswith("towerbench sweep: error: "), errors
    assert api in errors[0] and "Prefect API does not answer" in errors[0]
    assert seconds < LIMIT_SECONDS
    assert not (tmp_path / "mlflow.db").exists()


def test_no_loopback_stops_the_sweep_in_one_line_within_15s(tmp_path):
    """In a network namespace whose loopback interface is down, Prefect's temporary server
    cannot answer: said at once, not after Prefect's start-up timeout and its traceback."""
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    no_network = ("unshare", "--user", "--map-root-user", "--net")
    status, errors, seconds = _sweep(tmp_path, "--tracking-uri", store, inside=no_network)
    assert status == 2, errors
    assert len(errors) == 1 and errors[0].startswith("towerbench sweep: error: 127.0.0.1: "), errors
    assert "ip link set lo up" in errors[0] and "PREFECT_API_URL" in errors[0]
    assert seconds < LIMIT_SECONDS
    assert not (tmp_path / "mlflow.db").exists()


def test_a_temporary_server_slower_than_its_startup_timeout_is_one_line(tmp_path):
    """The user's PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS is the time given; 1 s is
    shorter than the server's start-up here, and Prefect's timeout becomes one line."""
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    status, errors, seconds = _sweep(
        tmp_path, "--tracking-uri", store, PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="1"
    )
    assert status == 2, errors
    assert errors[-1].startswith(
        "towerbench sweep: error: Prefect's temporary API server did not answer within 1 s"
    ), errors
    assert not any("Traceback" in line for line in errors), errors
    assert seconds < 60  # our 120 s default would not have ended it by then


# MLflow's own tracking server application (its REST API on a SQLite store) on a free port.
MLFLOW_APP = """
import os, sys
os.environ["_MLFLOW_SERVER_FILE_STORE"] = sys.argv[1]
os.environ["_MLFLOW_SERVER_ARTIFACT_ROOT"] = sys.argv[2]
from mlflow.server import app
from werkzeug.serving import make_server
server = make_server("127.0.0.1", 0, app, threaded=True)
print(server.server_port, flush=True)
server.serve_forever()
"""


def test_servers_that_answer_pass_and_a_failing_one_is_named(tmp_path):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    app = subprocess.Popen(
        [sys.executable, "-c", MLFLOW_APP, store, str(tmp_path / "artifacts")],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        mlflow_url = f"http://127.0.0.1:{app.stdout.readline().strip()}"
        httpx.get(mlflow_url + MLFLOW_PROBE, timeout=120)  # its tables are made on first use
        with (
            http_server({"/health": b"OK", "/api/health": b"true"}) as (url, _),
            temporary_settings({PREFECT_API_URL: f"{url}/api"}),  # as Prefect's clients read it
        ):
            check_servers(mlflow_url)  # both answer, MLflow as MLflow
            with pytest.raises(TowerbenchError, match="a web server answers, but not MLflow's"):
                check_servers(url)  # answers /health, but not MLflow's REST API (404)
    finally:
        app.kill()
        app.wait()
    with pytest.raises(TowerbenchError, match="tracking URI http://127.0.0.1:.*does not answer"):
        check_servers(_dead_url(), prefect=False)
    check_servers("sqlite:///nowhere/mlflow.db", prefect=False)  # a local store: nothing to ask


def test_mlflow_http_retries_are_bounded_unless_the_user_chose(monkeypatch):
    for name in MLFLOW_HTTP_DEFAULTS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "45")
    bound_mlflow_http()
    # Read back the way MLflow reads them, so a renamed variable would show here.
    assert MLFLOW_HTTP_REQUEST_MAX_RETRIES.get() == int(
        MLFLOW_HTTP_DEFAULTS["MLFLOW_HTTP_REQUEST_MAX_RETRIES"]
    )
    assert MLFLOW_HTTP_REQUEST_TIMEOUT.get() == 45


def _start_mlflow_app(tmp_path: Path) -> tuple[subprocess.Popen, str]:
    """MLFLOW_APP on a SQLite store in `tmp_path`, answering; (process, URL)."""
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    app = subprocess.Popen(
        [sys.executable, "-c", MLFLOW_APP, store, str(tmp_path / "artifacts")],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    url = f"http://127.0.0.1:{app.stdout.readline().strip()}"
    httpx.get(url + MLFLOW_PROBE, timeout=120)  # its tables are made on first use
    return app, url


def test_a_tracking_server_lost_mid_sweep_ends_it_in_one_last_line_with_status_1(tmp_path):
    fixtures_model.write_digits(tmp_path / "data", train=240, test=80)
    app, url = _start_mlflow_app(tmp_path)
    argv = [sys.executable, "-m", "towerbench.cli.main", "sweep", "--dataset", "digits"]
    argv += ["--towers", "1", "--seeds", "0", "--epochs", "500", "--tracking-uri", url]
    argv += ["--data-dir", str(tmp_path / "data"), "--report-dir", str(tmp_path / "reports")]
    environment = {**os.environ, "PYTHONUNBUFFERED": "1"}
    sweep = subprocess.Popen(argv, cwd=ROOT, env=environment, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        for line in sweep.stderr:
            lines.append(line.rstrip("\n"))
            if "epoch 1:" in line:
                break
        app.kill()
        app.wait()
        lines += sweep.stderr.read().splitlines()
        status = sweep.wait(timeout=120)
    finally:
        app.kill()
        sweep.kill()
        sweep.wait()
    shown = "\n".join(lines[-40:])
    assert status == 1, shown
    assert "Traceback" not in "\n".join(lines), shown
    last = lines[-1]
    assert last.startswith("towerbench sweep: error: ") and url in last, shown
    assert last.endswith("run the same command again to resume"), shown


def test_tracking_serve_on_a_taken_port_is_one_line_and_status_2(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "towerbench.cli.main", "tracking", "serve", "--port", str(port)]
            + ["--backend-store-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"]
            + ["--artifacts-destination", str(tmp_path / "artifacts")],
            cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line == (
        f"towerbench tracking: error: --port {port}: 127.0.0.1:{port} is already in use "
        "(another server listens there): stop it or choose another --port"
    )
    assert not (tmp_path / "mlflow.db").exists()  # nothing was started


def test_tracking_serve_killed_takes_its_server_and_workers_with_it(tmp_path):
    """SIGKILL of `towerbench tracking serve` (nothing of ours can run then): within seconds no
    process it started still serves the port, so no sweep goes on logging to an orphan."""
    port = free_port()
    command = [sys.executable, "-m", "towerbench.cli.main", "tracking", "serve"]
    command += ["--port", str(port), "--workers", "2"]
    command += ["--backend-store-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"]
    command += ["--artifacts-destination", str(tmp_path / "artifacts")]
    server = start(command, tmp_path / "serve.log", cwd=ROOT)
    try:
        health = f"http://127.0.0.1:{port}/health"
        wait_until(lambda: httpx.get(health, timeout=2).status_code == 200, 180, "serve", [server])
        started = psutil.Process(server.pid).children(recursive=True)
        assert len(started) >= 3, started  # the server, uvicorn's master and its 2 workers
        server.kill()
        server.wait()
        _, left = psutil.wait_procs(started, timeout=10)
        assert left == [], [process.cmdline() for process in left]
        with pytest.raises(httpx.TransportError):
            httpx.get(health, timeout=2)
    finally:
        stop([server])
