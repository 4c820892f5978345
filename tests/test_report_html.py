"""report.html as MLflow shows it: every markdown table of report.md is an HTML table."""

from __future__ import annotations

import re
from html.parser import HTMLParser

from towerbench.config.grid import canonical, group_name, run_name
from towerbench.config.sections import TrainConfig
from towerbench.core.outcome import Status
from towerbench.tasks.report.publish import report_html
from towerbench.tasks.report.render import ReportHeader, nightly_section, render_report
from towerbench.tasks.report.statistics import Curve, RunRecord
from towerbench.tasks.report.verdicts import compare

RUN = "http://mlflow/run"
CHARTS = "http://mlflow/#/experiments/1/runs?compareRunsMode=CHART"

TABLE_SEPARATOR = re.compile(r"^\|(\s*:?-+:?\s*\|)+$")


def record(towers: int, seed: int, accuracy: float) -> RunRecord:
    asked = TrainConfig(
        towers=towers, global_batch=32 * towers, reference_batch=32, lr_scaling="linear", seed=seed
    )
    config = canonical(asked)  # as the sweep names it
    return RunRecord(
        run_id=f"run-{towers}-{seed}",
        name=run_name(config),
        group=group_name(config),
        config=config,
        status=Status.COMPLETED,
        final_score=accuracy,
        images_per_sec=1000.0 / towers,
        effective_lr=0.1 * towers,
        noise_scale=None,
        device_kind="logical CPU",
        curve=Curve(epochs=[1.0, 2.0], wall_times=[1.0, 2.0], scores=[accuracy - 0.1, accuracy]),
        steps=10.0,
        losses={"train_cross_entropy": 0.3, "test_cross_entropy": 0.4, "generalization_gap": 0.1},
    )


class _Tables(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def handle_starttag(self, tag: str, attrs) -> None:
        if tag == "table":
            self.count += 1


def test_every_markdown_table_renders_as_an_html_table() -> None:
    records = [record(1, 0, 0.90), record(1, 1, 0.91), record(2, 0, 0.88), record(2, 1, 0.89)]
    rows, target = compare(records, [], None)
    earlier, _ = compare([record(2, 0, 0.92), record(2, 1, 0.93)], [], None)
    header = ReportHeader("a sweep", "parent", RUN, CHARTS, "v1", ["logical CPU"], target)
    nightly = nightly_section("previous", True, rows, {row.group: row for row in earlier})
    text = render_report(header, rows, records, {"accuracy": "accuracy.png"}, nightly)

    markdown_tables = sum(bool(TABLE_SEPARATOR.match(line)) for line in text.splitlines())
    parser = _Tables()
    parser.feed(report_html(text, header.title))
    assert markdown_tables >= 7  # setup, accuracy, losses, speed, per epoch, benchmark, runs
    assert parser.count == markdown_tables


def test_the_setup_table_says_why_one_tower_reads_lr_none_warmup_0() -> None:
    records = [record(1, 0, 0.90), record(2, 0, 0.88)]
    rows, target = compare(records, [], None)
    header = ReportHeader("a sweep", "parent", RUN, CHARTS, "v1", ["logical CPU"], target)
    setup = render_report(header, rows, records, {}).split("## Accuracy")[0]
    assert "every LR scaling rule gives base_lr there" in setup
    assert f"`{rows[0].group}`" in setup and f"`{rows[1].group}`" not in setup.split("\n\n")[-1]
