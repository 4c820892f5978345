"""Non-inferiority verdicts (one rule for the report and advise), the reference's convergence
check, and verdicts that never compare diverged runs: all on synthetic numbers."""

from __future__ import annotations

import pickle

import pytest

from towerbench.config.sections import TrainConfig
from towerbench.core.outcome import ConfigSummary, NothingTrained, Status, SweepResult
from towerbench.tasks.advise.recipe import Measurements, choose_recipe
from towerbench.tasks.advise.verdict import verify_outcome
from towerbench.tasks.report.statistics import (
    Curve,
    RunRecord,
    convergence,
    non_inferiority,
    seeds_to_decide,
    welch,
)
from towerbench.tasks.report.verdicts import compare

ONES = [0.900, 0.905, 0.910]


def test_reached_only_when_the_interval_lies_above_minus_the_margin() -> None:
    reached = non_inferiority([0.902, 0.906, 0.908], ONES)
    assert reached.outcome == "reached" and reached.difference.ci_low > -0.01
    missed = non_inferiority([0.850, 0.855, 0.860], ONES)
    assert missed.outcome == "not reached" and missed.difference.ci_high < -0.01
    # The mean is the same as 1 tower's, but the interval is wide: never "reached".
    wide = non_inferiority([0.80, 0.905, 1.0], ONES)
    assert wide.difference.difference == pytest.approx(-0.00333, abs=1e-4)
    assert wide.outcome == "inconclusive" and wide.difference.ci_low < -0.01
    assert wide.seeds_needed is not None and wide.seeds_needed > 3
    assert "seeds per side would decide it" in wide.reason()
    # A larger margin turns the close one into "reached", a tighter one cannot.
    assert non_inferiority([0.80, 0.905, 1.0], ONES, margin=0.5).outcome == "reached"
    assert non_inferiority([0.895, 0.9, 0.905], ONES, margin=0.001).outcome != "reached"


def test_one_seed_a_side_is_inconclusive_and_names_no_seed_count() -> None:
    decision = non_inferiority([0.95], [0.90])
    assert decision.outcome == "inconclusive" and decision.seeds_needed is None
    assert decision.interval() == "Δ +5.0 pp (one seed a side: no interval)"


def test_the_seeds_that_would_decide_an_inconclusive_verdict() -> None:
    """At the measured spread (pooled sd s) and difference d, n seeds a side give a 95% half
    width t(2n-2) s sqrt(2/n); the first n below |d + margin| decides it."""
    sample, baseline = [0.88, 0.90, 0.92], [0.89, 0.90, 0.91]  # d = 0, s^2 = (4e-4 + 1e-4)/2
    needed = seeds_to_decide(sample, baseline, 0.01)
    assert needed is not None
    fewer = welch(sample * 1, baseline * 1)  # the measured 3 a side straddle -1 pp
    assert fewer.ci_low < -0.01
    from scipy import stats

    spread = ((4e-4 + 1e-4) / 2) ** 0.5
    width = [stats.t.ppf(0.975, 2 * n - 2) * spread * (2 / n) ** 0.5 for n in (needed - 1, needed)]
    assert width[0] >= 0.01 > width[1]


def test_convergence_of_the_reference_on_rising_and_flat_histories() -> None:
    epochs = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
    rising = [Curve(epochs, epochs, [0.3 + 0.05 * e + 0.002 * s for e in epochs]) for s in (0, 1)]
    still = convergence(rising)  # +10 pp from epoch 6 to 8, seeds 0.14 pp apart
    assert still is not None and not still.converged
    assert still.rise == pytest.approx(0.10)
    assert still.text().startswith("the reference was still improving (+10.0 pp over the last")
    flat = [
        Curve(epochs, epochs, [0.5, 0.7, 0.8, 0.85, 0.86, 0.86, 0.861, a]) for a in (0.86, 0.87)
    ]
    settled = convergence(flat)  # +0.4 pp on average, seeds 0.7 pp apart
    assert settled is not None and settled.converged
    # Seeds that agree exactly: the margin, not a zero spread, is the noise.
    agreeing = convergence([Curve(epochs, epochs, [0.5] * 7 + [0.505])] * 2)
    assert agreeing is not None and agreeing.converged and agreeing.noise_kind == "the margin"
    assert not convergence([Curve(epochs, epochs, [0.5] * 7 + [0.52])] * 2).converged
    # One seed: the margin is the noise.
    assert convergence([Curve(epochs, epochs, [0.5] * 7 + [0.505])]).converged
    assert not convergence([Curve(epochs, epochs, [0.5] * 7 + [0.52])]).converged
    assert convergence([Curve([1.0], [1.0], [0.5])]) is None  # nothing before the last quarter


def _record(towers: int, seed: int, accuracy: float | None, status=Status.COMPLETED, rise=0.0):
    config = TrainConfig(towers=towers, global_batch=128 * towers, reference_batch=128, seed=seed)
    final = accuracy if accuracy is not None else 0.1
    return RunRecord(
        run_id=f"{towers}-{seed}",
        name=f"towers={towers} seed={seed}",
        group=f"towers={towers}",
        config=config,
        status=status,
        final_score=accuracy,
        images_per_sec=None,
        effective_lr=0.1,
        noise_scale=None,
        device_kind="logical CPU",
        curve=Curve(
            [1.0, 2.0, 3.0, 4.0], [5.0, 10.0, 15.0, 20.0 * towers], [final - rise] * 3 + [final]
        ),
        steps=100.0 / towers,
    )


def _summary(record: RunRecord) -> ConfigSummary:
    return ConfigSummary(
        status=record.status,
        test_accuracy=record.final_score,
        wall_time=None,  # reused from an earlier attempt: the sweep has no time, MLflow has
        run_id=record.run_id,
        name=record.name,
        towers=record.config.towers,
        workers=1,
        seed=record.config.seed,
    )


RECIPE = choose_recipe(
    Measurements(
        towers=2, per_tower_batch=128, reference_batch=128, base_lr=50.0, epochs=4,
        has_batchnorm=False, noise_scale=300.0, largest_stable_lr=0.0,
        instability="at LR 50: the training loss was not a number at step 3",
        train_examples=6400, step_seconds=0.1, device_kind="logical CPU",
    )
)  # fmt: skip


def _verify(records: list[RunRecord]):
    result = SweepResult(
        parent_run_id="p", mlflow_url="u", configs=[_summary(r) for r in records], report="r.md"
    )
    return verify_outcome(result, RECIPE, records)


def test_advise_reports_reached_with_measured_steps_and_time_beside_the_prediction() -> None:
    records = [_record(1, s, a) for s, a in enumerate(ONES)]
    records += [_record(2, s, a) for s, a in enumerate([0.902, 0.906, 0.908])]
    verification = _verify(records)
    assert verification.outcome == "reached" and verification.reference_converged
    assert verification.verdict.startswith("the recipe reached the 1-tower accuracy: Δ +0.0 pp")
    assert "it took 2.00× the 1-tower time (40.0 s against 20.0 s)" in verification.verdict
    assert verification.measured_steps == 50.0
    assert verification.predicted_steps == RECIPE.prediction.steps
    assert f"steps: 50 measured, {RECIPE.prediction.steps} predicted" in verification.verdict
    assert "towers are logical devices" in verification.verdict
    assert "reused" not in verification.verdict and "not recorded" not in verification.verdict
    # Passing the last-quarter check is said with what it cannot see, as in the report.
    assert "the reference passed the last-quarter check (+0.0 pp over" in verification.verdict
    assert "a reference at twice the epochs is the stronger check" in verification.verdict


def test_advise_does_not_say_reached_against_a_reference_still_improving() -> None:
    records = [_record(1, s, a, rise=0.05) for s, a in enumerate(ONES)]
    records += [_record(2, s, a) for s, a in enumerate([0.902, 0.906, 0.908])]
    verification = _verify(records)
    assert verification.outcome == "unconverged" and not verification.reached
    assert verification.verdict.startswith(
        "the reference was still improving: Δ compares two under-trained runs (Δ +0.0 pp"
    )
    assert verification.verdict.count("still improving") == 1


def test_advise_states_no_difference_when_every_recipe_run_diverged() -> None:
    records = [_record(1, s, None, Status.DIVERGED) for s in (0, 1)]
    records += [_record(2, s, None, Status.DIVERGED) for s in (0, 1)]
    verification = _verify(records)
    assert verification.outcome == "diverged" and verification.difference_pp is None
    verdict = verification.verdict
    assert verdict.startswith("every recipe run diverged (2/2 at 2 towers, and 2/2 1-tower runs")
    assert "Δ" not in verdict and "reused" not in verdict and "more epochs" not in verdict
    assert "the probe's advice: lower train.base_lr from 50 to 5" in verdict


def test_a_partly_diverged_recipe_compares_only_its_finished_runs() -> None:
    records = [_record(1, s, a) for s, a in enumerate(ONES)]
    records += [_record(2, 0, 0.905), _record(2, 1, 0.907), _record(2, 2, None, Status.DIVERGED)]
    verification = _verify(records)
    assert verification.outcome == "missed"
    assert verification.verdict.startswith("it did not: 1/3 recipe runs diverged (the finished")
    assert verification.difference_pp == pytest.approx(100 * (0.906 - 0.905))


def test_the_report_uses_the_same_rule_and_compares_no_diverged_baseline() -> None:
    ones = [_record(1, s, a) for s, a in enumerate(ONES)]
    close = [_record(2, s, a) for s, a in enumerate([0.902, 0.906, 0.908])]
    rows, _ = compare(ones + close, [], None)
    row = {row.group: row for row in rows}["towers=2"]
    expected = non_inferiority([0.902, 0.906, 0.908], ONES)
    assert row.verdict.startswith("reached the 1-tower accuracy: " + expected.interval())
    wide = [_record(2, s, a) for s, a in enumerate([0.80, 0.905, 1.0])]
    rows, _ = compare(ones + wide, [], None)
    assert {row.group: row for row in rows}["towers=2"].verdict.startswith("inconclusive: Δ")
    rows, _ = compare(ones + wide, [], None, margin=0.5)
    assert {row.group: row for row in rows}["towers=2"].verdict.startswith("reached")
    diverged = [_record(1, s, None, Status.DIVERGED) for s in (0, 1)]
    rows, _ = compare(diverged + close, [], None)
    verdict = {row.group: row for row in rows}["towers=2"].verdict
    assert verdict.startswith("no difference stated: the 1-tower baseline diverged in 2/2")
    assert "pp" not in verdict


def _ended(index: int, status: Status) -> ConfigSummary:
    accuracy = 0.9 if status == Status.COMPLETED else None
    return ConfigSummary(
        status=status,
        test_accuracy=accuracy,
        run_id=f"r{index}",
        name=f"c{index}",
        towers=1,
        workers=1,
        seed=index,
    )


def test_a_sweep_without_a_completed_configuration_says_what_became_of_each() -> None:
    verdicts = {"towers=1": "diverged in 1/1 seeds at LR 1e+05: lower the base LR"}
    result = SweepResult(
        parent_run_id="p",
        mlflow_url="u",
        configs=[_ended(0, Status.DIVERGED), _ended(1, Status.FAILED)],
        verdicts=verdicts,
        report="r.md",
    )
    assert result.nothing_trained() == (
        "no configuration completed (1 diverged and 1 failed of 2 runs); towers=1: diverged in "
        "1/1 seeds at LR 1e+05: lower the base LR; report: r.md"
    )
    one_completed = result.model_copy(update={"configs": [_ended(2, Status.COMPLETED)]})
    assert one_completed.nothing_trained() is None
    # Prefect may pickle the flow's exception: the result travels with it.
    error = pickle.loads(pickle.dumps(NothingTrained("why", result)))
    assert str(error) == "why" and error.result == result and error.exit_status == 1
