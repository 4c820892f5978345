"""A retrieval sweep's report (issue 62 item 4): the loss section gives each configuration's
candidates per query and chance level ln(candidates), and a local k-tower verdict names gather
with what the sweep measured of it, or says it is untested."""

from __future__ import annotations

from towerbench.config.grid import canonical, group_name, run_name
from towerbench.config.sections import TrainConfig
from towerbench.core.metrics import METRICS
from towerbench.core.outcome import Status
from towerbench.tasks.report.render import ReportHeader, render_report
from towerbench.tasks.report.statistics import Curve, RunRecord
from towerbench.tasks.report.verdicts import compare

RECALL = METRICS["recall_at_10"]
SWEPT = ["cross_tower"]


def _record(towers: int, cross_tower: str, seed: int, recall: float, loss: float) -> RunRecord:
    config = canonical(
        TrainConfig(
            towers=towers,
            global_batch=128,
            seed=seed,
            loss="in_batch_softmax",
            metric="recall_at_10",
            cross_tower=cross_tower,
            optimizer="adam",
            epochs=4,
        )
    )
    return RunRecord(
        run_id=f"run-{towers}-{cross_tower}-{seed}",
        name=run_name(config, SWEPT),
        group=group_name(config, SWEPT),
        config=config,
        status=Status.COMPLETED,
        final_score=recall,
        images_per_sec=1000.0,
        effective_lr=0.001,
        noise_scale=None,
        device_kind="logical CPU",
        curve=Curve([1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0], [recall] * 4),
        steps=10.0,
        losses={
            "train_cross_entropy": loss,
            "test_cross_entropy": 3.0,
            "generalization_gap": 3.0 - loss,
        },
        metric=RECALL,
    )


def _sweep(cross_towers: tuple[str, ...]) -> list[RunRecord]:
    """1 against 4 towers: local towers' loss lower (an easier objective) and recall lower."""
    records = []
    for cross_tower in cross_towers:
        for seed, shift in enumerate((0.0, 0.004, -0.004)):
            records.append(_record(1, cross_tower, seed, 0.70 + shift, 2.7))
            four = (0.62, 1.6) if cross_tower == "local" else (0.70, 2.7)
            records.append(_record(4, cross_tower, seed, four[0] + shift, four[1]))
    return records


def _four_local(rows):
    return next(r for r in rows if r.config.towers == 4 and r.config.cross_tower == "local")


def test_a_local_verdict_names_gather_with_what_the_sweep_measured() -> None:
    rows, _ = compare(_sweep(("local", "gather")), SWEPT, None)
    notes = "; ".join(_four_local(rows).notes)
    assert (
        "in_batch_softmax: each tower's softmax scored its own 32 candidates (B/k), not the "
        "batch's 128, an easier objective than one device's; cross_tower gather scores all 128 "
        "and trains what one device trains (measured: `towers=4 " in notes
    )
    assert "cross_tower=gather` +0.0 pp" in notes
    gathered = next(r for r in rows if r.config.towers == 4 and r.config.cross_tower == "gather")
    assert not any("B/k" in note for note in gathered.notes)


def test_without_a_gathered_run_the_cure_is_untested_here() -> None:
    rows, _ = compare(_sweep(("local",)), SWEPT, None)
    notes = "; ".join(_four_local(rows).notes)
    assert "trains what one device trains (untested here)" in notes


def test_the_loss_section_gives_each_configurations_candidates_and_chance_level() -> None:
    records = _sweep(("local", "gather"))
    rows, target = compare(records, SWEPT, None)
    header = ReportHeader("a sweep", "parent", "run", "charts", "v1", ["logical CPU"], target)
    text = render_report(header, rows, records, {}, None)
    losses = text[text.index("## Losses") :]
    assert "cross_tower=local`: 32 candidates, ln 32 = 3.47" in losses
    assert "cross_tower=gather`: 128 candidates, ln 128 = 4.85" in losses
    assert "A lower training loss at more local towers is partly that easier objective" in losses
    assert (
        "Here the lower loss is an easier objective: in_batch_softmax over each tower's 32 "
        "candidates, not the batch's 128" in losses
    )
    assert "different number of updates" not in losses
    assert "| test recall@10 |" in text
