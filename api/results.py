"""What `towerbench.train` returns: one run's result, read back from its MLflow run."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel

from towerbench.core.outcome import Status, SweepResult

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient


class TrainResult(BaseModel):
    """A configuration's final evaluation, losses and speed, and where to see the run."""

    run_id: str
    status: Status
    error: str | None = None
    metric: str | None = None  # train.metric as the run resolved it (`accuracy`, `mae`, ...)
    test_metric: float | None = None  # its value on the test split (raw weights)
    ema_test_metric: float | None = None
    test_accuracy: float | None = None  # runs judged by accuracy: test_metric
    ema_test_accuracy: float | None = None  # the moving average of the weights
    # With BatchNorm: with its moving statistics, and with statistics re-estimated at the
    # weights (model.batch_norm_statistics); the EMA weights with their own.
    test_accuracy_moving_bn: float | None = None
    test_accuracy_recomputed_bn: float | None = None
    ema_test_accuracy_recomputed_bn: float | None = None
    train_cross_entropy: float | None = None  # the last epoch's, over all towers' examples
    test_cross_entropy: float | None = None
    images_per_sec: float | None = None
    epochs: float | None = None  # as trained
    updates: int | None = None  # optimizer steps
    wall_time: float | None = None
    mlflow_url: str
    report: str


def train_result(sweep: SweepResult, client: MlflowClient) -> TrainResult:
    """The one configuration of `sweep` with its run's final metrics."""
    (config,) = sweep.configs
    run = client.get_run(config.run_id)
    metrics = run.data.metrics
    steps = metrics.get("steps")
    return TrainResult(
        run_id=config.run_id,
        status=config.status,
        error=config.error,
        metric=config.metric,
        test_metric=config.test_metric,
        ema_test_metric=metrics.get("ema_test_metric"),
        test_accuracy=config.test_accuracy,
        ema_test_accuracy=metrics.get("ema_test_accuracy"),
        test_accuracy_moving_bn=metrics.get("test_accuracy_moving_bn"),
        test_accuracy_recomputed_bn=metrics.get("test_accuracy_recomputed_bn"),
        ema_test_accuracy_recomputed_bn=metrics.get("ema_test_accuracy_recomputed_bn"),
        train_cross_entropy=metrics.get("train_cross_entropy"),
        test_cross_entropy=metrics.get("test_cross_entropy"),
        images_per_sec=metrics.get("images_per_sec"),
        epochs=metrics.get("epochs"),
        updates=int(steps) if steps is not None else None,
        wall_time=metrics.get("wall_time"),
        mlflow_url=sweep.mlflow_url,
        report=sweep.report,
    )
