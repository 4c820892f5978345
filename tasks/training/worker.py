"""One configuration's training run in its own process: forked by the sweep's fork server
(`forked_main`, tasks/training/fork_server.py) or, for a worker of a multi-worker configuration,
`python -m towerbench.tasks.training.worker < request`.

TensorFlow fixes its device layout once per process, and a crash or out-of-memory must not take
the sweep down, so the sweep runs one of these per configuration. It resumes the MLflow run the
sweep created for it, logs every epoch's metrics live, then the evaluation artifacts. It reports
back on stdout with `EVENT_PREFIX` lines; everything else it prints is only log. In a cluster
(TF_CONFIG, several workers) the chief does all that; the other workers only train.
"""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from towerbench.config.params import TrackingConfig
from towerbench.config.sections import TrainConfig
from towerbench.core.errors import TowerbenchError
from towerbench.core.outcome import Outcome, Status
from towerbench.core.processes import forked_from_server, watch_parent
from towerbench.model import cluster
from towerbench.model.records import EpochRecord, finite_numbers
from towerbench.tasks.preflight import bound_mlflow_http
from towerbench.tasks.training.local_cluster import end_with_launcher

EVENT_PREFIX = "@@towerbench "
PROGRESS_INTERVAL_SECONDS = 1.0
# CPU/memory sampling period (MLflow's default, 10 s, misses short runs); MLflow's own variable
# sets another.
SYSTEM_METRICS_SECONDS = float(os.environ.get("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", 5))


class WorkerRequest(BaseModel):
    """What the sweep hands one training process."""

    model_config = ConfigDict(extra="forbid")

    config: TrainConfig
    data_dir: Path
    tracking_uri: str
    run_id: str
    data_version: str
    checkpoint_dir: Path | None = None
    model_digest: str | None = None  # the sweep's model file: a pool worker refuses another
    loss_digest: str | None = None  # the sweep's loss file (train.loss), likewise


# Set once the request is known: stops this run when the process that reads our events is gone.
_sweep_gone: Callable[[], None] | None = None


def emit(event: str, values: dict[str, Any]) -> None:
    """One line for the parent process (finite floats only: JSON has no NaN)."""
    clean = {
        key: (value if not isinstance(value, float) or math.isfinite(value) else None)
        for key, value in values.items()
    }
    try:
        print(EVENT_PREFIX + json.dumps({"event": event, **clean}), flush=True)
    except BrokenPipeError:  # the sweep died before our watch noticed
        if _sweep_gone is not None:
            _sweep_gone()
        raise


def epoch_step(epoch: float) -> int:
    """The MLflow step of a record at `epoch`: the epoch it ends, so runs with different tower
    counts (different optimizer steps per epoch) line up in MLflow's charts.

    Records fall on epoch ends, except the last of a run stopped within an epoch (fractional
    `epochs`, divergence), which gets the next whole number; the exact value is the `epoch` metric.
    """
    return math.ceil(epoch)


def run(request: WorkerRequest) -> Outcome:
    """Train, log live, evaluate; returns the summary sent back to the sweep."""
    import mlflow
    import tensorflow as tf

    from towerbench.core.tfrecord_format import dataset_dir
    from towerbench.model.training import train
    from towerbench.tasks.tracking import DATA_DIR_TAG, DIVERGED_TAG, STATUS_TAG, UNSTABLE_TAG
    from towerbench.tasks.training import evaluate

    config = request.config
    mlflow.log_param("tensorflow_version", tf.__version__)
    evaluate.log_data_input(request.data_dir, config.dataset, request.data_version)
    mlflow.set_tag(DATA_DIR_TAG, str(dataset_dir(request.data_dir, config.dataset).resolve()))

    last_progress = 0.0

    def on_epoch(record: EpochRecord) -> None:
        metrics = record.metrics()
        mlflow.log_metrics(metrics, step=epoch_step(record.epoch))
        emit("epoch", metrics)

    def on_progress(progress: dict[str, float]) -> None:
        nonlocal last_progress
        if time.monotonic() - last_progress >= PROGRESS_INTERVAL_SECONDS:
            last_progress = time.monotonic()
            emit("progress", finite_numbers(progress))

    result = train(
        config,
        request.data_dir,
        request.checkpoint_dir,
        on_epoch=on_epoch,
        on_progress=on_progress,
    )
    final = result.final
    mlflow.log_params(final.mlflow_params())
    mlflow.log_metrics(final.mlflow_metrics(), step=epoch_step(final.epochs))
    evaluate.log_evaluation(result)
    lines: list[str] = []
    result.model.summary(print_fn=lambda line, **_: lines.append(line))
    mlflow.log_text("\n".join(lines), "model_summary.txt")  # layers and parameter counts
    if final.unstable is not None:
        mlflow.set_tag(UNSTABLE_TAG, final.unstable)
    if result.status == Status.DIVERGED:
        mlflow.set_tag(DIVERGED_TAG, final.unstable or "its losses stopped being finite")
    mlflow.set_tag(STATUS_TAG, result.status)
    return Outcome(
        status=result.status,
        unstable=final.unstable,
        metric=final.metric,
        test_metric=final.test_metric,
        test_accuracy=final.test_accuracy,
        images_per_sec=final.images_per_sec,
        wall_time=final.wall_time,
        epochs=final.epochs,
        steps=final.steps,
    )


def _end_with_the_sweep(request: WorkerRequest, sweep_process: int) -> None:
    """Stop when told to (SIGTERM, SIGINT) or when the process that started us (`sweep_process`:
    the sweep's fork server, or a cluster's launcher; noted at start, it may be gone by now) is
    gone: mark the run KILLED with the reason and exit at once. The last epoch's checkpoint stays
    for resume."""

    def stop(reason: str) -> None:
        from towerbench.tasks.tracking import mark_killed

        print(f"error: {reason}", file=sys.stderr, flush=True)
        try:
            mark_killed(TrackingConfig(tracking_uri=request.tracking_uri), request.run_id, reason)
        finally:
            os._exit(143)

    def sweep_gone() -> None:
        stop("the sweep process ended; run the same sweep again to resume from the checkpoint")

    global _sweep_gone
    _sweep_gone = sweep_gone

    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, lambda *_: stop("stopped; run the same sweep again to resume"))
    watch_parent(sweep_process, sweep_gone)


def _exit_status(work: Callable[[], object]) -> int:
    """Run `work`; 0, or a failure as one `error:` line on stderr: 2 for a bad setting, 1 for a
    crash (after its traceback)."""
    try:
        work()
    except TowerbenchError as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        return 2
    except Exception as error:  # noqa: BLE001 - any crash is recorded as this run's failure
        traceback.print_exc()
        # One line: TensorFlow's messages span many ("in user code: ... the actual problem").
        message = " ".join(line.strip() for line in str(error).splitlines() if line.strip())
        print(f"error: {type(error).__name__}: {message[-1000:]}", file=sys.stderr, flush=True)
        return 1
    return 0


def _train_and_log(request: WorkerRequest, sweep_process: int) -> int:
    """Train in the MLflow run the sweep made for `request`; its exit status."""
    if not cluster.Cluster.from_environment().is_chief:
        # The other workers train in step with the chief, which logs and saves.
        from towerbench.model.training import train

        return _exit_status(lambda: train(request.config, request.data_dir))
    _end_with_the_sweep(request, sweep_process)
    bound_mlflow_http()  # also when started by a served deployment, not the CLI
    import mlflow
    from mlflow.entities import RunStatus

    mlflow.set_tracking_uri(request.tracking_uri)
    mlflow.set_system_metrics_sampling_interval(SYSTEM_METRICS_SECONDS)
    outcomes: list[Outcome] = []

    def logged_run() -> None:
        with mlflow.start_run(run_id=request.run_id, log_system_metrics=True):
            outcomes.append(run(request))
            if outcomes[0].status == Status.DIVERGED:  # trained to its end, yet no model
                mlflow.end_run(RunStatus.to_string(RunStatus.FAILED))

    status = _exit_status(logged_run)
    if status == 0:
        emit("result", outcomes[0].model_dump(mode="json"))
    return status


def _leave(status: int) -> None:
    """Exit now: the run is logged and closed, so skip the interpreter's teardown (TensorFlow's
    takes 1.5 s)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def forked_main(request_json: str, environment: dict[str, str], stdout: int, stderr: int) -> None:
    """A configuration's process, forked by the fork server (tasks/training/fork_server.py) with the
    imports done: in a session of its own (a terminal's Ctrl-C reaches only the sweep, which
    stops it), with `environment`, its events on `stdout` and its log on `stderr`."""
    forked_from_server()
    sys.stdout.flush()
    sys.stderr.flush()
    for descriptor, standard in ((stdout, 1), (stderr, 2)):
        os.dup2(descriptor, standard)
        os.close(descriptor)
    os.environ.clear()
    os.environ.update(environment)
    _leave(_train_and_log(WorkerRequest.model_validate_json(request_json), os.getppid()))


def main() -> int:
    """A worker of a multi-worker configuration (tasks/training/local_cluster.py): the request
    on stdin."""
    launcher = os.getppid()
    import towerbench.tasks.training.imports  # noqa: F401

    return _train_and_log(WorkerRequest.model_validate_json(sys.stdin.read()), launcher)


if __name__ == "__main__":
    end_with_launcher()  # a worker of a multi-worker configuration ends with its launcher
    status = main()
    cluster.leave(status)  # a worker of a cluster exits here, once the others are done
    _leave(status)
