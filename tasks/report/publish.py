"""Publishing a sweep's report where people look for it.

`write_report` compares the runs read back from MLflow and writes, atomically, a folder
`<report_dir>/<parent run id>/` with `report.md` (figures as files beside it), `report.html`
(figures embedded, for MLflow's artifact viewer) and the figures; it logs that folder to the
parent run under `report/`, and the summary per configuration as the parent run's metrics.
`make_report` is the Prefect task; its markdown artifact embeds the figures as data URIs, since
the Prefect UI cannot load files beside the report.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import markdown
from mlflow.entities import Metric, Run
from mlflow.tracking import MlflowClient
from prefect import task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from towerbench.config.params import ReportConfig, TrackingConfig
from towerbench.tasks.report.figures import report_figures
from towerbench.tasks.report.reading import (
    previous_nightly,
    running_note,
    sweep_parent,
    sweep_records,
)
from towerbench.tasks.report.render import (
    ReportHeader,
    nightly_section,
    render_report,
    verdicts_by_group,
)
from towerbench.tasks.report.statistics import GroupRow, sweep_metric
from towerbench.tasks.report.verdicts import compare
from towerbench.tasks.tracking import (
    FLOW_TAG,
    existing_store_client,
    run_url,
    sweep_charts_url,
    swept_besides_axes,
)

REPORT_ARTIFACT_DIR = "report"
VERDICTS_FILE = "verdicts.json"  # beside report.md: each configuration's verdict
Say = Callable[[str], None]
FIGURE_LINK = re.compile(r"\]\(([\w.-]+\.png)\)")
HTML_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>{title}</title>
<style>body{{font-family:sans-serif;max-width:1200px;margin:1em auto;}}
table{{border-collapse:collapse;font-size:13px;}}td,th{{border:1px solid #ccc;padding:3px 6px;}}
img{{max-width:100%;}}</style></head><body>{body}</body></html>
"""


def embed_figures(text: str, folder: Path) -> str:
    """`text` with every `](name.png)` link to a file in `folder` replaced by a data URI."""

    def inline(match: re.Match) -> str:
        encoded = base64.b64encode((folder / match.group(1)).read_bytes()).decode()
        return f"](data:image/png;base64,{encoded})"

    return FIGURE_LINK.sub(inline, text)


def report_html(text: str, title: str) -> str:
    """The markdown report as the page MLflow's artifact viewer shows."""
    body = markdown.markdown(text, extensions=["tables"])
    return HTML_PAGE.format(title=title, body=body)


def _metric_key(group: str) -> str:
    """MLflow metric names allow letters, digits, `_-./ ` only: `towers=4 lr=sqrt` ->
    `towers-4_lr-sqrt`."""
    return group.replace("=", "-").replace(" ", "_")


def summary_metrics(rows: list[GroupRow]) -> dict[str, float]:
    """Per configuration: the mean test metric (named by it: `accuracy/…`, `mae/…`), epochs
    and updates as trained, and against 1 tower the difference (`delta_pp` of a share, `delta`
    in an error's units), p-value and the examples seen (its epochs trained / 1 tower's)."""
    metrics: dict[str, float] = {}
    for row in rows:
        key, metric = _metric_key(row.group), row.metric
        values = {
            metric.name: metric.value(row.score.mean) if row.score.count else None,
            "epochs": row.epochs,
            "updates": row.steps,
            "examples_factor": row.examples_factor,
        }
        if row.difference is not None:
            delta = metric.value(row.difference.difference)
            values.update({"delta_pp": 100 * delta} if metric.share else {"delta": delta})
            values["p_value"] = row.difference.p_value
        metrics.update({f"{name}/{key}": v for name, v in values.items() if v is not None})
    return metrics


def _nightly(client: MlflowClient, parent: Run, rows: list[GroupRow]) -> str | None:
    if parent.data.tags.get(FLOW_TAG) != "nightly":
        return None
    previous = previous_nightly(client, parent)
    if previous is None:
        return "No earlier finished nightly sweep in this experiment to compare with."
    swept = swept_besides_axes(previous)
    earlier = sweep_records(client, previous)
    was, now = sweep_metric(earlier), sweep_metric([run for row in rows for run in row.runs])
    if was != now:
        return (
            f"The previous nightly sweep, run `{previous.info.run_id}`, was judged by "
            f"{was.label}, this one by {now.label}: not compared."
        )
    before = {row.group: row for row in compare(earlier, swept, None)[0]}
    same_data = previous.data.params.get("data_version") == parent.data.params.get("data_version")
    return nightly_section(previous.info.run_id, same_data, rows, before)


def _write_folder(destination: Path, write) -> None:
    """Fill a staging folder with `write(folder)`, then swap it in for `destination`."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{destination.name}-", dir=destination.parent))
    try:
        write(staging)
        if destination.exists():
            shutil.rmtree(destination)
        os.replace(staging, destination)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def write_report(
    tracking: TrackingConfig, parent_run_id: str, report: ReportConfig, say: Say | None = None
) -> Path:
    """Compute, write and log the report of a sweep; returns the markdown file's path.

    Called from outside the sweep (`towerbench report`, with `say`), a sweep still running
    gives a partial report marked as such, and `say` is told why.
    """
    client = existing_store_client(tracking)
    parent = sweep_parent(client, parent_run_id)
    partial = running_note(client, parent) if say is not None else None
    if say is not None and partial is not None:
        say(partial)
    records = sweep_records(client, parent)
    swept = swept_besides_axes(parent)
    target, metric = report.target_accuracy, sweep_metric(records)
    if target is not None:
        metric.check_bounded(target, "report.target_accuracy", up_to_one=True)
        target = metric.score(target)
    rows, target = compare(records, swept, target, report.margin)
    header = ReportHeader(
        title=parent.info.run_name,
        parent_run_id=parent_run_id,
        run_link=run_url(tracking, parent.info.experiment_id, parent_run_id),
        charts_link=sweep_charts_url(tracking, parent.info.experiment_id, parent_run_id),
        data_version=parent.data.params.get("data_version", "unknown"),
        device_kinds=sorted({record.device_kind for record in records if record.device_kind}),
        target=target,
        partial=partial,
    )
    nightly = _nightly(client, parent, rows)

    def write(folder: Path) -> None:
        names = report_figures(records, folder)
        text = render_report(header, rows, records, {name: name for name in names}, nightly)
        (folder / "report.md").write_text(text)
        (folder / VERDICTS_FILE).write_text(json.dumps(verdicts_by_group(rows), indent=1))
        html = report_html(embed_figures(text, folder), header.title)
        (folder / "report.html").write_text(html)

    destination = Path(report.report_dir).resolve() / parent_run_id
    _write_folder(destination, write)
    client.log_artifacts(parent_run_id, str(destination), REPORT_ARTIFACT_DIR)
    now = int(time.time() * 1000)
    metrics = [Metric(key, value, now, 0) for key, value in summary_metrics(rows).items()]
    for start in range(0, len(metrics), 1000):  # MLflow's batch limit
        client.log_batch(parent_run_id, metrics=metrics[start : start + 1000])
    return destination / "report.md"


def read_verdicts(report_path: Path) -> dict[str, str]:
    """The verdicts the report at `report_path` states, by configuration."""
    return json.loads((Path(report_path).parent / VERDICTS_FILE).read_text())


def publish_artifact(report_path: Path, key: str, lead: str = "") -> None:
    """The report as a Prefect markdown artifact of the current run, figures embedded."""
    text = embed_figures(report_path.read_text(), report_path.parent)
    create_markdown_artifact(
        f"{lead}{text}\n\nReport folder: `{report_path.parent}`.\n",
        key=key,
        description="Sweep comparison report",
    )


@task(name="report", cache_policy=NO_CACHE)  # reads runs that may have changed
def make_report(tracking: TrackingConfig, parent_run_id: str, report: ReportConfig) -> str:
    """The report as files, in MLflow and as a Prefect markdown artifact."""
    path = write_report(tracking, parent_run_id, report)
    publish_artifact(path, key="sweep-report")
    return str(path)
