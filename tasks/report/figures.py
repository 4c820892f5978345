"""The report's figures: the test metric against epochs and wall time, losses and the gradient noise
scale (with AdaScale's gain) against epochs.

One colour per configuration, one line style per seed, both explained by one legend to the right
of the panels (never over the data); epochs on integer ticks.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display: figures only go to files

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402
from matplotlib.typing import LineStyleType

from towerbench.tasks.report.statistics import RunRecord  # noqa: E402

SEED_STYLES: tuple[LineStyleType, ...] = ("-", "--", ":", "-.")
DPI = 110


def _colours(records: list[RunRecord]) -> dict[str, tuple]:
    palette = plt.get_cmap("tab10")
    groups = dict.fromkeys(record.group for record in records)
    return {group: palette(index % 10) for index, group in enumerate(groups)}


def _style(seed: int) -> LineStyleType:
    return SEED_STYLES[seed % len(SEED_STYLES)]


def _plot_lines(axis, records, colours, points) -> None:
    """One line per run, its configuration's colour and its seed's style; `points(record)`
    gives its (x, y)."""
    for record in records:
        x, y = points(record)
        axis.plot(
            x, y, color=colours[record.group], linestyle=_style(record.config.seed), marker="."
        )


def legend_entries(records: list[RunRecord], colours: dict[str, tuple]) -> list[Line2D]:
    """A solid line per configuration in its colour, then (more than one seed) a grey line per
    seed in its style: every colour and line style a figure draws."""
    groups = dict.fromkeys(record.group for record in records)
    entries = [Line2D([], [], color=colours[g], marker=".", label=g) for g in groups]
    seeds = sorted({record.config.seed for record in records})
    if len(seeds) > 1:
        entries += [
            Line2D([], [], color="grey", linestyle=_style(seed), label=f"seed {seed}")
            for seed in seeds
        ]
    return entries


def _figure(records, colours, panels: int, width: float):
    """A figure of `panels` side by side, its legend in one column to their right (constrained
    layout keeps it off the axes)."""
    size = (width, 4.5)
    figure, axes = plt.subplots(1, panels, figsize=size, layout="constrained", squeeze=False)
    entries = legend_entries(records, colours)
    figure.legend(handles=entries, loc="outside right upper", fontsize="small")
    return figure, list(axes[0])


def _save(figure, folder: Path, name: str) -> str:
    figure.savefig(folder / name, dpi=DPI)
    plt.close(figure)
    return name


def _values(record: RunRecord) -> list[float]:
    """A run's test scores as its metric's values (an error plotted as itself, not negated)."""
    return [record.metric.value(score) for score in record.curve.scores]


def _metric_figure(records, colours, x_key: str, x_label: str, folder: Path, name: str) -> str:
    """The test metric against `x_key` (epochs or wall time)."""
    figure, (axis,) = _figure(records, colours, 1, 7)
    _plot_lines(axis, records, colours, lambda r: (getattr(r.curve, x_key), _values(r)))
    if x_key == "epochs":
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    label = f"test {records[0].metric.label}" if records else "test accuracy"
    axis.set(xlabel=x_label, ylabel=label, title=f"{label[0].upper()}{label[1:]} vs {x_label}")
    axis.grid(alpha=0.3)
    return _save(figure, folder, name)


def _loss_figure(records, colours, folder: Path, name: str) -> str:
    """The training loss (all towers) and the test loss per epoch, side by side."""
    figure, (train_axis, test_axis) = _figure(records, colours, 2, 11)
    test_axis.sharey(train_axis)
    _plot_lines(train_axis, records, colours, lambda r: r.loss_curves.get("train", ([], [])))
    _plot_lines(test_axis, records, colours, lambda r: r.loss_curves.get("test", ([], [])))
    for axis, title in ((train_axis, "Training"), (test_axis, "Test")):
        axis.set(xlabel="epoch", ylabel="loss", title=f"{title} loss")
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.grid(alpha=0.3)
    return _save(figure, folder, name)


def _positive(curve: tuple[list[float], list[float]]) -> tuple[list[float], list[float]]:
    """The points of `curve` with a positive value (a noise scale that is not is noise
    dominated, left out as model.noise_advice leaves it out)."""
    points = [(x, y) for x, y in zip(*curve, strict=True) if y > 0]
    return [x for x, _ in points], [y for _, y in points]


def _noise_figure(records, colours, folder: Path, name: str) -> str | None:
    """The noise scale per epoch (its positive values, log scale) and, with adascale runs, their
    gain per epoch, side by side; None when no run measured a noise scale (1 tower only)."""
    measured = [record for record in records if "noise_scale" in record.noise_curves]
    if not measured:
        return None
    adascale = [record for record in records if "adascale_gain" in record.noise_curves]
    figure, axes = _figure(measured, colours, 2 if adascale else 1, 11 if adascale else 7)
    noise_axis = axes[0]
    _plot_lines(noise_axis, measured, colours, lambda r: _positive(r.noise_curves["noise_scale"]))
    noise_axis.set(ylabel="noise scale B_noise", title="Gradient noise scale (last ~100 steps)")
    noise_axis.set_yscale("log")
    panels = [noise_axis]
    if adascale:
        gain_axis = axes[1]
        _plot_lines(gain_axis, adascale, colours, lambda r: r.noise_curves["adascale_gain"])
        gain_axis.set(ylabel="gain r", title="AdaScale gain")
        panels.append(gain_axis)
    for axis in panels:
        axis.set(xlabel="epoch")
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.grid(alpha=0.3)
    return _save(figure, folder, name)


def report_figures(records: list[RunRecord], folder: Path) -> list[str]:
    """Write the figures into `folder`; returns their file names."""
    colours = _colours(records)
    metric = records[0].metric.name if records else "accuracy"
    names = [
        _metric_figure(records, colours, "epochs", "epoch", folder, f"{metric}_vs_epoch.png"),
        _metric_figure(
            records, colours, "wall_times", "wall time (s)", folder, f"{metric}_vs_time.png"
        ),
        _loss_figure(records, colours, folder, "loss_vs_epoch.png"),
        _noise_figure(records, colours, folder, "noise_scale_vs_epoch.png"),
    ]
    return [name for name in names if name is not None]
