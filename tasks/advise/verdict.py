"""The verdict of `towerbench advise --verify`: did the recipe's K towers reach the 1-tower
value of the run's metric (train.metric: accuracy, MAE, ...), what next if not, and what the K
towers cost against the prediction.

The rule is the report's (tasks/report/statistics.py: non_inferiority, judgement, on scores:
the value, negated when lower is better), on the runs that finished; a diverged run's value is
never compared:
- reached: the 95% interval of (K towers - 1 tower) lies above -margin (report.margin; by
  default 1 pp of a share, 1% of 1 tower's MAE or RMSE), no recipe run diverged, and the 1-tower
  reference had converged (its last quarter of epochs moved the test metric by no more than the
  noise between seeds; else "unconverged": the reference was still improving, the difference
  compares two under-trained runs);
- missed: the interval lies below -margin, or a recipe run diverged;
- inconclusive: the interval straddles -margin (or one seed a side), with the seeds per side
  the measured spread says would decide it;
- diverged: every recipe run diverged: no difference, the probe's advice (what to change, to
  what value), and `towerbench advise` exits 1;
- none: a side has no finished run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, computed_field

from towerbench.config.params import TrackingConfig
from towerbench.core.metrics import METRICS, Metric
from towerbench.core.outcome import ConfigSummary, Status, SweepResult
from towerbench.tasks.advise.recipe import Recipe
from towerbench.tasks.report.reading import sweep_parent, sweep_records
from towerbench.tasks.report.statistics import (
    Difference,
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
    outcome: VerdictOutcome
    time_ratio: float | None  # mean wall time of a K-tower run / of a 1-tower run
    verdict: str
    seeds_needed: int | None = None  # per side, to decide an inconclusive verdict
    reference_converged: bool | None = None  # None: not checked (no curve)
    predicted_steps: int | None = None  # optimizer steps of a K-tower run
    measured_steps: float | None = None  # mean over the finished K-tower runs
    predicted_seconds: float | None = None  # of training steps
    measured_seconds: float | None = None  # mean wall time of the finished K-tower runs
    metric: str = "accuracy"  # what the runs were judged by (train.metric as resolved)
    # K towers - 1 tower, the mean test metric in its own values (MAE: positive is worse), and
    # its 95% interval; for a share (accuracy) also in percentage points.
    difference: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    difference_pp: float | None = None
    ci_low_pp: float | None = None
    ci_high_pp: float | None = None

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
    def scores(self) -> list[float]:
        """The completed runs' test metric as scores (statistics: higher is better)."""
        scores = []
        for summary in self.with_status(Status.COMPLETED):
            value = summary.test_metric if summary.metric else summary.test_accuracy
            if value is not None:
                scores.append(_metric_of([summary]).score(value))
        return scores

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


def _metric_of(summaries: list[ConfigSummary]) -> Metric:
    """What the runs were judged by: the first that says (accuracy for runs before it)."""
    named = [summary.metric for summary in summaries if summary.metric]
    return METRICS[named[0] if named else "accuracy"]


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
    if not ones.scores and ones.with_status(Status.DIVERGED):
        both = f", and {ones.count(Status.DIVERGED)} 1-tower runs too"
    return (
        f"every recipe run diverged ({many.count(Status.DIVERGED)} at "
        f"{many.summaries[0].towers * many.summaries[0].workers} towers{both}): no "
        f"{_metric_of(many.summaries).label} to compare; the probe's advice: {recipe.if_diverged}"
    )


def verify_outcome(
    result: SweepResult,
    recipe: Recipe,
    records: list[RunRecord] | None = None,
    margin: float | None = None,
) -> Verification:
    """The verdict on the verification sweep `result` of `recipe`; `records` (read back from
    MLflow: curves, steps) add the reference's convergence check and the measured steps;
    `margin` is report.margin (None: the metric's default, Metric.default_margin)."""
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
    empty = {"metric": _metric_of(result.configs).name}
    diverged = many.with_status(Status.DIVERGED)
    if diverged and not many.scores:
        verdict = _all_diverged(ones, many, recipe)
        return Verification(**base, **empty, outcome="diverged", verdict=verdict)
    if not ones.scores or not many.scores:
        missing = "1-tower" if not ones.scores else "recipe"
        why = (
            f" ({ones.count(Status.DIVERGED)} diverged)"
            if ones.with_status(Status.DIVERGED)
            else ""
        )
        verdict = (
            f"no verdict: no {missing} run finished{why}, no difference stated (see the report)"
        )
        return Verification(**base, **empty, outcome="none", verdict=verdict)
    metric = _metric_of(result.configs)
    if margin is None:
        margin = metric.default_margin(sum(ones.scores) / len(ones.scores))
    metric.check_bounded(margin, "report.margin")
    return _compared(ones, many, recipe, (margin, metric), base, cost)


def _compared(
    ones: _Side,
    many: _Side,
    recipe: Recipe,
    judged: tuple[float, Metric],
    base: dict,
    cost: str,
) -> Verification:
    """The verdict when both sides have finished runs (the differences of those only), by
    `judged`'s metric against its margin."""
    margin, metric = judged
    decision = non_inferiority(many.scores, ones.scores, margin, metric)
    curves = [record.curve for record in ones.completed_records()]
    reference = convergence(curves, margin, metric) if curves else None
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
    return Verification(
        **base,
        **_differences(decision.difference, metric),
        outcome=outcome,
        verdict=verdict,
        seeds_needed=decision.seeds_needed,
        reference_converged=None if reference is None else reference.converged,
    )


def _differences(difference: Difference, metric: Metric) -> dict[str, Any]:
    """Verification's differences in the metric's values (and in pp for a share)."""
    ends = [end for end in (difference.ci_low, difference.ci_high) if end is not None]
    low, high = sorted(metric.value(end) for end in ends) if ends else (None, None)
    values = {"difference": metric.value(difference.difference), "ci_low": low, "ci_high": high}
    if metric.share:
        values |= {
            f"{key}_pp": None if value is None else 100 * value for key, value in values.items()
        }
    return {"metric": metric.name, **values}


def verification_records(tracking: TrackingConfig, result: SweepResult) -> list[RunRecord]:
    """The verification sweep's runs read back from MLflow (curves, steps, wall times)."""
    client = client_for(tracking)
    return sweep_records(client, sweep_parent(client, result.parent_run_id))
