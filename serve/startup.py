"""What a command, or a call from Python, takes and starts before it runs a flow on this machine."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

from towerbench.config.grid import expand
from towerbench.config.params import Params
from towerbench.tasks.data.check import manifest_digest
from towerbench.tasks.sweep_lock import only_live_sweep, sweep_key

if TYPE_CHECKING:
    from prefect.server.api.server import SubprocessASGIServer

# Prefect starts a temporary API server when none is configured; its default 20 s start-up
# budget is too short on a busy 2-core machine.
EPHEMERAL_STARTUP_SECONDS = 120


def prepare_prefect(params: Params) -> SubprocessASGIServer | None:
    """Servers checked (one line and exit 2 if one is down); then, when this machine trains the
    sweep, the training processes' fork server started (its imports overlap what follows); then
    Prefect's temporary server started as ours (when no API URL is set), returned if this call
    started it. This process never imports TensorFlow: training, preprocessing and evaluation
    run in processes of their own."""
    startup = os.environ.setdefault(
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", str(EPHEMERAL_STARTUP_SECONDS)
    )
    # Reading a run's artifacts draws a bar per download: after a command's results, or in
    # the middle of a notebook cell's.
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    from towerbench.tasks.preflight import check_servers

    check_servers(params.tracking.tracking_uri)  # before the slow imports and any training
    from towerbench.tasks.training.fork_server import start_fork_server_for

    start_fork_server_for(expand(params.train, params.sweep), params.sweep.pool)
    from towerbench.serve.temporary_server import start_owned_temporary_server

    # The user's value (Prefect checked it), else ours.
    return start_owned_temporary_server(int(startup))


def sweep_lock(params: Params) -> contextlib.AbstractContextManager[None]:
    """The lock of the sweep `params` describes (tasks/sweep_lock.py), as its flow takes it."""
    configs = expand(params.train, params.sweep)
    data_dir = Path(params.data.data_dir).resolve()
    datasets = dict.fromkeys([params.train.dataset, *(config.dataset for config in configs)])
    versions = [manifest_digest(data_dir, dataset) for dataset in datasets]  # as plan_sweep's
    return only_live_sweep(data_dir, sweep_key(configs, versions, "sweep"))
