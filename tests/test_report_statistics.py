"""The report's statistics on constructed numbers, checked against independent computations."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from scipy import stats

from towerbench.config.sections import TrainConfig
from towerbench.model.noise_advice import advising_noise_scale, epochs_needed
from towerbench.tasks.report.columns import models
from towerbench.tasks.report.render import loss_paradox
from towerbench.tasks.report.statistics import (
    Curve,
    RunRecord,
    scaling_efficiency,
    scores_by_epoch,
    summarize,
    time_to_target,
    welch,
)
from towerbench.tasks.report.verdicts import compare, noise_scale_note


def test_welch_matches_scipy_ttest_and_its_confidence_interval() -> None:
    sample = [0.842, 0.851, 0.838, 0.847]
    baseline = [0.861, 0.858, 0.866]
    result = welch(sample, baseline)
    reference = stats.ttest_ind(sample, baseline, equal_var=False)
    interval = reference.confidence_interval(0.95)
    assert result.difference == pytest.approx(np.mean(sample) - np.mean(baseline))
    assert result.p_value == pytest.approx(reference.pvalue, rel=1e-9)
    assert result.ci_low == pytest.approx(interval.low, rel=1e-9)
    assert result.ci_high == pytest.approx(interval.high, rel=1e-9)


def test_welch_textbook_degrees_of_freedom() -> None:
    # Two samples with variances 1 and 4 (n = 5 each): Welch-Satterthwaite gives
    # df = (1/5 + 4/5)^2 / ((1/5)^2/4 + (4/5)^2/4) = 1 / (0.17) ≈ 5.882.
    a = np.array([-2.0, -1.0, 0.0, 1.0, 2.0]) * math.sqrt(1 / 2.5)  # variance 1
    b = np.array([-2.0, -1.0, 0.0, 1.0, 2.0]) * math.sqrt(4 / 2.5) + 1  # variance 4, mean 1
    result = welch(list(a), list(b))
    dof = 1 / 0.17
    t_statistic = -1 / math.sqrt(1 / 5 + 4 / 5)
    assert result.p_value == pytest.approx(2 * stats.t.cdf(t_statistic, dof), rel=1e-9)
    half_width = stats.t.ppf(0.975, dof) * 1.0
    assert result.ci_low == pytest.approx(-1 - half_width)
    assert result.ci_high == pytest.approx(-1 + half_width)


def test_one_seed_gives_a_difference_but_no_test() -> None:
    result = welch([0.80], [0.82, 0.84])
    assert result.difference == pytest.approx(-0.03)
    assert result.p_value is None and result.ci_low is None


def test_summary_uses_the_sample_standard_deviation() -> None:
    summary = summarize([0.8, 0.9, 1.0])
    assert summary.mean == pytest.approx(0.9)
    assert summary.std == pytest.approx(0.1)
    assert math.isnan(summarize([0.5]).std)


def test_time_to_target_is_the_first_evaluation_reaching_it() -> None:
    curve = Curve(epochs=[1, 2, 3], wall_times=[10.0, 21.0, 30.5], scores=[0.5, 0.91, 0.95])
    assert time_to_target(curve, 0.9) == 21.0
    assert time_to_target(curve, 0.99) is None


def test_scaling_efficiency_and_noise_scale_note() -> None:
    assert scaling_efficiency(300.0, 100.0, 4) == pytest.approx(0.75)
    assert "far above" in noise_scale_note(1024, 300.0, 128)
    assert "well below" in noise_scale_note(64, 300.0, 32)
    assert noise_scale_note(64, None, 32) is None
    # (1 + 1024/300) / (1 + 128/300) = 4.413 / 1.427
    assert "the same progress needs ≈ 3.09× the epochs of batch 128" in noise_scale_note(
        1024, 300.0, 128
    )


# A cure-bn-like noise scale per epoch: it grows as the loss falls, to 9228 with the LR at 0.
GROWING_NOISE = [150.0, 300.0, 600.0, 1200.0, 9228.0]


def test_the_advising_noise_scale_is_the_harmonic_mean_over_the_epochs() -> None:
    harmonic = 5 / sum(1 / value for value in GROWING_NOISE)
    assert advising_noise_scale(GROWING_NOISE) == pytest.approx(harmonic)
    assert harmonic == pytest.approx(396.6, abs=0.1)  # not the final 9228
    # Values not measured (None, NaN) or not positive (noise dominated) are left out.
    assert advising_noise_scale([None, math.nan, -5.0, 100.0, 300.0]) == pytest.approx(150.0)
    assert advising_noise_scale([None, math.nan]) is None
    assert epochs_needed(396.6, 128, 512) == pytest.approx((1 + 512 / 396.6) / (1 + 128 / 396.6))


def _record(
    towers: int,
    lr_scaling: str,
    seed: int,
    accuracy: float,
    status: str = "completed",
    warmup_epochs: float = 0,
    epochs: float = 10,
    unstable: str | None = None,
    losses: dict[str, float] | None = None,
    noise_scale: float = 200.0,
    noise_curves: dict[str, tuple[list[float], list[float]]] | None = None,
    steps: float | None = None,
):
    config = TrainConfig(
        towers=towers,
        global_batch=128 * towers,
        lr_scaling=lr_scaling,
        seed=seed,
        warmup_epochs=warmup_epochs,
        epochs=epochs,
    )
    group = f"towers={towers} lr={lr_scaling}" + (f" epochs={epochs:g}" if epochs != 10 else "")
    seconds = 100.0 / towers
    return RunRecord(
        run_id=f"{group}-{seed}",
        name=f"{group} seed={seed}",
        group=group,
        config=config,
        status=status,
        final_score=accuracy if status == "completed" else None,
        images_per_sec=1000.0 if towers == 1 else 500.0 * towers,  # half of linear
        effective_lr=0.1 * towers if lr_scaling == "linear" else 0.1,
        noise_scale=noise_scale,
        device_kind="logical CPU",
        curve=Curve([1.0, 2.0], [seconds / 2, seconds], [accuracy - 0.1, accuracy]),
        error="boom" if status == "failed" else None,
        unstable=unstable,
        losses=losses or {},
        noise_curves=noise_curves or {},
        steps=steps,
    )


def test_compare_rows_verdicts_and_speedup() -> None:
    baseline = [_record(1, "none", seed, accuracy) for seed, accuracy in enumerate([0.86, 0.862])]
    unscaled = [_record(4, "none", seed, accuracy) for seed, accuracy in enumerate([0.84, 0.841])]
    scaled = [_record(4, "linear", seed, accuracy) for seed, accuracy in enumerate([0.85, 0.87])]
    failed = [_record(2, "linear", 0, 0.0, status="failed")]
    rows, target = compare(baseline + unscaled + scaled + failed, [], None)
    by_group = {row.group: row for row in rows}

    assert target == pytest.approx(0.95 * np.mean([0.86, 0.862]))
    assert by_group["towers=1 lr=none"].verdict == "baseline"
    unscaled_row = by_group["towers=4 lr=none"]
    expected = stats.ttest_ind([0.84, 0.841], [0.86, 0.862], equal_var=False)
    assert unscaled_row.difference.p_value == pytest.approx(expected.pvalue)
    assert expected.pvalue < 0.05
    assert unscaled_row.verdict.startswith("did not reach the 1-tower accuracy: Δ −2.0 pp")
    assert "apply linear scaling (measured: `towers=4 lr=linear` −0.1 pp" in unscaled_row.verdict
    # Two seeds 2 pp apart: an interval of ±12 pp, which does not say the gap closed.
    assert "closed the gap" not in unscaled_row.verdict
    assert "global batch 512" in unscaled_row.verdict
    linear = by_group["towers=4 lr=linear"]
    assert linear.verdict.startswith("inconclusive: Δ −0.1 pp, 95% CI [−12.3, +12.1]: the ")
    assert "seeds per side would decide it" in linear.verdict
    # The baseline's curves rose 10 pp over their last half: it is noted, as in advise.
    baseline_notes = by_group["towers=1 lr=none"].notes
    assert baseline_notes and baseline_notes[0].startswith("the reference was still improving")
    assert "twice the epochs" not in baseline_notes[0]
    # Time to the target (reached at the last point): 25 s with 4 towers, 100 s with one.
    assert unscaled_row.speedup == pytest.approx(4.0)
    assert unscaled_row.efficiency == pytest.approx(0.5)
    assert any("far above the noise scale ≈ 200" in note for note in unscaled_row.notes)
    assert by_group["towers=2 lr=linear"].verdict == "failed: boom"


def test_a_reference_that_passed_the_last_quarter_check_is_told_its_limit() -> None:
    baseline = [_record(1, "none", seed, accuracy) for seed, accuracy in enumerate([0.86, 0.862])]
    for record in baseline:  # +0.2 pp over the last quarter: a plateau
        final = record.curve.scores[-1]
        record.curve = Curve(
            [1.0, 2.0, 3.0, 4.0],
            [25.0, 50.0, 75.0, 100.0],
            [final - 0.1, final - 0.01, final - 0.002, final],
        )
    scaled = [_record(4, "linear", seed, accuracy) for seed, accuracy in enumerate([0.859, 0.861])]
    rows, _ = compare(baseline + scaled, [], None)
    notes = {row.group: row.notes for row in rows}["towers=1 lr=none"]
    assert notes[0].startswith("the reference passed the last-quarter check (+0.2 pp over the last")
    assert "a reference at twice the epochs is the stronger check" in notes[0]


def test_scores_by_epoch_averages_seeds_and_counts_the_ones_that_got_there() -> None:
    full = _record(4, "linear", 0, 0.8)
    stopped = _record(4, "linear", 1, 0.6, status="diverged")
    stopped.curve.epochs.pop()  # stopped after epoch 1
    stopped.curve.scores.pop()
    baseline = _record(1, "none", 0, 0.9)
    rows, _ = compare([baseline, full, stopped], [], None)
    table = scores_by_epoch(rows)
    assert list(table) == [1.0, 2.0]
    assert table[1.0]["towers=4 lr=linear"].mean == pytest.approx((0.7 + 0.5) / 2)
    assert table[1.0]["towers=4 lr=linear"].seeds == 2
    assert table[2.0]["towers=4 lr=linear"].mean == pytest.approx(0.8)
    assert table[2.0]["towers=4 lr=linear"].seeds == 1
    assert table[2.0]["towers=1 lr=none"].mean == pytest.approx(0.9)


def test_verdicts_for_a_warmed_up_rule_that_still_trails_and_for_a_running_configuration() -> None:
    baseline = [_record(1, "none", seed, accuracy) for seed, accuracy in enumerate([0.68, 0.69])]
    sqrt = [_record(4, "sqrt", seed, acc, warmup_epochs=2) for seed, acc in enumerate([0.62, 0.63])]
    running = [_record(4, "linear", 0, 0.0, status="running", warmup_epochs=2)]
    rows, _ = compare(baseline + sqrt + running, [], None)
    by_group = {row.group: row for row in rows}
    verdict = by_group["towers=4 lr=sqrt"].verdict
    assert "4x fewer updates than 1 tower" in verdict
    assert "train for the same number of updates (untested here)" in verdict
    assert "compare linear scaling (untested here)" in verdict  # the linear run has not finished
    assert by_group["towers=4 lr=linear"].verdict == "still running: no seed has finished yet"


def test_a_measured_remedy_is_named_and_untested_advice_is_labelled() -> None:
    """Equal updates (4x the epochs) closed the gap: the equal-epoch verdict says so."""
    baseline = [_record(1, "none", seed, acc) for seed, acc in enumerate([0.685, 0.686])]
    short = [_record(4, "sqrt", seed, acc, warmup_epochs=2) for seed, acc in enumerate([0.6, 0.61])]
    long = [
        _record(4, "sqrt", seed, acc, warmup_epochs=2, epochs=40)
        for seed, acc in enumerate([0.6855, 0.6858])
    ]
    rows, _ = compare(baseline + short + long, [], None)
    by_group = {row.group: row for row in rows}
    verdict = by_group["towers=4 lr=sqrt"].verdict
    assert verdict.startswith("did not reach the 1-tower accuracy: Δ −8.1 pp")
    assert "`towers=4 lr=sqrt epochs=40` closed the gap (+0.0 pp, p=0.82)" in verdict
    assert "train for the same number of updates (measured: `towers=4 lr=sqrt epochs=40`" in verdict
    assert by_group["towers=4 lr=sqrt epochs=40"].closes_gap


def test_an_unstable_configuration_is_named_and_its_noise_scale_not_used() -> None:
    baseline = [_record(1, "none", seed, acc) for seed, acc in enumerate([0.985, 0.986])]
    reason = "training cross-entropy reached 4.40 in epoch 1, above chance level ln 10 = 2.30"
    collapsed = [_record(4, "linear", seed, 0.226, unstable=reason) for seed in (0, 1)]
    rows, _ = compare(baseline + collapsed, [], None)
    row = {row.group: row for row in rows}["towers=4 lr=linear"]
    assert row.verdict.startswith(f"unstable in 2/2 seeds ({reason}): LR 0.4 is too high")
    assert "try sqrt scaling (untested here)" in row.verdict
    assert "adascale (its LR follows the gain the gradients allow) (untested here)" in row.verdict
    assert "fewer updates" not in row.verdict
    assert row.noise_scale is None and not row.notes
    adascale = [_adascale_run(seed, acc) for seed, acc in enumerate([0.984, 0.987])]
    rows, _ = compare(baseline + collapsed + adascale, [], None)
    verdict = {row.group: row for row in rows}["towers=4 lr=linear"].verdict
    assert "adascale (its LR follows the gain the gradients allow) (measured: " in verdict
    assert "`towers=4 lr=adascale` +0.0 pp, p=1.00)" in verdict


def _adascale_run(seed: int, accuracy: float):
    """4 towers under adascale: tau reached 1000 in 400 updates (mean gain 2.5 of 4)."""
    epochs = [1.0, 2.0]
    curves = {
        "adascale_gain": (epochs, [2.0, 2.4]),
        "adascale_sigma_sq": (epochs, [0.6, 0.5]),
        "adascale_mu_sq": (epochs, [0.02, 0.01]),
        "adascale_tau": (epochs, [400.0, 1000.0]),
    }
    return _record(4, "adascale", seed, accuracy, noise_curves=curves, steps=400.0)


def test_adascale_is_at_equal_progress_with_one_tower_and_counts_as_equal_updates() -> None:
    """AdaScale's budget is 1 tower's updates in progress tau: its verdict does not call it
    "fewer updates" nor advise warmup, and it is the measured evidence for equal updates."""
    baseline = [_record(1, "none", seed, acc) for seed, acc in enumerate([0.86, 0.862])]
    adascale = [_adascale_run(seed, acc) for seed, acc in enumerate([0.84, 0.841])]
    linear = [_record(4, "linear", seed, acc) for seed, acc in enumerate([0.80, 0.801])]
    rows, _ = compare(baseline + adascale + linear, [], None)
    by_group = {row.group: row for row in rows}
    row = by_group["towers=4 lr=adascale"]
    assert row.adascale.mean_gain == pytest.approx(2.5) and row.adascale.last_gain == 2.4
    assert row.verdict.startswith("did not reach the 1-tower accuracy: Δ −2.0 pp, 95% CI [")
    assert (
        "at equal scale-invariant progress with 1 tower (tau 1000 in 400 updates: mean gain "
        "2.50 of 4)" in row.verdict
    )
    assert "compare a fixed rule at equal optimizer updates (untested here)" in row.verdict
    assert "fewer updates" not in row.verdict and "warmup" not in row.verdict
    diverged = _record(4, "adascale", 1, 0.1, status="diverged")
    rows, _ = compare([*baseline, adascale[0], diverged], [], None)
    verdict = {row.group: row for row in rows}["towers=4 lr=adascale"].verdict
    assert verdict.startswith("diverged in 1/2 seeds") and "warmup" not in verdict
    assert row.notes[-1].endswith("its budget is already 1 tower's updates in progress tau")
    # The linear run at equal epochs needs (1 + 512/200) / (1 + 128/200) = 2.17x the epochs.
    note = by_group["towers=4 lr=linear"].notes[-1]
    assert "needs ≈ 2.17× the epochs of batch 128: train for equal updates" in note
    assert "(measured: `towers=4 lr=adascale` −2.0 pp" in note

    equal_updates = [
        _record(4, "linear", seed, acc, epochs=40) for seed, acc in enumerate([0.85, 0.851])
    ]
    rows, _ = compare(baseline + adascale + linear + equal_updates, [], None)
    verdict = {row.group: row for row in rows}["towers=4 lr=adascale"].verdict
    assert "compare a fixed rule at equal optimizer updates (measured: " in verdict
    assert "`towers=4 lr=linear epochs=40` −1.0 pp" in verdict


def test_the_note_advises_from_the_harmonic_mean_not_the_final_noise_scale() -> None:
    """cure-bn's case: the final 9228 says batch 512 pays off linearly; the harmonic mean over
    the epochs (397) says it needs 1.73x the epochs, so equal epochs are not enough."""
    baseline = [_record(1, "none", seed, acc) for seed, acc in enumerate([0.86, 0.862])]
    advising = advising_noise_scale(GROWING_NOISE)
    scaled = [
        _record(4, "linear", seed, acc, warmup_epochs=2, noise_scale=advising)
        for seed, acc in enumerate([0.85, 0.87])
    ]
    rows, _ = compare(baseline + scaled, [], None)
    row = {row.group: row for row in rows}["towers=4 lr=linear"]
    assert row.notes == [
        "global batch 512 is near the noise scale ≈ 397 (harmonic mean over training); the same "
        "progress needs ≈ 1.73× the epochs of batch 128: train for equal updates (or equal "
        "progress tau: adascale) (untested here)"
    ]


def test_a_budget_beyond_what_the_noise_scale_asks_is_not_told_to_train_longer() -> None:
    """The noise budget of issue 38 gave 2.04x the epochs; the noise scale measured in training
    (harmonic mean 601 at batch 512) asks only 1.53x: the note says the budget gives that."""
    baseline = [_record(1, "none", seed, acc) for seed, acc in enumerate([0.639, 0.642])]
    scaled = [
        _record(4, "sqrt", seed, acc, epochs=20.4, noise_scale=601.0)
        for seed, acc in enumerate([0.647, 0.666])
    ]
    rows, _ = compare(baseline + scaled, [], None)
    note = {row.group: row for row in rows}["towers=4 lr=sqrt epochs=20.4"].notes[0]
    assert note.endswith(
        "≈ 1.53× the epochs of batch 128: its budget (2.04× the epochs) already gives that"
    )
    assert "train for equal updates" not in note


def test_loss_paradox_is_explained_from_the_measured_losses() -> None:
    def losses(train: float, test: float) -> dict[str, float]:
        return {
            "train_cross_entropy": train,
            "test_cross_entropy": test,
            "generalization_gap": test - train,
        }

    one = [_record(1, "none", s, a, losses=losses(0.7, 0.8)) for s, a in enumerate([0.86, 0.861])]
    four = [_record(4, "none", s, a, losses=losses(0.5, 0.9)) for s, a in enumerate([0.84, 0.841])]
    rows, _ = compare(one + four, [], None)
    text = loss_paradox(rows)
    assert "`towers=4 lr=none` ended with a lower training cross-entropy" in text
    assert "(0.500 vs 0.700)" in text and "(84.05% vs 86.05%)" in text
    assert "gap of 0.400 vs 0.100" in text
    rows, _ = compare(one, [], None)
    assert "no loss paradox was measured" in loss_paradox(rows)


def test_rendered_tables_fit_a_page_and_figures_can_be_embedded() -> None:
    from towerbench.tasks.report.render import ReportHeader, render_report

    records = [_record(1, "none", s, a) for s, a in enumerate([0.86, 0.862])]
    records += [_record(4, "linear", s, a) for s, a in enumerate([0.85, 0.87])]
    records += [_adascale_run(s, a) for s, a in enumerate([0.85, 0.87])]
    rows, target = compare(records, [], None)
    charts = "http://mlflow/#/experiments/1/runs?compareRunsMode=CHART"
    header = ReportHeader(
        "sweep", "run-id", "http://mlflow/#/run-id", charts, "v1", ["logical CPU"], target
    )
    text = render_report(
        header, rows, records, {"accuracy_vs_epoch.png": "data:image/png;base64,AA"}
    )
    table_headers = [line for line in text.splitlines() if line.startswith("| configuration |")]
    assert len(table_headers) == 7 and all(line.count("|") <= 7 for line in table_headers)
    # The optimizers table: weight decay as the optimizer applies it, AdaScale's LR factor.
    adascale = "| towers=4 lr=adascale | momentum | momentum 0.9 | L2 0.004 in the loss | gain |"
    assert adascale in text
    assert "| towers=4 lr=linear | 200 | — | 2.17× |" in text  # no final value given
    assert "| towers=4 lr=adascale | 2.50 · 2.40 | 0.5 | 0.01 | 1000 / 400 |" in text
    assert "The verdicts use its harmonic mean" in text
    assert "![accuracy_vs_epoch.png](data:image/png;base64,AA)" in text
    assert "](accuracy_vs_epoch.png)" not in text


def test_the_report_names_a_user_model_by_function_and_file_digest() -> None:
    records = [_record(1, "none", seed, 0.8) for seed in (0, 1)]
    for record, digest in zip(records, ("a" * 64, "b" * 64), strict=True):
        record.config = record.config.model_copy(update={"model": "/home/me/nets/tiny.py:build"})
        record.model_digest = digest  # the file was edited between the two seeds
    rows, _ = compare(records, [], None)
    assert models(rows) == "tiny:build (sha256 aaaaaaaaaaaa, bbbbbbbbbbbb)"
    builtin, _ = compare([_record(1, "none", 0, 0.8)], [], None)
    assert models(builtin) == "tutorial"


def test_the_noise_figure_is_drawn_when_a_run_measured_the_noise_scale(tmp_path) -> None:
    from towerbench.tasks.report.figures import _positive, report_figures

    one = _record(1, "none", 0, 0.9)
    # An unstable run's first epoch: |G|^2 averaged below 0, a negative noise scale.
    curve = ([1.0, 2.0, 3.0], [-3700.0, 900.0, 12.0])
    four = _record(4, "linear", 0, 0.9, noise_curves={"noise_scale": curve})
    assert _positive(curve) == ([2.0, 3.0], [900.0, 12.0])  # what the log scale can show
    (tmp_path / "both").mkdir()
    assert "noise_scale_vs_epoch.png" in report_figures([one, four], tmp_path / "both")
    assert (tmp_path / "both" / "noise_scale_vs_epoch.png").stat().st_size > 0
    (tmp_path / "one").mkdir()
    assert "noise_scale_vs_epoch.png" not in report_figures([one], tmp_path / "one")


def test_an_adaptive_optimizer_scaled_linearly_is_told_its_rule_and_what_it_measured() -> None:
    def adam(record, optimizer: str = "adam"):
        config = record.config.model_copy(update={"optimizer": optimizer})
        return dataclasses.replace(record, config=config)

    records = [adam(_record(1, "none", s, a)) for s, a in enumerate([0.86, 0.862])]
    records += [adam(_record(4, "linear", s, a)) for s, a in enumerate([0.80, 0.81])]
    records += [adam(_record(4, "sqrt", s, a)) for s, a in enumerate([0.85, 0.86])]
    rows, _ = compare(records, [], None)
    by_group = {row.group: row for row in rows}
    note = by_group["towers=4 lr=linear"].notes[0]
    assert note.startswith("adam is adaptive: its rule is sqrt, which also moves its betas")
    assert "(measured: `towers=4 lr=sqrt` −0.6 pp, p=0.44)" in note
    assert not any("adaptive" in other for other in by_group["towers=4 lr=sqrt"].notes)
    momentum = [adam(record, "momentum") for record in records]
    notes = [note for row in compare(momentum, [], None)[0] for note in row.notes]
    assert notes and not any("adaptive" in note for note in notes)


@pytest.mark.parametrize("lr_scaling", ["none", "linear", "adascale"])
def test_a_diverged_run_at_the_reference_batch_is_told_what_changes_there(lr_scaling) -> None:
    """At 1 tower's batch no scaling rule changes the LR: the advice is the base LR and, unless
    AdaScale (no warmup in its schedule), the warmup."""
    rows, _ = compare([_record(1, lr_scaling, 0, 0.1, status="diverged")], [], None)
    verdict = rows[0].verdict
    assert verdict.startswith("diverged in 1/1 seeds"), verdict
    assert f"lower the base LR ({TrainConfig().base_lr:g}) (untested here)" in verdict, verdict
    assert "scaling" not in verdict and "sqrt" not in verdict, verdict
    assert ("add warmup epochs (untested here)" in verdict) == (lr_scaling != "adascale"), verdict
