"""The report's BatchNorm section and the verdict's note on the statistics' lag (issue 63)."""

from __future__ import annotations

from towerbench.config.sections import TrainConfig
from towerbench.core.outcome import Status
from towerbench.tasks.report.render import ReportHeader, render_report, verdicts_by_group
from towerbench.tasks.report.statistics import Curve, RunRecord
from towerbench.tasks.report.verdicts import compare

EPOCHS = [1.0, 2.0]


def _record(towers: int, seed: int, moving: list[float], recomputed: list[float] | None):
    config = TrainConfig(towers=towers, global_batch=128 * towers, reference_batch=128, seed=seed)
    return RunRecord(
        run_id=f"{towers}-{seed}",
        name=f"towers={towers} seed={seed}",
        group=f"towers={towers}",
        config=config,
        status=Status.COMPLETED,
        final_score=moving[-1],
        images_per_sec=None,
        effective_lr=0.1,
        noise_scale=None,
        device_kind="logical CPU",
        curve=Curve(EPOCHS, [5.0, 10.0], moving),
        steps=100.0 / towers,
        bn_curves=(
            {}
            if recomputed is None
            else {
                "test_accuracy_moving_bn": (EPOCHS, moving),
                "test_accuracy_recomputed_bn": (EPOCHS, recomputed),
            }
        ),
    )


def _report(records: list[RunRecord]) -> tuple[dict[str, str], str]:
    rows, target = compare(records, [], None)
    header = ReportHeader("sweep", "parent", "run", "charts", "digits", ["logical CPU"], target)
    return verdicts_by_group(rows), render_report(header, rows, records, {})


def test_a_gap_the_moving_statistics_explain_is_named_with_both_figures() -> None:
    seeds = range(3)
    one = [_record(1, s, [0.80, 0.900 + 0.001 * s], [0.81, 0.905 + 0.001 * s]) for s in seeds]
    four = [_record(4, s, [0.40, 0.869 + 0.001 * s], [0.78, 0.901 + 0.001 * s]) for s in seeds]
    verdicts, report = _report(one + four)
    assert (
        "4 towers: −3.1 pp with moving BatchNorm statistics, −0.4 pp re-estimated at the "
        "weights: the statistics' lag (4× fewer steps an epoch) explains 2.7 pp of the gap"
    ) in verdicts["towers=4"]
    section = report.split("## BatchNorm's statistics")[1].split("## Speed")[0]
    assert "| 1 | 80.0% / 81.0% (+1.0) | 40.0% / 78.0% (+38.0) |" in section
    assert "| 2 | 90.1% / 90.6% (+0.5) | 87.0% / 90.2% (+3.2) |" in section


def test_no_note_where_re_estimating_changes_little_and_no_section_without_batch_norm() -> None:
    seeds = range(3)
    one = [_record(1, s, [0.8, 0.90 + 0.001 * s], [0.8, 0.90 + 0.001 * s]) for s in seeds]
    four = [_record(4, s, [0.7, 0.87 + 0.001 * s], [0.7, 0.872 + 0.001 * s]) for s in seeds]
    verdicts, _ = _report(one + four)
    assert "BatchNorm" not in verdicts["towers=4"]
    plain = [_record(t, s, [0.8, 0.9], None) for t in (1, 4) for s in seeds]
    _, report = _report(plain)
    assert "## BatchNorm's statistics" not in report
