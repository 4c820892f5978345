"""The per-example losses of config/losses.py in TensorFlow: `loss(labels, outputs) -> (batch,)`.

Labels are int32 class ids (batch,) for sparse_categorical_crossentropy and float32 rows
(batch, columns) for the others (a user's loss gets what the dataset holds); outputs are the
network's (batch, columns), logits for the cross-entropies. A row's loss is the mean over its
columns, as Keras' losses take it. in_batch_softmax takes candidate ids (batch,) and the pairs
(batch, 2, d) of a retrieval model: each example's loss depends on the batch it is in.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tensorflow as tf

from towerbench.config.losses import HUBER_DELTA, parse_loss
from towerbench.config.model_ref import ModelReference
from towerbench.core.errors import TowerbenchError
from towerbench.model.user_model import load_builder, raised

PerExampleLoss = Callable[[tf.Tensor, tf.Tensor], tf.Tensor]


def _sparse_categorical(labels: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
    return tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)


def _categorical(labels: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
    return tf.nn.softmax_cross_entropy_with_logits(labels, logits)


def _binary(labels: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
    return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels, logits), -1)


def _squared(labels: tf.Tensor, outputs: tf.Tensor) -> tf.Tensor:
    return tf.reduce_mean(tf.square(outputs - labels), -1)


def _absolute(labels: tf.Tensor, outputs: tf.Tensor) -> tf.Tensor:
    return tf.reduce_mean(tf.abs(outputs - labels), -1)


def _huber(labels: tf.Tensor, outputs: tf.Tensor) -> tf.Tensor:
    error = tf.abs(outputs - labels)
    quadratic = tf.minimum(error, HUBER_DELTA)
    return tf.reduce_mean(0.5 * tf.square(quadratic) + HUBER_DELTA * (error - quadratic), -1)


# TFRS' mask value: low enough to take a logit out of the softmax, finite so no gradient is NaN.
MASKED_LOGIT = float(np.finfo(np.float32).min) / 100


def in_batch_softmax(temperature: float = 1.0) -> PerExampleLoss:
    """Each query's cross-entropy against its own candidate among the batch's: logits q·cᵀ /
    `temperature` over the batch's candidates, the other examples of the query's own candidate
    id (accidental hits) masked out. `outputs` (batch, 2, d): [:, 0] queries, [:, 1] candidates;
    `labels` (batch,) candidate ids."""

    def loss(labels: tf.Tensor, outputs: tf.Tensor) -> tf.Tensor:
        queries, candidates = outputs[:, 0], outputs[:, 1]
        logits = tf.matmul(queries, candidates, transpose_b=True) / temperature
        own = tf.range(tf.shape(labels)[0])
        same_id = tf.equal(labels[:, None], labels[None, :])
        accidental = same_id & ~tf.cast(tf.eye(tf.shape(labels)[0]), tf.bool)
        logits = tf.where(accidental, MASKED_LOGIT, logits)
        return tf.nn.sparse_softmax_cross_entropy_with_logits(own, logits)

    return loss


BUILT_IN: dict[str, PerExampleLoss] = {
    "sparse_categorical_crossentropy": _sparse_categorical,
    "categorical_crossentropy": _categorical,
    "binary_crossentropy": _binary,
    "mse": _squared,
    "mae": _absolute,
    "huber": _huber,
}


def per_example_loss(name: str, temperature: float = 1.0) -> PerExampleLoss:
    """The loss `name` (built in, or the user's `file.py:function`) as `fn(labels, outputs) ->
    (batch,)` in float32; `temperature` divides in_batch_softmax's logits."""
    reference = parse_loss(name)
    if name == "in_batch_softmax":
        loss = in_batch_softmax(temperature)
    else:
        loss = BUILT_IN[name] if reference is None else _users_loss(reference)

    def as_float32(labels: tf.Tensor, outputs: tf.Tensor) -> tf.Tensor:
        return loss(labels, tf.cast(outputs, tf.float32))

    return as_float32


def _users_loss(reference: ModelReference) -> PerExampleLoss:
    """The user's function, refused in one line when it raises or returns other than one
    float per example."""
    function = load_builder(reference, reference.function or "")
    call = f"{reference.function}(y_true, y_pred)"

    def checked(labels: tf.Tensor, outputs: tf.Tensor) -> tf.Tensor:
        try:
            losses = tf.convert_to_tensor(function(labels, outputs))
        except Exception as error:  # the user's code: any exception is a one-line refusal
            raise TowerbenchError(f"{reference.text}: " + raised(call, error)) from None
        if losses.shape.rank != 1 or losses.shape[0] != outputs.shape[0]:
            raise TowerbenchError(
                f"{reference.text}: {call} returned shape {tuple(losses.shape)} for a batch of "
                f"{outputs.shape[0]}: a per-example loss returns one value per example "
                "(batch,), not their mean (Keras' losses, e.g. keras.losses.mse, do)"
            )
        return tf.cast(losses, tf.float32)

    return checked


def true_classes(labels: tf.Tensor) -> tf.Tensor:
    """Each example's class, int32 (batch,): its id, or its label row's largest value."""
    if labels.shape.rank == 1:
        return labels
    return tf.argmax(labels, -1, tf.int32)
