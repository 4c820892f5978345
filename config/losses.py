"""The losses a run can train with, the labels each takes and the loss of an output that knows
nothing (its chance level).

Every loss but one is a mean over examples of a per-example loss (Keras' signature:
`fn(y_true, y_pred) -> (batch,)`, the mean over a label row's columns where it has several), so k
towers averaged are exactly the big batch's gradient. The one is `in_batch_softmax`, a retrieval
model's: each query's candidates are the other examples' in its batch (EMBEDDING_PAIRS), so a
tower's loss depends on which examples share its batch. The cross-entropies take logits: the
network's last layer has no activation. `train.loss` is one of LOSSES or the user's own
per-example loss, `path/to/file.py:function` (relative to the params file's folder) or
`package.module:function`, which takes the labels the dataset holds.

Plain Python: the config, the checks and the report read it without TensorFlow.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

from towerbench.config.model_ref import (
    ModelReference,
    absolute_function,
    function_provenance,
    parse_model,
    provenance,
)
from towerbench.core.tfrecord_format import LabelKind

LossName = Literal[
    "sparse_categorical_crossentropy",
    "categorical_crossentropy",
    "binary_crossentropy",
    "mse",
    "mae",
    "huber",
    "in_batch_softmax",
]
LOSS_LABELS: dict[str, LabelKind] = {
    "sparse_categorical_crossentropy": "class_ids",
    "categorical_crossentropy": "rows",  # one-hot or soft class rows
    "binary_crossentropy": "rows",  # 0/1 per column: binary or multi-label (multi-hot)
    "mse": "rows",
    "mae": "rows",
    "huber": "rows",
    "in_batch_softmax": "class_ids",  # each example's candidate id
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
# Losses of a model whose output is (batch, 2, d): [:, 0] a query's embedding, [:, 1] its
# candidate's; the label is the candidate's id, the network builder's second argument the number
# of distinct ids.
EMBEDDING_PAIRS: frozenset[str] = frozenset({"in_batch_softmax"})
# What a tower computes differently on its share of the batch, by loss (gradcheck's cause).
BATCH_DEPENDENCE = {
    "in_batch_softmax": "each tower's softmax sees its own B/k = {shard} candidates, not the "
    "batch's B = {batch}",
}
HUBER_DELTA = 1.0  # Keras' default
# Keras' names of the built-in losses (a compiled model's `loss`), by train.loss's.
KERAS_NAMES = {
    "sparse_categorical_crossentropy": {"sparse_categorical_crossentropy"},
    "categorical_crossentropy": {"categorical_crossentropy"},
    "binary_crossentropy": {"binary_crossentropy"},
    "mse": {"mse", "mean_squared_error"},
    "mae": {"mae", "mean_absolute_error"},
    "huber": {"huber", "huber_loss"},
}


def chance_loss(loss: str, width: int) -> float | None:
    """The loss of all-zero logits (the uniform prediction) over `width` classes or columns;
    None for a regression loss, whose level depends on the targets, and for in_batch_softmax,
    whose depends on the batch."""
    if loss in SINGLE_CLASS:
        return math.log(width)
    if loss == "binary_crossentropy":
        return math.log(2)
    return None


def parse_loss(text: str) -> ModelReference | None:
    """None for a built-in loss, the reference to the user's own; ValueError in one line when
    `text` is neither."""
    if text in LOSS_LABELS:
        return None
    try:
        reference = parse_model(text)
    except ValueError:
        reference = None
    if reference is None or reference.builtin:
        raise ValueError(
            f"{text!r} is not a built-in loss ({', '.join(LOSSES)}) nor path/to/file.py:function "
            "nor package.module:function"
        )
    return reference


def absolute_loss(text: str, base: Path) -> str:
    """`text` with a relative loss file made absolute against `base`; ValueError naming the
    file when it does not exist."""
    reference = parse_loss(text)
    return text if reference is None else absolute_function(reference, base, "loss")


def labels_taken(loss: str, held: LabelKind) -> LabelKind:
    """The labels `loss` takes: a built-in's own, the dataset's (`held`) for the user's."""
    return LOSS_LABELS.get(loss, held)


def judged_by_accuracy(loss: str, held: LabelKind) -> bool:
    """Whether a run of `loss` on labels of kind `held` names one class per example, what
    accuracy and the confusion matrix judge: the cross-entropies over classes, and the user's
    own loss on class ids."""
    return loss in SINGLE_CLASS or (loss not in LOSS_LABELS and held == "class_ids")


def user_code(model: str, loss: str) -> dict[str, str]:
    """What names the user's own code a run imports, in MLflow and in a sweep's identity: the
    network's and the loss's function and file sha256 (`model_digest`, `loss_digest`)."""
    return provenance(model) | function_provenance(parse_loss(loss), "loss")


def code_digests(model: str, loss: str) -> list[str]:
    """The sha256 of each user file a run imports (none for built-ins)."""
    return [value for key, value in user_code(model, loss).items() if key.endswith("_digest")]
