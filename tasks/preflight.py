"""Before any training: do the MLflow tracking server and the Prefect API answer?

Hours into a sweep is the worst time to learn that a server is down, so the sweep, pipeline and
report commands ask first, each server for at most `WAIT_SECONDS`. The tracking URI must answer
a call of MLflow's REST API (one experiment searched) with JSON, or with 401/403: a server asking
for the credentials MLflow will send. Another web server at that address is refused. For the
Prefect API any HTTP answer below 500 counts; without one, Prefect's temporary server will listen
on 127.0.0.1, so this machine must be able to connect there (a network namespace with its
loopback interface down cannot, and Prefect would time out after minutes).
"""

from __future__ import annotations

import os
import socket
import time

import httpx

from towerbench.core.errors import TowerbenchError

# MLflow retries a failed request 7 times with exponential backoff (about 4 minutes) and waits
# up to 120 s for each answer, so a tracking server that dies mid-sweep would hang the sweep and
# its training process for minutes before anything is said. These give up within about a
# minute (3 tries of at most 20 s, 0-2 s apart); a value the user set wins.
MLFLOW_HTTP_DEFAULTS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "20",
}
WAIT_SECONDS = 3.0  # per server, all tries included: two dead servers are told within 15 s
TRY_SECONDS = 2.0  # one request, connecting included
PAUSE_SECONDS = 0.5


def bound_mlflow_http() -> None:
    """Bound MLflow's HTTP retries in this process and in every process it starts."""
    for name, value in MLFLOW_HTTP_DEFAULTS.items():
        os.environ.setdefault(name, value)


# One call of MLflow's REST API that every tracking server answers, cheaply.
MLFLOW_PROBE = "/api/2.0/mlflow/experiments/search?max_results=1"
CREDENTIALS_ASKED = (401, 403)


def _answer(url: str) -> httpx.Response | str:
    """`url`'s first answer below HTTP 500 within WAIT_SECONDS, else the last failure."""
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        timeout = max(min(TRY_SECONDS, deadline - time.monotonic()), 0.1)
        try:
            response = httpx.get(url, timeout=timeout)
            if response.status_code < 500:
                return response
            problem = f"HTTP {response.status_code}"
        except httpx.HTTPError as error:
            problem = str(error) or type(error).__name__
        if time.monotonic() + PAUSE_SECONDS >= deadline:
            return problem
        time.sleep(PAUSE_SECONDS)


def _speaks_mlflow(response: httpx.Response) -> bool:
    """An MLflow server's answer to MLFLOW_PROBE: a JSON object, or a request for credentials."""
    if response.status_code in CREDENTIALS_ASKED:
        return True
    try:
        return response.status_code == 200 and isinstance(response.json(), dict)
    except ValueError:
        return False


def _check_tracking_server(tracking_uri: str) -> None:
    answer = _answer(tracking_uri.rstrip("/") + MLFLOW_PROBE)
    if isinstance(answer, str):
        raise TowerbenchError(
            f"tracking URI {tracking_uri}: the MLflow tracking server does not answer "
            f"({answer}); start it, or track into a local sqlite:/// store"
        )
    if not _speaks_mlflow(answer):
        kind = answer.headers.get("content-type", "no content type").split(";")[0]
        raise TowerbenchError(
            f"tracking URI {tracking_uri}: a web server answers, but not MLflow's REST API "
            f"(GET {MLFLOW_PROBE.split('?')[0]}: HTTP {answer.status_code}, {kind}); give the "
            "address of an MLflow tracking server (`towerbench tracking serve`, `mlflow server`)"
        )


def prefect_api_url() -> str | None:
    """The Prefect API this process would use (environment or profile); None for a temporary
    server of its own."""
    from prefect.settings import get_current_settings

    return get_current_settings().api.url


def _check_loopback() -> None:
    """Listen on 127.0.0.1 and connect there, as Prefect's temporary server and its clients
    will; one line if this machine cannot."""
    try:
        with socket.create_server(("127.0.0.1", 0)) as listener:
            socket.create_connection(listener.getsockname(), timeout=TRY_SECONDS).close()
    except OSError as error:
        raise TowerbenchError(
            f"127.0.0.1: cannot listen and connect there ({error}), where Prefect's temporary "
            "server (started when no PREFECT_API_URL is set) would serve; bring the loopback "
            "interface up (`ip link set lo up`), or set PREFECT_API_URL to a running Prefect "
            "server"
        ) from None


def check_servers(tracking_uri: str | None, prefect: bool = True) -> None:
    """One-line TowerbenchError naming the first server that does not answer: the MLflow
    tracking server (when `tracking_uri` is http(s); another kind of web server there is
    refused too), then the Prefect API (when `prefect` and one is configured), or 127.0.0.1
    where Prefect's temporary server would serve (when `prefect` and none is). Also bounds
    MLflow's HTTP retries for the rest of the command."""
    bound_mlflow_http()
    if tracking_uri and tracking_uri.startswith(("http://", "https://")):
        _check_tracking_server(tracking_uri)
    if not prefect:
        return
    api_url = prefect_api_url()
    if not api_url:  # None (or empty): a temporary server of our own
        _check_loopback()
        return
    problem = _answer(f"{api_url.rstrip('/')}/health")
    if isinstance(problem, str):
        raise TowerbenchError(
            f"PREFECT_API_URL {api_url}: the Prefect API does not answer ({problem}); "
            "start it (`prefect server start`), or unset PREFECT_API_URL to use a "
            "temporary server"
        )
