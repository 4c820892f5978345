"""The statistics of a sweep report: seeds summarised, each configuration against 1 tower.

Plain numpy/scipy on numbers already read from MLflow, so every figure can be checked by hand.
Runs are compared by *score*: train.metric's value, negated when lower is better (MAE, RMSE),
so that higher is better for every metric; config.metrics.Metric words scores as values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from scipy import stats

from towerbench.config.sections import TrainConfig
from towerbench.core.errors import TowerbenchError
from towerbench.core.metrics import METRICS, Metric
from towerbench.core.outcome import Status

ACCURACY = METRICS["accuracy"]


@dataclass(frozen=True)
class Summary:
    """Mean and sample standard deviation (ddof=1; NaN with one value) over seeds."""

    mean: float
    std: float
    count: int


def summarize(values: list[float]) -> Summary:
    array = np.asarray(values, dtype=float)
    if array.size == 0:
        return Summary(math.nan, math.nan, 0)
    std = float(array.std(ddof=1)) if array.size > 1 else math.nan
    return Summary(float(array.mean()), std, int(array.size))


@dataclass(frozen=True)
class Difference:
    """sample mean - baseline mean, its confidence interval and Welch's two-sided p-value.

    The interval and p-value are None when either side has fewer than two values.
    """

    difference: float
    ci_low: float | None
    ci_high: float | None
    p_value: float | None


def welch(sample: list[float], baseline: list[float], confidence: float = 0.95) -> Difference:
    """Welch's unequal-variance t-test with the Welch-Satterthwaite degrees of freedom."""
    a, b = np.asarray(sample, dtype=float), np.asarray(baseline, dtype=float)
    difference = float(a.mean() - b.mean())
    if a.size < 2 or b.size < 2:
        return Difference(difference, None, None, None)
    var_a, var_b = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    standard_error = math.sqrt(var_a + var_b)
    if standard_error == 0:  # identical seeds on both sides: no spread to test against
        return Difference(difference, difference, difference, 1.0 if difference == 0 else 0.0)
    dof = (var_a + var_b) ** 2 / (var_a**2 / (a.size - 1) + var_b**2 / (b.size - 1))
    p_value = 2 * stats.t.sf(abs(difference) / standard_error, dof)
    half_width = stats.t.ppf(0.5 + confidence / 2, dof) * standard_error
    return Difference(difference, difference - half_width, difference + half_width, float(p_value))


CLOSE_ENOUGH = 0.01  # 1 percentage point of accuracy: non_inferiority's default margin
MOST_SEEDS = 100  # beyond this many seeds a side, "inconclusive" says "more than 100"
# What passing the last-quarter check does not show, as measured (docs/findings.md, the fastest
# recipe: a 24-epoch reference that passed it, and the same at 48 epochs).
LONGER_REFERENCE = (
    "that check reads the end of its schedule, not of training: on 10,000 CIFAR-10 images a "
    "step-schedule reference that passed it gained +4.5 pp at twice the epochs (docs/findings.md); "
    "a reference at twice the epochs is the stronger check"
)

Outcome = Literal["reached", "not reached", "inconclusive"]


@dataclass(frozen=True)
class NonInferiority:
    """Did the sample reach the baseline's score within `margin`? "reached" when the 95%
    interval of (sample - baseline) lies above -margin, "not reached" when it lies below,
    "inconclusive" otherwise (one seed a side included), with the seeds per side the measured
    spread says would decide it (None: no spread measured). Worded in `metric`'s values: an
    error's interval lies *below* +margin when reached."""

    outcome: Outcome
    difference: Difference
    margin: float
    seeds_needed: int | None = None
    metric: Metric = ACCURACY

    def interval(self) -> str:
        """`Δ +0.3 pp, 95% CI [−0.5, +1.1]` (or `(one seed a side: no interval)`)."""
        low, high = self.difference.ci_low, self.difference.ci_high
        text = f"Δ {self.metric.change(self.difference.difference)}"
        if low is None or high is None:
            return f"{text} (one seed a side: no interval)"
        return f"{text}, 95% CI {self.metric.interval(low, high)}"

    def reason(self) -> str:
        """Why the outcome, against the margin, in a clause."""
        metric = self.metric
        bound = metric.bound(self.margin)
        if self.outcome == "reached":
            return f"the interval lies {metric.better} {bound}"
        if self.outcome == "not reached":
            return f"the interval lies {metric.worse} {bound}"
        if self.seeds_needed is None:
            return (
                f"no interval to set against {bound}: more seeds (at least 3 a side) would give one"
            )
        more = "more than " if self.seeds_needed > MOST_SEEDS else ""
        return (
            f"the interval straddles {bound}: {more}{min(self.seeds_needed, MOST_SEEDS)} seeds "
            "per side would decide it at the measured spread"
        )


def signed_pp(value: float) -> str:
    """A fraction as signed percentage points with a true minus sign: `−1.2`, `+0.4`."""
    return f"{100 * value:+.1f}".replace("-", "−")


def seeds_to_decide(
    sample: list[float], baseline: list[float], margin: float, confidence: float = 0.95
) -> int | None:
    """The fewest seeds per side whose 95% interval would clear -margin, if the difference and
    the spread (the pooled sample standard deviation) stayed as measured; None without any
    spread measured (fewer than two values on both sides), MOST_SEEDS + 1 beyond MOST_SEEDS."""
    spreads = [np.var(side, ddof=1) for side in (sample, baseline) if len(side) > 1]
    if not spreads:
        return None
    spread = math.sqrt(float(np.mean(spreads)))
    gap = abs(float(np.mean(sample) - np.mean(baseline)) + margin)
    for seeds in range(2, MOST_SEEDS + 1):
        dof = 2 * seeds - 2
        half_width = stats.t.ppf(0.5 + confidence / 2, dof) * spread * math.sqrt(2 / seeds)
        if half_width < gap:
            return seeds
    return MOST_SEEDS + 1


def non_inferiority(
    sample: list[float],
    baseline: list[float],
    margin: float = CLOSE_ENOUGH,
    metric: Metric = ACCURACY,
) -> NonInferiority:
    """The non-inferiority verdict on final scores (see NonInferiority); one rule for the
    report's verdicts and advise's."""
    difference = welch(sample, baseline)
    low, high = difference.ci_low, difference.ci_high
    if low is not None and low > -margin:
        return NonInferiority("reached", difference, margin, metric=metric)
    if high is not None and high < -margin:
        return NonInferiority("not reached", difference, margin, metric=metric)
    seeds = seeds_to_decide(sample, baseline, margin)
    return NonInferiority("inconclusive", difference, margin, seeds, metric)


@dataclass(frozen=True)
class Convergence:
    """Whether the reference stopped improving: its test score's rise over the last quarter
    of its epochs (mean over seeds) against the noise between seeds (the sample standard
    deviation of their final scores), never less than the verdicts' margin."""

    converged: bool
    rise: float
    noise: float
    noise_kind: str  # the spread between seeds, or the margin when larger
    metric: Metric = ACCURACY

    def evidence(self) -> str:
        """`+7.4 pp over the last quarter of its epochs, more than 1.0 pp (the margin)` (an
        error falls as it improves: `−0.031 ...`)."""
        rise = f"{self.metric.change(self.rise)} over the last quarter of its epochs"
        against = "within" if self.converged else "more than"
        return f"{rise}, {against} {self.metric.amount(self.noise)} ({self.noise_kind})"

    def text(self) -> str:
        state = "had converged" if self.converged else "was still improving"
        return f"the reference {state} ({self.evidence()})"

    def note(self) -> str:
        """The 1-tower baseline's note, passed or not (the report's, and advise's beside
        "reached")."""
        if self.converged:
            passed = f"the reference passed the last-quarter check ({self.evidence()})"
            return f"{passed}; {LONGER_REFERENCE}"
        return f"{self.text()}: differences from it compare under-trained runs"


def judgement(decision: NonInferiority, reference: Convergence | None) -> str:
    """The verdict's sentence on a decision, the same in the report and in advise: "reached"
    becomes "the reference was still improving" when the reference had not converged."""
    still = reference is not None and not reference.converged
    if decision.outcome == "reached" and still and reference is not None:
        return (
            "the reference was still improving: Δ compares two under-trained runs "
            f"({decision.interval()}; {reference.evidence()})"
        )
    after = f"; {reference.text()}" if still and reference is not None else ""
    if decision.outcome == "inconclusive":
        return f"inconclusive: {decision.interval()}: {decision.reason()}{after}"
    reached = "reached" if decision.outcome == "reached" else "did not reach"
    label = decision.metric.label
    return f"{reached} the 1-tower {label}: {decision.interval()} ({decision.reason()}){after}"


def _last_quarter_rise(curve: Curve) -> float | None:
    """The test score at the last evaluation minus at the last one at or before 3/4 of the
    epochs; None without both."""
    if not curve.epochs:
        return None
    last = curve.epochs[-1]
    earlier = [i for i, epoch in enumerate(curve.epochs) if epoch <= 0.75 * last + 1e-9]
    if not earlier or curve.epochs[earlier[-1]] == last:
        return None
    return curve.scores[-1] - curve.scores[earlier[-1]]


def convergence(
    curves: list[Curve], margin: float = CLOSE_ENOUGH, metric: Metric = ACCURACY
) -> Convergence | None:
    """The reference's convergence check on its seeds' score curves; None when no curve has
    an evaluation before its last quarter."""
    rises = [rise for curve in curves if (rise := _last_quarter_rise(curve)) is not None]
    if not rises:
        return None
    finals = [curve.scores[-1] for curve in curves if curve.scores]
    spread = float(np.std(finals, ddof=1)) if len(finals) > 1 else 0.0
    if spread > margin:
        noise, kind = spread, "the spread between seeds"
    else:  # seeds that agree (or one seed) cannot ask for less than the verdicts' margin
        noise, kind = margin, "the margin" if len(finals) > 1 else "the margin, one seed"
    rise = float(np.mean(rises))
    return Convergence(rise <= noise, rise, noise, kind, metric)


@dataclass(frozen=True)
class Curve:
    """The test score of one run after each evaluation."""

    epochs: list[float]
    wall_times: list[float]
    scores: list[float]


def time_to_target(curve: Curve, target: float) -> float | None:
    """Wall-clock seconds until the test score first reaches `target` (None: never)."""
    for seconds, score in zip(curve.wall_times, curve.scores, strict=True):
        if score >= target:
            return seconds
    return None


def scaling_efficiency(images_per_sec: float, baseline_images_per_sec: float, towers: int) -> float:
    """Throughput with k towers (over all workers) as a fraction of k times the 1-tower
    throughput."""
    return images_per_sec / (towers * baseline_images_per_sec)


# The per-epoch metrics of lr_scaling adascale (model.records.EpochRecord).
ADASCALE_METRICS = ("adascale_gain", "adascale_sigma_sq", "adascale_mu_sq", "adascale_tau")
# With BatchNorm: test accuracy with its moving statistics and re-estimated at the weights.
BN_METRICS = ("test_accuracy_moving_bn", "test_accuracy_recomputed_bn")

EpochCurve = tuple[list[float], list[float]]  # (epochs, values)


@dataclass
class RunRecord:
    """One configuration run with one seed, as recorded in MLflow. `noise_scale` is the one
    that advises (model.noise_advice: the harmonic mean of its per-epoch values)."""

    run_id: str
    name: str
    group: str
    config: TrainConfig
    status: Status
    final_score: float | None  # train.metric's last value as a score (higher is better)
    images_per_sec: float | None
    effective_lr: float | None
    noise_scale: float | None
    device_kind: str | None
    curve: Curve
    error: str | None = None
    unstable: str | None = None  # why learning collapsed, if it did
    steps: float | None = None  # optimizer updates made
    epochs: float | None = None  # epochs trained (MLflow `epochs`: steps / steps per epoch)
    losses: dict[str, float] = field(default_factory=dict)  # final losses (see LOSS_METRICS)
    loss_curves: dict[str, EpochCurve] = field(default_factory=dict)
    model_digest: str | None = None  # sha256 of the user's model file the run trained
    final_noise_scale: float | None = None  # its last value: an average over ~100 steps
    # Per epoch: `noise_scale` and, under adascale, ADASCALE_METRICS.
    noise_curves: dict[str, EpochCurve] = field(default_factory=dict)
    bn_curves: dict[str, EpochCurve] = field(default_factory=dict)  # BN_METRICS per evaluation
    metric: Metric = ACCURACY  # what it is judged by (MLflow param `effective.metric`)

    def last(self, key: str) -> float | None:
        """The last per-epoch value of `key` in `noise_curves`."""
        values = self.noise_curves.get(key, ([], []))[1]
        return values[-1] if values else None


@dataclass(frozen=True)
class AdaScaleSummary:
    """A configuration's AdaScale, averaged over its completed seeds: the mean gain over the run
    (tau / updates), the last epoch's gain, sigma^2 and |mu|^2, tau and the updates made."""

    mean_gain: float
    last_gain: float
    sigma_sq: float
    mu_sq: float
    tau: float
    updates: float


def adascale_summary(runs: list[RunRecord]) -> AdaScaleSummary | None:
    """The AdaScale of `runs` (those that logged tau and made updates), or None."""
    logged, mean_gains = [], []
    for run in runs:
        tau = run.last("adascale_tau")
        if tau is not None and run.steps:
            logged.append(run)
            mean_gains.append(tau / run.steps)
    if not logged:
        return None

    def mean(values) -> float:
        return float(np.mean(list(values)))

    return AdaScaleSummary(
        mean_gain=mean(mean_gains),
        last_gain=mean(run.last("adascale_gain") for run in logged),
        sigma_sq=mean(run.last("adascale_sigma_sq") for run in logged),
        mu_sq=mean(run.last("adascale_mu_sq") for run in logged),
        tau=mean(run.last("adascale_tau") for run in logged),
        updates=mean(run.steps for run in logged),
    )


@dataclass
class GroupRow:
    """One configuration (all its seeds) compared with the 1-tower baseline."""

    group: str
    config: TrainConfig
    runs: list[RunRecord]
    score: Summary  # of its completed seeds' final scores
    difference: Difference | None
    time_to_target: float | None
    reached_target: int
    speedup: float | None
    images_per_sec: float | None
    efficiency: float | None
    noise_scale: float | None  # the advising one, mean over stable completed seeds
    verdict: str = ""
    is_baseline: bool = False
    notes: list[str] = field(default_factory=list)
    baseline_group: str | None = None
    losses: dict[str, float | None] = field(default_factory=dict)  # mean over completed seeds
    steps: float | None = None  # mean optimizer updates of its trained seeds (see _trained)
    epochs: float | None = None  # mean epochs trained, of the same seeds
    final_noise_scale: float | None = None  # mean over stable completed seeds
    adascale: AdaScaleSummary | None = None
    decision: NonInferiority | None = None  # against the baseline
    convergence: Convergence | None = None  # of a baseline's completed seeds
    epochs_factor: float | None = None  # its configured epochs / its baseline's
    examples_factor: float | None = None  # its epochs trained / its baseline's: examples seen
    budget: str | None = None  # which budget its epochs are, and why (budget_reason)
    margin: float | None = None  # the non-inferiority margin against (or of) its baseline

    @property
    def metric(self) -> Metric:
        return self.runs[0].metric

    @property
    def unstable(self) -> list[RunRecord]:
        return [run for run in self.runs if run.unstable]

    @property
    def closes_gap(self) -> bool:
        """Reached the baseline's score: the 95% interval lies above -margin."""
        return self.decision is not None and self.decision.outcome == "reached"


MORE_EXAMPLES = 1.05  # beyond this factor a verdict says how many more examples a row saw


def more_examples(row: GroupRow) -> str | None:
    """`2.32× the training examples of `towers=1` (18.6 epochs trained against 8)` when `row`
    saw more than MORE_EXAMPLES times its baseline's examples; else None."""
    factor, epochs = row.examples_factor, row.epochs
    if factor is None or epochs is None or factor <= MORE_EXAMPLES:
        return None
    return (
        f"{factor:.2f}× the training examples of `{row.baseline_group}` ({epochs:.3g} epochs "
        f"trained against {epochs / factor:.3g})"
    )


def _mean(values: list[float | None]) -> float | None:
    present = [value for value in values if value is not None and math.isfinite(value)]
    return float(np.mean(present)) if present else None


def _baseline_for(group: list[RunRecord], groups: dict[str, list[RunRecord]], swept: list[str]):
    """The 1-tower group (of 1 worker) with the same other swept settings (preferring the same
    LR policy)."""
    config = group[0].config
    candidates = [
        name
        for name, runs in groups.items()
        if runs[0].config.replicas == 1
        and all(getattr(runs[0].config, key) == getattr(config, key) for key in swept)
    ]
    candidates.sort(
        key=lambda name: (
            groups[name][0].config.lr_scaling != config.lr_scaling,
            groups[name][0].config.warmup_epochs != config.warmup_epochs,
        )
    )
    return candidates[0] if candidates else None


def _finals(group: list[RunRecord]) -> list[float]:
    """The final scores of a group's completed runs."""
    return [
        run.final_score
        for run in group
        if run.status == Status.COMPLETED and run.final_score is not None
    ]


def _trained(group: list[RunRecord]) -> list[RunRecord]:
    """The runs whose epochs and updates a row states: the completed ones, else (none
    completed) the diverged ones, which trained until they diverged."""
    completed = [run for run in group if run.status == Status.COMPLETED]
    return completed or [run for run in group if run.status == Status.DIVERGED]


def _group_row(
    name: str, group: list[RunRecord], baseline: str | None, target: float | None
) -> GroupRow:
    """A configuration's row, before it is compared with its baseline."""
    completed = [run for run in group if run.status == Status.COMPLETED]
    stable = [run for run in completed if not run.unstable]
    times = [time_to_target(run.curve, target) if target is not None else None for run in completed]
    return GroupRow(
        group=name,
        config=group[0].config,
        runs=group,
        score=summarize(_finals(group)),
        difference=None,
        time_to_target=_mean(times),
        reached_target=sum(time is not None for time in times),
        speedup=None,
        images_per_sec=_mean([run.images_per_sec for run in completed]),
        efficiency=None,
        noise_scale=_mean([run.noise_scale for run in stable]),
        final_noise_scale=_mean([run.final_noise_scale for run in stable]),
        adascale=adascale_summary(completed),
        is_baseline=baseline == name,
        baseline_group=baseline,
        losses={
            key: _mean([run.losses.get(key) for run in completed])
            for key in dict.fromkeys(key for run in completed for key in run.losses)
        },
        steps=_mean([run.steps for run in _trained(group)]),
        epochs=_mean([run.epochs for run in _trained(group)]),
    )


def budget_reason(config: TrainConfig, baseline: TrainConfig) -> str:
    """Which budget a configuration trained against its 1-tower baseline, read from the epochs
    both ran (config/grid.py stretched them): equal epochs, equal updates, AdaScale's progress
    tau, or the noise scale's factor (1 + B/N) / (1 + b/N) between the two, N solved from it."""
    factor = config.epochs / baseline.epochs
    batch, base = config.global_batch, baseline.global_batch
    if config.lr_scaling == "adascale":
        times = "" if math.isclose(factor, 1.0, rel_tol=1e-6) else f"{factor:.3g}× "
        return f"AdaScale's own: its progress tau reaches {times}1 tower's updates"
    if math.isclose(factor, 1.0, rel_tol=1e-6):
        return "equal epochs"
    if math.isclose(factor, batch / base, rel_tol=1e-6):
        return f"equal updates ({factor:.3g}× the epochs)"
    noise = (batch - factor * base) / (factor - 1)
    if noise <= 0:
        return f"{factor:.3g}× the epochs"
    return (
        f"the noise scale's: {factor:.2f}× the epochs = (1 + {batch}/{noise:.0f}) / "
        f"(1 + {base}/{noise:.0f}) at noise scale {noise:.0f}"
    )


def _compare_with(row: GroupRow, baseline: GroupRow, margin: float | None) -> None:
    """Fill in `row`'s difference and non-inferiority decision, speedup, scaling efficiency,
    budget (its configured epochs over the baseline's) and examples seen (its epochs trained over
    the baseline's) against `baseline`."""
    sample, reference = _finals(row.runs), _finals(baseline.runs)
    row.margin = margin
    if sample and reference and margin is not None:
        row.decision = non_inferiority(sample, reference, margin, row.metric)
        row.difference = row.decision.difference
    row.epochs_factor = row.config.epochs / baseline.config.epochs
    row.budget = budget_reason(row.config, baseline.config)
    if row.epochs and baseline.epochs:  # one training set: epochs trained count its examples
        row.examples_factor = row.epochs / baseline.epochs
    if row.time_to_target and baseline.time_to_target:
        row.speedup = baseline.time_to_target / row.time_to_target
    if row.images_per_sec and baseline.images_per_sec:
        row.efficiency = scaling_efficiency(
            row.images_per_sec, baseline.images_per_sec, row.config.replicas
        )


def sweep_metric(runs: list[RunRecord]) -> Metric:
    """The one metric a sweep's runs are judged by (reading.judged_by gave them one)."""
    names = sorted({run.metric.name for run in runs})
    if len(names) > 1:
        raise TowerbenchError(f"the runs compared are judged by {' and '.join(names)}")
    return runs[0].metric if runs else ACCURACY


def default_target(baseline_means: list[float]) -> float | None:
    """The time-to-target default: 95% of the worst baseline's value (105% of an error's)."""
    means = [mean for mean in baseline_means if math.isfinite(mean)]
    return min(means) - 0.05 * abs(min(means)) if means else None


def _margin(margin: float | None, baseline: GroupRow) -> float | None:
    """report.margin, or the metric's default at the baseline's mean (Metric.default_margin;
    None while no baseline seed finished)."""
    if margin is not None:
        baseline.metric.check_bounded(margin, "report.margin")
        return margin
    mean = baseline.score.mean
    return baseline.metric.default_margin(mean) if math.isfinite(mean) else None


def group_rows(
    runs: list[RunRecord],
    swept: list[str],
    target: float | None,
    margin: float | None = None,
) -> tuple[list[GroupRow], float | None]:
    """One row per configuration, in run order, each against its 1-tower baseline (no verdicts
    yet; a baseline with its convergence check), and the target score used for timing
    (default: default_target). `margin` None: each metric's default (Metric.default_margin)."""
    metric = sweep_metric(runs)
    groups: dict[str, list[RunRecord]] = {}
    for run in runs:
        groups.setdefault(run.group, []).append(run)
    baselines = {name: _baseline_for(group, groups, swept) for name, group in groups.items()}
    if target is None:
        names = set(baselines.values()) - {None}
        target = default_target([summarize(_finals(groups[name])).mean for name in names])
    rows = {
        name: _group_row(name, group, baselines[name], target) for name, group in groups.items()
    }
    for name, row in rows.items():
        baseline = rows.get(baselines[name] or "")
        if row.is_baseline:
            row.margin = _margin(margin, row)
            completed = [run.curve for run in row.runs if run.status == Status.COMPLETED]
            if row.margin is not None:
                row.convergence = convergence(completed, row.margin, metric)
        elif baseline is not None:
            _compare_with(row, baseline, _margin(margin, baseline))
    return list(rows.values()), target


@dataclass(frozen=True)
class EpochCell:
    """Mean test score of a configuration's seeds at one evaluation, and how many had one."""

    mean: float
    seeds: int


def scores_by_epoch(rows: list[GroupRow]) -> dict[float, dict[str, EpochCell]]:
    """For every evaluated epoch, each configuration's test score averaged over its seeds."""
    collected: dict[float, dict[str, list[float]]] = {}
    for row in rows:
        for run in row.runs:
            for epoch, score in zip(run.curve.epochs, run.curve.scores, strict=True):
                collected.setdefault(round(epoch, 2), {}).setdefault(row.group, []).append(score)
    return {
        epoch: {
            group: EpochCell(float(np.mean(values)), len(values))
            for group, values in by_group.items()
        }
        for epoch, by_group in sorted(collected.items())
    }
