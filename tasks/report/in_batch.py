"""What the report says of a loss over the batch's candidates (in_batch_softmax): why its
training loss falls with more local towers, and the cure the verdict names (cross_tower
gather), with what the sweep measured of it."""

from __future__ import annotations

import math

from towerbench.config.losses import EMBEDDING_PAIRS
from towerbench.config.sections import TrainConfig
from towerbench.tasks.report.statistics import GroupRow


def candidates_seen(config: TrainConfig) -> int:
    """The candidates each query's softmax is over in training: the tower's B/k (local) or the
    batch's B (gather, or one tower)."""
    if config.cross_tower == "gather":
        return config.global_batch
    return config.global_batch // config.replicas


def is_split(config: TrainConfig) -> bool:
    """A batch-dependent loss computed on each tower's share of the batch."""
    return config.loss in EMBEDDING_PAIRS and candidates_seen(config) < config.global_batch


def split_loss_note(row: GroupRow) -> str | None:
    """For local towers under in_batch_softmax: what each tower's softmax saw, the start of the
    verdict's note (the caller adds what the sweep measured of gather)."""
    config = row.config
    if not is_split(config):
        return None
    return (
        f"{config.loss}: each tower's softmax scored its own {candidates_seen(config)} "
        f"candidates (B/k), not the batch's {config.global_batch}, an easier objective than one "
        f"device's; cross_tower gather scores all {config.global_batch} and trains what one "
        "device trains"
    )


def chance_levels(rows: list[GroupRow]) -> str | None:
    """The loss section's paragraph for in_batch_softmax: each configuration's candidates per
    query and its chance level ln(candidates)."""
    seen = [row for row in rows if row.config.loss in EMBEDDING_PAIRS]
    if not seen:
        return None
    levels = "; ".join(
        f"`{row.group}`: {count} candidates, ln {count} = {math.log(count):.2f}"
        for row in seen
        if (count := candidates_seen(row.config))
    )
    return (
        "`in_batch_softmax` is not a mean over examples: each query's softmax is over the "
        "candidates its tower's loss sees (B/k with cross_tower local, the batch's B with "
        "gather), and its chance level, every candidate scored alike, is the log of their "
        f"number at most (masked accidental hits leave fewer): {levels}. A lower training "
        "loss at more local towers is partly that easier objective, not a better model. The "
        "test loss ranks every test query against the same fixed test candidates "
        "(train.eval_candidates) whatever the towers, so it compares."
    )
