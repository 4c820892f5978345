"""The training records: the names MLflow, `train --json` and the history file have always used."""

import json
import math

from towerbench.model.records import LOSS_METRICS, EpochRecord, FinalMetrics, last_losses


def _final(**optional) -> FinalMetrics:
    return FinalMetrics(
        test_accuracy=0.9,
        ema_test_accuracy=0.8,
        test_examples=103,
        images_per_sec=1000.0,
        step_time=float("nan"),
        wall_time=12.5,
        steps=20,
        epochs=2.0,
        global_batch=64,
        per_tower_batch=32,
        effective_lr=0.05,
        device_kind="logical CPU",
        device_names=["/device:CPU:1", "/device:CPU:2"],
        parameter_device="/device:CPU:0",
        replicas=2,
        metric="accuracy",
        test_metric=0.9,
        ema_test_metric=0.8,
        **optional,
    )


def test_final_metrics_are_split_into_the_mlflow_metrics_and_params_runs_always_had():
    final = _final(noise_scale=300.0, **last_losses([_epoch(1, test_cross_entropy=2.0)]))
    assert sorted(final.mlflow_metrics()) == sorted(
        [
            "test_accuracy",
            "ema_test_accuracy",
            "test_metric",
            "ema_test_metric",
            "test_examples",
            "images_per_sec",
            "wall_time",  # step_time is NaN: not logged
            "steps",
            "epochs",
            "noise_scale",
            *LOSS_METRICS,
        ]
    )
    assert final.mlflow_params() == {
        "per_tower_batch": 32,
        "effective_lr": 0.05,
        "device_kind": "logical CPU",
        "device_names": "/device:CPU:1,/device:CPU:2",
        "parameter_device_name": "/device:CPU:0",
        "replicas": 2,
        "effective.metric": "accuracy",
    }
    assert LOSS_METRICS == (
        "train_cross_entropy",
        "train_weight_decay_loss",
        "train_total_loss",
        "test_cross_entropy",
        "generalization_gap",
    )


def test_final_metrics_leave_out_what_does_not_apply():
    one_tower = _final().to_dict()
    assert "noise_scale" not in one_tower and "unstable" not in one_tower
    assert not set(LOSS_METRICS) & set(one_tower)  # nothing trained in this process
    assert list(one_tower)[:3] == ["test_accuracy", "ema_test_accuracy", "test_examples"]
    assert _final(unstable="collapsed").to_dict()["unstable"] == "collapsed"


def test_last_losses_take_the_last_epoch_and_the_last_test_measured():
    history = [_epoch(1, test_cross_entropy=1.5), _epoch(2)]  # epoch 2 was not evaluated
    assert last_losses(history) == {
        "train_cross_entropy": 2.0,
        "train_weight_decay_loss": 0.5,
        "train_total_loss": 2.5,
        "test_cross_entropy": 1.5,
        "generalization_gap": -0.5,
    }
    assert last_losses([]) == {}


def test_a_history_file_written_before_the_records_still_loads():
    # An entry as the dict-based trainer wrote it: the step as a float, NaN where not evaluated,
    # no noise scale with one tower.
    written = (
        '{"epoch": 1.0, "step": 10.0, "lr": 0.05, "cross_entropy": 2.3, '
        '"weight_decay_loss": 0.4, "total_loss": 2.7, "train_accuracy": 0.12, '
        '"images_per_sec": 125.0, "step_time": 0.48, "wall_time": 5.2, '
        '"test_accuracy": NaN, "ema_test_accuracy": NaN, "test_cross_entropy": NaN}'
    )
    record = EpochRecord.from_dict(json.loads(written))
    assert record.step == 10 and isinstance(record.step, int)
    assert math.isnan(record.test_accuracy) and record.noise_scale is None
    assert "test_accuracy" not in record.metrics() and "noise_scale" not in record.metrics()
    again = EpochRecord.from_dict(json.loads(json.dumps(record.to_dict())))
    assert again.metrics() == record.metrics()


def _epoch(epoch: int, test_cross_entropy: float = float("nan")) -> EpochRecord:
    return EpochRecord(
        epoch=float(epoch),
        step=10 * epoch,
        lr=0.05,
        cross_entropy=2.0,
        weight_decay_loss=0.5,
        total_loss=2.5,
        train_accuracy=0.3,
        images_per_sec=100.0,
        step_time=0.1,
        wall_time=float(epoch),
        test_cross_entropy=test_cross_entropy,
    )
