"""The verdict of `towerbench advise --verify`: did the recipe's K towers reach the 1-tower
accuracy, what next if not, and what the K towers cost against the prediction.

The rule is the report's (tasks/report/statistics.py: non_inferiority, judgement), on the runs
that finished; a diverged run's accuracy is never compared:
- reached: the 95% interval of (K towers - 1 tower) lies above -margin (report.margin, 1 pp),
  no recipe run diverged, and the 1-tower reference had converged (its last quarter of epochs
  moved test accuracy by no more than the noise between seeds; else "unconverged": the
  reference was still improving, the difference compares two under-trained runs);
- missed: the interval lies below -margin, or a recipe run diverged;
- inconclusive: the interval straddles -margin (or one seed a side), with the seeds per side
  the measured spread says would decide it;
- diverged: every recipe run diverged: no difference, the probe's advice (what to change, to
  what value), and `towerbench advise` exits 1;
- none: a side has no finished run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, computed_field

from towerbench.config.params import TrackingConfig
from towerbench.core.outcome import ConfigSummary, Status, SweepResult
from towerbench.tasks.advise.recipe import Recipe
from towerbench.tasks.report.reading import sweep_parent, sweep_records
from towerbench.tasks.report.statistics import (
    CLOSE_ENOUGH,
    RunRecord,
    convergence,
    judgement,
    non_inferiority,
)
from towerbench.tasks.tracking import client_for

VerdictOutcome = Literal["reached", "missed", "inconclusive", "unconverged", "diverged", "none"]


class Verification(BaseModel):
    """What the verification sweep measured, and its one-line verdict."""

    parent_run_id: str
    report: str
    difference_pp: float | None  # K towers - 1 tower, mean test accuracy, percentage points
    ci_low_pp: float | None
    ci_high_pp: float | None
    outcome: VerdictOutcome
    time_ratio: float | None  # mean wall time of a K-tower run / of a 1-tower run
    verdict: str
    seeds_needed: int | None = None  # per side, to decide an inconclusive verdict
    reference_converged: bool | None = None  # None: not checked (no curve)
    predicted_steps: int | None = None  # optimizer steps of a K-tower run
    measured_steps: float | None = None  # mean over the finished K-tower runs
    predicted_seconds: float | None = None  # of training steps
    measured_seconds: float | None = None  # mean wall time of the finished K-tower runs

    @computed_field  # type: ignore[prop-decorator]  # pydantic's documented use
    @property
    def reached(self) -> bool:
        return self.outcome == "reached"


def next_to_try(recipe: Recipe) -> str:
    """The change most likely to close a remaining gap, after this recipe."""
    rule, budget = recipe.lr_scaling.value, recipe.budget.value
    if budget in ("epochs", "noise") and rule != "adascale":
        return "equal updates (sweep.budget: updates; Hoffer et al.)"
    if rule == "linear":
        return "sqrt scaling (sweep.lr_scaling: sqrt), or a longer warmup"
    if rule == "sqrt":
        return "adascale (sweep.lr_scaling: adascale), which scales the LR by the gain it measures"
    if rule == "adascale":
        return "sqrt scaling at equal updates (sweep.lr_scaling: sqrt, sweep.budget: updates)"
    return "more epochs at the base LR, or a smaller per-tower batch"


@dataclass(frozen=True)
class _Side:
    """One side's runs (1 tower, or the recipe's K towers) as the sweep left them."""

    summaries: list[ConfigSummary]
    records: list[RunRecord]  # those read back from MLflow (curves, steps, wall time)

    def with_status(self, status: Status) -> list[ConfigSummary]:
        return [summary for summary in self.summaries if summary.status == status]

    @property
    def accuracies(self) -> list[float]:
        completed = self.with_status(Status.COMPLETED)
        return [s.test_accuracy for s in completed if s.test_accuracy is not None]

    def completed_records(self) -> list[RunRecord]:
        ids = {summary.run_id for summary in self.with_status(Status.COMPLETED)}
        return [record for record in self.records if record.run_id in ids]

    def mean_seconds(self) -> float | None:
        """Mean wall time of the completed runs: the sweep's, else MLflow's last evaluation."""
        by_id = {record.run_id: record for record in self.records}
        times = []
        for summary in self.with_status(Status.COMPLETED):
            record = by_id.get(summary.run_id)
            logged = record.curve.wall_times[-1] if record and record.curve.wall_times else None
            seconds = summary.wall_time if summary.wall_time is not None else logged
            if seconds is not None:
                times.append(seconds)
        return sum(times) / len(times) if times else None

    def mean_steps(self) -> float | None:
        steps = [r.steps for r in self.completed_records() if r.steps is not None]
        return sum(steps) / len(steps) if steps else None

    def count(self, status: Status) -> str:
        return f"{len(self.with_status(status))}/{len(self.summaries)}"


def _sides(result: SweepResult, records: list[RunRecord]) -> tuple[_Side, _Side]:
    """(1 tower, K towers)."""
    sides = []
    for one in (True, False):
        summaries = [s for s in result.configs if (s.towers * s.workers == 1) == one]
        ids = {summary.run_id for summary in summaries}
        sides.append(_Side(summaries, [record for record in records if record.run_id in ids]))
    return sides[0], sides[1]


def _cost(ones: _Side, many: _Side, recipe: Recipe) -> tuple[float | None, str]:
    """K-tower over 1-tower mean wall time, and the measured steps and time beside the
    prediction."""
    one, mine = ones.mean_seconds(), many.mean_seconds()
    ratio = mine / one if one and mine is not None else None
    parts = []
    if ratio is not None and one is not None and mine is not None:
        parts.append(f"it took {ratio:.2f}× the 1-tower time ({mine:.1f} s against {one:.1f} s)")
    else:
        parts.append("no wall time recorded for a finished run on both sides")
    prediction, steps = recipe.prediction, many.mean_steps()
    if prediction is not None:
        measured = f"{steps:.0f}" if steps is not None else "not recorded"
        parts.append(f"steps: {measured} measured, {prediction.steps} predicted")
        if prediction.seconds is not None and mine is not None:
            caveat = "; towers are logical devices" if prediction.logical else ""
            parts.append(
                f"time: {mine:.1f} s measured (evaluation included), {prediction.seconds:.3g} s "
                f"of training steps predicted{caveat}"
            )
    return ratio, "; ".join(parts)


def _all_diverged(ones: _Side, many: _Side, recipe: Recipe) -> str:
    """The verdict when every recipe run diverged: no difference, the probe's advice."""
    both = ""
    if not ones.accuracies and ones.with_status(Status.DIVERGED):
        both = f", and {ones.count(Status.DIVERGED)} 1-tower runs too"
    return (
        f"every recipe run diverged ({many.count(Status.DIVERGED)} at "
        f"{many.summaries[0].towers * many.summaries[0].workers} towers{both}): no accuracy to "
        f"compare; the probe's advice: {recipe.if_diverged}"
    )


def verify_outcome(
    result: SweepResult,
    recipe: Recipe,
    records: list[RunRecord] | None = None,
    margin: float | None = None,
) -> Verification:
    """The verdict on the verification sweep `result` of `recipe`; `records` (read back from
    MLflow: curves, steps) add the reference's convergence check and the measured steps;
    `margin` is report.margin (None: 1 pp, advise judging by accuracy)."""
    ones, many = _sides(result, records or [])
    ratio, cost = _cost(ones, many, recipe)
    prediction = recipe.prediction
    base = {
        "parent_run_id": result.parent_run_id,
        "report": result.report,
        "time_ratio": ratio,
        "predicted_steps": prediction.steps if prediction else None,
        "predicted_seconds": prediction.seconds if prediction else None,
        "measured_steps": many.mean_steps(),
        "measured_seconds": many.mean_seconds(),
    }
    empty = {"difference_pp": None, "ci_low_pp": None, "ci_high_pp": None}
    diverged = many.with_status(Status.DIVERGED)
    if diverged and not many.accuracies:
        verdict = _all_diverged(ones, many, recipe)
        return Verification(**base, **empty, outcome="diverged", verdict=verdict)
    if not ones.accuracies or not many.accuracies:
        missing = "1-tower" if not ones.accuracies else "recipe"
        why = (
            f" ({ones.count(Status.DIVERGED)} diverged)"
            if ones.with_status(Status.DIVERGED)
            else ""
        )
        verdict = (
            f"no verdict: no {missing} run finished{why}, no difference stated (see the report)"
        )
        return Verification(**base, **empty, outcome="none", verdict=verdict)
    margin = CLOSE_ENOUGH if margin is None else margin
    return _compared(ones, many, recipe, margin, base, cost)


def _compared(
    ones: _Side, many: _Side, recipe: Recipe, margin: float, base: dict, cost: str
) -> Verification:
    """The verdict when both sides have finished runs (the differences of those only)."""
    decision = non_inferiority(many.accuracies, ones.accuracies, margin)
    curves = [record.curve for record in ones.completed_records()]
    reference = convergence(curves, margin) if curves else None
    text = judgement(decision, reference)
    if ones.with_status(Status.DIVERGED):
        text += f" (1-tower runs diverged: {ones.count(Status.DIVERGED)}, left out)"
    diverged = many.with_status(Status.DIVERGED)
    if diverged:
        outcome: VerdictOutcome = "missed"
        verdict = (
            f"it did not: {many.count(Status.DIVERGED)} recipe runs diverged (the finished ones: "
            f"{decision.interval()}); the probe's advice: {recipe.if_diverged}; {cost}"
        )
    elif decision.outcome == "reached":
        converged = reference is None or reference.converged
        outcome = "reached" if converged else "unconverged"
        limit = f"; {reference.note()}" if reference is not None and converged else ""
        verdict = f"{'the recipe ' if converged else ''}{text}{limit}; {cost}"
    elif decision.outcome == "inconclusive":
        outcome = "inconclusive"
        verdict = f"{text}; else try: {next_to_try(recipe)}; {cost}"
    else:
        outcome = "missed"
        verdict = f"the recipe {text}; next thing to try: {next_to_try(recipe)}; {cost}"
    difference = decision.difference
    return Verification(
        **base,
        difference_pp=100 * difference.difference,
        ci_low_pp=None if difference.ci_low is None else 100 * difference.ci_low,
        ci_high_pp=None if difference.ci_high is None else 100 * difference.ci_high,
        outcome=outcome,
        verdict=verdict,
        seeds_needed=decision.seeds_needed,
        reference_converged=None if reference is None else reference.converged,
    )


def verification_records(tracking: TrackingConfig, result: SweepResult) -> list[RunRecord]:
    """The verification sweep's runs read back from MLflow (curves, steps, wall times)."""
    client = client_for(tracking)
    return sweep_records(client, sweep_parent(client, result.parent_run_id))
