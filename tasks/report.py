"""The sweep report: read the runs back from MLflow, compare, write markdown + figures.

The report is written to `<report_dir>/<parent run id>/report.md` (atomically, with its two
figures), logged to the parent run under `report/`, and shown as a Prefect markdown artifact.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display: figures only go to files

import matplotlib.pyplot as plt  # noqa: E402
from mlflow.entities import Run  # noqa: E402
from mlflow.exceptions import MlflowException  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402
from prefect import task  # noqa: E402
from prefect.artifacts import create_markdown_artifact  # noqa: E402
from prefect.cache_policies import NO_CACHE  # noqa: E402

from model.config import ReportConfig, TrackingConfig, TrainConfig  # noqa: E402
from model.errors import TowerbenchError  # noqa: E402
from tasks.comparison import (  # noqa: E402
    Curve,
    GroupRow,
    RunRecord,
    accuracy_by_epoch,
    compare,
)
from tasks.markdown import markdown_table  # noqa: E402
from tasks.tracking import (  # noqa: E402
    CONFIG_TAG,
    ERROR_TAG,
    FLOW_TAG,
    GROUP_TAG,
    KIND_TAG,
    PARENT_TAG,
    STATUS_TAG,
    SWEPT_TAG,
    client_for,
    run_url,
)

REPORT_ARTIFACT_DIR = "report"


def _curve(client: MlflowClient, run_id: str) -> Curve:
    """Test accuracy per evaluation, joined with the epoch and wall time logged at that step."""
    series = {
        key: {point.step: point.value for point in client.get_metric_history(run_id, key)}
        for key in ("test_accuracy", "epoch", "wall_time")
    }
    steps = sorted(set(series["test_accuracy"]) & set(series["epoch"]) & set(series["wall_time"]))
    return Curve(
        epochs=[series["epoch"][step] for step in steps],
        wall_times=[series["wall_time"][step] for step in steps],
        accuracies=[series["test_accuracy"][step] for step in steps],
    )


def _float(value: str | float | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def run_record(client: MlflowClient, run: Run) -> RunRecord:
    tags, metrics, params = run.data.tags, run.data.metrics, run.data.params
    return RunRecord(
        run_id=run.info.run_id,
        name=run.info.run_name,
        group=tags.get(GROUP_TAG, run.info.run_name),
        config=TrainConfig.model_validate_json(tags[CONFIG_TAG]),
        status=tags.get(STATUS_TAG, "failed" if run.info.status == "FAILED" else "running"),
        final_accuracy=metrics.get("test_accuracy"),
        images_per_sec=metrics.get("images_per_sec"),
        effective_lr=_float(params.get("effective_lr")),
        noise_scale=metrics.get("noise_scale"),
        device_kind=params.get("device_kind"),
        curve=_curve(client, run.info.run_id),
        error=tags.get(ERROR_TAG),
    )


def sweep_parent(client: MlflowClient, parent_run_id: str) -> Run:
    """The parent run of a sweep, or a clear error naming `--sweep`."""
    try:
        parent = client.get_run(parent_run_id)
    except MlflowException as error:
        raise TowerbenchError(
            f"--sweep: no MLflow run {parent_run_id!r} in {client.tracking_uri}"
        ) from error
    if parent.data.tags.get(KIND_TAG) != "sweep":
        raise TowerbenchError(f"--sweep: run {parent_run_id} is not a sweep's parent run")
    return parent


def sweep_records(client: MlflowClient, parent: Run) -> list[RunRecord]:
    """The configuration runs of a sweep, in start order."""
    children = client.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.`{PARENT_TAG}` = '{parent.info.run_id}'",
        order_by=["attributes.start_time ASC"],
        max_results=5000,
    )
    return [run_record(client, run) for run in children]


def previous_benchmark(client: MlflowClient, parent: Run) -> Run | None:
    """The latest finished benchmark sweep before `parent` in the same experiment."""
    runs = client.search_runs(
        [parent.info.experiment_id],
        filter_string=(
            f"tags.`{KIND_TAG}` = 'sweep' and tags.`{FLOW_TAG}` = 'benchmark' "
            f"and attributes.status = 'FINISHED' "
            f"and attributes.start_time < {parent.info.start_time}"
        ),
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    return runs[0] if runs else None


def accuracy_figures(records: list[RunRecord], folder: Path) -> list[str]:
    """Test accuracy against epochs and against wall time, one colour per configuration."""
    names = []
    palette = plt.get_cmap("tab10")
    groups = dict.fromkeys(record.group for record in records)
    colours = {group: palette(index % 10) for index, group in enumerate(groups)}
    for x_key, x_label, file_name in (
        ("epochs", "epoch", "accuracy_vs_epoch.png"),
        ("wall_times", "wall time (s)", "accuracy_vs_time.png"),
    ):
        figure, axis = plt.subplots(figsize=(7, 4.5))
        labelled: set[str] = set()
        for record in records:
            axis.plot(
                getattr(record.curve, x_key),
                record.curve.accuracies,
                color=colours[record.group],
                linestyle=("-", "--", ":", "-.")[record.config.seed % 4],
                marker=".",
                label=None if record.group in labelled else record.group,
            )
            labelled.add(record.group)
        axis.set(xlabel=x_label, ylabel="test accuracy", title=f"Test accuracy vs {x_label}")
        axis.grid(alpha=0.3)
        axis.legend(fontsize="small")
        figure.tight_layout()
        figure.savefig(folder / file_name, dpi=110)
        plt.close(figure)
        names.append(file_name)
    return names


def _pct(value: float | None, digits: int = 1) -> str:
    return "—" if value is None or not math.isfinite(value) else f"{100 * value:.{digits}f}%"


def _number(value: float | None, pattern: str) -> str:
    return "—" if value is None or not math.isfinite(value) else format(value, pattern)


def _row_cells(row: GroupRow, target: float | None) -> list[str]:
    accuracy = row.accuracy
    if accuracy.count == 0:
        accuracy_text = "—"
    elif math.isfinite(accuracy.std):
        accuracy_text = f"{100 * accuracy.mean:.2f} ± {100 * accuracy.std:.2f}%"
    else:
        accuracy_text = f"{100 * accuracy.mean:.2f}%"
    difference, ci, p_value = "—", "—", "—"
    if row.difference is not None:
        difference = f"{100 * row.difference.difference:+.2f} pp"
        if row.difference.ci_low is not None:
            ci = f"[{100 * row.difference.ci_low:+.2f}, {100 * row.difference.ci_high:+.2f}]"
            p_value = f"{row.difference.p_value:.3f}"
    completed = sum(run.status == "completed" for run in row.runs)
    time_text = _number(row.time_to_target, ".1f")
    if target is not None and completed and row.reached_target < completed:
        time_text += f" ({row.reached_target}/{completed} reached)"
    lr = [run.effective_lr for run in row.runs if run.effective_lr is not None]
    return [
        row.group,
        str(row.config.global_batch),
        _number(lr[0] if lr else None, ".4g"),
        f"{completed}/{len(row.runs)}",
        accuracy_text,
        difference,
        ci,
        p_value,
        time_text,
        _number(row.speedup, ".2f"),
        _number(row.images_per_sec, ".0f"),
        _number(row.efficiency, ".2f"),
        _number(row.noise_scale, ".0f"),
    ]


def _epoch_table(rows: list[GroupRow], most_rows: int = 20) -> str:
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


def _comparison_with_previous(client: MlflowClient, parent: Run, rows: list[GroupRow]) -> str:
    previous = previous_benchmark(client, parent)
    if previous is None:
        return "No earlier finished benchmark in this experiment to compare with."
    previous_records = sweep_records(client, previous)
    swept = json.loads(previous.data.tags.get(SWEPT_TAG, "[]"))
    previous_rows = {row.group: row for row in compare(previous_records, swept, None)[0]}
    same_data = previous.data.params.get("data_version") == parent.data.params.get("data_version")
    lines = [
        f"Previous benchmark: run `{previous.info.run_id}` "
        f"({'same' if same_data else 'DIFFERENT'} data version).",
        "",
    ]
    table = []
    for row in rows:
        before = previous_rows.get(row.group)
        if before is None:
            table.append([row.group, _pct(row.accuracy.mean, 2), "—", "—", "—"])
            continue
        change = row.accuracy.mean - before.accuracy.mean
        speed = (
            row.images_per_sec / before.images_per_sec
            if row.images_per_sec and before.images_per_sec
            else None
        )
        table.append(
            [
                row.group,
                _pct(row.accuracy.mean, 2),
                _pct(before.accuracy.mean, 2),
                f"{100 * change:+.2f} pp" if math.isfinite(change) else "—",
                _number(speed, ".2f"),
            ]
        )
    header = ["configuration", "accuracy now", "before", "change", "images/s now / before"]
    return "\n".join(lines) + markdown_table(header, table)


def render_markdown(
    tracking: TrackingConfig,
    parent: Run,
    rows: list[GroupRow],
    records: list[RunRecord],
    target: float | None,
    figures: list[str],
    benchmark_section: str | None,
) -> str:
    link = run_url(tracking, parent.info.experiment_id, parent.info.run_id)
    device_kinds = sorted({record.device_kind for record in records if record.device_kind})
    data_version = parent.data.params.get("data_version", "unknown")
    header = [
        "configuration",
        "global batch",
        "LR",
        "seeds ok",
        "test accuracy",
        "Δ vs 1 tower",
        "95% CI",
        "p (Welch)",
        f"s to {_pct(target)}",
        "speedup",
        "images/s",
        "scaling eff.",
        "noise scale",
    ]
    parts = [
        f"# towerbench sweep report: {parent.info.run_name}",
        "",
        f"MLflow parent run: [{parent.info.run_id}]({link}) · data version `{data_version}` · "
        f"devices: {', '.join(device_kinds) or 'unknown'} · time-to-accuracy target "
        f"{_pct(target)}",
        "",
        markdown_table(header, [_row_cells(row, target) for row in rows]),
        "",
        "## Verdicts",
        "",
    ]
    for row in rows:
        notes = "".join(f"; {note}" for note in row.notes)
        parts.append(f"- **{row.group}**: {row.verdict}{notes}")
    if any("logical" in kind for kind in device_kinds):
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
        _epoch_table(rows),
    ]
    parts += ["", "## Figures", ""] + [f"![{name}]({name})" for name in figures]
    if benchmark_section is not None:
        parts += ["", "## Compared with the previous benchmark", "", benchmark_section]
    run_rows = [
        [
            record.name,
            record.status,
            _pct(record.final_accuracy, 2),
            record.run_id,
            (record.error or "")[:120],
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


def write_report(tracking: TrackingConfig, parent_run_id: str, report: ReportConfig) -> Path:
    """Compute, write and log the report of a sweep; returns the markdown file's path."""
    client = client_for(tracking)
    parent = sweep_parent(client, parent_run_id)
    records = sweep_records(client, parent)
    swept = json.loads(parent.data.tags.get(SWEPT_TAG, "[]"))
    rows, target = compare(records, swept, report.target_accuracy)
    benchmark = (
        _comparison_with_previous(client, parent, rows)
        if parent.data.tags.get(FLOW_TAG) == "benchmark"
        else None
    )
    destination = Path(report.report_dir).resolve() / parent_run_id
    destination.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{parent_run_id}-", dir=destination.parent))
    try:
        figures = accuracy_figures(records, staging)
        markdown = render_markdown(tracking, parent, rows, records, target, figures, benchmark)
        (staging / "report.md").write_text(markdown)
        if destination.exists():
            shutil.rmtree(destination)
        os.replace(staging, destination)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    client.log_artifacts(parent_run_id, str(destination), REPORT_ARTIFACT_DIR)
    return destination / "report.md"


@task(name="report", cache_policy=NO_CACHE)  # reads runs that may have changed
def make_report(tracking: TrackingConfig, parent_run_id: str, report: ReportConfig) -> str:
    """The report as a file, in MLflow and as a Prefect markdown artifact."""
    path = write_report(tracking, parent_run_id, report)
    # The figures are files next to the report (and under report/ in the parent run).
    markdown = path.read_text() + f"\n\nFigures and full report: `{path}`.\n"
    create_markdown_artifact(
        markdown, key="sweep-report", description=f"Sweep {parent_run_id}: comparison report"
    )
    return str(path)
