"""Reading a sweep back from MLflow: its parent run and one `RunRecord` per configuration run."""

from __future__ import annotations

from mlflow.entities import Run
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from towerbench.config.sections import TrainConfig
from towerbench.core.errors import TowerbenchError
from towerbench.core.metrics import METRICS, Metric
from towerbench.core.outcome import Status
from towerbench.model.noise_advice import advising_noise_scale
from towerbench.model.records import LOSS_METRICS
from towerbench.tasks.report.statistics import (
    ADASCALE_METRICS,
    BN_METRICS,
    Curve,
    EpochCurve,
    RunRecord,
)
from towerbench.tasks.tracking import (
    CONFIG_TAG,
    ERROR_TAG,
    FLOW_TAG,
    GROUP_TAG,
    KIND_TAG,
    STATUS_TAG,
    UNSTABLE_TAG,
    children_filter,
)


def _history(client: MlflowClient, run_id: str, key: str) -> dict[int, float]:
    return {point.step: point.value for point in client.get_metric_history(run_id, key)}


def _by_epoch(epochs: dict[int, float], values: dict[int, float]) -> tuple[list, list]:
    """(epochs, values) where both were logged at the same step, in step order."""
    steps = sorted(set(epochs) & set(values))
    return [epochs[step] for step in steps], [values[step] for step in steps]


def _curves(
    client: MlflowClient, run_id: str, metric: Metric
) -> tuple[Curve, dict[str, EpochCurve], dict[str, EpochCurve], dict[str, EpochCurve]]:
    """The test score per evaluation (with its epoch and wall time), the training and test
    loss per epoch, the noise scale and AdaScale's values per epoch, and with BatchNorm the
    accuracies with moving and re-estimated statistics per evaluation (those logged)."""
    epochs = _history(client, run_id, "epoch")
    # Runs logged before train.metric have test_accuracy only.
    values = _history(client, run_id, "test_metric") or _history(client, run_id, "test_accuracy")
    wall = _history(client, run_id, "wall_time")
    steps = sorted(set(values) & set(epochs) & set(wall))
    curve = Curve(
        epochs=[epochs[step] for step in steps],
        wall_times=[wall[step] for step in steps],
        scores=[metric.score(values[step]) for step in steps],
    )
    losses = {
        "train": _by_epoch(epochs, _history(client, run_id, "cross_entropy")),
        "test": _by_epoch(epochs, _history(client, run_id, "test_cross_entropy")),
    }
    logged = {
        key: _by_epoch(epochs, _history(client, run_id, key))
        for key in (*NOISE_METRICS, *BN_METRICS)
    }
    logged = {key: values for key, values in logged.items() if values[0]}
    noise = {key: values for key, values in logged.items() if key in NOISE_METRICS}
    batch_norm = {key: values for key, values in logged.items() if key in BN_METRICS}
    return curve, losses, noise, batch_norm


NOISE_METRICS = ("noise_scale", *ADASCALE_METRICS)


def _float(value: str | float | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _untagged_status(run: Run) -> Status:
    """A run its training process never tagged: failed if MLflow says so, else still running."""
    return Status.FAILED if run.info.status == "FAILED" else Status.RUNNING


def judged_by(runs: list[Run]) -> Metric:
    """The metric a sweep's runs are judged by, as they state it (MLflow param
    `effective.metric`, logged as each run opens); accuracy when none does (runs logged before
    train.metric). Two are refused in one line: a report compares one."""
    stated = sorted({name for run in runs if (name := run.data.params.get("effective.metric"))})
    if len(stated) > 1:
        raise TowerbenchError(
            f"the sweep's runs are judged by {' and '.join(stated)}: a report compares one "
            "metric; sweep losses judged by one metric (train.metric) at a time"
        )
    return METRICS[stated[0] if stated else "accuracy"]


def _final_score(run: Run, metric: Metric) -> float | None:
    metrics = run.data.metrics
    value = metrics.get("test_metric", metrics.get("test_accuracy"))
    return None if value is None else metric.score(value)


def run_record(client: MlflowClient, run: Run, metric: Metric | None = None) -> RunRecord:
    """One run as the report reads it, judged by `metric` (default: what it states)."""
    tags, metrics, params = run.data.tags, run.data.metrics, run.data.params
    metric = metric or judged_by([run])
    curve, loss_curves, noise_curves, bn_curves = _curves(client, run.info.run_id, metric)
    return RunRecord(
        run_id=run.info.run_id,
        name=run.info.run_name,
        group=tags.get(GROUP_TAG, run.info.run_name),
        config=TrainConfig.from_stored(tags[CONFIG_TAG]),
        status=Status(tags.get(STATUS_TAG, _untagged_status(run))),
        final_score=_final_score(run, metric),
        metric=metric,
        images_per_sec=metrics.get("images_per_sec"),
        effective_lr=_float(params.get("effective_lr")),
        noise_scale=advising_noise_scale(noise_curves.get("noise_scale", ([], []))[1]),
        final_noise_scale=metrics.get("noise_scale"),
        device_kind=params.get("device_kind"),
        model_digest=params.get("model_digest"),
        curve=curve,
        error=tags.get(ERROR_TAG),
        unstable=tags.get(UNSTABLE_TAG),
        steps=metrics.get("steps"),
        epochs=metrics.get("epochs"),
        losses={key: metrics[key] for key in LOSS_METRICS if key in metrics},
        loss_curves=loss_curves,
        noise_curves=noise_curves,
        bn_curves=bn_curves,
    )


def sweep_parent(client: MlflowClient, parent_run_id: str) -> Run:
    """The parent run of a sweep, or a clear error naming `--sweep`."""
    try:
        parent = client.get_run(parent_run_id)
    except MlflowException as error:
        raise TowerbenchError(
            f"--sweep: no MLflow run {parent_run_id!r} in {client.tracking_uri}"
        ) from error
    if parent.data.tags.get(KIND_TAG) != "sweep":
        raise TowerbenchError(f"--sweep: run {parent_run_id} is not a sweep's parent run")
    return parent


def sweep_records(client: MlflowClient, parent: Run) -> list[RunRecord]:
    """The configuration runs of a sweep, in start order."""
    children = client.search_runs(
        [parent.info.experiment_id],
        filter_string=children_filter(parent.info.run_id),
        order_by=["attributes.start_time ASC"],
        max_results=5000,
    )
    metric = judged_by(children)  # a run that failed before it started states none
    return [run_record(client, run, metric) for run in children]


def previous_nightly(client: MlflowClient, parent: Run) -> Run | None:
    """The latest finished nightly sweep before `parent` in the same experiment (tagged
    "benchmark" before the flow took its name)."""
    runs = [
        run
        for flow in ("nightly", "benchmark")
        for run in client.search_runs(
            [parent.info.experiment_id],
            filter_string=(
                f"tags.`{KIND_TAG}` = 'sweep' and tags.`{FLOW_TAG}` = '{flow}' "
                f"and attributes.status = 'FINISHED' "
                f"and attributes.start_time < {parent.info.start_time}"
            ),
            order_by=["attributes.start_time DESC"],
            max_results=1,
        )
    ]
    return max(runs, key=lambda run: run.info.start_time, default=None)


def running_note(client: MlflowClient, parent: Run) -> str | None:
    """What to say of a sweep whose parent run is still RUNNING (a sweep in progress, or one
    killed outright before it could close its run); None once it ended."""
    if parent.info.status != "RUNNING":
        return None
    ended = sum(record.status != Status.RUNNING for record in sweep_records(client, parent))
    return (
        f"sweep {parent.info.run_id} is still running (or was killed before it could say it "
        f"stopped): this report covers the {ended} run(s) ended so far; run `towerbench report` "
        "again when the sweep ends (it writes the full report itself)"
    )
