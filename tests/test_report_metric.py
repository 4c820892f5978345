"""A sweep judged by a lower-is-better metric (MAE): its verdicts, tables, figures and summary
read in MAE, in its own units, and the report never says "accuracy"."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from mlflow.entities import Param, Run, RunData, RunInfo
from scipy import stats

from towerbench.config.grid import canonical, group_name, run_name
from towerbench.config.sections import TrainConfig
from towerbench.core.errors import TowerbenchError
from towerbench.core.metrics import METRICS
from towerbench.core.outcome import Status
from towerbench.tasks.report.figures import report_figures
from towerbench.tasks.report.publish import summary_metrics
from towerbench.tasks.report.reading import judged_by
from towerbench.tasks.report.render import ReportHeader, nightly_section, render_report
from towerbench.tasks.report.statistics import Curve, RunRecord
from towerbench.tasks.report.verdicts import compare

MAE = METRICS["mae"]
ONE_TOWER = [0.200, 0.202, 0.204]


def _record(towers: int, seed: int, mae: float, metric: str = "mae") -> RunRecord:
    judged = METRICS[metric]
    config = canonical(
        TrainConfig(
            towers=towers,
            global_batch=32 * towers,
            reference_batch=32,
            lr_scaling="linear",
            seed=seed,
            loss="mse",
            metric=metric,
            epochs=4,
        )
    )
    values = [2 * mae, 1.2 * mae, mae, mae]  # an error falling as it trains, then flat
    return RunRecord(
        run_id=f"run-{towers}-{seed}",
        name=run_name(config),
        group=group_name(config),
        config=config,
        status=Status.COMPLETED,
        final_score=judged.score(mae),
        images_per_sec=1000.0,
        effective_lr=0.1 * towers,
        noise_scale=None,
        device_kind="logical CPU",
        curve=Curve([1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0], [judged.score(v) for v in values]),
        steps=10.0,
        losses={
            "train_cross_entropy": 0.05,
            "test_cross_entropy": 0.06,
            "generalization_gap": 0.01,
        },
        metric=judged,
    )


def _sweep(four_towers: list[float]) -> list[RunRecord]:
    ones = [_record(1, seed, mae) for seed, mae in enumerate(ONE_TOWER)]
    return ones + [_record(4, seed, mae) for seed, mae in enumerate(four_towers)]


def test_a_higher_mae_did_not_reach_one_tower_and_the_interval_is_in_mae() -> None:
    worse = [0.230, 0.233, 0.236]
    rows, target = compare(_sweep(worse), [], None)
    four = next(row for row in rows if row.config.towers == 4)

    expected = stats.ttest_ind(worse, ONE_TOWER, equal_var=False)
    interval = expected.confidence_interval()
    assert four.difference.p_value == pytest.approx(expected.pvalue)
    assert MAE.value(four.difference.difference) == pytest.approx(0.031)  # k towers − 1, in MAE
    low, high = (f"{value:+.2g}".replace("-", "−") for value in interval)
    assert four.verdict.startswith(
        f"did not reach the 1-tower MAE: Δ +0.031, 95% CI [{low}, {high}]"
    )
    # The default margin: 1% of 1 tower's MAE, above which an error is worse.
    assert four.margin == pytest.approx(0.01 * np.mean(ONE_TOWER))
    assert f"the interval lies above +{0.01 * np.mean(ONE_TOWER):.3g}" in four.verdict
    # The timing target: 105% of 1 tower's MAE, as a score.
    assert MAE.value(target) == pytest.approx(1.05 * np.mean(ONE_TOWER))


def test_an_equal_mae_reached_one_tower_below_the_margin() -> None:
    rows, _ = compare(_sweep([0.2005, 0.2015, 0.2035]), [], None, 0.01)
    four = next(row for row in rows if row.config.towers == 4)
    assert four.verdict.startswith("reached the 1-tower MAE: Δ −0.00017")
    assert "the interval lies below +0.01" in four.verdict


def test_the_report_of_a_regression_sweep_never_says_accuracy(tmp_path: Path) -> None:
    records = _sweep([0.230, 0.233, 0.236])
    rows, target = compare(records, [], None)
    earlier, _ = compare(_sweep([0.220, 0.221, 0.222]), [], None)
    nightly = nightly_section("previous", True, rows, {row.group: row for row in earlier})
    names = report_figures(records, tmp_path)
    header = ReportHeader("a sweep", "parent", "run", "charts", "v1", ["logical CPU"], target)
    text = render_report(header, rows, records, {name: name for name in names}, nightly)

    assert "accuracy" not in text.lower()
    assert "| test MAE | Δ vs 1 tower |" in text and "## Test MAE per epoch" in text
    assert "| 0.233 ± 0.003 |" in text  # the 4-tower MAE over seeds, in its own units, not %
    assert "time-to-MAE target 0.212" in text and "| s to 0.212 |" in text
    assert "lies below the margin (report.margin; default: 1% of" in text
    assert "| MAE now |" in text and "+0.012" in text  # nightly: MAE rose 0.0117 since
    assert names[:2] == ["mae_vs_epoch.png", "mae_vs_time.png"]
    summary = summary_metrics(rows)
    assert summary["mae/towers-4_agg-mean_lr-linear_warmup-0"] == pytest.approx(0.233)
    assert summary["delta/towers-4_agg-mean_lr-linear_warmup-0"] == pytest.approx(0.031)
    assert not any(key.startswith(("accuracy", "delta_pp")) for key in summary)


def test_a_sweep_judged_by_two_metrics_is_refused_in_one_line() -> None:
    records = _sweep([0.23]) + [dataclasses.replace(_record(2, 0, 0.2, "rmse"))]
    with pytest.raises(TowerbenchError) as raised:
        compare(records, [], None)
    assert str(raised.value).startswith("the runs compared are judged by mae and rmse")
    assert "\n" not in str(raised.value)


def _run(metric: str | None) -> Run:
    info = RunInfo("r", "0", "u", "FAILED", 0, None, "active")
    return Run(info, RunData(params=[Param("effective.metric", metric)] if metric else []))


def test_a_run_that_states_no_metric_is_judged_by_its_sweep_s() -> None:
    # A run that failed before training states what its sweep opened it with; older runs none.
    assert judged_by([_run("mae"), _run(None)]) == MAE
    assert judged_by([_run(None)]).name == "accuracy"
    with pytest.raises(TowerbenchError, match=r"^the sweep's runs are judged by mae and rmse: "):
        judged_by([_run("mae"), _run("rmse")])


def test_a_fraction_s_margin_or_target_of_one_is_refused_and_an_error_s_is_its_units() -> None:
    accuracy = [dataclasses.replace(r, metric=METRICS["accuracy"]) for r in _sweep([0.23])]
    with pytest.raises(TowerbenchError, match=r"^report.margin 1: accuracy is judged as a frac"):
        compare(accuracy, [], None, 1.0)
    rows, _ = compare(_sweep([0.23]), [], None, 12.5)  # MAE in the labels' units: taken
    assert all(row.margin == 12.5 for row in rows)
    # Never exponent notation for an error in large units.
    assert (MAE.shown(-123456.7), MAE.change(-1234.5), MAE.bound(0.00202)) == (
        "123500",
        "+1200",
        "+0.00202",
    )
