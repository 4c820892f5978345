"""Train one configuration in its own process and follow it live.

The process (tasks/training/worker.py) logs into the MLflow run created for it; this side relays its
progress to Prefect (run logger + a progress artifact) and, if the process dies without finishing
(crash, out-of-memory kill), records the run as failed so the sweep can go on. A configuration
with several workers runs as that many processes on this machine
(tasks/training/local_cluster.py), whose chief logs and reports.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any
from uuid import UUID

from prefect import get_run_logger, task
from prefect.artifacts import update_progress_artifact
from prefect.cache_policies import NO_CACHE

from towerbench.config.metrics import resolved_metric
from towerbench.config.params import TrackingConfig
from towerbench.config.sections import TrainConfig
from towerbench.core.errors import TowerbenchError
from towerbench.core.metrics import METRICS
from towerbench.core.outcome import Outcome, Status
from towerbench.core.processes import stop
from towerbench.core.tfrecord_format import dataset_dir, load_manifest
from towerbench.model.training_data import check_training_data
from towerbench.tasks.tracking import mark_failed, mark_killed, tracking_server_watched
from towerbench.tasks.training.fork_server import TrainingProcess
from towerbench.tasks.training.local_cluster import last_error, run_local_cluster
from towerbench.tasks.training.progress import tell, tell_finished
from towerbench.tasks.training.worker import EVENT_PREFIX, WorkerRequest


def _error_line(log_text: str, returncode: int) -> str:
    if error := last_error(log_text):
        return error
    if returncode < 0:
        return f"training process killed by signal {-returncode} (out of memory?)"
    lines = [line.strip() for line in log_text.splitlines() if line.strip()]
    return lines[-1] if lines else f"training process exited with code {returncode}"


# A worker of a multi-worker configuration: a process of its own, the request on its stdin.
WORKER_COMMAND = [sys.executable, "-m", "towerbench.tasks.training.worker"]
CHECKPOINTS = "checkpoints"  # under the data dir, one folder per MLflow run


def checkpoint_dir(data_dir: Path, run_id: str) -> Path:
    """Where a configuration's run keeps the checkpoint it resumes from."""
    return data_dir / CHECKPOINTS / run_id


class TrainingFailed(TowerbenchError):
    """A configuration's training process failed; the message is its one-line cause (its task
    shows it without a traceback: tasks/user_errors_log.py). A command that ends on it exits 1."""

    exit_status = 1


# How long a stopped training process has to mark its run and exit before it is killed (a
# process still loading TensorFlow cannot run its signal handler; the run is marked for it).
STOP_GRACE_SECONDS = 3


class _Events:
    """Reads the worker's stdout: events go to `on_event`, the result is kept."""

    def __init__(self, on_event: Callable[[dict[str, Any]], None]):
        self.on_event = on_event
        self.result: Outcome | None = None

    def __call__(self, line: str) -> None:
        if not line.startswith(EVENT_PREFIX):
            return
        event = json.loads(line.removeprefix(EVENT_PREFIX))
        if event["event"] == "result":
            self.result = Outcome.model_validate(event)
        else:
            self.on_event(event)


def training_environment(tracking_uri: str) -> dict[str, str]:
    """The environment of a training process that logs to `tracking_uri`."""
    environment = dict(os.environ, MLFLOW_TRACKING_URI=tracking_uri)
    environment.pop("MLFLOW_RUN_ID", None)  # would override the run id we pass
    environment.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return environment


def run_training_process(
    request: WorkerRequest,
    on_event: Callable[[dict[str, Any]], None],
) -> Outcome:
    """Run the worker to completion; returns its outcome (a failed one with the error and log).

    The worker runs in its own session, so a terminal's Ctrl-C reaches only this process, which
    then stops the worker itself; a worker whose parent disappears stops on its own.
    """
    environment = training_environment(request.tracking_uri)
    events = _Events(on_event)
    if request.config.workers > 1:
        outcome = run_local_cluster(
            WORKER_COMMAND,
            request.config.workers,
            events,
            request.model_dump_json(),
            environment,
            capture_chief_stderr=True,
        )
        if outcome.status == 0 and events.result is not None:
            return events.result
        log_text = "\n".join(outcome.stderr)
        return Outcome.failed("; ".join(outcome.failures()), log_text)
    with contextlib.closing(TrainingProcess(request.model_dump_json(), environment)) as process:
        try:
            for line in process.stdout:
                events(line)
            returncode = process.wait()
        except BaseException:  # Ctrl-C, SIGTERM, a crash of ours: the worker ends with us
            stop([process], STOP_GRACE_SECONDS)
            raise
        process.log.seek(0)
        log_text = process.log.read()
    if returncode == 0 and events.result is not None:
        return events.result
    return Outcome.failed(_error_line(log_text, returncode), log_text)


def _metric_label(config: TrainConfig, data_dir: Path) -> str:
    """How the progress lines name the metric the run is judged by (`accuracy`, `MAE`): its
    train.metric as the training process resolves it (`auto`: the loss's own)."""
    labels = load_manifest(dataset_dir(data_dir, config.dataset)).labels
    return METRICS[resolved_metric(config.metric, config.loss, labels)].label


# Never cached: every call is a new training run with its own MLflow run.
@task(name="train-configuration", task_run_name="train {name}", cache_policy=NO_CACHE)
def train_configuration(
    request: WorkerRequest,
    name: str,
    tracking: TrackingConfig,
    progress_artifact: UUID | None = None,
    progress_span: tuple[float, float] = (0.0, 100.0),
) -> Outcome:
    """One configuration; a failed run is recorded in MLflow and raised as `TrainingFailed`, so
    its task shows Failed (the sweep goes on with the next configuration)."""
    logger = get_run_logger()
    start, end = progress_span
    epochs = request.config.epochs
    try:  # a dataset that is not there, or damaged, fails at once without starting a process
        check_training_data([request.config], request.data_dir)
        label = _metric_label(request.config, request.data_dir)
    except TowerbenchError as error:
        with tracking_server_watched(tracking):
            mark_failed(tracking, request.run_id, str(error), "")
        tell_finished(f"{name} failed: {error}")
        raise TrainingFailed(f"{name}: {error}") from None

    def on_event(event: dict[str, Any]) -> None:
        if event["event"] == "epoch":
            logger.info(
                "%s epoch %.3g: test %s %.4f, loss %.4f, %.0f images/s",
                name,
                event.get("epoch", float("nan")),
                label,
                event.get("test_metric") or float("nan"),
                event.get("total_loss") or float("nan"),
                event.get("images_per_sec") or float("nan"),
            )
        epoch = event.get("epoch")
        if epoch is not None:
            tell(name, epoch, epochs)
        if progress_artifact is not None and epoch is not None:
            fraction = min(max(epoch / epochs, 0.0), 1.0)
            update_progress_artifact(progress_artifact, start + (end - start) * fraction)

    try:
        outcome = run_training_process(request, on_event)
    except BaseException:  # Ctrl-C, SIGTERM: the process is stopped; never leave its run RUNNING
        with contextlib.suppress(Exception):
            mark_killed(tracking, request.run_id, "stopped; run the same sweep again to resume")
        raise
    if progress_artifact is not None:
        update_progress_artifact(progress_artifact, end)
    if outcome.status == Status.FAILED:
        # A run that failed because the tracking server went away ends the sweep, in one line.
        with tracking_server_watched(tracking):
            mark_failed(tracking, request.run_id, outcome.error or "", outcome.log)
        tell_finished(f"{name} failed: {outcome.error}")
        raise TrainingFailed(f"{name}: {outcome.error}")
    judged_by, value = outcome.judged_by()
    ended = f"{name} {outcome.status}: test {judged_by} {value or 0:.4f}"
    logger.info(ended)
    tell_finished(ended)
    if outcome.unstable:
        logger.warning("%s is unstable: %s", name, outcome.unstable)
    return outcome
