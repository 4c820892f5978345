"""`towerbench serve` and `towerbench ui`: the deployments, and the local servers behind the UIs."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import cast

import httpx

from towerbench.config.params import Params, TrackingConfig
from towerbench.core.errors import TowerbenchError
from towerbench.core.processes import stop_tree
from towerbench.core.reaper import Reaper
from towerbench.serve.process_output import OutputRelay
from towerbench.serve.telemetry import telemetry_off_unless_opted_in

# Named for what they do: the Prefect UI lists deployments by name, the flow only in grey.
PIPELINE_DEPLOYMENT = "towerbench-pipeline"
NIGHTLY_DEPLOYMENT = "towerbench-nightly"  # short: the deployments list cuts longer names
ADVISE_DEPLOYMENT = "towerbench-advise"
# Each deployment as the API names it (flow/deployment); `serve` registers them one at a time.
SERVED_DEPLOYMENTS = (
    f"pipeline/{PIPELINE_DEPLOYMENT}",
    f"nightly/{NIGHTLY_DEPLOYMENT}",
    f"advise/{ADVISE_DEPLOYMENT}",
)
HOST = "127.0.0.1"
PREFECT_PORT = 4200
MLFLOW_PORT = 5000

SERVER_STOP_GRACE_SECONDS = 20  # each server shuts down gracefully on SIGTERM


def prefect_api_url() -> str | None:
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value() or None


def schedule_tag(timezone: str) -> str:
    """The scheduled deployment's tag naming the zone its schedule's times are in."""
    return f"times in {timezone}"


def serve(params: Params, params_path: Path) -> None:
    """Register and serve `pipeline` and `advise` (run on demand) and `nightly` (on its cron)
    until stopped.

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
    from prefect.deployments.runner import EntrypointType, RunnerDeployment
    from prefect.schedules import Cron

    from towerbench.config.run_form import form_parameters
    from towerbench.flows.advise import advise
    from towerbench.flows.nightly import nightly
    from towerbench.flows.pipeline import pipeline

    # Module entrypoints: the served runs import the flows by name, whatever the working directory.
    on_demand = pipeline.to_deployment(
        name=PIPELINE_DEPLOYMENT,
        parameters=form_parameters(params, params_path),
        description=f"fetch -> preprocess (DVC) -> sweep -> report. The form starts from "
        f"`{params_path.resolve()}`; settings it does not show come from that file.",
        entrypoint_type=EntrypointType.MODULE_PATH,
    )
    scheduled = nightly.to_deployment(
        name=NIGHTLY_DEPLOYMENT,
        schedule=Cron(params.nightly.cron, timezone=params.nightly.timezone),
        parameters={"params_file": str(params_path.resolve())},
        # Prefect 3.9's deployments list labels the schedule without its zone (ui-v2
        # schedule-badge: only the tooltip has it); a tag shows it beside the label.
        tags=[schedule_tag(params.nightly.timezone)],
        # The UI's schedule label leaves the time zone out; say it here.
        description=f"The fixed nightly sweep at `{params.nightly.cron}` "
        f"({params.nightly.timezone}), compared with its previous run.",
        entrypoint_type=EntrypointType.MODULE_PATH,
    )
    advisor = advise.to_deployment(
        name=ADVISE_DEPLOYMENT,
        parameters={
            "advice": {"towers": 4},
            "optimizer": params.train.optimizer,
            "params_file": str(params_path.resolve()),
        },
        description="The LR recipe for K towers from a short probe, checked by a sweep of 1 "
        f"tower against K. Settings the form does not show come from `{params_path.resolve()}`.",
        entrypoint_type=EntrypointType.MODULE_PATH,
    )
    # Polling every 2 s (Prefect's default: 10) starts a run soon after the Run button. Prefect
    # types to_deployment as maybe returning a coroutine (its async twin); here it does not.
    deployments = cast(list[RunnerDeployment], [on_demand, scheduled, advisor])
    prefect_serve(*deployments, pause_on_shutdown=False, query_seconds=2)


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


def tool(name: str) -> str:
    """A console script of this environment (next to its python), else from PATH."""
    candidate = Path(sys.executable).with_name(name)
    return str(candidate) if candidate.exists() else (shutil.which(name) or name)


def _start(command: list[str], environment: dict[str, str]) -> subprocess.Popen[str]:
    """A child in its own session (Ctrl-C reaches only us; we stop it in order), its output
    piped to us line by line."""
    return subprocess.Popen(
        command,
        env=environment,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        start_new_session=True,
    )


def server_environment() -> dict[str, str]:
    # MLflow's background job runner (GenAI scoring, trace archival) is 8 processes we never use.
    return {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **os.environ}


def _deployments_served(api_url: str) -> bool:
    """Whether every deployment is registered, not only the first `serve` got to."""
    try:
        responses = [httpx.get(f"{api_url}/deployments/name/{name}") for name in SERVED_DEPLOYMENTS]
    except httpx.HTTPError:
        return False
    return all(response.status_code == 200 for response in responses)


class _Children:
    """The servers ui starts: each watched by the reaper (ended within seconds if we are killed,
    SIGKILL included) and its output relayed; stopped in reverse order."""

    def __init__(self, relay: OutputRelay, reaper: Reaper):
        self.relay = relay
        self.reaper = reaper
        self.processes: list[subprocess.Popen] = []

    def start(
        self, name: str, command: list[str], environment: dict[str, str], everything: bool = False
    ) -> subprocess.Popen[str]:
        """`command` started, its output relayed under `name` (`everything`: all its stderr)."""
        process = _start(command, environment)
        self.processes.append(process)
        self.reaper.watch(process)
        assert process.stdout is not None and process.stderr is not None  # both piped
        self.relay.follow(name, process.stdout)
        self.relay.follow(name, process.stderr, everything=everything)
        return process

    def stop(self) -> None:
        for process in reversed(self.processes):  # serve first, while its server still answers
            stop_tree(process, SERVER_STOP_GRACE_SECONDS)


def _exit_through_finally_on_signals() -> None:
    """Ctrl-C (even if the shell started us with SIGINT ignored), `kill` and a closed terminal
    all end in `finally`."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    signal.signal(signal.SIGHUP, lambda *_: sys.exit(128 + signal.SIGHUP))


def _mlflow_ui_command(tracking: TrackingConfig) -> list[str]:
    command = [tool("mlflow"), "ui", "--host", HOST, "--port", str(MLFLOW_PORT)]
    command += ["--workers", "1"]  # one user: spare the cores for training
    command += ["--uvicorn-opts", "--no-access-log --log-level warning"]
    command += ["--backend-store-uri", tracking.tracking_uri or ""]
    if tracking.artifact_root:
        command += ["--default-artifact-root", tracking.artifact_root]
    return command


def _serve_until_it_exits(
    children: _Children, params: Params, params_path: Path, prefect_url: str
) -> int:
    """`towerbench serve` against the Prefect server; says when its deployments are up, and
    returns its exit code."""
    environment = dict(os.environ, PREFECT_API_URL=f"{prefect_url}/api")
    command = [tool("towerbench"), "serve", "--params", str(params_path)]
    command += ["--tracking-uri", params.tracking.tracking_uri or ""]
    # Its stdout is Prefect's banner; the runs log to stderr.
    served = children.start("serve", command, environment, everything=True)
    children.relay.say(
        f"Logs         {children.relay.log_dir}  (Ctrl-C stops everything and removes them)"
    )
    while served.poll() is None and not _deployments_served(f"{prefect_url}/api"):
        time.sleep(2)
    if served.poll() is None:
        schedule = f"{params.nightly.cron} {params.nightly.timezone}"
        children.relay.say(
            f"Deployments  {PIPELINE_DEPLOYMENT} and {ADVISE_DEPLOYMENT} (Run in the Prefect "
            f"UI), {NIGHTLY_DEPLOYMENT} ({schedule})"
        )
    return served.wait()


def run_ui(params: Params, params_path: Path) -> None:
    """Prefect server + MLflow UI + `towerbench serve`, all on 127.0.0.1, until Ctrl-C.

    The terminal gets one line per server, then the served runs' logs; the servers' own output
    goes to log files (see serve/process_output.py).
    """
    from towerbench.tasks.tracking import ensure_experiment, experiment_name, runs_url

    for port in (PREFECT_PORT, MLFLOW_PORT):
        if not _port_free(port):
            raise TowerbenchError(f"{HOST}:{port} is already in use; stop what runs there first")
    _exit_through_finally_on_signals()
    telemetry_off_unless_opted_in()
    tracking = params.tracking
    # The servers' logs and temporary files, removed when ui ends (kept when it fails).
    scratch = Path(tempfile.mkdtemp(prefix="towerbench-ui-"))
    relay = OutputRelay(scratch / "logs")
    relay.log_dir.mkdir()
    os.environ["TMPDIR"] = str(scratch)  # the children's temporary files go there too
    prefect_url = f"http://{HOST}:{PREFECT_PORT}"
    children = _Children(relay, Reaper())
    children.reaper.remove(str(scratch))
    try:
        prefect_server = children.start(
            "prefect-server",
            [tool("prefect"), "server", "start", "--host", HOST, "--port", str(PREFECT_PORT)],
            server_environment(),
        )
        # Before the MLflow server opens the store: the link below goes straight to its runs.
        experiment_id = ensure_experiment(tracking, experiment_name(tracking, params.train))
        mlflow_server = children.start(
            "mlflow-ui", _mlflow_ui_command(tracking), server_environment()
        )
        _wait_for(f"{prefect_url}/api/health", prefect_server)
        relay.say(f"Prefect UI   {prefect_url}")
        _wait_for(f"http://{HOST}:{MLFLOW_PORT}/health", mlflow_server)
        ui = tracking.model_copy(update={"ui_url": f"http://{HOST}:{MLFLOW_PORT}"})
        relay.say(f"MLflow UI    {runs_url(ui, experiment_id)}")
        code = _serve_until_it_exits(children, params, params_path, prefect_url)
        children.reaper.keep(str(scratch))  # the error names its logs
        raise TowerbenchError(f"`towerbench serve` exited with code {code}; see {relay.log_dir}")
    finally:
        children.stop()
        relay.finish()
        children.reaper.close()
