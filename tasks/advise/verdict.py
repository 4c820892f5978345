"""The verdict of `towerbench advise --verify`: did the recipe's K towers reach the 1-tower
accuracy, what next if not, and what the K towers cost in time.

Three outcomes:
- reached: the mean difference over seeds is at least -1 pp (the report's "close enough") and,
  with two or more seeds a side, the 95% interval of Welch's test reaches 0; no K-tower run
  diverged.
- missed: a K-tower run diverged, the interval lies below 0 (worse beyond the seeds' noise), or
  with one seed a side the difference is below -1 pp.
- inconclusive: the mean is more than 1 pp below but the interval reaches 0: the seeds disagree
  too much to tell, and more seeds would.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, computed_field

from towerbench.core.outcome import ConfigSummary, Status, SweepResult
from towerbench.tasks.advise.recipe import Recipe
from towerbench.tasks.report.statistics import CLOSE_ENOUGH, welch


class Verification(BaseModel):
    """What the verification sweep measured, and its one-line verdict."""

    parent_run_id: str
    report: str
    difference_pp: float | None  # K towers - 1 tower, mean test accuracy, percentage points
    ci_low_pp: float | None
    ci_high_pp: float | None
    outcome: Literal["reached", "missed", "inconclusive", "none"]
    time_ratio: float | None  # mean wall time of a K-tower run / of a 1-tower run
    verdict: str

    @computed_field  # type: ignore[prop-decorator]  # pydantic's documented use
    @property
    def reached(self) -> bool:
        return self.outcome == "reached"


def next_to_try(recipe: Recipe) -> str:
    """The change most likely to close a remaining gap, after this recipe."""
    rule, budget = recipe.lr_scaling.value, recipe.budget.value
    if budget == "epochs" and rule != "adascale":
        return "equal updates (sweep.budget: updates; Hoffer et al.)"
    if rule == "linear":
        return "sqrt scaling (sweep.lr_scaling: sqrt), or a longer warmup"
    if rule == "sqrt":
        return "adascale (sweep.lr_scaling: adascale), which scales the LR by the gain it measures"
    if rule == "adascale":
        return "sqrt scaling at equal updates (sweep.lr_scaling: sqrt, sweep.budget: updates)"
    return "more epochs at the base LR, or a smaller per-tower batch"


def _accuracies(summaries: list[ConfigSummary], one_tower: bool) -> list[float]:
    return [
        summary.test_accuracy
        for summary in summaries
        if (summary.towers * summary.workers == 1) == one_tower
        and summary.status in (Status.COMPLETED, Status.DIVERGED)
        and summary.test_accuracy is not None
    ]


def _time_ratio(summaries: list[ConfigSummary]) -> tuple[float | None, str]:
    """K-tower over 1-tower mean wall time, and how it reads."""
    times: dict[bool, list[float]] = {True: [], False: []}
    for summary in summaries:
        if summary.wall_time is not None and summary.status == Status.COMPLETED:
            times[summary.towers * summary.workers == 1].append(summary.wall_time)
    if not times[True] or not times[False]:
        return None, "time not recorded for both sides (runs reused from an earlier attempt)"
    one, many = (sum(values) / len(values) for values in (times[True], times[False]))
    ratio = many / one
    return ratio, f"it took {ratio:.2f}× the 1-tower time ({many:.1f} s against {one:.1f} s)"


def _pp(value: float) -> str:
    return f"{100 * value:+.1f}".replace("-", "−")


def verify_outcome(result: SweepResult, recipe: Recipe) -> Verification:
    """The verdict on the verification sweep `result` of `recipe`."""
    ones, many = _accuracies(result.configs, True), _accuracies(result.configs, False)
    ratio, cost = _time_ratio(result.configs)
    diverged = [s for s in result.configs if s.status == Status.DIVERGED and s.towers > 1]
    if not ones or not many:
        verdict = "no verdict: a side has no finished run (see the report)"
        return Verification(
            parent_run_id=result.parent_run_id,
            report=result.report,
            difference_pp=None,
            ci_low_pp=None,
            ci_high_pp=None,
            outcome="none",
            time_ratio=ratio,
            verdict=verdict,
        )
    difference = welch(many, ones)
    interval = (
        f", 95% CI [{_pp(difference.ci_low)}, {_pp(difference.ci_high)}]"
        if difference.ci_low is not None and difference.ci_high is not None
        else " (one seed a side: no interval)"
    )
    close = difference.difference >= -CLOSE_ENOUGH
    reaches_zero = difference.ci_high is None or difference.ci_high >= 0
    measured = f"Δ {_pp(difference.difference)} pp{interval}"
    if close and reaches_zero and not diverged:
        outcome = "reached"
        verdict = f"the recipe reached the 1-tower accuracy: {measured}; {cost}"
    elif reaches_zero and not diverged and difference.ci_low is not None:
        outcome = "inconclusive"
        verdict = (
            f"inconclusive: {measured}: the seeds disagree too much to tell a miss from noise; "
            f"more seeds (--seeds) would narrow it, else try: {next_to_try(recipe)}; {cost}"
        )
    else:
        outcome = "missed"
        why = f" ({len(diverged)} run(s) diverged)" if diverged else ""
        verdict = f"it did not: {measured}{why}, next thing to try: {next_to_try(recipe)}; {cost}"
    return Verification(
        parent_run_id=result.parent_run_id,
        report=result.report,
        difference_pp=100 * difference.difference,
        ci_low_pp=None if difference.ci_low is None else 100 * difference.ci_low,
        ci_high_pp=None if difference.ci_high is None else 100 * difference.ci_high,
        outcome=outcome,
        time_ratio=ratio,
        verdict=verdict,
    )
