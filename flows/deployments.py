"""`towerbench serve` and `towerbench ui`: the deployments, and the local servers behind the UIs."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from model.config import Params
from model.errors import TowerbenchError

DEPLOYMENT_NAME = "towerbench"
HOST = "127.0.0.1"
PREFECT_PORT = 4200
MLFLOW_PORT = 5000


def prefect_api_url() -> str | None:
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value() or None


def serve(params: Params, project_dir: Path) -> None:
    """Register and serve `pipeline` (run on demand) and `benchmark` (on its cron) until stopped.

    Needs a Prefect server: in Prefect's ephemeral mode nobody could trigger a run and the
    schedule would never fire.
    """
    if prefect_api_url() is None:
        raise TowerbenchError(
            "PREFECT_API_URL is not set: deployments and schedules need a Prefect server "
            "(Prefect's ephemeral mode never fires schedules). Start one with `towerbench ui` "
            "or `prefect server start`, then set PREFECT_API_URL=http://127.0.0.1:4200/api"
        )
    from prefect import serve as prefect_serve
    from prefect.deployments.runner import EntrypointType

    from flows.benchmark import benchmark
    from flows.pipeline import pipeline

    # Module entrypoints: the served runs import the flows by name, whatever the working directory.
    on_demand = pipeline.to_deployment(
        name=DEPLOYMENT_NAME,
        parameters={"config": params.pipeline(project_dir).model_dump(mode="json")},
        description="fetch -> preprocess (DVC) -> sweep -> report, with the settings of "
        "params.yaml as the form's defaults.",
        entrypoint_type=EntrypointType.MODULE_PATH,
    )
    scheduled = benchmark.to_deployment(
        name=DEPLOYMENT_NAME,
        cron=params.benchmark.cron,
        parameters={"config": params.benchmark_pipeline(project_dir).model_dump(mode="json")},
        description="The fixed benchmark sweep, compared with its previous run.",
        entrypoint_type=EntrypointType.MODULE_PATH,
    )
    prefect_serve(on_demand, scheduled, pause_on_shutdown=False)


def _port_free(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex((HOST, port)) != 0


def _wait_for(url: str, process: subprocess.Popen, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise TowerbenchError(f"{url}: the server exited with code {process.returncode}")
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TowerbenchError(f"{url}: no answer after {timeout:.0f} s")


def _tool(name: str) -> str:
    """A console script of this environment (next to its python), else from PATH."""
    candidate = Path(sys.executable).with_name(name)
    return str(candidate) if candidate.exists() else (shutil.which(name) or name)


def run_ui(params: Params, params_path: Path) -> None:
    """Prefect server + MLflow UI + `towerbench serve`, all on 127.0.0.1, until Ctrl-C."""
    for port in (PREFECT_PORT, MLFLOW_PORT):
        if not _port_free(port):
            raise TowerbenchError(f"{HOST}:{port} is already in use; stop what runs there first")
    # Ctrl-C (even if the shell started us with SIGINT ignored) and `kill` both end in `finally`.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    tracking = params.tracking
    # Children get their own sessions, so Ctrl-C reaches only this process, which then stops
    # `serve` first (while its server still answers) and the servers after it.
    processes: list[subprocess.Popen] = []
    try:
        # Local and offline by default: no usage telemetry from the server.
        server_environment = {"PREFECT_SERVER_ANALYTICS_ENABLED": "false", **os.environ}
        prefect_server = subprocess.Popen(
            [_tool("prefect"), "server", "start", "--host", HOST, "--port", str(PREFECT_PORT)],
            env=server_environment,
            start_new_session=True,
        )
        processes.append(prefect_server)
        mlflow_command = [_tool("mlflow"), "ui", "--host", HOST, "--port", str(MLFLOW_PORT)]
        mlflow_command += ["--workers", "1"]  # one user: spare the cores for training
        mlflow_command += ["--backend-store-uri", tracking.tracking_uri or ""]
        if tracking.artifact_root:
            mlflow_command += ["--default-artifact-root", tracking.artifact_root]
        processes.append(subprocess.Popen(mlflow_command, start_new_session=True))
        _wait_for(f"http://{HOST}:{PREFECT_PORT}/api/health", prefect_server)
        environment = dict(os.environ, PREFECT_API_URL=f"http://{HOST}:{PREFECT_PORT}/api")
        served = subprocess.Popen(
            [
                _tool("towerbench"),
                "serve",
                "--params",
                str(params_path),
                "--tracking-uri",
                tracking.tracking_uri or "",
            ],
            env=environment,
            start_new_session=True,
        )
        processes.append(served)
        print(
            f"Prefect UI: http://{HOST}:{PREFECT_PORT}  (Deployments -> pipeline -> Run)\n"
            f"MLflow UI:  http://{HOST}:{MLFLOW_PORT}\nCtrl-C stops all three.",
            flush=True,
        )
        served.wait()
    finally:
        for process in reversed(processes):  # serve first, then the servers
            _stop(process)


def _stop(process: subprocess.Popen, grace_seconds: float = 20) -> None:
    """SIGTERM (each of them shuts down gracefully on it); killed after the grace period."""
    if process.poll() is None:
        process.terminate()
    try:
        process.wait(timeout=grace_seconds)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
