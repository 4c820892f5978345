"""The sweep report as markdown: a pure function of the compared rows (no MLflow, no files)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from towerbench.config.losses import FROM_LOGITS
from towerbench.config.optimizers import DECOUPLED_WEIGHT_DECAY
from towerbench.core.markdown import markdown_table
from towerbench.core.metrics import Metric
from towerbench.tasks.report.batch_norm import lag_section
from towerbench.tasks.report.columns import (
    ADASCALE_COLUMNS,
    LOSS_COLUMNS,
    NOISE_COLUMNS,
    OPTIMIZER_COLUMNS,
    SETUP_COLUMNS,
    models,
    number,
    score_columns,
    speed_columns,
    table,
)
from towerbench.tasks.report.in_batch import candidates_seen, chance_levels, is_split
from towerbench.tasks.report.statistics import (
    ACCURACY,
    GroupRow,
    RunRecord,
    more_examples,
    scores_by_epoch,
)


@dataclass(frozen=True)
class ReportHeader:
    """What the report says about the sweep as a whole."""

    title: str
    parent_run_id: str
    run_link: str
    charts_link: str  # MLflow's charts of the configuration runs
    data_version: str
    device_kinds: list[str]
    target: float | None
    partial: str | None = None  # why the report covers only some runs (the sweep still runs)


def _metric(rows: list[GroupRow]) -> Metric:
    """What the sweep is judged by (statistics.sweep_metric made it one)."""
    return rows[0].metric if rows else ACCURACY


def _title(metric: Metric) -> str:
    """`Accuracy`, `Binary accuracy`, `MAE`."""
    return metric.label[0].upper() + metric.label[1:]


def _loss_word(rows: list[GroupRow]) -> str:
    """`cross-entropy` when every configuration trained one, else `loss`."""
    losses = {row.config.loss for row in rows}
    return "cross-entropy" if losses and losses <= FROM_LOGITS else "loss"


def epoch_table(rows: list[GroupRow], most_rows: int = 20) -> str:
    """The test metric per evaluated epoch (mean over seeds), one column per configuration.

    Long runs show every n-th evaluation and the last, at most `most_rows` rows.
    """
    by_epoch = scores_by_epoch(rows)
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
                cells.append(f"{row.metric.shown(cell.mean)}{partial}")
        lines.append(cells)
    return markdown_table(["epoch", *(row.group for row in rows)], lines)


def loss_paradox(rows: list[GroupRow]) -> str:
    """When does a lower training loss come with a worse test metric? Said from the numbers."""
    metric, loss = _metric(rows), _loss_word(rows)
    test = f"test {metric.label}"
    measured = [  # (row, its training loss)
        (row, train_loss)
        for row in rows
        if row.score.count
        and (train_loss := row.losses.get("train_cross_entropy")) is not None
        and row.losses.get("test_cross_entropy") is not None
    ]
    paradoxes = [
        (row, other)
        for row, row_train_loss in measured
        for other, other_train_loss in measured
        if row_train_loss < other_train_loss and row.score.mean < other.score.mean
    ]
    how = (
        f"Every training loss here averages the {loss} over all towers' examples of the "
        "last epoch (the tutorial printed one tower's last-batch loss plus weight decay); the "
        "weight-decay term is shown apart."
    )
    if not paradoxes:
        return (
            f"{how} In this sweep a lower training {loss} always came with a better {test}: no "
            "loss paradox was measured."
        )
    row, other = max(
        paradoxes,
        key=lambda pair: pair[1].score.mean - pair[0].score.mean,
    )
    row_loss, other_loss = row.losses, other.losses
    return (
        f"{how} `{row.group}` ended with a lower training {loss} than `{other.group}` "
        f"({row_loss['train_cross_entropy']:.3f} vs {other_loss['train_cross_entropy']:.3f}) "
        f"but a worse {test} ({metric.shown(row.score.mean)} vs "
        f"{metric.shown(other.score.mean)}): its test {loss} is "
        f"{row_loss['test_cross_entropy']:.3f} vs {other_loss['test_cross_entropy']:.3f}, a "
        f"train–test gap of {row_loss['generalization_gap']:.3f} vs "
        f"{other_loss['generalization_gap']:.3f}. " + _why_lower(row)
    )


def _why_lower(row: GroupRow) -> str:
    """Why a configuration's lower training loss did not mean a better test metric."""
    if is_split(row.config):
        return (
            f"Here the lower loss is an easier objective: {row.config.loss} over each tower's "
            f"{candidates_seen(row.config)} candidates, not the batch's {row.config.global_batch} "
            "(their chance levels below)."
        )
    return (
        "A lower training loss means a better fit of the training set, not of new data: with a "
        "different number of updates at a different learning rate the runs reach different "
        "minima, and the one that fits the training set more tightly can generalise worse."
    )


def nightly_section(
    previous_run_id: str, same_data: bool, rows: list[GroupRow], before: dict[str, GroupRow]
) -> str:
    """This nightly sweep's rows against the previous one's rows of the same name."""
    lines = [
        f"Previous nightly sweep: run `{previous_run_id}` "
        f"({'same' if same_data else 'DIFFERENT'} data version).",
        "",
    ]
    metric = _metric(rows)
    cells = []
    for row in rows:
        earlier = before.get(row.group)
        if earlier is None:
            cells.append([row.group, metric.shown(row.score.mean), "—", "—", "—"])
            continue
        change = row.score.mean - earlier.score.mean
        speed = (
            row.images_per_sec / earlier.images_per_sec
            if row.images_per_sec and earlier.images_per_sec
            else None
        )
        cells.append(
            [
                row.group,
                metric.shown(row.score.mean),
                metric.shown(earlier.score.mean),
                metric.change(change, 2) if math.isfinite(change) else "—",
                number(speed, ".2f"),
            ]
        )
    now = f"{metric.label} now"
    header = ["configuration", now, "before", "change", "images/s now / before"]
    return "\n".join([*lines, markdown_table(header, cells)])  # a blank line before the table


def _heading(header: ReportHeader, rows: list[GroupRow]) -> list[str]:
    metric = _metric(rows)
    return [
        f"# towerbench sweep report: {header.title}",
        "",
        f"MLflow parent run: [{header.parent_run_id}]({header.run_link}) "
        f"([its runs' charts]({header.charts_link})) · data version "
        f"`{header.data_version}` · model: {models(rows)} · devices: "
        f"{', '.join(header.device_kinds) or 'unknown'} · time-to-{metric.label} target "
        f"{metric.shown(header.target, 1)}",
        *([] if header.partial is None else ["", f"**Partial report:** {header.partial}."]),
    ]


def _normalised(rows: list[GroupRow]) -> list[str]:
    """Why a configuration is named other than the sweep asked (config/grid.py `canonical`)."""
    at_reference = [
        row.group for row in rows if row.config.global_batch == row.config.reference_batch
    ]
    if not at_reference:
        return []
    names = ", ".join(f"`{group}`" for group in at_reference)
    return [
        "",
        f"{names} trained at the reference batch ({rows[0].config.reference_batch}): every LR "
        "scaling rule gives base_lr there, so it is named lr=none warmup=0 whatever the sweep "
        "asked.",
    ]


EPOCHS_TEXT = (
    "Epochs trained and updates are what the runs did (MLflow's `epochs` and `steps`, mean over "
    "the completed seeds, or the diverged ones when none completed); in brackets the configured "
    "epochs where they differ (AdaScale ends when its progress τ reaches 1 tower's updates; a "
    "run can also stop early or diverge) and, where sweep.budget stretched them, the times the "
    "1-tower configuration's epochs."
)


def _budgets(rows: list[GroupRow]) -> list[str]:
    """Each configuration's budget against its 1-tower baseline and why (sweep.budget), and the
    examples it saw where more than the baseline's."""
    lines = []
    for row in rows:
        if row.budget is not None:
            seen = more_examples(row)
            lines.append(f"- `{row.group}`: {row.budget}" + (f"; saw {seen}" if seen else ""))
    if not lines:
        return []
    return ["", "Budget, against each configuration's 1-tower baseline (sweep.budget):", "", *lines]


def verdicts_by_group(rows: list[GroupRow]) -> dict[str, str]:
    """Each configuration's verdict with its notes, as the report states it."""
    return {row.group: row.verdict + "".join(f"; {note}" for note in row.notes) for row in rows}


def _margins(rows: list[GroupRow]) -> str:
    """The non-inferiority margins the verdicts held each difference against."""
    metric = _metric(rows)
    bounds = {
        f"`{row.group}`: {metric.bound(row.margin)}"
        for row in rows
        if row.is_baseline and row.margin is not None
    }
    default = "" if metric.higher_is_better else "; default: 1% of each 1-tower baseline's value"
    return (
        f"Δ is k towers − 1 tower in test {metric.label}; a configuration reached its 1-tower "
        f"baseline when the 95% interval of Δ lies {metric.better} the margin (report.margin"
        f"{default}): " + "; ".join(sorted(bounds)) + "."
    )


def _scores(rows: list[GroupRow]) -> list[str]:
    metric = _metric(rows)
    return [f"## {_title(metric)}", "", table(score_columns(metric), rows), "", _margins(rows)]


def _verdicts(rows: list[GroupRow]) -> list[str]:
    lines = ["## Verdicts", ""]
    lines += [f"- **{group}**: {text}" for group, text in verdicts_by_group(rows).items()]
    return lines


def _optimizers(rows: list[GroupRow]) -> list[str]:
    """The optimizer of each configuration with its hyperparameters as it ran them: the
    square-root rule moves an adaptive optimizer's betas and epsilon (Malladi et al. 2022)."""
    return [
        "## Optimizers",
        "",
        "Hyperparameters as each run used them, its scaling rule applied (sqrt on adam, adamw, "
        "rmsprop and lamb: 1 − β × k, ε / √k, Malladi et al. 2022); weight decay as the "
        "optimizer applies it.",
        "",
        table(OPTIMIZER_COLUMNS, rows),
    ]


def _losses(rows: list[GroupRow]) -> list[str]:
    decoupled = any(row.config.optimizer in DECOUPLED_WEIGHT_DECAY for row in rows)
    losses = ", ".join(f"`{loss}`" for loss in dict.fromkeys(row.config.loss for row in rows))
    lines = [
        "## Losses",
        "",
        f"The loss ({losses}) of the last epoch; weight decay is the L2 term added to it"
        + (
            " (none where the optimizer decays the weights itself: adamw, lamb, lars)."
            if decoupled
            else "."
        ),
        "",
        table(LOSS_COLUMNS, rows),
        "",
        loss_paradox(rows),
    ]
    chances = chance_levels(rows)
    if chances is not None:
        lines += ["", chances]
    if any(row.config.model in ("tutorial_bn", "resnet20") for row in rows):
        lines += [
            "",
            "BatchNorm statistics are computed per tower (each tower normalises its own shard), "
            "as each worker does in Goyal et al.: a different function from BatchNorm over the "
            "whole global batch (`towerbench gradcheck --model tutorial_bn` shows both).",
        ]
    return lines


def _speed(header: ReportHeader, rows: list[GroupRow]) -> list[str]:
    lines = ["## Speed", "", table(speed_columns(header.target, _metric(rows)), rows)]
    if any("logical" in kind for kind in header.device_kinds):
        lines += [
            "",
            "Towers ran on logical devices split from one physical device: they share its cores, "
            "so images/s, speedup and scaling efficiency measure tower overhead, not scaling.",
        ]
    return lines


NOISE_TEXT = (
    "The gradient noise scale B_noise = tr(Σ) / ‖G‖² (McCandlish et al. 2018) is measured from "
    "the towers' own gradients, averaged over about the last 100 steps; the figure "
    "`noise_scale_vs_epoch.png` shows it per epoch. It grows as the loss falls, so its final "
    "value understates what a large batch costs early on. The verdicts use its harmonic mean "
    "over the epochs: reaching a loss at batch B takes 1 + B / B_noise times the fewest "
    "examples, and added up over training that is 1 + B / (harmonic mean), which the small early "
    "values dominate. From it, the epochs batch B needs for the reference batch's progress: "
    "(1 + B / B_noise) / (1 + b0 / B_noise); above 1.25×, equal epochs fall short and the "
    "verdicts advise equal updates."
)
ADASCALE_TEXT = (
    "AdaScale (`lr=adascale`, Johnson et al. 2020) multiplies each step's LR by its gain "
    "r = (σ² + ‖μ‖²) / (σ²/S + ‖μ‖²) and ends when its progress τ (the sum of the gains) reaches "
    "1 tower's updates: such a run is at equal scale-invariant progress with 1 tower, in fewer "
    "optimizer updates. Mean gain = τ / updates; the last epoch's gain, σ² (the gradient "
    "variance at the reference batch b0) and ‖μ‖² are moving averages over about 1000 / towers "
    "steps. Its peak LR in the configurations table is the base LR × the mean gain."
)


def _noise(rows: list[GroupRow]) -> list[str]:
    lines = ["## Gradient noise", "", NOISE_TEXT, "", table(NOISE_COLUMNS, rows)]
    adascale = [row for row in rows if row.adascale is not None]
    if adascale:
        lines += ["", ADASCALE_TEXT, "", table(ADASCALE_COLUMNS, adascale)]
    return lines


def _per_epoch(rows: list[GroupRow], figures: dict[str, str]) -> list[str]:
    return [
        f"## Test {_metric(rows).label} per epoch",
        "",
        "Mean over seeds; (n/m) where only n of the m seeds reached that epoch.",
        "",
        epoch_table(rows),
        "",
        "## Figures",
        "",
        *(f"![{name}]({link})" for name, link in figures.items()),
    ]


def _runs(records: list[RunRecord]) -> list[str]:
    run_rows = [
        [
            record.name,
            record.status + (" (unstable)" if record.unstable else ""),
            record.metric.shown(record.final_score),
            record.run_id,
            (record.error or record.unstable or "")[:120],
        ]
        for record in records
    ]
    label = records[0].metric.label if records else ACCURACY.label
    header = ["run", "status", f"test {label}", "run id", "error"]
    return ["## Runs", "", markdown_table(header, run_rows), ""]


def render_report(
    header: ReportHeader,
    rows: list[GroupRow],
    records: list[RunRecord],
    figures: dict[str, str],
    nightly: str | None = None,
) -> str:
    """The whole report; `figures` maps each figure's name to its link (file or data URI)."""
    sections = [
        _heading(header, rows),
        [
            "## Configurations",
            "",
            table(SETUP_COLUMNS, rows),
            "",
            EPOCHS_TEXT,
            *_budgets(rows),
            *_normalised(rows),
        ],
        _optimizers(rows),
        _scores(rows),
        _verdicts(rows),
        _losses(rows),
        lag_section(rows),
        _speed(header, rows),
        _noise(rows),
        _per_epoch(rows, figures),
    ]
    if nightly is not None:
        sections.append(["## Compared with the previous nightly sweep", "", nightly])
    sections.append(_runs(records))
    return "\n\n".join("\n".join(section) for section in sections if section)
