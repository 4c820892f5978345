"""What a training run reports: one `EpochRecord` per epoch, then its `FinalMetrics`.

The field names are the names everywhere else: MLflow metrics and params, the keys of
`towerbench train --json`, the checkpoint folder's history file. They are spelled here once and
every reader imports them from here.
"""

from __future__ import annotations

import math
from dataclasses import Field, asdict, dataclass, field, fields
from typing import Any

import numpy as np

from towerbench.config.sections import TrainConfig
from towerbench.core.outcome import Status
from towerbench.core.tfrecord_format import LabelKind

# Field metadata: how a final metric is logged to MLflow (fields without it are not logged from
# here: `global_batch` is already a config param, `unstable` is a tag).
_METRIC = {"mlflow": "metric"}
_LOSS = {"mlflow": "metric", "loss_table": True}  # a metric of the report's loss table


def _param(name: str | None = None) -> dict[str, str]:
    return {"mlflow": "param", "name": name} if name else {"mlflow": "param"}


def finite_numbers(values: dict[str, Any]) -> dict[str, float]:
    """The finite numbers of `values` as floats (JSON and MLflow have no NaN; epochs without
    evaluation carry NaN test metrics)."""
    return {
        key: float(value)
        for key, value in values.items()
        if isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(float(value))
    }


def _present(record: Any) -> dict[str, Any]:
    """The fields that have a value (optional ones are None when they do not apply)."""
    return {key: value for key, value in asdict(record).items() if value is not None}


@dataclass(frozen=True)
class EpochRecord:
    """The end of an epoch: training metrics over the epoch and, when it was evaluated, on the
    test split (NaN otherwise)."""

    epoch: float  # steps / steps per epoch: fractional when a run ends mid-epoch
    step: int
    lr: float  # the mean LR of the epoch's steps
    cross_entropy: float  # mean over the epoch's examples of all towers
    weight_decay_loss: float  # the last step's
    total_loss: float  # cross_entropy + weight_decay_loss
    train_accuracy: float
    images_per_sec: float
    step_time: float
    wall_time: float
    test_cross_entropy: float = math.nan  # the loss (train.loss) on the test split
    test_metric: float = math.nan  # train.metric's value: raw weights
    ema_test_metric: float = math.nan  # moving average of the weights
    test_accuracy: float = math.nan  # raw weights (runs judged by accuracy: test_metric)
    ema_test_accuracy: float = math.nan  # moving average of the weights
    # With BatchNorm: the raw weights with its moving statistics (test_accuracy under eval_bn
    # moving) and with statistics re-estimated at them; the EMA weights with their own.
    test_accuracy_moving_bn: float | None = None
    test_accuracy_recomputed_bn: float | None = None
    ema_test_accuracy_recomputed_bn: float | None = None
    noise_scale: float | None = None  # k >= 2 towers only
    lr_first: float | None = None  # the epoch's first and last step's LR, where they differ
    lr_last: float | None = None
    # lr_scaling adascale only (model.adascale): the last step's gain, the averaged sigma^2 (of a
    # reference-batch gradient) and |mu|^2, and the progress tau in reference steps.
    adascale_gain: float | None = None
    adascale_sigma_sq: float | None = None
    adascale_mu_sq: float | None = None
    adascale_tau: float | None = None

    def metrics(self) -> dict[str, float]:
        """The MLflow metrics of this epoch (the progress events carry the same)."""
        return finite_numbers(asdict(self))

    def to_dict(self) -> dict[str, float]:
        """The history file's entry (NaN stays: a test metric not measured this epoch)."""
        return _present(self)

    @classmethod
    def from_dict(cls, entry: dict[str, Any]) -> EpochRecord:
        # History files before these records stored the step as a float.
        return cls(**{**entry, "step": int(entry["step"])})


@dataclass(frozen=True)
class FinalMetrics:
    """A run's result: final evaluation, speed, where it ran, its last losses."""

    # Runs judged by accuracy: test_metric and ema_test_metric (None for other metrics).
    test_accuracy: float | None = field(metadata=_METRIC)  # raw weights, whole test split
    ema_test_accuracy: float | None = field(metadata=_METRIC)
    test_examples: int = field(metadata=_METRIC)
    images_per_sec: float = field(metadata=_METRIC)  # steady state: steps that traced are left out
    step_time: float = field(metadata=_METRIC)
    wall_time: float = field(metadata=_METRIC)
    steps: int = field(metadata=_METRIC)
    epochs: float = field(metadata=_METRIC)
    global_batch: int
    per_tower_batch: int = field(metadata=_param())
    # The peak LR after scaling; adascale: base LR x the run's mean gain tau / updates.
    effective_lr: float = field(metadata=_param())
    device_kind: str = field(metadata=_param())
    device_names: list[str] = field(metadata=_param())
    # The config's `parameter_device` param is the choice; this is the device it resolved to.
    parameter_device: str = field(metadata=_param("parameter_device_name"))
    replicas: int = field(metadata=_param())  # towers over all workers
    metric: str = field(
        metadata=_param("effective.metric")
    )  # train.metric as resolved (`auto`: the loss's own)
    test_metric: float = field(metadata=_METRIC)  # its value: raw weights, whole test split
    ema_test_metric: float = field(metadata=_METRIC)
    # The workers' host:port, chief first; empty for a run in one process.
    cluster: list[str] = field(default_factory=list, metadata=_param())
    noise_scale: float | None = field(default=None, metadata=_METRIC)  # k >= 2 towers only
    # With BatchNorm, the last evaluation's (EpochRecord's fields of these names).
    test_accuracy_moving_bn: float | None = field(default=None, metadata=_METRIC)
    test_accuracy_recomputed_bn: float | None = field(default=None, metadata=_METRIC)
    ema_test_accuracy_recomputed_bn: float | None = field(default=None, metadata=_METRIC)
    # The last epoch's training losses (all towers), the last test cross-entropy and the gap:
    # what the report's loss paradox is made of. None when nothing was trained or tested.
    train_cross_entropy: float | None = field(default=None, metadata=_LOSS)
    train_weight_decay_loss: float | None = field(default=None, metadata=_LOSS)
    train_total_loss: float | None = field(default=None, metadata=_LOSS)
    test_cross_entropy: float | None = field(default=None, metadata=_LOSS)
    generalization_gap: float | None = field(default=None, metadata=_LOSS)
    unstable: str | None = None  # why learning counts as collapsed (see model.stability)

    def to_dict(self) -> dict[str, Any]:
        """By name, the fields that apply (the keys of `towerbench train --json`)."""
        return _present(self)

    def mlflow_metrics(self) -> dict[str, float]:
        values = {item.name: getattr(self, item.name) for item in _logged_as("metric")}
        return finite_numbers(values)

    def mlflow_params(self) -> dict[str, str | float | int]:
        params = {}
        for item in _logged_as("param"):
            value = getattr(self, item.name)
            if value == []:
                continue
            params[item.metadata.get("name", item.name)] = (
                ",".join(value) if isinstance(value, list) else value
            )
        return params


def _logged_as(kind: str) -> list[Field]:
    return [item for item in fields(FinalMetrics) if item.metadata.get("mlflow") == kind]


# The final metrics that make up the report's loss table.
LOSS_METRICS = tuple(item.name for item in fields(FinalMetrics) if item.metadata.get("loss_table"))


def last_losses(history: list[EpochRecord]) -> dict[str, float]:
    """The loss fields of `FinalMetrics`: the last epoch's training losses, the last test
    cross-entropy measured, and the gap between them."""
    if not history:
        return {}
    last = history[-1]
    losses = {
        "train_cross_entropy": last.cross_entropy,
        "train_weight_decay_loss": last.weight_decay_loss,
        "train_total_loss": last.total_loss,
    }
    tested = [record.test_cross_entropy for record in history]
    tested = [value for value in tested if math.isfinite(value)]
    if tested:
        losses["test_cross_entropy"] = tested[-1]
        losses["generalization_gap"] = tested[-1] - last.cross_entropy
    return losses


@dataclass
class TrainResult:
    """What a training run produced."""

    config: TrainConfig
    history: list[EpochRecord]
    final: FinalMetrics
    status: Status  # completed or diverged
    confusion_matrix: np.ndarray | None  # [classes, classes], rows = true class; accuracy only
    classes: list[str]
    model: Any = field(repr=False)  # keras.Model with the final raw weights
    labels: LabelKind = "class_ids"  # what the dataset's labels are (its manifest's)
