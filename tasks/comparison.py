"""The statistics of a sweep report: seeds summarised, each configuration against 1 tower.

Plain numpy/scipy on numbers already read from MLflow, so every figure can be checked by hand.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from scipy import stats

from model.config import TrainConfig


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


@dataclass(frozen=True)
class Curve:
    """Test accuracy of one run after each evaluation."""

    epochs: list[float]
    wall_times: list[float]
    accuracies: list[float]


def time_to_target(curve: Curve, target: float) -> float | None:
    """Wall-clock seconds until test accuracy first reaches `target` (None: never)."""
    for seconds, accuracy in zip(curve.wall_times, curve.accuracies, strict=True):
        if accuracy >= target:
            return seconds
    return None


def scaling_efficiency(images_per_sec: float, baseline_images_per_sec: float, towers: int) -> float:
    """Throughput with k towers as a fraction of k times the 1-tower throughput."""
    return images_per_sec / (towers * baseline_images_per_sec)


def noise_scale_note(global_batch: int, noise_scale: float | None) -> str | None:
    """What the measured gradient noise scale B_simple says about this global batch."""
    if noise_scale is None or not math.isfinite(noise_scale) or noise_scale <= 0:
        return None
    if global_batch > 2 * noise_scale:
        return (
            f"global batch {global_batch} is far above the measured noise scale ≈ "
            f"{noise_scale:.0f}: expect diminishing returns per example"
        )
    if global_batch < noise_scale / 2:
        return (
            f"global batch {global_batch} is well below the noise scale ≈ {noise_scale:.0f}: "
            "larger batches should still pay off almost linearly"
        )
    return f"global batch {global_batch} is near the noise scale ≈ {noise_scale:.0f}"


@dataclass
class RunRecord:
    """One configuration run with one seed, as recorded in MLflow."""

    run_id: str
    name: str
    group: str
    config: TrainConfig
    status: str  # completed | diverged | failed | running
    final_accuracy: float | None
    images_per_sec: float | None
    effective_lr: float | None
    noise_scale: float | None
    device_kind: str | None
    curve: Curve
    error: str | None = None


@dataclass
class GroupRow:
    """One configuration (all its seeds) compared with the 1-tower baseline."""

    group: str
    config: TrainConfig
    runs: list[RunRecord]
    accuracy: Summary
    difference: Difference | None
    time_to_target: float | None
    reached_target: int
    speedup: float | None
    images_per_sec: float | None
    efficiency: float | None
    noise_scale: float | None
    verdict: str = ""
    is_baseline: bool = False
    notes: list[str] = field(default_factory=list)


def _mean(values: list[float | None]) -> float | None:
    present = [value for value in values if value is not None and math.isfinite(value)]
    return float(np.mean(present)) if present else None


def _baseline_for(group: list[RunRecord], groups: dict[str, list[RunRecord]], swept: list[str]):
    """The 1-tower group with the same other swept settings (preferring the same LR policy)."""
    config = group[0].config
    candidates = [
        name
        for name, runs in groups.items()
        if runs[0].config.towers == 1
        and all(getattr(runs[0].config, key) == getattr(config, key) for key in swept)
    ]
    candidates.sort(
        key=lambda name: (
            groups[name][0].config.lr_scaling != config.lr_scaling,
            groups[name][0].config.warmup_epochs != config.warmup_epochs,
        )
    )
    return candidates[0] if candidates else None


def verdict(row: GroupRow, baseline: GroupRow | None) -> str:
    """One plain-language sentence: is the difference real, and what to change."""
    config = row.config
    failed = [run for run in row.runs if run.status == "failed"]
    diverged = [run for run in row.runs if run.status == "diverged"]
    if len(failed) == len(row.runs):
        return f"failed: {failed[0].error or 'see the run log'}"
    if diverged:
        lr = _mean([run.effective_lr for run in diverged])
        lr_text = f" at LR {lr:g}" if lr is not None else ""
        return (
            f"diverged in {len(diverged)}/{len(row.runs)} seeds{lr_text} (global batch "
            f"{config.global_batch}): lower the peak LR (sqrt scaling) or lengthen the warmup"
        )
    if row.accuracy.count == 0 and any(run.status == "running" for run in row.runs):
        return "still running: no seed has finished yet"
    if row.is_baseline:
        return "baseline"
    if baseline is None or row.difference is None:
        return "no 1-tower baseline to compare with"
    difference = row.difference
    points = 100 * difference.difference
    if difference.p_value is None:
        return f"{points:+.1f} pp from one seed per side: add seeds to tell it from noise"
    if difference.p_value >= 0.05:
        return (
            f"no significant difference ({points:+.1f} pp, 95% CI "
            f"[{100 * difference.ci_low:+.1f}, {100 * difference.ci_high:+.1f}], "
            f"p={difference.p_value:.2f})"
        )
    if points > 0:
        return f"{points:+.1f} pp better than 1 tower (p={difference.p_value:.3f})"
    base_config = baseline.config
    prefix = f"{points:+.1f} pp (p={difference.p_value:.3f})"
    if config.aggregation == "sum" and config.towers > 1:
        return (
            f"{prefix}: summed gradients make each step {config.towers}x larger — aggregate "
            f"with mean or divide the LR by {config.towers}"
        )
    if config.global_batch > base_config.global_batch and config.lr_scaling == "none":
        return (
            f"{prefix}: global batch {config.global_batch} at unscaled LR {config.base_lr:g} "
            "— apply linear scaling"
        )
    if config.lr_scaling != "none" and config.warmup_epochs == 0:
        return (
            f"{prefix}: {config.lr_scaling} scaling jumps straight to the peak LR — add warmup "
            "epochs"
        )
    if config.global_batch > base_config.global_batch:
        ratio = config.global_batch / base_config.global_batch
        other_rule = "sqrt" if config.lr_scaling == "linear" else "linear"
        return (
            f"{prefix}: {ratio:g}x fewer updates per epoch — train for more epochs (the same "
            f"number of updates) or compare {other_rule} scaling"
        )
    return f"{prefix}: the runs differ beyond seed noise — compare their learning curves"


def compare(
    runs: list[RunRecord], swept: list[str], target_accuracy: float | None
) -> tuple[list[GroupRow], float | None]:
    """One row per configuration, in run order, and the target accuracy used for timing."""
    groups: dict[str, list[RunRecord]] = {}
    for run in runs:
        groups.setdefault(run.group, []).append(run)

    def finals(group: list[RunRecord]) -> list[float]:
        return [
            run.final_accuracy
            for run in group
            if run.status == "completed" and run.final_accuracy is not None
        ]

    baselines = {name: _baseline_for(group, groups, swept) for name, group in groups.items()}
    if target_accuracy is None:
        baseline_means = [
            summarize(finals(groups[name])).mean for name in set(baselines.values()) if name
        ]
        baseline_means = [mean for mean in baseline_means if math.isfinite(mean)]
        target_accuracy = 0.95 * min(baseline_means) if baseline_means else None

    rows: dict[str, GroupRow] = {}
    for name, group in groups.items():
        completed = [run for run in group if run.status == "completed"]
        times = [
            time_to_target(run.curve, target_accuracy) if target_accuracy is not None else None
            for run in completed
        ]
        rows[name] = GroupRow(
            group=name,
            config=group[0].config,
            runs=group,
            accuracy=summarize(finals(group)),
            difference=None,
            time_to_target=_mean(times),
            reached_target=sum(time is not None for time in times),
            speedup=None,
            images_per_sec=_mean([run.images_per_sec for run in completed]),
            efficiency=None,
            noise_scale=_mean([run.noise_scale for run in completed]),
            is_baseline=baselines[name] == name,
        )
    for name, row in rows.items():
        baseline = rows.get(baselines[name] or "")
        if baseline is not None and not row.is_baseline:
            sample, reference = finals(row.runs), finals(baseline.runs)
            if sample and reference:
                row.difference = welch(sample, reference)
            if row.time_to_target and baseline.time_to_target:
                row.speedup = baseline.time_to_target / row.time_to_target
            if row.images_per_sec and baseline.images_per_sec:
                row.efficiency = scaling_efficiency(
                    row.images_per_sec, baseline.images_per_sec, row.config.towers
                )
        row.verdict = verdict(row, baseline)
        note = noise_scale_note(row.config.global_batch, row.noise_scale)
        if note and row.verdict not in ("baseline",) and not row.verdict.startswith("failed"):
            row.notes.append(note)
    return list(rows.values()), target_accuracy


@dataclass(frozen=True)
class EpochCell:
    """Mean test accuracy of a configuration's seeds at one evaluation, and how many had one."""

    mean: float
    seeds: int


def accuracy_by_epoch(rows: list[GroupRow]) -> dict[float, dict[str, EpochCell]]:
    """For every evaluated epoch, each configuration's test accuracy averaged over its seeds."""
    collected: dict[float, dict[str, list[float]]] = {}
    for row in rows:
        for run in row.runs:
            for epoch, accuracy in zip(run.curve.epochs, run.curve.accuracies, strict=True):
                collected.setdefault(round(epoch, 2), {}).setdefault(row.group, []).append(accuracy)
    return {
        epoch: {
            group: EpochCell(float(np.mean(values)), len(values))
            for group, values in by_group.items()
        }
        for epoch, by_group in sorted(collected.items())
    }
