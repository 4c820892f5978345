"""The report's tables as lists of (header, formatter) columns, so a header never drifts from its
cells; six columns at most, so every table fits the Prefect and MLflow pages."""

from __future__ import annotations

import math
from collections.abc import Callable

from towerbench.config.model_ref import model_label, parse_model
from towerbench.config.optimizers import DECOUPLED_WEIGHT_DECAY, adascale_power
from towerbench.core.markdown import markdown_table
from towerbench.core.metrics import Metric
from towerbench.core.outcome import Status
from towerbench.model.noise_advice import epochs_needed
from towerbench.tasks.report.statistics import GroupRow

Column = tuple[str, Callable[[GroupRow], str]]


def number(value: float | None, pattern: str) -> str:
    return "—" if value is None or not math.isfinite(value) else format(value, pattern)


def _score(row: GroupRow) -> str:
    """`84.20 ± 0.31%`, `0.1234 ± 0.0051`: the mean value over seeds and its spread."""
    score, metric = row.score, row.metric
    if score.count == 0:
        return "—"
    shown = metric.shown(score.mean)
    if not math.isfinite(score.std):
        return shown
    if metric.share:
        return f"{shown[:-1]} ± {100 * score.std:.2f}%"
    return f"{shown} ± {score.std:.2g}"


def _difference(row: GroupRow) -> str:
    return "—" if row.difference is None else row.metric.change(row.difference.difference, 2)


def _interval(row: GroupRow) -> str:
    difference = row.difference
    if difference is None or difference.ci_low is None or difference.ci_high is None:
        return "—"
    return row.metric.interval(difference.ci_low, difference.ci_high, 2)


def _p_value(row: GroupRow) -> str:
    difference = row.difference
    return "—" if difference is None or difference.p_value is None else f"{difference.p_value:.3f}"


def _completed(row: GroupRow) -> int:
    return sum(run.status == Status.COMPLETED for run in row.runs)


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


def _epochs_needed(row: GroupRow) -> str:
    if row.noise_scale is None:
        return "—"
    config = row.config
    return f"{epochs_needed(row.noise_scale, config.reference_batch, config.global_batch):.2f}×"


def _gains(row: GroupRow) -> str:
    adascale = row.adascale
    return "—" if adascale is None else f"{adascale.mean_gain:.2f} · {adascale.last_gain:.2f}"


def _tau(row: GroupRow) -> str:
    adascale = row.adascale
    return "—" if adascale is None else f"{adascale.tau:.0f} / {adascale.updates:.0f}"


def _adascale_value(name: str) -> Callable[[GroupRow], str]:
    return lambda row: "—" if row.adascale is None else f"{getattr(row.adascale, name):.3g}"


def _loss(key: str) -> Callable[[GroupRow], str]:
    return lambda row: number(row.losses.get(key), ".3f")


def models(rows: list[GroupRow]) -> str:
    """The networks of a sweep by their labels; a user's file with the start of its sha256 (a
    file edited between two runs shows both)."""
    shown: dict[str, set[str]] = {}
    for row in rows:
        digests = shown.setdefault(model_label(row.config.model), set())
        digests.update(run.model_digest[:12] for run in row.runs if run.model_digest)
    return "; ".join(
        label + (f" (sha256 {', '.join(sorted(digests))})" if digests else "")
        for label, digests in shown.items()
    )


EPOCHS_ROUNDING = 0.02  # a last step rounded: 0.5 steps of 25 or more an epoch


def trained_differs(trained: float, configured: float) -> bool:
    """A run's epochs trained differ from its configured epochs by more than the rounding of its
    last step: AdaScale's progress budget, an early stop or a divergence."""
    return not math.isclose(trained, configured, rel_tol=EPOCHS_ROUNDING)


def _epochs(row: GroupRow) -> str:
    """`18.6 (budget 8)`: the epochs trained, then the configured epochs where they differ, and
    the times the baseline's configured epochs where not the same (`7.33 (1.83×)`)."""
    configured, factor = row.config.epochs, row.epochs_factor
    budget = [f"budget {configured:.3g}"]
    if row.epochs is not None and not trained_differs(row.epochs, configured):
        budget = []
    if factor is not None and not math.isclose(factor, 1.0, rel_tol=1e-6):
        budget.append(f"{factor:.2f}×")
    trained = number(row.epochs, ".3g")
    return trained + (f" ({', '.join(budget)})" if budget else "")


SETUP_COLUMNS: list[Column] = [
    ("configuration", lambda row: row.group),
    ("global batch", lambda row: str(row.config.global_batch)),
    ("peak LR", _peak_lr),
    ("epochs trained (budget)", _epochs),
    ("updates", lambda row: number(row.steps, ".0f")),
    ("seeds ok", lambda row: f"{_completed(row)}/{len(row.runs)}"),
]


def _hyperparameters(row: GroupRow) -> str:
    values = row.config.optimizer_hyperparameters().items()
    values.pop("weight_decay", None)
    return ", ".join(f"{name} {value:.4g}" for name, value in values.items()) or "—"


def weight_decay_meaning(row: GroupRow) -> str:
    """`L2 0.004 in the loss`, `decoupled 0.004 (the optimizer's)` or `the model's own`."""
    config = row.config
    if config.optimizer in DECOUPLED_WEIGHT_DECAY:
        return f"decoupled {config.weight_decay:g} (the optimizer's)"
    if not parse_model(config.model).builtin:
        return "the model's regularizers, in the loss"
    return f"L2 {config.weight_decay:g} in the loss"


def _lr_gain(row: GroupRow) -> str:
    if row.config.lr_scaling != "adascale":
        return "—"
    power = adascale_power(row.config.optimizer)
    return "gain" if power == 1 else f"gain^{power:g} (AdamScale)"


OPTIMIZER_COLUMNS: list[Column] = [
    ("configuration", lambda row: row.group),
    ("optimizer", lambda row: row.config.optimizer),
    ("hyperparameters as run", _hyperparameters),
    ("weight decay", weight_decay_meaning),
    ("AdaScale LR factor", _lr_gain),
]


def score_columns(metric: Metric) -> list[Column]:
    """The judged metric's table: its value over seeds, and against 1 tower."""
    return [
        ("configuration", lambda row: row.group),
        (f"test {metric.label}", _score),
        ("Δ vs 1 tower", _difference),
        ("95% CI", _interval),
        ("p (Welch)", _p_value),
    ]


LOSS_COLUMNS: list[Column] = [
    ("configuration", lambda row: row.group),
    ("train loss", _loss("train_cross_entropy")),
    ("weight decay", _loss("train_weight_decay_loss")),
    ("train total", _loss("train_total_loss")),
    ("test loss", _loss("test_cross_entropy")),
    ("test − train loss", _loss("generalization_gap")),
]


def speed_columns(target: float | None, metric: Metric) -> list[Column]:
    """Speed, and the seconds to the time-to-target score."""
    return [
        ("configuration", lambda row: row.group),
        (f"s to {metric.shown(target, 1)}", _time_to_target(target)),
        ("speedup", lambda row: number(row.speedup, ".2f")),
        ("images/s", lambda row: number(row.images_per_sec, ".0f")),
        ("scaling eff.", lambda row: number(row.efficiency, ".2f")),
    ]


NOISE_COLUMNS: list[Column] = [
    ("configuration", lambda row: row.group),
    ("noise scale (advises)", _noise_scale),
    ("final noise scale", lambda row: number(row.final_noise_scale, ".0f")),
    ("epochs for equal progress", _epochs_needed),
]

ADASCALE_COLUMNS: list[Column] = [
    ("configuration", lambda row: row.group),
    ("gain: mean · last", _gains),
    ("σ² (batch b0)", _adascale_value("sigma_sq")),
    ("‖μ‖²", _adascale_value("mu_sq")),
    ("τ / updates", _tau),
]


def table(columns: list[Column], rows: list[GroupRow]) -> str:
    return markdown_table(
        [header for header, _ in columns], [[cell(row) for _, cell in columns] for row in rows]
    )
