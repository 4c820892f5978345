"""BatchNorm's lag in the report: its moving statistics move once per optimizer step, so k towers
(k times fewer steps an epoch) leave them further behind the weights at equal epochs. Per
configuration and epoch, the test accuracy with the moving statistics and with statistics
re-estimated at the weights (model.batch_norm_statistics), and the note a verdict gets when the
lag explains part of its gap to the baseline."""

from __future__ import annotations

import numpy as np

from towerbench.core.markdown import markdown_table
from towerbench.core.outcome import Status
from towerbench.tasks.report.statistics import BN_METRICS, GroupRow, signed_pp

MOVING, RECOMPUTED = BN_METRICS
# A verdict names the lag when re-estimated statistics move the gap by at least this share of
# the margin (report.margin).
LAG_SHARE_OF_MARGIN = 0.5

LAG_TEXT = (
    "BatchNorm's moving statistics are updated once per optimizer step (moving = m × moving + "
    "(1 − m) × the batch's), so k towers, with k× fewer steps an epoch, leave them further behind "
    "the weights at equal epochs. Each evaluation also re-estimates them at the evaluated weights "
    "from 10 fixed training batches, each tower shard's statistics averaged (precise BN, Wu & "
    "Johnson 2021). Per epoch, mean over seeds: test accuracy with the moving statistics / "
    "re-estimated (the lag in pp)."
)


def _final(row: GroupRow, key: str) -> float | None:
    """The mean over completed seeds of the last evaluation's `key`."""
    values = [
        run.bn_curves[key][1][-1]
        for run in row.runs
        if run.status == Status.COMPLETED and run.bn_curves.get(key, ([], []))[1]
    ]
    return float(np.mean(values)) if values else None


def lag_note(row: GroupRow, baseline: GroupRow) -> str | None:
    """`4 towers: −3.1 pp with moving BatchNorm statistics, −0.4 pp re-estimated ...` when the
    re-estimated statistics close a part of `row`'s gap to `baseline` worth naming (half its
    margin)."""
    margin = row.margin if row.margin is not None else 0.0
    row_moving, row_recomputed = _final(row, MOVING), _final(row, RECOMPUTED)
    base_moving, base_recomputed = _final(baseline, MOVING), _final(baseline, RECOMPUTED)
    if row_moving is None or row_recomputed is None or base_moving is None:
        return None
    if base_recomputed is None:
        return None
    moving_gap = row_moving - base_moving
    recomputed_gap = row_recomputed - base_recomputed
    if moving_gap >= 0 or recomputed_gap - moving_gap < LAG_SHARE_OF_MARGIN * margin:
        return None
    fewer = row.config.global_batch / baseline.config.global_batch
    steps = f" ({fewer:g}× fewer steps an epoch)" if fewer > 1 else ""
    return (
        f"{row.config.replicas} towers: {signed_pp(moving_gap)} pp with moving BatchNorm "
        f"statistics, {signed_pp(recomputed_gap)} pp re-estimated at the weights: the "
        f"statistics' lag{steps} explains {100 * (recomputed_gap - moving_gap):.1f} pp of the gap"
    )


def _by_epoch(rows: list[GroupRow]) -> dict[float, dict[str, tuple[float, float]]]:
    """Per evaluated epoch, each configuration's mean (moving, re-estimated) over its seeds."""
    collected: dict[float, dict[str, list[tuple[float, float]]]] = {}
    for row in rows:
        for run in row.runs:
            (epochs, moving), (_, recomputed) = (run.bn_curves.get(k, ([], [])) for k in BN_METRICS)
            for epoch, pair in zip(epochs, zip(moving, recomputed, strict=True), strict=True):
                collected.setdefault(round(epoch, 2), {}).setdefault(row.group, []).append(pair)
    return {
        epoch: {group: tuple(np.mean(pairs, axis=0)) for group, pairs in by_group.items()}
        for epoch, by_group in sorted(collected.items())
    }


def lag_section(rows: list[GroupRow]) -> list[str]:
    """The report's BatchNorm section; none when no configuration has BatchNorm."""
    by_epoch = _by_epoch(rows)
    if not by_epoch:
        return []
    shown = [row for row in rows if any(row.group in cells for cells in by_epoch.values())]
    lines = []
    for epoch, cells in by_epoch.items():
        line = [f"{epoch:g}"]
        for row in shown:
            pair = cells.get(row.group)
            if pair is None:
                line.append("—")
            else:
                moving, recomputed = pair
                lag = signed_pp(recomputed - moving)
                line.append(f"{100 * moving:.1f}% / {100 * recomputed:.1f}% ({lag})")
        lines.append(line)
    table = markdown_table(["epoch", *(row.group for row in shown)], lines)
    return ["## BatchNorm's statistics", "", LAG_TEXT, "", table]
