"""The sweep report as markdown: a pure function of the compared rows (no MLflow, no files).

Tables are lists of (header, formatter) columns, so a header never drifts from its cells.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from tasks.report.markdown import markdown_table
from tasks.report.statistics import GroupRow, RunRecord, accuracy_by_epoch

Column = tuple[str, Callable[[GroupRow], str]]


@dataclass(frozen=True)
class ReportHeader:
    """What the report says about the sweep as a whole."""

    title: str
    parent_run_id: str
    run_link: str
    data_version: str
    device_kinds: list[str]
    target: float | None


def pct(value: float | None, digits: int = 1) -> str:
    return "—" if value is None or not math.isfinite(value) else f"{100 * value:.{digits}f}%"


def number(value: float | None, pattern: str) -> str:
    return "—" if value is None or not math.isfinite(value) else format(value, pattern)


def _accuracy(row: GroupRow) -> str:
    accuracy = row.accuracy
    if accuracy.count == 0:
        return "—"
    if math.isfinite(accuracy.std):
        return f"{100 * accuracy.mean:.2f} ± {100 * accuracy.std:.2f}%"
    return f"{100 * accuracy.mean:.2f}%"


def _difference(row: GroupRow) -> str:
    return "—" if row.difference is None else f"{100 * row.difference.difference:+.2f} pp"


def _interval(row: GroupRow) -> str:
    difference = row.difference
    if difference is None or difference.ci_low is None:
        return "—"
    return f"[{100 * difference.ci_low:+.2f}, {100 * difference.ci_high:+.2f}]"


def _p_value(row: GroupRow) -> str:
    difference = row.difference
    return "—" if difference is None or difference.p_value is None else f"{difference.p_value:.3f}"


def _completed(row: GroupRow) -> int:
    return sum(run.status == "completed" for run in row.runs)


def _peak_lr(row: GroupRow) -> str:
    rates = [run.effective_lr for run in row.runs if run.effective_lr is not None]
    return number(rates[0] if rates else None, ".4g")


def _time_to_target(target: float | None) -> Callable[[GroupRow], str]:
    def cell(row: GroupRow) -> str:
        text = number(row.time_to_target, ".1f")
        completed = _completed(row)
        if target is not None and completed and row.reached_target < completed:
            text += f" ({row.reached_target}/{completed} reached)"
        return text

    return cell


def _noise_scale(row: GroupRow) -> str:
    return (
        "(unstable)" if row.unstable and row.noise_scale is None else number(row.noise_scale, ".0f")
    )


def _loss(key: str) -> Callable[[GroupRow], str]:
    return lambda row: number(row.losses.get(key), ".3f")


# Tables of six columns at most, so they fit the Prefect and MLflow pages.
SETUP_COLUMNS: list[Column] = [
    ("configuration", lambda row: row.group),
    ("global batch", lambda row: str(row.config.global_batch)),
    ("peak LR", _peak_lr),
    ("epochs", lambda row: f"{row.config.epochs:g}"),
    ("updates", lambda row: number(row.steps, ".0f")),
    ("seeds ok", lambda row: f"{_completed(row)}/{len(row.runs)}"),
]

ACCURACY_COLUMNS: list[Column] = [
    ("configuration", lambda row: row.group),
    ("test accuracy", _accuracy),
    ("Δ vs 1 tower", _difference),
    ("95% CI", _interval),
    ("p (Welch)", _p_value),
]

LOSS_COLUMNS: list[Column] = [
    ("configuration", lambda row: row.group),
    ("train CE", _loss("train_cross_entropy")),
    ("weight decay", _loss("train_weight_decay_loss")),
    ("train total", _loss("train_total_loss")),
    ("test CE", _loss("test_cross_entropy")),
    ("test − train CE", _loss("generalization_gap")),
]


def speed_columns(target: float | None) -> list[Column]:
    return [
        ("configuration", lambda row: row.group),
        (f"s to {pct(target)}", _time_to_target(target)),
        ("speedup", lambda row: number(row.speedup, ".2f")),
        ("images/s", lambda row: number(row.images_per_sec, ".0f")),
        ("scaling eff.", lambda row: number(row.efficiency, ".2f")),
        ("noise scale", _noise_scale),
    ]


def table(columns: list[Column], rows: list[GroupRow]) -> str:
    return markdown_table(
        [header for header, _ in columns], [[cell(row) for _, cell in columns] for row in rows]
    )


def epoch_table(rows: list[GroupRow], most_rows: int = 20) -> str:
    """Test accuracy per evaluated epoch (mean over seeds), one column per configuration.

    Long runs show every n-th evaluation and the last, at most `most_rows` rows.
    """
    by_epoch = accuracy_by_epoch(rows)
    epochs = list(by_epoch)
    stride = math.ceil(len(epochs) / most_rows) if epochs else 1
    shown = epochs[stride - 1 :: stride]
    if epochs and epochs[-1] not in shown:
        shown.append(epochs[-1])
    lines = []
    for epoch in shown:
        cells = [f"{epoch:g}"]
        for row in rows:
            cell = by_epoch[epoch].get(row.group)
            if cell is None:
                cells.append("—")
            else:
                partial = f" ({cell.seeds}/{len(row.runs)})" if cell.seeds < len(row.runs) else ""
                cells.append(f"{100 * cell.mean:.2f}%{partial}")
        lines.append(cells)
    return markdown_table(["epoch", *(row.group for row in rows)], lines)


def loss_paradox(rows: list[GroupRow]) -> str:
    """When does a lower training loss come with a lower test accuracy? Said from the numbers."""
    measured = [
        row
        for row in rows
        if row.accuracy.count
        and row.losses.get("train_cross_entropy") is not None
        and row.losses.get("test_cross_entropy") is not None
    ]
    paradoxes = [
        (row, other)
        for row in measured
        for other in measured
        if row.losses["train_cross_entropy"] < other.losses["train_cross_entropy"]
        and row.accuracy.mean < other.accuracy.mean
    ]
    how = (
        "Every training loss here averages the cross-entropy over all towers' examples of the "
        "last epoch (the tutorial printed one tower's last-batch loss plus weight decay); the "
        "weight-decay term is shown apart."
    )
    if not paradoxes:
        return (
            f"{how} In this sweep a lower training cross-entropy always came with a higher test "
            "accuracy: no loss paradox was measured."
        )
    row, other = max(
        paradoxes,
        key=lambda pair: pair[1].accuracy.mean - pair[0].accuracy.mean,
    )
    row_loss, other_loss = row.losses, other.losses
    return (
        f"{how} `{row.group}` ended with a lower training cross-entropy than `{other.group}` "
        f"({row_loss['train_cross_entropy']:.3f} vs {other_loss['train_cross_entropy']:.3f}) "
        f"but a lower test accuracy ({pct(row.accuracy.mean, 2)} vs "
        f"{pct(other.accuracy.mean, 2)}): its test cross-entropy is "
        f"{row_loss['test_cross_entropy']:.3f} vs {other_loss['test_cross_entropy']:.3f}, a "
        f"train–test gap of {row_loss['generalization_gap']:.3f} vs "
        f"{other_loss['generalization_gap']:.3f}. A lower training loss means a better fit of "
        "the training set, not of new data: with a different number of updates at a different "
        "learning rate the runs reach different minima, and the one that fits the training set "
        "more tightly can generalise worse."
    )


def benchmark_section(
    previous_run_id: str, same_data: bool, rows: list[GroupRow], before: dict[str, GroupRow]
) -> str:
    """This benchmark's rows against the previous benchmark's rows of the same name."""
    lines = [
        f"Previous benchmark: run `{previous_run_id}` "
        f"({'same' if same_data else 'DIFFERENT'} data version).",
        "",
    ]
    cells = []
    for row in rows:
        earlier = before.get(row.group)
        if earlier is None:
            cells.append([row.group, pct(row.accuracy.mean, 2), "—", "—", "—"])
            continue
        change = row.accuracy.mean - earlier.accuracy.mean
        speed = (
            row.images_per_sec / earlier.images_per_sec
            if row.images_per_sec and earlier.images_per_sec
            else None
        )
        cells.append(
            [
                row.group,
                pct(row.accuracy.mean, 2),
                pct(earlier.accuracy.mean, 2),
                f"{100 * change:+.2f} pp" if math.isfinite(change) else "—",
                number(speed, ".2f"),
            ]
        )
    header = ["configuration", "accuracy now", "before", "change", "images/s now / before"]
    return "\n".join(lines) + markdown_table(header, cells)


def render_report(
    header: ReportHeader,
    rows: list[GroupRow],
    records: list[RunRecord],
    figures: dict[str, str],
    benchmark: str | None = None,
) -> str:
    """The whole report; `figures` maps each figure's name to its link (file or data URI)."""
    parts = [
        f"# towerbench sweep report: {header.title}",
        "",
        f"MLflow parent run: [{header.parent_run_id}]({header.run_link}) · data version "
        f"`{header.data_version}` · devices: {', '.join(header.device_kinds) or 'unknown'} · "
        f"time-to-accuracy target {pct(header.target)}",
        "",
        "## Configurations",
        "",
        table(SETUP_COLUMNS, rows),
        "",
        "## Accuracy",
        "",
        table(ACCURACY_COLUMNS, rows),
        "",
        "## Verdicts",
        "",
    ]
    for row in rows:
        notes = "".join(f"; {note}" for note in row.notes)
        parts.append(f"- **{row.group}**: {row.verdict}{notes}")
    parts += [
        "",
        "## Losses",
        "",
        "Cross-entropy (CE) of the last epoch; weight decay is the L2 term added to it.",
        "",
        table(LOSS_COLUMNS, rows),
        "",
        loss_paradox(rows),
    ]
    if any(row.config.model in ("tutorial_bn", "resnet20") for row in rows):
        parts += [
            "",
            "BatchNorm statistics are computed per tower (each tower normalises its own shard), "
            "as each worker does in Goyal et al.: a different function from BatchNorm over the "
            "whole global batch (`towerbench gradcheck --model tutorial_bn` shows both).",
        ]
    parts += ["", "## Speed and gradient noise", "", table(speed_columns(header.target), rows)]
    if any("logical" in kind for kind in header.device_kinds):
        parts += [
            "",
            "Towers ran on logical devices split from one physical device: they share its cores, "
            "so images/s, speedup and scaling efficiency measure tower overhead, not scaling.",
        ]
    parts += [
        "",
        "## Test accuracy per epoch",
        "",
        "Mean over seeds; (n/m) where only n of the m seeds reached that epoch.",
        "",
        epoch_table(rows),
        "",
        "## Figures",
        "",
    ]
    parts += [f"![{name}]({link})" for name, link in figures.items()]
    if benchmark is not None:
        parts += ["", "## Compared with the previous benchmark", "", benchmark]
    run_rows = [
        [
            record.name,
            record.status + (" (unstable)" if record.unstable else ""),
            pct(record.final_accuracy, 2),
            record.run_id,
            (record.error or record.unstable or "")[:120],
        ]
        for record in records
    ]
    parts += [
        "",
        "## Runs",
        "",
        markdown_table(["run", "status", "test accuracy", "run id", "error"], run_rows),
        "",
    ]
    return "\n".join(parts)
