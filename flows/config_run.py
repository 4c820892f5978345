"""The flow a pool's worker runs for one configuration of `towerbench sweep --pool`.

The sweep created the configuration's MLflow run and wrote which attempt owns it; this flow
checks that the worker holds the sweep's data (pulling it with DVC), records where it runs, and
trains in a process of its own as a local sweep would (tasks/training/train.py), resuming from
the run's checkpoint when the data folder is shared. An attempt the sweep has replaced stops.
"""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
from pathlib import Path

from mlflow.entities import Run
from prefect import flow, get_run_logger
from prefect.runtime import flow_run

from towerbench.config.losses import parse_loss
from towerbench.config.model_ref import function_in_checkout, model_in_checkout
from towerbench.config.params import TrackingConfig
from towerbench.core.errors import TowerbenchError
from towerbench.core.outcome import Outcome, Status
from towerbench.tasks.data.check import ensure_data
from towerbench.tasks.tracking import (
    ATTEMPT_TAG,
    DEVICES_TAG,
    FLOW_RUN_TAG,
    HOST_TAG,
    WORKER_TAG,
    client_for,
    mark_failed,
    reopen_run,
    run_outcome,
    set_tags,
)
from towerbench.tasks.training.fork_server import start_fork_server_for
from towerbench.tasks.training.train import checkpoint_dir, train_configuration
from towerbench.tasks.training.worker import WorkerRequest

CONFIG_FLOW = "train-config"
WORKER_ENV = "PREFECT__WORKER_NAME"  # set by Prefect's worker

# Set by `towerbench worker` for the flow runs it starts (they inherit its environment).
PROJECT_ENV = "TOWERBENCH_PROJECT"
DEVICES_ENV = "TOWERBENCH_DEVICES"


def deployment_name(pool: str) -> str:
    """The per-configuration deployment of `pool` (one per pool: a deployment has one pool)."""
    return f"{CONFIG_FLOW}/towerbench-config-{pool}"


def _end_with_the_worker() -> None:
    """Exit when the worker that started this flow run is gone (its process runs in a session of
    its own, so nothing else would stop it); the training process then marks its run KILLED and
    keeps its checkpoint, and the sweep gives the configuration to another worker."""
    worker = os.getppid()

    def watch() -> None:
        while os.getppid() == worker:
            time.sleep(1.0)
        os._exit(143)

    threading.Thread(target=watch, daemon=True, name="watch-worker").start()


def _owner(run: Run) -> int:
    """The attempt the sweep gave the run to last."""
    return int(run.data.tags.get(ATTEMPT_TAG, "0"))


@flow(name=CONFIG_FLOW)
def train_config(request: WorkerRequest, name: str, attempt: int = 1) -> Outcome:
    """Train one configuration of a sweep on this worker's devices; a relative `data_dir` is
    taken in the worker's project folder."""
    logger = get_run_logger()
    _end_with_the_worker()
    start_fork_server_for([request.config], pool=None)  # imports beside the checks below
    tracking = TrackingConfig(tracking_uri=request.tracking_uri)
    run = client_for(tracking).get_run(request.run_id)
    earlier = run_outcome(run)
    if earlier.status.ended:  # an earlier attempt finished after all
        logger.info("%s: already %s", name, earlier.status)
        return earlier
    if _owner(run) != attempt:
        raise TowerbenchError(f"{name}: attempt {attempt} was replaced by a later one")
    project = Path(os.environ.get(PROJECT_ENV, os.getcwd()))
    data_dir = project / request.data_dir  # an absolute data_dir (a shared mount) stays as is
    try:
        ensure_data(project, data_dir, request.config.dataset, request.data_version)
        model = model_in_checkout(request.config.model, project, request.model_digest)
        loss = function_in_checkout(
            parse_loss(request.config.loss), project, request.loss_digest, "loss"
        )
    except TowerbenchError as error:
        mark_failed(tracking, request.run_id, str(error))
        raise
    placement = {
        HOST_TAG: socket.gethostname(),
        WORKER_TAG: os.environ.get(WORKER_ENV, "unknown"),
        DEVICES_TAG: os.environ.get(DEVICES_ENV, "all"),
        FLOW_RUN_TAG: str(flow_run.get_id()),
    }
    reopen_run(tracking, request.run_id, Status.RUNNING)
    set_tags(tracking, request.run_id, placement)
    logger.info("%s: attempt %d on %s", name, attempt, placement[WORKER_TAG])
    checkpoints = checkpoint_dir(data_dir, request.run_id)
    config = request.config.model_copy(update={"model": model, "loss": loss or request.config.loss})
    update = {"data_dir": data_dir, "checkpoint_dir": checkpoints, "config": config}
    local = request.model_copy(update=update)
    outcome = train_configuration(local, name, tracking)
    if _owner(client_for(tracking).get_run(request.run_id)) == attempt:  # else it resumes here
        shutil.rmtree(checkpoints, ignore_errors=True)  # the model is in MLflow
    return outcome
