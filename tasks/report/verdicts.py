"""Plain-language verdicts that advise only what a sweep measured; other advice says "untested".

A remedy counts as measured when the sweep holds a configuration with the same towers and global
batch that applies it (more updates, a scaling rule, warmup, ...): the verdict then quotes that
configuration's result, and names it first when it closed the gap (reached 1 tower's accuracy:
the 95% interval of the difference above -margin, statistics.non_inferiority, the rule advise's
verdict also uses).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from towerbench.config.optimizers import family
from towerbench.config.sections import TrainConfig
from towerbench.core.outcome import Status
from towerbench.model.noise_advice import EPOCHS_TOLERANCE, epochs_needed
from towerbench.tasks.report.batch_norm import lag_note
from towerbench.tasks.report.in_batch import split_loss_note
from towerbench.tasks.report.statistics import (
    GroupRow,
    RunRecord,
    group_rows,
    judgement,
    more_examples,
)

Applies = Callable[[TrainConfig], bool]


def noise_scale_note(
    global_batch: int, noise_scale: float | None, reference_batch: int
) -> str | None:
    """What the advising noise scale (model.noise_advice: the harmonic mean over training) says
    about this global batch: where it stands, and the epochs the same progress needs."""
    if noise_scale is None or not math.isfinite(noise_scale) or noise_scale <= 0:
        return None
    against = f"the noise scale ≈ {noise_scale:.0f} (harmonic mean over training)"
    if global_batch > 2 * noise_scale:
        relation = f"far above {against}: each extra example buys less"
    elif global_batch < noise_scale / 2:
        relation = f"well below {against}: larger batches should still pay off almost linearly"
    else:
        relation = f"near {against}"
    needed = epochs_needed(noise_scale, reference_batch, global_batch)
    return (
        f"global batch {global_batch} is {relation}; the same progress needs ≈ {needed:.2f}× "
        f"the epochs of batch {reference_batch}"
    )


def _noise_advice(row: GroupRow, baseline: GroupRow, rows: list[GroupRow]) -> str | None:
    """The noise scale's note on `row`, and the budget it advises: equal epochs when the same
    progress needs at most EPOCHS_TOLERANCE times the epochs, else equal updates (or equal
    progress tau), with the sweep's evidence."""
    config, noise_scale = row.config, row.noise_scale
    note = noise_scale_note(config.global_batch, noise_scale, config.reference_batch)
    if note is None or noise_scale is None:
        return None
    if epochs_needed(noise_scale, config.reference_batch, config.global_batch) <= (
        EPOCHS_TOLERANCE
    ):
        return f"{note}: equal epochs suffice"
    if _equal_updates(config, baseline.config):
        counted = " in progress tau" if config.lr_scaling == "adascale" else ""
        return f"{note}: its budget is already 1 tower's updates{counted}"
    needed = epochs_needed(noise_scale, baseline.config.global_batch, config.global_batch)
    if row.epochs_factor is not None and row.epochs_factor >= needed / EPOCHS_TOLERANCE:
        return f"{note}: its budget ({row.epochs_factor:.2f}× the epochs) already gives that"
    advice = _advice(
        "train for equal updates (or equal progress tau: adascale)",
        row,
        rows,
        lambda c: _equal_updates(c, baseline.config),
    )
    return f"{note}: {advice}"


def measured(row: GroupRow) -> str:
    """`−0.3 pp, p=0.71` (or what is known so far) for a row compared with its baseline."""
    difference = row.difference
    if difference is None:
        return "no finished seed" if row.score.count == 0 else "no baseline"
    text = row.metric.change(difference.difference)
    return text if difference.p_value is None else f"{text}, p={difference.p_value:.2f}"


def _same_devices(row: GroupRow, rows: list[GroupRow]) -> list[GroupRow]:
    """Other non-baseline configurations with this one's towers (over all workers) and global
    batch."""
    return [
        other
        for other in rows
        if other is not row
        and not other.is_baseline
        and other.config.replicas == row.config.replicas
        and other.config.global_batch == row.config.global_batch
    ]


def _advice(text: str, row: GroupRow, rows: list[GroupRow], applies: Applies) -> str:
    """`text`, with the sweep's evidence for it: the best configuration applying it, or
    "untested here"."""
    tried = [other for other in _same_devices(row, rows) if applies(other.config)]
    tried = [other for other in tried if other.score.count]
    if not tried:
        return f"{text} (untested here)"
    best = max(tried, key=lambda other: other.score.mean)
    return f"{text} (measured: `{best.group}` {measured(best)})"


def _updates_per_example(config: TrainConfig) -> float:
    """The run's budget in updates per training example: adascale's is in scale-invariant
    updates (its progress tau ends at `epochs` reference epochs), the others' in optimizer
    steps."""
    batch = config.reference_batch if config.lr_scaling == "adascale" else config.global_batch
    return config.epochs / batch


def _equal_updates(config: TrainConfig, baseline: TrainConfig) -> bool:
    """`config` trains as many updates as `baseline` (within 2%): optimizer steps, or for
    adascale the scale-invariant ones its progress tau counts."""
    ratio = _updates_per_example(config) / _updates_per_example(baseline)
    return abs(ratio - 1) < 0.02


def _prefix_with_remedy(text: str, row: GroupRow, rows: list[GroupRow]) -> str:
    closed = [  # (row, its difference from 1 tower)
        (other, other.difference.difference)
        for other in _same_devices(row, rows)
        if other.closes_gap and other.difference is not None
    ]
    if not closed:
        return text
    best, _ = min(closed, key=lambda pair: abs(pair[1]))
    return f"`{best.group}` closed the gap ({measured(best)}); {text}"


def _unstable(row: GroupRow, rows: list[GroupRow], unstable: list[RunRecord]) -> str:
    lr = unstable[0].effective_lr
    lr_text = f"LR {lr:g}" if lr is not None else "the LR"
    config = row.config
    remedies = [_advice("try sqrt scaling", row, rows, lambda c: c.lr_scaling == "sqrt")]
    if config.lr_scaling in ("linear", "sqrt"):
        remedies.append(
            _advice(
                "adascale (its LR follows the gain the gradients allow)",
                row,
                rows,
                lambda c: c.lr_scaling == "adascale",
            )
        )
    if config.lr_scaling != "adascale":  # whose schedule has no warmup
        remedies.append(
            _advice("a longer warmup", row, rows, lambda c: c.warmup_epochs > config.warmup_epochs)
        )
    remedies.append(
        _advice("a BatchNorm network", row, rows, lambda c: c.model in ("tutorial_bn", "resnet20"))
    )
    advice = "; ".join(remedies)
    return (
        f"unstable in {len(unstable)}/{len(row.runs)} seeds ({unstable[0].unstable}): {lr_text} "
        f"is too high for {config.model} at global batch {config.global_batch} — {advice}"
    )


def _unscaled_remedy(row: GroupRow, rows: list[GroupRow]) -> str:
    """What can change for a configuration trained at the reference batch, whose LR no scaling
    rule touches: the base LR and (unless AdaScale, which has none) the warmup."""
    config = row.config
    lower_lr = _advice(
        f"lower the base LR ({config.base_lr:g})", row, rows, lambda c: c.base_lr < config.base_lr
    )
    if config.lr_scaling == "adascale":
        return lower_lr
    warmup = _advice(
        "warm up for longer" if config.warmup_epochs else "add warmup epochs",
        row,
        rows,
        lambda c: c.warmup_epochs > config.warmup_epochs,
    )
    return f"{lower_lr}; {warmup}"


def _failure(row: GroupRow, rows: list[GroupRow]) -> str | None:
    """The verdict of a configuration that failed, diverged or was unstable, else None."""
    config = row.config
    failed = [run for run in row.runs if run.status == Status.FAILED]
    diverged = [run for run in row.runs if run.status == Status.DIVERGED]
    if len(failed) == len(row.runs):
        return f"failed: {failed[0].error or 'see the run log'}"
    if diverged:
        lr = diverged[0].effective_lr
        lr_text = f" at LR {lr:g}" if lr is not None else ""
        if config.global_batch == config.reference_batch:  # no scaling rule changes its LR
            advice = _unscaled_remedy(row, rows)
        elif config.lr_scaling == "adascale":  # whose schedule has no warmup
            advice = _advice(
                "lower the peak LR (sqrt scaling)", row, rows, lambda c: c.lr_scaling == "sqrt"
            )
        else:
            advice = _advice(
                "lower the peak LR (sqrt scaling) or lengthen the warmup",
                row,
                rows,
                lambda c: c.lr_scaling == "sqrt" or c.warmup_epochs > config.warmup_epochs,
            )
        return (
            f"diverged in {len(diverged)}/{len(row.runs)} seeds{lr_text} (global batch "
            f"{config.global_batch}): {advice}"
        )
    if row.unstable:
        text = _unstable(row, rows, row.unstable)
        return f"baseline, but {text}" if row.is_baseline else text
    return None


def _adascale_remedy(row: GroupRow, base_config: TrainConfig, rows: list[GroupRow]) -> str:
    """What to change in an adascale configuration significantly worse than 1 tower. Its
    budget is scale-invariant: at 1 tower's budget it made 1 tower's updates of progress tau
    in fewer optimizer steps, as many fewer as the gain allowed."""
    config, summary = row.config, row.adascale
    scale = config.global_batch / config.reference_batch
    progress = (
        ""
        if summary is None
        else f" (tau {summary.tau:.0f} in {summary.updates:.0f} updates: mean gain "
        f"{summary.mean_gain:.2f} of {scale:g})"
    )
    if not _equal_updates(config, base_config):
        advice = _advice(
            "give tau 1 tower's budget",
            row,
            rows,
            lambda c: c.lr_scaling == "adascale" and _equal_updates(c, base_config),
        )
        return f"AdaScale's progress budget is not 1 tower's updates{progress} — {advice}"
    fixed = _advice(
        "compare a fixed rule at equal optimizer updates",
        row,
        rows,
        lambda c: c.lr_scaling in ("linear", "sqrt") and _equal_updates(c, base_config),
    )
    return (
        f"at equal scale-invariant progress with 1 tower{progress}, the measured gain did not "
        f"make up for the larger batch — {fixed}"
    )


def _remedy(row: GroupRow, base_config: TrainConfig, rows: list[GroupRow]) -> str:
    """What to change in a configuration significantly worse than 1 tower."""
    config = row.config
    if config.global_batch > base_config.global_batch and config.lr_scaling == "none":
        advice = _advice("apply linear scaling", row, rows, lambda c: c.lr_scaling == "linear")
        return f"global batch {config.global_batch} at unscaled LR {config.base_lr:g} — {advice}"
    if config.lr_scaling == "adascale":
        return _adascale_remedy(row, base_config, rows)
    if config.lr_scaling != "none" and config.warmup_epochs == 0:
        advice = _advice("add warmup epochs", row, rows, lambda c: c.warmup_epochs > 0)
        return f"{config.lr_scaling} scaling jumps straight to the peak LR — {advice}"
    if config.global_batch > base_config.global_batch and not _equal_updates(config, base_config):
        ratio = config.global_batch / base_config.global_batch
        other_rule = "sqrt" if config.lr_scaling == "linear" else "linear"
        more_updates = _advice(
            "train for the same number of updates",
            row,
            rows,
            lambda c: _equal_updates(c, base_config),
        )
        other = _advice(
            f"compare {other_rule} scaling", row, rows, lambda c: c.lr_scaling == other_rule
        )
        return f"{ratio:g}x fewer updates than 1 tower — {more_updates}; {other}"
    return "the runs differ beyond seed noise — compare their learning curves"


def _no_comparison(baseline: GroupRow | None) -> str:
    """Why a row has no difference from 1 tower: no baseline, or none of its seeds finished."""
    if baseline is None:
        return "no 1-tower baseline to compare with"
    diverged = sum(run.status == Status.DIVERGED for run in baseline.runs)
    if diverged:
        return (
            f"no difference stated: the 1-tower baseline diverged in {diverged}/"
            f"{len(baseline.runs)} seeds and none finished"
        )
    return "no finished 1-tower seed to compare with"


def verdict(row: GroupRow, baseline: GroupRow | None, rows: list[GroupRow]) -> str:
    """One plain-language sentence: did it reach 1 tower's accuracy (the non-inferiority rule,
    statistics.judgement), having seen how many times 1 tower's examples (when more), and if
    not, what to change."""
    config = row.config
    failure = _failure(row, rows)
    if failure is not None:
        return failure
    if row.score.count == 0 and any(run.status == Status.RUNNING for run in row.runs):
        return "still running: no seed has finished yet"
    if row.is_baseline:
        return "baseline"
    decision = row.decision
    if baseline is None or decision is None:
        return _no_comparison(baseline)
    text = judgement(decision, baseline.convergence)
    seen = more_examples(row)
    if seen is not None:
        text += f"; it saw {seen}"
    if decision.outcome != "not reached":
        return text
    if config.aggregation == "sum" and config.replicas > 1:
        advice = _advice(
            f"aggregate with mean or divide the LR by {config.replicas}",
            row,
            rows,
            lambda c: c.aggregation == "mean",
        )
        return f"{text}: summed gradients make each step {config.replicas}x larger — {advice}"
    remedy = _remedy(row, baseline.config, rows)
    return f"{text}: {_prefix_with_remedy(remedy, row, rows)}"


def _adaptive_rule_note(row: GroupRow, rows: list[GroupRow]) -> str | None:
    """For an adaptive optimizer scaled linearly (or not at all, at a larger batch): the rule
    that fits it, and what the sweep measured of it."""
    config = row.config
    larger = config.global_batch > config.reference_batch
    if family(config.optimizer) != "adaptive" or not larger:
        return None
    if config.lr_scaling not in ("linear", "none"):
        return None
    return _advice(
        f"{config.optimizer} is adaptive: its rule is sqrt, which also moves its betas and "
        "epsilon (Malladi et al. 2022), or adascale's gain to the power 1/2",
        row,
        rows,
        lambda c: c.optimizer == config.optimizer and c.lr_scaling in ("sqrt", "adascale"),
    )


def _gather_note(row: GroupRow, rows: list[GroupRow]) -> str | None:
    """For local towers under in_batch_softmax: the candidates each tower saw, and gather with
    what the sweep measured of it."""
    note = split_loss_note(row)
    if note is None:
        return None
    return _advice(note, row, rows, lambda c: c.cross_tower == "gather")


def compare(
    runs: list[RunRecord],
    swept: list[str],
    target: float | None,
    margin: float | None = None,
) -> tuple[list[GroupRow], float | None]:
    """One row per configuration with its verdict and notes, and the timing target used (a
    score); `margin` is the non-inferiority margin (report.margin; None: the metric's)."""
    rows, target = group_rows(runs, swept, target, margin)
    by_group = {row.group: row for row in rows}
    for row in rows:
        baseline = by_group.get(row.baseline_group or "")
        row.verdict = verdict(row, baseline, rows)
        if row.convergence is not None:
            row.notes.append(row.convergence.note())
        for note in (_adaptive_rule_note(row, rows), _gather_note(row, rows)):
            if note is not None:
                row.notes.append(note)
        if baseline is None or row.is_baseline or row.unstable or not row.score.count:
            continue
        for note in (_noise_advice(row, baseline, rows), lag_note(row, baseline)):
            if note is not None:
                row.notes.append(note)
    return rows, target
