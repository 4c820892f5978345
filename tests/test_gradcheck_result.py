"""gradcheck's typed result: the JSON document `--json` prints and MLflow keeps as
gradcheck.json, and the verdict read from the fields."""

from __future__ import annotations

import pytest

from towerbench.model.gradcheck import (
    Comparison,
    GradcheckResult,
    SumVsMean,
    VariableDifference,
)

KEYS = [
    "model",
    "towers",
    "global_batch",
    "device_kind",
    "devices",
    "learning_rate",
    "weight_decay",
    "loss",
    "cross_tower",
    "batchnorm",
    "dropout_disabled",
    "precision",
    "tolerance",
    "mean_vs_single",
    "sum_vs_mean",
    "mirrored_vs_single",
    "mirrored_vs_mean",
    "ghost_vs_mean",
    "loss_vs_shards",
    "updates_vs_single",
]


def _comparison(relative: float) -> Comparison:
    variable = VariableDifference(
        variable="conv1/kernel",
        grad_max_abs_diff=relative / 10,
        grad_rel_diff=relative,
        weight_max_abs_diff=relative / 100,
        weight_rel_diff=relative / 10,
    )
    return Comparison(
        max_abs_diff=relative / 10,
        max_rel_diff=relative,
        weights_max_abs_diff=relative / 100,
        weights_max_rel_diff=relative / 10,
        per_variable=[variable],
    )


def _result(**changes) -> GradcheckResult:
    values = dict(
        model="tutorial",
        towers=2,
        global_batch=8,
        device_kind="logical CPU",
        devices=["/device:CPU:0", "/device:CPU:1"],
        learning_rate=0.1,
        weight_decay=0.004,
        batchnorm=False,
        dropout_disabled=[],
        precision="float32",
        tolerance=1e-5,
        mean_vs_single=_comparison(6e-7),
        sum_vs_mean=SumVsMean(
            ratio=2.0,
            expected_ratio=2,
            max_abs_diff_from_k_times_mean=0.0,
            max_rel_diff_from_k_times_mean=0.0,
        ),
        mirrored_vs_single=_comparison(6e-7),
        mirrored_vs_mean=_comparison(0.0),
        ghost_vs_mean=_comparison(0.0),
    )
    return GradcheckResult(**(values | changes))


def test_the_json_document_has_every_field_then_the_verdict() -> None:
    document = _result().to_json()
    assert list(document) == [*KEYS, "passed", "batch_dependent", "explanation"]
    assert document["passed"] is True
    assert "That is rounding level" in document["explanation"]
    assert document["mean_vs_single"]["per_variable"][0] == {
        "variable": "conv1/kernel",
        "grad_max_abs_diff": pytest.approx(6e-8),
        "grad_rel_diff": 6e-7,
        "weight_max_abs_diff": pytest.approx(6e-9),
        "weight_rel_diff": pytest.approx(6e-8),
    }
    assert document["sum_vs_mean"] == {
        "ratio": 2.0,
        "expected_ratio": 2,
        "max_abs_diff_from_k_times_mean": 0.0,
        "max_rel_diff_from_k_times_mean": 0.0,
    }


def test_the_workers_appear_only_in_a_cluster() -> None:
    document = _result(workers=2, workers_vs_single=_comparison(2e-5)).to_json()
    keys = [*KEYS[:-1], "workers", "workers_vs_single", KEYS[-1], "passed", "batch_dependent"]
    keys.append("explanation")
    assert list(document) == keys
    assert document["passed"] is False  # the workers disagree beyond the tolerance
    assert "Across 2 worker processes" in document["explanation"]


def test_a_batchnorm_network_is_judged_against_ghost_batchnorm() -> None:
    result = _result(batchnorm=True, mean_vs_single=_comparison(3e-3))
    assert result.passed
    assert "Only the per-shard comparison is at rounding level" in result.explanation
    assert "difference from one device is BatchNorm, not averaging" in result.explanation
