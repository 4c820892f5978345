"""What a sweep says of each run: the metric it is judged by and its test value."""

from __future__ import annotations

from towerbench.core.outcome import ConfigSummary, Status, SweepResult


def _completed(index: int, **fields: object) -> ConfigSummary:
    return ConfigSummary.model_validate(
        {
            "status": Status.COMPLETED,
            "run_id": f"r{index}",
            "name": f"c{index}",
            "towers": 1,
            "workers": 1,
            "seed": index,
            **fields,
        }
    )


def test_the_summary_names_each_run_s_metric() -> None:
    by_mae = _completed(0, metric="mae", test_metric=0.25)
    by_accuracy = _completed(1, metric="accuracy", test_metric=0.9, test_accuracy=0.9)
    older = _completed(2, test_accuracy=0.9)  # recorded before runs named their metric
    result = SweepResult(
        parent_run_id="p", mlflow_url="u", configs=[by_mae, by_accuracy, older], report="r.md"
    )
    mae, accuracy, old, *_ = result.summary_lines()
    assert "test MAE 0.2500" in mae and "accuracy" not in mae
    assert accuracy.endswith("test accuracy 0.9000") and old.endswith("test accuracy 0.9000")
