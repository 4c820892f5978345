"""The losses a run can train with, the labels each takes and the loss of an output that knows
nothing (its chance level).

Every loss is a mean over examples of a per-example loss (Keras' signature: `fn(y_true,
y_pred) -> (batch,)`, the mean over a label row's columns where it has several), so k towers
averaged are exactly the big batch's gradient. The cross-entropies take logits: the network's
last layer has no activation.

Plain Python: the config, the checks and the report read it without TensorFlow.
"""

from __future__ import annotations

import math
from typing import Literal

from towerbench.core.tfrecord_format import LabelKind

LossName = Literal[
    "sparse_categorical_crossentropy",
    "categorical_crossentropy",
    "binary_crossentropy",
    "mse",
    "mae",
    "huber",
]
LOSS_LABELS: dict[str, LabelKind] = {
    "sparse_categorical_crossentropy": "class_ids",
    "categorical_crossentropy": "rows",  # one-hot or soft class rows
    "binary_crossentropy": "rows",  # 0/1 per column: binary or multi-label (multi-hot)
    "mse": "rows",
    "mae": "rows",
    "huber": "rows",
}
LOSSES: tuple[str, ...] = tuple(LOSS_LABELS)
# Losses whose labels name one class per example (a class id, or a row's largest value): the
# runs judged today by accuracy and a confusion matrix.
SINGLE_CLASS: frozenset[str] = frozenset(
    {"sparse_categorical_crossentropy", "categorical_crossentropy"}
)
FROM_LOGITS: frozenset[str] = frozenset(
    {"sparse_categorical_crossentropy", "categorical_crossentropy", "binary_crossentropy"}
)
HUBER_DELTA = 1.0  # Keras' default


def chance_loss(loss: str, width: int) -> float | None:
    """The loss of all-zero logits (the uniform prediction) over `width` classes or columns;
    None for a regression loss, whose level depends on the targets."""
    if loss in SINGLE_CLASS:
        return math.log(width)
    if loss == "binary_crossentropy":
        return math.log(2)
    return None
