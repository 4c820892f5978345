"""`towerbench tracking serve`: the team's MLflow server (`mlflow server`), with the settings a
shared store needs and one-line errors for the ones it lacks."""

from __future__ import annotations

import errno
import importlib.util
import os
import socket
import subprocess
from pathlib import Path

from towerbench.core.errors import TowerbenchError
from towerbench.core.processes import stop_tree
from towerbench.core.reaper import Reaper
from towerbench.serve.deployments import SERVER_STOP_GRACE_SECONDS, server_environment, tool

# `mlflow server --app-name basic-auth` refuses to start without these (MLflow 3.17 has no
# default admin password); they come from the environment, never from a file in the project.
BASIC_AUTH_SETTINGS = ("MLFLOW_FLASK_SERVER_SECRET_KEY", "MLFLOW_AUTH_ADMIN_PASSWORD")


def check_address_free(host: str, port: int) -> None:
    """Refuse, in one line, an address `mlflow server` could not listen on (a port in use, a
    host that is not this machine's): its own error would come after it had started."""
    try:
        family, kind, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds
            probe.bind(address)
    except OSError as error:
        if error.errno == errno.EADDRINUSE:
            raise TowerbenchError(
                f"--port {port}: {host}:{port} is already in use (another server listens "
                "there): stop it or choose another --port"
            ) from None
        raise TowerbenchError(
            f"--host {host}: cannot listen there ({error.strerror or error})"
        ) from None


def server_command(
    backend_store_uri: str,
    artifacts_destination: str,
    host: str,
    port: int,
    workers: int,
    allowed_hosts: str | None,
    basic_auth: bool,
) -> list[str]:
    """The `mlflow server` command line; refuses a store it cannot open before starting it."""
    # SQLAlchemy 2 reads a plain postgresql:// as psycopg 3 (the `team` extra).
    psycopg3 = backend_store_uri.startswith(("postgresql://", "postgresql+psycopg://"))
    if psycopg3 and importlib.util.find_spec("psycopg") is None:
        raise TowerbenchError(
            f"--backend-store-uri {backend_store_uri.split('@')[-1]}: PostgreSQL needs the "
            "psycopg driver: pip install 'towerbench[team]'"
        )
    check_address_free(host, port)
    mlflow = tool("mlflow")
    if not Path(mlflow).is_file():
        raise TowerbenchError("no `mlflow` command in this environment or on PATH")
    command = [mlflow, "server", "--backend-store-uri", backend_store_uri]
    command += ["--artifacts-destination", artifacts_destination, "--serve-artifacts"]
    command += ["--host", host, "--port", str(port), "--workers", str(workers)]
    if allowed_hosts:
        command += ["--allowed-hosts", allowed_hosts]
    if basic_auth:
        missing = [name for name in BASIC_AUTH_SETTINGS if not os.environ.get(name)]
        if missing:
            raise TowerbenchError(f"--basic-auth: set {' and '.join(missing)} in the environment")
        if importlib.util.find_spec("flask_wtf") is None:
            raise TowerbenchError(
                "--basic-auth needs MLflow's auth extra: pip install 'mlflow[auth]'"
            )
        command += ["--app-name", "basic-auth"]
    return command


def serve_tracking(command: list[str]) -> int:
    """Run the MLflow server until it exits or this command is stopped; its exit status. It runs
    in a session of its own, watched by a reaper (core/reaper.py), so it ends with this command
    with the uvicorn workers it starts, however the command ends: Ctrl-C and SIGTERM stop it
    here, SIGKILL and a closed terminal through the reaper."""
    reaper = Reaper()
    server = subprocess.Popen(command, env=server_environment(), start_new_session=True)
    reaper.watch(server)
    try:
        return server.wait()
    finally:
        stop_tree(server, SERVER_STOP_GRACE_SECONDS)
        reaper.close()
