"""The report states epochs and updates as the runs trained them (MLflow `epochs`, `steps`), the
configured budget beside them where it differs, and how many times 1 tower's examples a
configuration saw; the figures' legend explains every colour and line style."""

from __future__ import annotations

from towerbench.config.sections import TrainConfig
from towerbench.core.outcome import Status
from towerbench.tasks.report.columns import SETUP_COLUMNS, table
from towerbench.tasks.report.figures import _colours, legend_entries
from towerbench.tasks.report.publish import summary_metrics
from towerbench.tasks.report.render import _budgets
from towerbench.tasks.report.statistics import Curve, RunRecord
from towerbench.tasks.report.verdicts import compare

HAND = 846 / 462  # the noise budget's factor at noise scale 334, batch 512 against 128


def _run(group: str, config: TrainConfig, seed: int, accuracy: float, epochs: float, steps):
    return RunRecord(
        run_id=f"{group}-{seed}", name=group, group=group,
        config=config.model_copy(update={"seed": seed}), status=Status.COMPLETED,
        final_score=accuracy, images_per_sec=1000.0, effective_lr=0.1, noise_scale=None,
        device_kind="logical CPU", curve=Curve([epochs], [10.0], [accuracy]), steps=steps,
        epochs=epochs,
    )  # fmt: skip


def _sweep() -> list[RunRecord]:
    one = TrainConfig(global_batch=128, reference_batch=128, epochs=8)
    four = one.model_copy(update={"towers": 4, "global_batch": 512})
    adascale = four.model_copy(update={"lr_scaling": "adascale"})
    noise = four.model_copy(update={"lr_scaling": "sqrt", "epochs": 8 * HAND})
    runs = []
    for seed, shift in enumerate((0.0, 0.004, -0.004)):
        runs.append(_run("towers=1", one, seed, 0.80 + shift, 8.0, 96))
        # tau reached 1 tower's 96 updates after 18.58 epochs (223 of 12 steps an epoch).
        runs.append(_run("towers=4 lr=adascale", adascale, seed, 0.81 + shift, 18.58, 223))
        runs.append(_run("towers=4 lr=sqrt", noise, seed, 0.79 + shift, 8 * HAND, 44))
    return runs


def test_the_configurations_table_shows_the_epochs_trained_and_the_budget() -> None:
    rows, _ = compare(_sweep(), [], None)
    text = table(SETUP_COLUMNS, rows)
    assert "| epochs trained (budget) | updates |" in text
    assert "| towers=1 | 128 | 0.1 | 8 | 96 | 3/3 |" in text
    assert "| towers=4 lr=adascale | 512 | 0.1 | 18.6 (budget 8) | 223 | 3/3 |" in text
    assert "| towers=4 lr=sqrt | 512 | 0.1 | 14.6 (1.83×) | 44 | 3/3 |" in text  # noise budget
    by_group = {row.group: row for row in rows}
    assert by_group["towers=4 lr=adascale"].examples_factor == 18.58 / 8


def test_a_verdict_says_how_many_times_more_examples_it_saw() -> None:
    rows, _ = compare(_sweep(), [], None)
    by_group = {row.group: row for row in rows}
    seen = "2.32× the training examples of `towers=1` (18.6 epochs trained against 8)"
    assert f"; it saw {seen}" in by_group["towers=4 lr=adascale"].verdict
    assert "it saw 1.83× the training examples" in by_group["towers=4 lr=sqrt"].verdict
    assert "examples" not in by_group["towers=1"].verdict
    budgets = "\n".join(_budgets(rows))
    assert "- `towers=4 lr=adascale`: AdaScale's own: its progress tau reaches 1 tower's " in (
        budgets
    )
    assert f"; saw {seen}" in budgets
    metrics = summary_metrics(rows)
    assert metrics["epochs/towers-4_lr-adascale"] == 18.58
    assert metrics["updates/towers-4_lr-adascale"] == 223
    assert metrics["examples_factor/towers-4_lr-adascale"] == 18.58 / 8


def test_an_early_stop_shows_the_configured_epochs_and_no_more_examples() -> None:
    runs = [r for r in _sweep() if r.group != "towers=4 lr=sqrt"]
    stopped = [r for r in runs if r.group == "towers=4 lr=adascale"]
    for run in stopped:
        run.epochs, run.steps = 5.5, 66
    rows, _ = compare(runs, [], None)
    row = {row.group: row for row in rows}["towers=4 lr=adascale"]
    assert "| 5.5 (budget 8) | 66 |" in table(SETUP_COLUMNS, rows)
    assert "examples" not in row.verdict


def test_the_legend_explains_each_colour_and_each_seeds_line_style() -> None:
    runs = _sweep()
    colours = _colours(runs)
    entries = legend_entries(runs, colours)
    labels = [entry.get_label() for entry in entries]
    assert labels == [
        "towers=1", "towers=4 lr=adascale", "towers=4 lr=sqrt", "seed 0", "seed 1", "seed 2",
    ]  # fmt: skip
    styles = {entry.get_label(): entry.get_linestyle() for entry in entries}
    assert (styles["seed 0"], styles["seed 1"], styles["seed 2"]) == ("-", "--", ":")
    one_seed = [run for run in runs if run.config.seed == 0]
    assert [e.get_label() for e in legend_entries(one_seed, colours)] == labels[:3]
